"""What each stored file promises by its model's format (``registry.integrity``): the plan a
manifest gives (pure), and each header check on small files written here: whole, cut short,
and replaced by other bytes."""

from __future__ import annotations

import json
import math
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.integrity import Check, ExpectedFile, check_header, expected_files
from registry.store import Adapter, ModelFile, ModelRecord, WeightFacts
from tests.registry.conftest import write_gguf
from tests.registry.test_formats import llama_tensors, write_safetensors
from tests.registry.test_weights import whisper_ggml

SHA = {c: f"sha256:{c * 64}" for c in "abcdef0123"}


def record(**fields: object) -> ModelRecord:
    base: dict[str, object] = {
        "name": "m", "digest": SHA["a"], "size": 100, "path": "/s/blobs/sha256-" + "a" * 64,
        "source": "test", "created_at": 0.0, "modified_at": 0.0,
    }  # fmt: skip
    return ModelRecord(**{**base, **fields})  # type: ignore[arg-type]


def files(*names_sizes: tuple[str, int]) -> list[ModelFile]:
    digits = "abcdef0123"
    return [ModelFile(name=n, digest=SHA[digits[i]], size=s) for i, (n, s) in enumerate(names_sizes)]


def plan(r: ModelRecord) -> list[tuple[str, int | None, Check | None]]:
    return [(f.name, f.size, f.check) for f in expected_files(r)]


# -- the plan: what the manifest promises, by format (pure) ------------------------------


def test_a_one_file_gguf_promises_its_size_and_header() -> None:
    assert plan(record()) == [("model file", 100, "gguf")]


def test_a_split_gguf_records_only_the_total_so_its_parts_are_checked_by_their_headers() -> None:
    projector = "/s/blobs/sha256-" + "d" * 64
    r = record(size=300, blobs=[SHA["b"], SHA["c"], SHA["d"]], projector=projector)
    assert plan(r) == [
        ("part 1 of 3", None, "gguf"),
        ("part 2 of 3", None, "gguf"),
        ("part 3 of 3", None, "gguf"),
        ("projector", None, "gguf"),
    ]
    # One file and a projector: the record's size is the model file's own.
    assert plan(record(blobs=[SHA["d"]], projector=projector)) == [
        ("model file", 100, "gguf"),
        ("projector", None, "gguf"),
    ]


def test_adapters_promise_their_size_and_a_gguf_header() -> None:
    lora = Adapter(name="style", digest=SHA["e"], size=42)
    assert plan(record(adapters=[lora]))[-1] == ("LoRA adapter 'style'", 42, "gguf")


def test_multi_file_models_promise_each_file_its_own_size() -> None:
    whisper = record(
        format="ctranslate2", kind="stt", size=1006,
        files=files(("model.bin", 1000), ("config.json", 2), ("tokenizer.json", 3), ("vocabulary.txt", 1)),
    )  # fmt: skip
    assert plan(whisper) == [
        ("model.bin", 1000, "ctranslate2"),
        ("config.json", 2, "json"),
        ("tokenizer.json", 3, None),
        ("vocabulary.txt", 1, None),
    ]
    piper = record(format="onnx", kind="tts", entry="v.onnx", files=files(("v.onnx", 10), ("v.onnx.json", 2)))
    assert plan(piper) == [("v.onnx", 10, "onnx"), ("v.onnx.json", 2, "json")]
    hf_files = files(
        ("config.json", 1),
        ("model-00001-of-00002.safetensors", 5),
        ("model.safetensors.index.json", 1),
        ("tokenizer.model", 4),
        ("original/params.json", 1),
    )
    hf = record(format="safetensors", files=hf_files)
    assert [c for _n, _s, c in plan(hf)] == ["json", "safetensors", "json", None, None]
    mlx = record(format="mlx", files=files(("config.json", 1), ("weights.npz", 9)))
    assert plan(mlx)[1] == ("weights.npz", 9, "zip")


def test_a_diffusion_checkpoint_is_checked_as_its_container() -> None:
    for container, check in (("safetensors", "safetensors"), ("gguf", "gguf"), ("ckpt", "zip")):
        r = record(format="diffusion", kind="image", entry="x", files=files(("x", 7)),
                   facts=WeightFacts(container=container))  # fmt: skip
        assert plan(r) == [("x", 7, check)], container
    whisper_cpp = record(format="ggml-whisper", kind="stt", entry="ggml-tiny.en.bin",
                         files=files(("ggml-tiny.en.bin", 7)))  # fmt: skip
    assert plan(whisper_cpp) == [("ggml-tiny.en.bin", 7, "ggml-whisper")]


def test_expected_files_are_plain_data() -> None:
    assert expected_files(record())[0] == ExpectedFile(
        digest=SHA["a"], name="model file", size=100, check="gguf"
    )


# -- the header checks, on files written here ---------------------------------------------


