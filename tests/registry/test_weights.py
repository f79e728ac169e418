"""Safetensors and MLX directories, diffusion checkpoints and whisper.cpp files in the store, on
small files the tests write (headers with tiny tensors): import, facts, kinds, the tree an
engine opens, memory, routing, removal, and adopting them from a Hugging Face cache."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import trio

from actors.config import RuntimeConfig
from actors.engines.routing import route
from actors.errors import UnsupportedEngine
from actors.offline import plan_offline
from actors.planning import launch_spec_for
from registry import fit
from registry.errors import ChecksumMismatch, InvalidModelFile, ModelFileIncomplete, ModelKindMismatch
from registry.ggml import MAGIC, parse_whisper_header
from registry.imports import import_gguf, import_path
from registry.kinds import TEXT_KINDS, require
from registry.multifile import estimate_path
from registry.reuse import adopt, adopt_all
from registry.scan import Roots, scan
from registry.store import ModelRecord, Store
from registry.weights import import_weights, lane_format
from tests.registry.conftest import Pulls
from tests.registry.hub import Hub
from tests.registry.test_formats import (
    hf_config,
    hf_dir,
    llama_params,
    llama_tensors,
    sd15_tensors,
    write_safetensors,
)

TensorTable = dict[str, tuple[str, list[int]]]


def sharded_dir(tmp_path: Path, config: dict[str, Any] | None = None, *, name: str = "tiny-llama") -> Path:
    """A Hugging Face repo as downloaded: config.json, two shards with their index, a tokenizer,
    a generation config, a nested folder, and weights the format does not load (a PyTorch
    copy, Mistral's consolidated file) that must stay out of the store."""
    tensors = llama_tensors()
    names = list(tensors)
    shards = [{k: tensors[k] for k in names[:5]}, {k: tensors[k] for k in names[5:]}]
    folder = hf_dir(tmp_path, config or hf_config(), shards, name=name)
    weight_map = {
        k: f"model-{i + 1:05d}-of-00002.safetensors" for i, shard in enumerate(shards) for k in shard
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "generation_config.json").write_text('{"temperature": 0.6}')
    (folder / "original").mkdir()
    (folder / "original" / "params.json").write_text('{"dim": 64}')
    (folder / "original" / "consolidated.00.pth").write_bytes(b"pickle" * 100)
    (folder / "pytorch_model.bin").write_bytes(b"pickle" * 100)
    write_safetensors(folder / "consolidated.safetensors", tensors)
    (folder / ".cache").mkdir()
    (folder / ".cache" / "download.lock").write_text("")
    return folder


def mlx_dir(tmp_path: Path) -> Path:
    hidden, bits = 64, 4
    tensors: TensorTable = {
        "model.embed_tokens.weight": ("U32", [128, hidden * bits // 32]),
        "model.embed_tokens.scales": ("BF16", [128, hidden // 64]),
        "model.embed_tokens.biases": ("BF16", [128, hidden // 64]),
        "model.norm.weight": ("BF16", [hidden]),
    }
    quant = {"group_size": 64, "bits": bits}
    return hf_dir(tmp_path, hf_config(quantization=quant, quantization_config=quant), [tensors],
                  metadata={"format": "mlx"}, name="tiny-mlx")  # fmt: skip


def awq_dir(tmp_path: Path) -> Path:
    hidden, packed = 64, 64 // 8
    tensors: TensorTable = {"model.embed_tokens.weight": ("F16", [128, hidden])}
    for proj in ("q_proj", "k_proj"):
        base = f"model.layers.0.self_attn.{proj}"
        tensors[f"{base}.qweight"] = ("I32", [hidden, packed])
        tensors[f"{base}.qzeros"] = ("I32", [hidden // 32, packed])
        tensors[f"{base}.scales"] = ("F16", [hidden // 32, hidden])
    config = hf_config(quantization_config={"quant_method": "awq", "bits": 4, "group_size": 32})
    return hf_dir(tmp_path, config, [tensors], name="tiny-awq")


def whisper_ggml(path: Path, *, n_vocab: int = 51864, n_audio_layer: int = 4, ftype: int = 1) -> Path:
    """A whisper.cpp ggml file's header (tiny.en's numbers), then filler where the mel filters,
    vocabulary and tensors would be."""
    hparams = [n_vocab, 1500, 384, 6, n_audio_layer, 448, 384, 6, 4, 80, ftype]
    path.write_bytes(struct.pack("<I11i", MAGIC, *hparams) + bytes(4096))
    return path


def diffusion_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, arch="sd")
    writer.add_tensor("model.diffusion_model.input_blocks.0.0.weight", np.zeros((8, 4), dtype=np.float16))
    writer.add_tensor("model.diffusion_model.output_blocks.0.0.weight", np.zeros((8,), dtype=np.float16))
    writer.add_tensor(
        "cond_stage_model.transformer.text_model.final_layer_norm.weight", np.zeros(4, np.float32)
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home" / "models")


def _blobs(store: Store) -> set[str]:
    return {p.name for p in store.blobs_dir.iterdir()} if store.blobs_dir.is_dir() else set()


# -- import --------------------------------------------------------------------------


def test_a_sharded_directory_is_stored_file_by_file(store: Store, tmp_path: Path) -> None:
    folder = sharded_dir(tmp_path)
    record = import_path(store, folder, "acme/Tiny-Llama")
    assert (record.name, record.kind, record.format) == ("acme/tiny-llama", "chat", "safetensors")
    names = [f.name for f in record.files]
    assert names == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "original/params.json",
        "tokenizer.json",
    ]  # no PyTorch copy, no consolidated file, nothing hidden
    facts = record.facts
    assert facts is not None and facts.architecture == "LlamaForCausalLM"
    assert facts.parameters == llama_params() and facts.quantization is None and facts.dtype == "BF16"
    assert facts.context_length == 8192 and facts.kv_bytes_per_token == 2 * 2 * 16 * 2 * 2
    assert facts.weights_bytes == sum(
        (folder / n).stat().st_size for n in names if n.endswith(".safetensors")
    )
    assert facts.hparams["num_hidden_layers"] == 2 and facts.hparams["num_key_value_heads"] == 2
    assert record.size == sum((folder / n).stat().st_size for n in names)
    assert lane_format(record) == "safetensors"
    # The engine opens the folder: each file under its name, a link to its blob; blobs hardlinked.
    tree = Path(record.path)
    assert tree.is_dir() and record.entry == ""
    assert json.loads((tree / "generation_config.json").read_text()) == {"temperature": 0.6}
    assert (tree / "original" / "params.json").is_file() and (tree / "original" / "params.json").is_symlink()
    shard = tree / "model-00001-of-00002.safetensors"
    assert os.stat(shard).st_ino == os.stat(folder / shard.name).st_ino
    assert record.digest == next(f.digest for f in record.files if f.name == "config.json")
    assert set(record.digests()) == {f.digest for f in record.files}
    # what listings read
    info = store.info(record)
    assert (info.architecture, info.parameter_count, info.context_length) == (
        "LlamaForCausalLM",
        llama_params(),
        8192,
    )
    assert info.block_count == 2 and info.file_type == "BF16"


def test_awq_mlx_and_embedding_directories(store: Store, tmp_path: Path) -> None:
    awq = import_path(store, awq_dir(tmp_path), "tiny-awq")
    assert awq.facts is not None and awq.facts.quantization == "awq"
    assert lane_format(awq) == "safetensors:awq" and awq.kind == "chat"
    assert awq.facts.parameters == 128 * 64 + 2 * 64 * 64  # packed int4 unpacked
    mlx = import_path(store, mlx_dir(tmp_path), "tiny-mlx")
    assert (mlx.format, lane_format(mlx), mlx.kind) == ("mlx", "mlx", "chat")
    assert mlx.facts is not None and mlx.facts.quantization == "4bit"
    embed = hf_dir(tmp_path, hf_config(architectures=["BertModel"]), [llama_tensors()], name="embed")
    (embed / "modules.json").write_text("[]")
    assert import_path(store, embed, "tiny-embed").kind == "embedding"


def test_a_diffusion_checkpoint_is_an_image_model(store: Store, tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "v1-5-pruned.safetensors", sd15_tensors())
    record = import_path(store, path, "sd15")
    assert (record.kind, record.format, record.entry) == ("image", "diffusion", "v1-5-pruned.safetensors")
    assert record.facts is not None and (record.facts.architecture, record.facts.container) == (
        "sd1",
        "safetensors",
    )
    assert (
        Path(record.path).name == "v1-5-pruned.safetensors"
        and Path(record.path).stat().st_size == path.stat().st_size
    )
    assert record.digests() == [record.digest] and lane_format(record) == "diffusion"
    # A diffusion GGUF is never taken for a chat model, whichever way it comes in.
    gg = diffusion_gguf(tmp_path / "sd-q8.gguf")
    for record in (import_path(store, gg, "sd-gguf"), import_gguf(store, gg, "sd-gguf-2")):
        assert (record.kind, record.format) == ("image", "diffusion")
        assert record.facts is not None and record.facts.container == "gguf"
        assert Path(record.path).name == "sd-q8.gguf"
    with pytest.raises(InvalidModelFile, match="image model"):
        store.import_file(gg, "sd-gguf-3")  # the store's own GGUF import takes text models only
    assert store.find("sd-gguf-3") is None
    with pytest.raises(ChecksumMismatch):
        import_weights(store, path, "sd-bad", expected_sha256="0" * 64)
    assert store.find("sd-bad") is None
    short = tmp_path / "short.gguf"
    short.write_bytes(gg.read_bytes()[:-40])
    with pytest.raises(ModelFileIncomplete):
        import_path(store, short, "sd-short")


def test_a_whisper_cpp_file_is_a_speech_model(store: Store, tmp_path: Path) -> None:
    header = parse_whisper_header(whisper_ggml(tmp_path / "ggml-tiny.en.bin").read_bytes())
    assert header is not None and (header.size, header.language, header.quantization) == ("tiny", "en", "f16")
    record = import_path(store, tmp_path / "ggml-tiny.en.bin", "whisper-cpp-tiny")
    assert (record.kind, record.format, lane_format(record)) == ("stt", "ggml-whisper", "ggml-whisper")
    assert record.speech is not None and (record.speech.language, record.speech.sample_rate) == ("en", 16000)
    assert record.facts is not None and record.facts.quantization == "f16"
    assert record.facts.hparams["n_audio_layer"] == 4 and record.facts.hparams["n_vocab"] == 51864
    assert Path(record.path).name == "ggml-tiny.en.bin"
    q5 = whisper_ggml(tmp_path / "ggml-base-q5_1.bin", n_vocab=51865, n_audio_layer=6, ftype=1009)
    other = parse_whisper_header(q5.read_bytes())
    assert other is not None and (other.size, other.language, other.quantization) == (
        "base",
        "multilingual",
        "q5_1",
    )
    # the same magic on a pre-GGUF llama.cpp file is not a whisper model
    old = tmp_path / "ggml-llama.bin"
    old.write_bytes(struct.pack("<I7i", MAGIC, 32000, 4096, 256, 32, 32, 128, 2) + bytes(64))
    assert parse_whisper_header(old.read_bytes()) is None
    with pytest.raises(InvalidModelFile, match="not a model Blazar can store"):
        import_path(store, old, "old")


def test_what_cannot_be_imported_says_what_can(store: Store, tmp_path: Path) -> None:
    lone = write_safetensors(tmp_path / "model.safetensors", llama_tensors())
    with pytest.raises(InvalidModelFile, match="needs its directory"):
        import_path(store, lone, "lone")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("hi")
    with pytest.raises(InvalidModelFile, match=r"config\.json"):
        import_path(store, notes, "notes")
    folder = sharded_dir(tmp_path, name="broken")
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InvalidModelFile, match="missing shards"):
        import_path(store, folder, "broken")
    assert store.list() == [] and _blobs(store) == set()


# -- kinds, routing, memory ------------------------------------------------------------


def test_text_routes_refuse_an_image_model(store: Store, tmp_path: Path) -> None:
    record = import_path(store, write_safetensors(tmp_path / "sd.safetensors", sd15_tensors()), "sd")
    with pytest.raises(ModelKindMismatch) as exc:
        require(record, TEXT_KINDS, "text")
    assert exc.value.code == "MODEL_KIND_MISMATCH" and "/v1/images/generations" in exc.value.message
    config = RuntimeConfig.in_home(str(store.root.parent))
    with pytest.raises(ModelKindMismatch):
        launch_spec_for(config, store, record)


def test_each_format_routes_to_its_lanes() -> None:
    def taken(fmt: str, lanes: dict[str, Any]) -> str | None:
        return route(fmt, needs=frozenset(), pin=None, lanes=lanes).lane

    from tests.actors.test_routing import LLAMA

    none: dict[str, Any] = {"llamacpp": LLAMA}
    for fmt in ("safetensors", "safetensors:awq", "mlx", "diffusion", "ggml-whisper"):
        assert taken(fmt, none) is None
    why = {
        c.lane: c.why for c in route("safetensors:awq", needs=frozenset(), pin=None, lanes=none).considered
    }
    assert why["vllm"].startswith("not installed") and why["sglang"].startswith("not installed")
    assert why["mlx"] == "does not load safetensors:awq models (and is not installed)"  # MLX takes no AWQ
    assert why["llamacpp"] == "does not load safetensors:awq models"


def test_plans_show_the_lane_that_would_run_each_and_how_to_install_it(store: Store, tmp_path: Path) -> None:
    import_path(store, sharded_dir(tmp_path), "tiny")
    import_path(store, mlx_dir(tmp_path), "tiny-mlx")
    import_path(store, write_safetensors(tmp_path / "sd.safetensors", sd15_tensors()), "sd")
    config = RuntimeConfig.in_home(str(store.root.parent))
    lanes = {"tiny": ("vllm", "sglang"), "tiny-mlx": ("mlx",), "sd": ("sdcpp",)}
    from actors.engines.routing import installed

    here = installed(config.engine, config.home)
    for name, wanted in lanes.items():
        if any(here.get(lane) is not None for lane in wanted):
            continue  # the lane runs here: a real plan, not the refusal this test is about
        plan = trio.run(plan_offline, config, name)
        assert plan.lane is None and plan.preview.code == "MODEL_UNSUPPORTED_ENGINE"
        assert plan.preview.refused is not None and f"runs on {' or '.join(wanted)}" in plan.preview.refused
        why = {c.lane: c.why for c in plan.lanes}
        for lane in wanted:
            assert why[lane].startswith("not installed (")
        assert why["llamacpp"].startswith("does not load")
        assert plan.estimate is not None and plan.estimate.total > plan.estimate.weights
        with pytest.raises(UnsupportedEngine) as exc:
            launch_spec_for(config, store, store.get(name), frozenset({store.get(name).kind}))
        assert "not installed here" in exc.value.message


def test_where_the_lanes_are_installed_each_model_starts_on_its_own(store: Store, tmp_path: Path) -> None:
    """The store's records reach the GPU lanes' argv: the tree an engine opens, the architecture
    its options key on. The programs are configured paths (nothing is started)."""
    from actors.config import EngineConfig
    from actors.engines.routing import lane_for
    from registry.kinds import IMAGE_KINDS

    awq = import_path(store, awq_dir(tmp_path), "tiny-awq")
    mlx = import_path(store, mlx_dir(tmp_path), "tiny-mlx")
    sd = import_path(store, write_safetensors(tmp_path / "sd.safetensors", sd15_tensors()), "sd")
    engine = EngineConfig(
        vllm="/opt/vllm/bin/vllm", mlx="/opt/mlx/bin/mlx_lm.server", sd_server="/opt/sd-server"
    )
    config = RuntimeConfig.in_home(str(store.root.parent), engine=engine)
    for record, kinds, lane in (
        (awq, TEXT_KINDS, "vllm"),
        (mlx, TEXT_KINDS, "mlx"),
        (sd, IMAGE_KINDS, "sdcpp"),
    ):
        spec = launch_spec_for(config, store, record, kinds)
        assert (spec.lane, spec.path, spec.kind) == (lane, record.path, record.kind)
        assert spec.architecture == (record.facts.architecture if record.facts else None)
        argv = lane_for(spec, config.engine, config.home).argv(spec, 8123, "key")
        assert record.path in argv and "8123" in argv
    assert launch_spec_for(config, store, awq).ctx_train == 8192
    plan = trio.run(plan_offline, config, "tiny-awq")
    assert plan.lane == "vllm" and plan.preview.code != "MODEL_UNSUPPORTED_ENGINE"
    assert {c.lane: c.taken for c in plan.lanes}["vllm"] is True


def test_a_pin_to_a_lane_that_cannot_load_the_format_says_so(store: Store, tmp_path: Path) -> None:
    from actors.config import ModelOverride

    record = import_path(store, sharded_dir(tmp_path), "tiny")
    config = RuntimeConfig.in_home(str(store.root.parent), models={"tiny": ModelOverride(engine="llamacpp")})
    with pytest.raises(UnsupportedEngine) as exc:
        launch_spec_for(config, store, record)
    message = exc.value.message
    assert 'models."tiny".engine' in message and "llamacpp: does not load safetensors models" in message


def test_memory_from_the_files_and_config(store: Store, tmp_path: Path) -> None:
    record = import_path(store, sharded_dir(tmp_path), "tiny")
    facts = record.facts
    assert facts is not None and facts.weights_bytes is not None and facts.kv_bytes_per_token
    est = estimate_path(record.path, slots=4, ctx_per_slot=4096)
    assert est is not None
    assert est.weights == facts.weights_bytes
    assert est.kv == facts.kv_bytes_per_token * 4096 * 4
    assert est.total == est.weights + est.kv + fit.WEIGHTS_WORK_TEXT + fit.WEIGHTS_OVERHEAD_TEXT
    image = import_path(store, write_safetensors(tmp_path / "sd.safetensors", sd15_tensors()), "sd")
    est = estimate_path(image.path, slots=4, ctx_per_slot=4096)
    assert est is not None and est.kv == 0 and est.compute == fit.WEIGHTS_WORK["image"]
    whisper = import_path(store, whisper_ggml(tmp_path / "ggml-tiny.en.bin"), "wcpp")
    est = estimate_path(whisper.path, slots=1)
    assert est is not None and est.weights == whisper.size  # kept as stored, not widened
    verdict = fit.fit_weights(
        fit.estimate_weights("chat", 10 << 30, kv_bytes_per_token=1 << 17, ctx_per_slot=8192, slots=2),
        fit.Memory(ram_available=64 << 30, gpu_free=[8 << 30]),
    )
    assert verdict.device == "gpu" and verdict.verdict == "no_fit"


# -- removal ---------------------------------------------------------------------------


def test_rm_collects_blobs_no_other_name_uses(store: Store, tmp_path: Path) -> None:
    a = import_path(store, sharded_dir(tmp_path), "tiny")
    b = import_path(store, awq_dir(tmp_path), "tiny-awq")  # shares tokenizer.json's bytes with a
    shared = {f.digest for f in a.files} & {f.digest for f in b.files}
    assert shared
    store.remove("tiny")
    left = {d.removeprefix("sha256:") for d in b.digests()}
    assert {n.removeprefix("sha256-") for n in _blobs(store)} == left
    assert not Path(a.path).exists() and Path(b.path).is_dir()
    store.remove("tiny-awq")
    assert _blobs(store) == set() and list(store.trees_dir.iterdir()) == []


def test_a_manifest_reads_back_with_its_facts(store: Store, tmp_path: Path) -> None:
    record = import_path(store, mlx_dir(tmp_path), "tiny-mlx")
    again = store.get("tiny-mlx")
    assert again == record and isinstance(again, ModelRecord)


# -- other tools' stores ----------------------------------------------------------------


def hub_snapshot(hub: Path, repo: str, folder: Path) -> Path:
    """``folder`` as huggingface_hub caches it: snapshot files are symlinks into blobs/, which
    are named by their sha256 (LFS: the shards) or their git sha1 (small files)."""
    import hashlib

    repo_dir = hub / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / ("b" * 40)
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or any(p.startswith(".") for p in path.relative_to(folder).parts):
            continue
        data = path.read_bytes()
        lfs = path.suffix in (".safetensors", ".bin", ".pth")
        etag = hashlib.sha256(data).hexdigest() if lfs else hashlib.sha1(data).hexdigest()
        blob = repo_dir / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            os.link(path, blob)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text("b" * 40)
    return snapshot


def test_the_hub_cache_lists_and_adopts_directories_by_link(store: Store, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    src = tmp_path / "src"
    src.mkdir()
    snapshot = hub_snapshot(hub, "Acme/Tiny-Llama", sharded_dir(src))
    hub_snapshot(hub, "mlx-community/Tiny-4bit", mlx_dir(src))
    hub_snapshot(
        hub, "acme/sd-ckpt", _only(src / "sd", write_safetensors(src / "sd.safetensors", sd15_tensors()))
    )
    found = scan(Roots(huggingface=(str(hub),)))
    assert found.warnings == []
    by_name = {m.name: m for m in found.models}
    assert {n: (m.format, m.quantization) for n, m in by_name.items()} == {
        "acme/tiny-llama": ("safetensors", None),
        "mlx-community/tiny-4bit": ("mlx", "4bit"),
        "acme/sd-ckpt:sd": ("diffusion", None),
    }
    llama = by_name["acme/tiny-llama"]
    assert llama.path == str(snapshot) and llama.family == "LlamaForCausalLM"

    results = {a.name: a for a in adopt_all(store, found.models)}
    assert all(a.status == "adopted" for a in results.values()), results
    assert results["acme/tiny-llama"].method == "hardlink" and results["acme/tiny-llama"].bytes_copied == 0
    record = store.get("acme/tiny-llama")
    assert record.source == f"huggingface:{hub}" and record.kind == "chat"
    shard = Path(record.path) / "model-00001-of-00002.safetensors"
    assert os.stat(shard).st_ino == os.stat((snapshot / shard.name).resolve()).st_ino  # reused, not copied
    sd = store.get("acme/sd-ckpt:sd")
    assert sd.kind == "image" and Path(sd.path).name == "sd.safetensors"
    # again: all already installed
    again = adopt_all(store, scan(Roots(huggingface=(str(hub),))).models)
    assert {a.status for a in again} == {"skipped"} and {a.reason for a in again} == {"already installed"}
    # one name, explicitly
    assert adopt(store, llama, "mine").files == record.files


def _only(folder: Path, file: Path) -> Path:
    folder.mkdir()
    os.replace(file, folder / file.name)
    return folder


async def test_a_diffusion_gguf_pulled_from_the_hub_is_an_image_model(
    hub: Hub, do_pull: Pulls, store: Store, tmp_path: Path
) -> None:
    data = diffusion_gguf(tmp_path / "flux-tiny-Q8_0.gguf").read_bytes()
    hub.add_hf_file("Acme/Flux-Tiny-GGUF", "flux-tiny-Q8_0.gguf", data)
    record = await do_pull("Acme/Flux-Tiny-GGUF:Q8_0")
    assert (record.kind, record.format, record.entry) == ("image", "diffusion", "flux-tiny-Q8_0.gguf")
    assert record.source == "hf:Acme/Flux-Tiny-GGUF/flux-tiny-Q8_0.gguf"
    assert await trio.Path(record.path).read_bytes() == data and do_pull.statuses()[-1] == "success"
    assert store.get(record.name) == record
