"""Control vectors in the store: checked against the model's width and layers, kept as blobs."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from registry.control import add_vector, find_vector, read_vector, remove_vector
from registry.errors import ControlVectorMismatch, ControlVectorNotFound, InvalidControlVector
from registry.store import Store
from tests.lora_adapter import build_adapter
from tests.support import MODEL, ensure_model
from tests.synthetic_control import build_vector, model_shape


@pytest.fixture(scope="module")
def model_file() -> Path:
    return ensure_model()


@pytest.fixture
def store(tmp_path: Path, model_file: Path) -> Store:
    store = Store(tmp_path / "models")
    store.import_file(model_file, MODEL, source="test")
    return store


def test_a_vector_is_checked_stored_and_removed(store: Store, model_file: Path, tmp_path: Path) -> None:
    width, blocks = model_shape(model_file)
    src = build_vector(model_file, tmp_path / "calm.gguf")
    facts = read_vector(src)
    assert facts.width == width and facts.layers == list(range(1, blocks)) and facts.model_hint == "llama"
    record, vector = add_vector(store, MODEL, src)
    assert vector.name == "calm" and vector.layers == facts.layers and vector.width == width
    assert store.get(MODEL).control_vectors == [vector] == record.control_vectors
    assert vector.digest in store.used_digests()
    assert find_vector(record, "calm") == vector
    _, again = add_vector(store, MODEL, src)  # the same name replaces it
    assert [v.name for v in store.get(MODEL).control_vectors] == [
        "calm"
    ] and again.added_at >= vector.added_at
    record, removed = remove_vector(store, MODEL, "calm")
    assert removed.name == "calm" and record.control_vectors == []
    with pytest.raises(ControlVectorNotFound, match="has no control vector 'calm'"):
        remove_vector(store, MODEL, "calm")


def test_what_does_not_fit_the_model_is_refused(store: Store, model_file: Path, tmp_path: Path) -> None:
    width, blocks = model_shape(model_file)
    narrow = build_vector(model_file, tmp_path / "narrow.gguf", width=width - 1)
    with pytest.raises(ControlVectorMismatch, match=f"has width {width - 1}, and model '{MODEL}' has"):
        add_vector(store, MODEL, narrow)
    deep = build_vector(model_file, tmp_path / "deep.gguf", layers=blocks)
    with pytest.raises(ControlVectorMismatch, match=f"has {blocks} layers .* has {blocks} blocks"):
        add_vector(store, MODEL, deep)
    lora = build_adapter(model_file, tmp_path / "lora.gguf", layers=1)
    with pytest.raises(InvalidControlVector, match=r"general\.architecture = 'llama'"):
        add_vector(store, MODEL, lora)
    with pytest.raises(InvalidControlVector, match="not a GGUF file"):
        read_vector(Path(__file__))
    with pytest.raises(InvalidControlVector, match="give one with --name"):
        add_vector(store, MODEL, build_vector(model_file, tmp_path / "ok.gguf"), name="../x")
    assert store.get(MODEL).control_vectors == []


def test_a_layer_count_the_file_misstates_is_refused(model_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "liar.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_int32("controlvector.layer_count", 5)
    writer.add_tensor("direction.1", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InvalidControlVector, match="layer_count = 5 and holds 1 directions"):
        read_vector(path)