def ct2_model(path: Path) -> Path:
    """A CTranslate2 ``model.bin`` (binary version 6), laid out as ``ctranslate2.specs`` writes it."""

    def string(s: str) -> bytes:
        return struct.pack("<H", len(s) + 1) + s.encode() + b"\0"

    out = struct.pack("<I", 6) + string("WhisperSpec") + struct.pack("<I", 3) + struct.pack("<I", 2)
    for name, shape in (("encoder/conv1/weight", [4, 2]), ("decoder/embeddings/weight", [3])):
        data = bytes(4 * math.prod(shape))
        out += string(name) + struct.pack("<B", len(shape)) + b"".join(struct.pack("<I", d) for d in shape)
        out += struct.pack("<B", 0) + struct.pack("<I", len(data)) + data
    out += struct.pack("<I", 1) + string("decoder/projection/weight") + string("decoder/embeddings/weight")
    path.write_bytes(out)
    return path


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def onnx_model(path: Path) -> Path:
    """The top level of an ONNX ModelProto: ir_version, producer, a graph (opaque bytes here)
    and an opset import."""
    graph = bytes(300)
    out = _varint(1 << 3 | 0) + _varint(8)
    out += _varint(2 << 3 | 2) + _varint(7) + b"pytorch"
    out += _varint(7 << 3 | 2) + _varint(len(graph)) + graph
    out += _varint(8 << 3 | 2) + _varint(2) + b"\x10\x0f"
    path.write_bytes(out)
    return path


def ckpt(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", b"model.diffusion_model.input_blocks.0.0.weight" + bytes(64))
        zf.writestr("archive/data/0", bytes(4096))
    return path


WRITERS: dict[Check, Callable[[Path], Path]] = {
    "gguf": lambda p: write_gguf(p.with_suffix(".gguf")),
    "safetensors": lambda p: write_safetensors(p.with_suffix(".safetensors"), llama_tensors()),
    "zip": lambda p: ckpt(p.with_suffix(".ckpt")),
    "ggml-whisper": lambda p: whisper_ggml(p.with_suffix(".bin")),
    "ctranslate2": lambda p: ct2_model(p.with_name("model.bin")),
    "onnx": lambda p: onnx_model(p.with_suffix(".onnx")),
    "json": lambda p: (
        p.with_suffix(".json").write_text(json.dumps({"a": [1, 2, 3]})),
        p.with_suffix(".json"),
    )[1],
}


def cut(path: Path, keep: int) -> Path:
    short = path.with_name("short-" + path.name)
    short.write_bytes(path.read_bytes()[:keep])
    return short


@pytest.mark.parametrize("check", list(WRITERS))
def test_a_whole_file_checks_out(tmp_path: Path, check: Check) -> None:
    assert check_header(WRITERS[check](tmp_path / "f"), check) is None


# Where each format's own header can tell that bytes are missing: a cut short at the end.
CUT_SHORT: list[Check] = ["gguf", "safetensors", "zip", "ggml-whisper", "ctranslate2", "onnx"]


@pytest.mark.parametrize("check", CUT_SHORT)
def test_a_file_cut_short_is_incomplete(tmp_path: Path, check: Check) -> None:
    whole = WRITERS[check](tmp_path / "f")
    size = whole.stat().st_size
    for keep in (size - 1, size // 2, 20):
        if check == "ggml-whisper" and keep >= 48:
            continue  # past its 48-byte header the file states no length: the manifest's size tells
        problem = check_header(cut(whole, keep), check)
        assert problem is not None and problem.incomplete, (check, keep, problem)


@pytest.mark.parametrize("check", list(WRITERS))
def test_other_bytes_are_not_the_format(tmp_path: Path, check: Check) -> None:
    other = tmp_path / "other"
    other.write_bytes(b"\x00\x00\x00\x00{ this is not the file it was" + bytes(200))
    if check == "ctranslate2":
        # Another binary version is not judged (its size and digest are); version 6 is.
        assert check_header(other, check) is None
        return
    problem = check_header(other, check)
    assert problem is not None and not problem.incomplete, (check, problem)


def test_safetensors_data_offsets_bound_the_file(tmp_path: Path) -> None:
    whole = WRITERS["safetensors"](tmp_path / "f")
    problem = check_header(cut(whole, whole.stat().st_size - 2), "safetensors")
    assert problem is not None and problem.incomplete and "declares tensor data up to byte" in problem.message
    header_cut = check_header(cut(whole, 30), "safetensors")
    assert header_cut is not None and "ends inside its safetensors header" in header_cut.message


def test_a_gguf_names_where_its_tensor_data_ends(tmp_path: Path) -> None:
    whole = WRITERS["gguf"](tmp_path / "f")
    size = whole.stat().st_size
    problem = check_header(cut(whole, size - 10), "gguf")
    assert problem is not None and problem.incomplete
    assert problem.message == f"{size - 10} bytes, and its GGUF header lists tensor data up to byte {size}"
    bad = check_header(WRITERS["json"](tmp_path / "g"), "gguf")
    assert bad is not None and not bad.incomplete and bad.message == "not a GGUF file"


def test_json_that_does_not_parse(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["Llama')
    problem = check_header(path, "json")
    assert problem is not None and not problem.incomplete and problem.message.startswith("not valid JSON")
