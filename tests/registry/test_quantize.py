"""``registry.quantize``: a GGUF model of the store written again in a smaller type, by the
``gguf`` package where llama.cpp's quantizer is not installed (it is not, here: every test
runs with a ``PATH`` that has none), checked from the file it writes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from registry.errors import (
    AlreadyQuantized,
    InvalidModelFile,
    ModelExists,
    QuantizeFailed,
    QuantizeToolMissing,
)
from registry.gguf import read_header
from registry.quantize import (
    TOOL_ENV,
    default_name,
    quantize_file,
    quantize_model,
    tool_argv,
    weight_types,
)
from registry.store import ModelSettings, Store
from tests.support import MODEL
from tests.synthetic_f16 import build_f16_model

pytestmark = pytest.mark.slow  # each test writes a whole model: the full suite's tier, not the fast one

F16 = "smollm2-f16"
LIVE_TOOL = os.environ.get(TOOL_ENV) or shutil.which("llama-quantize")
"""llama.cpp's quantizer, where this machine has one (the other tests hide it)."""


@pytest.fixture(autouse=True)
def _no_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No llama-quantize, whatever this machine has: the built-in writer is what runs."""
    monkeypatch.delenv(TOOL_ENV, raising=False)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


@pytest.fixture(scope="module")
def f16_path(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    return build_f16_model(model_path, tmp_path_factory.mktemp("f16"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, f16_path: Path, model_path: Path) -> Store:
    """One store for the module (each import hashes the whole file): every test adds models
    under names of its own, or none."""
    store = Store(tmp_path_factory.mktemp("store") / "models")
    settings = ModelSettings(system="Answer briefly.", parameters={"temperature": 0.2})
    store.import_file(f16_path, F16, source="test", settings=settings)
    store.import_file(model_path, MODEL, source="test")
    return store


def test_the_f16_source_is_unquantized(f16_path: Path) -> None:
    assert weight_types(f16_path) == {"F16": 211}
    assert read_header(f16_path).values["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_F16)


def test_q8_0_is_written_and_stored_like_an_import(store: Store, f16_path: Path) -> None:
    record = quantize_model(store, F16, "q8_0")
    assert record.name == "smollm2-q8_0" and record.source == f"quantize:{F16}:Q8_0"
    assert record.settings == store.get(F16).settings  # the system prompt and parameters go along
    path = Path(record.path)
    assert path.parent == store.blobs_dir and record.size == path.stat().st_size
    assert weight_types(path) == {"Q8_0": 211}
    before, after = read_header(f16_path), read_header(path)
    assert after.values["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert after.values["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    for key, value in before.values.items():  # every other key as it was
        if key not in ("general.file_type", "general.quantization_version"):
            assert after.values[key] == value, key
    assert after.array_lengths == before.array_lengths  # the vocabulary too
    types = {t.name: t.type for t in after.tensors}
    assert types["output_norm.weight"] == types["blk.0.attn_norm.weight"] == "F32"
    assert store.info(record).file_type == "Q8_0"
    assert 0.5 < record.size / store.get(F16).size < 0.56  # 8.5 bits a weight where there were 16
    assert not list(store.partial_dir.iterdir())  # the work file is gone


def test_q4_0_weights_stay_close_to_the_original(store: Store, f16_path: Path, tmp_path: Path) -> None:
    record = quantize_model(store, F16, "Q4_0", name="small")
    assert record.name == "small" and weight_types(Path(record.path)) == {"Q4_0": 211}
    # The original's weights straight from its bytes (gguf's reader would take seconds over the
    # vocabulary); the result is read back by gguf's reader.
    source = read_header(f16_path)
    original = {t.name: t for t in source.tensors}
    data = np.memmap(f16_path, dtype=np.uint8, mode="r")[source.data_offset :]
    for tensor in gguf.GGUFReader(record.path).tensors[:12]:
        if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_0:
            continue
        f16 = original[tensor.name]
        assert f16.type == "F16" and f16.n_bytes is not None
        was = data[f16.offset : f16.offset + f16.n_bytes].view(np.float16).astype(np.float32)
        was = was.reshape(f16.shape[::-1])
        now = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert now.shape == was.shape
        # 4 bits a weight (16 steps a block): off by a few percent of the weights' size on the whole
        assert np.abs(now - was).mean() < 0.2 * np.abs(was).mean(), tensor.name


def test_rows_that_are_not_whole_blocks_and_1d_tensors_stay_as_they_are(tmp_path: Path) -> None:
    src, dst = tmp_path / "tiny.gguf", tmp_path / "tiny-q8.gguf"
    writer = gguf.GGUFWriter(src, arch="llama")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    rng = np.random.default_rng(0)
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((4, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((4, 48), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", rng.standard_normal((2, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    quantize_file(src, dst, "Q8_0")
    types = {t.name: (t.type, t.shape) for t in read_header(dst).tensors}
    assert types == {
        "blk.0.ffn_up.weight": ("Q8_0", [64, 4]),  # two blocks of 32 a row
        "blk.0.attn_q.weight": ("F32", [48, 4]),  # 48 is no whole number of blocks
        "blk.0.attn_norm.weight": ("F32", [64]),
        "blk.0.ffn_norm.weight": ("F32", [64, 2]),  # a norm stays, whatever its shape
    }
    kept = {t.name: t.data for t in gguf.GGUFReader(dst).tensors}
    assert np.array_equal(kept["blk.0.attn_q.weight"], gguf.GGUFReader(src).tensors[1].data)


def test_an_already_quantized_model_is_refused_unless_allowed(store: Store) -> None:
    with pytest.raises(AlreadyQuantized) as refused:
        quantize_model(store, MODEL, "Q8_0")
    assert refused.value.code == "ALREADY_QUANTIZED"
    assert "Q4_1" in refused.value.message and "--allow-requantize" in refused.value.message
    assert store.find("smollm2-135m-q8_0") is None and not list(store.partial_dir.glob("*"))
    record = quantize_model(store, MODEL, "Q8_0", allow_requantize=True)
    assert record.name == "smollm2-135m-q8_0" and weight_types(Path(record.path)) == {"Q8_0": 211}


@pytest.mark.parametrize("kind", ["Q4_K_M", "IQ2_XS", "q6_k"])
def test_types_only_llama_quantize_writes_name_it(store: Store, kind: str) -> None:
    with pytest.raises(QuantizeToolMissing) as refused:
        quantize_model(store, F16, kind)
    assert refused.value.code == "QUANTIZE_TOOL_MISSING"
    assert "llama-quantize" in refused.value.message and TOOL_ENV in refused.value.message
    assert "Q8_0" in refused.value.message  # and says what works without it


def test_an_imatrix_needs_llama_quantize(store: Store, tmp_path: Path) -> None:
    (tmp_path / "m.imatrix").write_bytes(b"x")
    with pytest.raises(QuantizeToolMissing, match="--imatrix"):
        quantize_model(store, F16, "Q8_0", imatrix=tmp_path / "m.imatrix")


def test_a_tool_named_in_the_environment_must_exist(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOL_ENV, "/nowhere/llama-quantize")
    with pytest.raises(QuantizeToolMissing, match=TOOL_ENV):
        quantize_model(store, F16, "Q8_0")


def test_llama_quantize_s_command_line() -> None:
    """llama.cpp's quantizer is not installed on this project's machines: its command line is
    pinned here, and a real program run in its place shows how a failure is reported."""
    src, dst = Path("/m/in.gguf"), Path("/m/out.gguf")
    assert tool_argv("llama-quantize", src, dst, "Q4_K_M", imatrix=None, allow_requantize=False) == [
        "llama-quantize", "/m/in.gguf", "/m/out.gguf", "Q4_K_M",
    ]  # fmt: skip
    assert tool_argv("q", src, dst, "Q6_K", imatrix=Path("/m/i.dat"), allow_requantize=True) == [
        "q", "--allow-requantize", "--imatrix", "/m/i.dat", "/m/in.gguf", "/m/out.gguf", "Q6_K",
    ]  # fmt: skip


def test_a_quantizer_that_fails_is_reported_with_its_last_line(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    failing = tmp_path / "bin" / "llama-quantize"
    failing.write_text("#!/bin/sh\necho 'main: invalid ftype' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(QuantizeFailed, match="main: invalid ftype"):
        quantize_model(store, F16, "Q4_K_M")
    assert store.find("smollm2-q4_k_m") is None  # nothing half-written is kept


@pytest.mark.skipif(
    LIVE_TOOL is None,
    reason="llama.cpp's quantizer (llama-quantize) is not installed here: its command line is "
    "pinned by test_llama_quantize_s_command_line",
)
def test_llama_quantize_writes_q4_k_m_where_installed(
    tmp_path: Path, f16_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert LIVE_TOOL is not None
    monkeypatch.setenv(TOOL_ENV, LIVE_TOOL)
    store = Store(tmp_path / "live")
    store.import_file(f16_path, F16, source="test")
    record = quantize_model(store, F16, "Q4_K_M")
    assert "Q4_K" in weight_types(Path(record.path))


def test_unknown_types_and_taken_names_are_refused(store: Store) -> None:
    with pytest.raises(InvalidModelFile, match="not a quantization type"):
        quantize_model(store, F16, "Q9_9")
    with pytest.raises(ModelExists):
        quantize_model(store, F16, "Q8_0", name=MODEL)
    assert store.get(MODEL).source == "test"


@pytest.mark.parametrize(
    ("model", "kind", "expected"),
    [
        ("smollm2-f16", "Q8_0", "smollm2-q8_0"),
        ("llama-3-8b-bf16", "Q4_0", "llama-3-8b-q4_0"),
        ("qwen:7b-f16", "Q4_K_M", "qwen:7b-q4_k_m"),
        ("mine", "Q5_1", "mine-q5_1"),
        ("org/model:latest", "Q8_0", "org/model-q8_0"),
    ],
)
def test_default_names(model: str, kind: str, expected: str) -> None:
    assert default_name(model, kind) == expected
