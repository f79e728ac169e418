"""LoRA adapters in the store: checked against their base from the headers, kept as blobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.adapters import add_adapter, find_adapter, read_adapter, remove_adapter
from registry.errors import AdapterMismatch, AdapterNotFound, InvalidAdapter
from registry.store import Store
from tests.lora_adapter import build_adapter
from tests.support import MODEL, ensure_model


@pytest.fixture(scope="module")
def model_file() -> Path:
    return ensure_model()


@pytest.fixture
def store(tmp_path: Path, model_file: Path) -> Store:
    store = Store(tmp_path / "models")
    store.import_file(model_file, MODEL, source="test")
    return store


def test_an_adapter_is_checked_stored_and_listed(store: Store, model_file: Path, tmp_path: Path) -> None:
    src = build_adapter(model_file, tmp_path / "pirate.gguf", layers=2)
    facts = read_adapter(src)
    assert facts.architecture == "llama" and facts.rank == 8 and facts.alpha == 8.0
    assert set(facts.shapes) == {
        f"blk.{i}.{w}.weight" for i in range(2) for w in ("attn_q", "attn_v", "ffn_up")
    }
    record, adapter = add_adapter(store, MODEL, src, scale=0.5)
    assert adapter.name == "pirate" and adapter.scale == 0.5 and adapter.size == src.stat().st_size
    assert store.has_blob(adapter.digest.removeprefix("sha256:"))
    assert store.get(MODEL).adapters == [adapter] == record.adapters
    assert adapter.digest in store.used_digests()

    second, other = add_adapter(store, MODEL, src, name="second")
    assert [a.name for a in second.adapters] == ["pirate", "second"]
    assert find_adapter(second, 1) == (1, other) and find_adapter(second, "pirate")[0] == 0
    # Same name again: replaced in place, the numbering kept.
    again, _ = add_adapter(store, MODEL, src, name="pirate", scale=2.0)
    assert [(a.name, a.scale) for a in again.adapters] == [("pirate", 2.0), ("second", 1.0)]

    remove_adapter(store, MODEL, "pirate")
    assert store.has_blob(adapter.digest.removeprefix("sha256:"))  # "second" has the same bytes
    remove_adapter(store, MODEL, "second")
    assert store.get(MODEL).adapters == []
    assert not store.has_blob(adapter.digest.removeprefix("sha256:"))  # nothing uses it now
    with pytest.raises(AdapterNotFound, match="blazar lora list"):
        remove_adapter(store, MODEL, "pirate")


def test_removing_the_model_removes_its_adapters_blobs(
    store: Store, model_file: Path, tmp_path: Path
) -> None:
    _, adapter = add_adapter(store, MODEL, build_adapter(model_file, tmp_path / "a.gguf", layers=1))
    store.remove(MODEL)
    assert not store.has_blob(adapter.digest.removeprefix("sha256:"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"architecture": "qwen2"}, "made for a 'qwen2' model, and 'smollm2-135m' is 'llama'"),
        ({"transpose_a": True}, "lora_a must be stored transposed"),
        ({"width": 320}, "maps 320"),
    ],
)
def test_an_adapter_for_another_base_is_refused(
    store: Store, model_file: Path, tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    src = build_adapter(model_file, tmp_path / "x.gguf", layers=1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(AdapterMismatch, match=message) as caught:
        add_adapter(store, MODEL, src)
    assert caught.value.code == "LORA_MISMATCH"
    assert store.get(MODEL).adapters == []


def test_a_file_that_is_no_adapter_is_refused(store: Store, model_file: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidAdapter, match="not a LoRA adapter") as caught:
        add_adapter(store, MODEL, model_file)  # a whole model
    assert caught.value.code == "LORA_INVALID"
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(InvalidAdapter, match="not a GGUF file"):
        add_adapter(store, MODEL, text)
    src = build_adapter(model_file, tmp_path / "ok.gguf", layers=1)
    with pytest.raises(InvalidAdapter, match="not a usable adapter name"):
        add_adapter(store, MODEL, src, name="../x")
    with pytest.raises(InvalidAdapter, match="out of range"):
        add_adapter(store, MODEL, src, scale=50.0)
