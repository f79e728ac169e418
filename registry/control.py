"""Control (steering) vectors of installed models: checked against the model, kept as blobs.

A control vector is a GGUF file as llama.cpp's ``llama-cvector-generator`` writes it:
``general.architecture = controlvector``, ``controlvector.model_hint`` (the architecture
it was made from), ``controlvector.layer_count``, and one tensor ``direction.N`` per layer
``N`` (1 and up), a flat array of the model's embedding width in 32-bit floats. llama.cpp
adds ``strength x direction.N`` to the hidden state after block ``N``; it refuses a vector
of another width only when the engine starts, so we check it here from the headers alone:

- every ``direction.N`` is F32, flat, of one width, and that width is the model's
  ``embedding_length``;
- every ``N`` is a layer the model has after its first (1 ≤ N < ``block_count``);
- ``controlvector.layer_count``, when given, is the number of directions.

Vectors live in the model's manifest (``ModelRecord.control_vectors``), their bytes in the
blob store. Blocking: async callers run these in a thread.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec

from .adapters import attachment_name, gguf_model
from .errors import ControlVectorMismatch, ControlVectorNotFound, InvalidControlVector, InvalidModelFile
from .gguf import GGUFHeader, looks_like_gguf, read_header
from .store import ControlVector, ModelRecord, Store

__all__ = [
    "ControlFacts",
    "add_vector",
    "check_vector",
    "find_vector",
    "model_layers",
    "read_vector",
    "remove_vector",
]

_DIRECTION = re.compile(r"^direction\.(\d+)$")


class ControlFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a control vector's GGUF header says."""

    width: int
    layers: list[int]
    """The layers it has a direction for, ascending."""
    model_hint: str | None


def read_vector(path: Path, *, shown: str | None = None) -> ControlFacts:
    """The facts of a control vector file; ``InvalidControlVector`` when it is not one.
    ``shown`` names the file in messages instead of its path (a request's field: a client
    is never told the daemon's paths)."""
    said = shown or str(path)
    if not path.is_file():
        raise InvalidControlVector(f"no such file: {said}")
    if not looks_like_gguf(path):
        raise InvalidControlVector(
            f"{said} is not a GGUF file — make the vector with llama.cpp's llama-cvector-generator"
        )
    try:
        header = read_header(path)
    except InvalidModelFile:
        raise InvalidControlVector(f"{said} is not a readable GGUF file (its header is cut short)") from None
    return _facts(said, header)


def _facts(said: str, header: GGUFHeader) -> ControlFacts:
    values = header.values
    arch = values.get("general.architecture")
    if arch != "controlvector":
        raise InvalidControlVector(
            f"{said} is not a control vector (general.architecture = {arch!r}, a control vector has "
            "'controlvector') — a LoRA adapter is added with `blazar lora add`"
        )
    widths: set[int] = set()
    layers: list[int] = []
    for t in header.tensors:
        m = _DIRECTION.match(t.name)
        if m is None or int(m.group(1)) == 0:
            raise InvalidControlVector(
                f"{said} has a tensor '{t.name}': a control vector holds only direction.N, N from 1"
            )
        if t.type != "F32" or len(t.shape) != 1:
            raise InvalidControlVector(
                f"{said}: '{t.name}' must be a flat array of F32 (it is {t.type} {t.shape})"
            )
        widths.add(t.shape[0])
        layers.append(int(m.group(1)))
    if not layers:
        raise InvalidControlVector(f"{said} has no direction.N tensors")
    if len(widths) != 1:
        raise InvalidControlVector(f"{said}: its directions have different widths {sorted(widths)}")
    count = values.get("controlvector.layer_count")
    if isinstance(count, int) and count != len(layers):
        raise InvalidControlVector(
            f"{said} says controlvector.layer_count = {count} and holds {len(layers)} directions"
        )
    hint = values.get("controlvector.model_hint")
    return ControlFacts(
        width=widths.pop(), layers=sorted(layers), model_hint=hint if isinstance(hint, str) else None
    )


def model_layers(header: GGUFHeader) -> tuple[int, int]:
    """A model's (embedding width, block count), from its header."""
    arch = header.values.get("general.architecture")
    width = header.values.get(f"{arch}.embedding_length")
    blocks = header.values.get(f"{arch}.block_count")
    if not isinstance(width, int) or not isinstance(blocks, int):
        raise ControlVectorMismatch(
            f"the model's header gives no embedding width or block count ({arch}): it cannot be steered"
        )
    return width, blocks


def check_vector(
    facts: ControlFacts, model: str, model_header: GGUFHeader, *, what: str = "the vector"
) -> None:
    """Refuse (``ControlVectorMismatch``) a vector that does not fit ``model``: another width,
    or a direction for a layer the model lacks."""
    width, blocks = model_layers(model_header)
    if facts.width != width:
        raise ControlVectorMismatch(
            f"{what} has width {facts.width}, and model '{model}' has embedding width {width} — "
            "it was made for another model"
        )
    if facts.layers[-1] >= blocks:
        raise ControlVectorMismatch(
            f"{what} has {len(facts.layers)} layers (up to direction.{facts.layers[-1]}), and model "
            f"'{model}' has {blocks} blocks (directions 1 to {blocks - 1}) — it was made for a deeper model"
        )


def find_vector(record: ModelRecord, name: str) -> ControlVector:
    for vector in record.control_vectors:
        if vector.name == name:
            return vector
    have = ", ".join(v.name for v in record.control_vectors) or "none"
    raise ControlVectorNotFound(
        f"model '{record.name}' has no control vector {name!r} (it has {have}) — see "
        f"`blazar control list {record.name}`, or add one with `blazar control add {record.name} FILE.gguf`"
    )


def add_vector(
    store: Store, model: str, src: Path, *, name: str | None = None, link: bool = False
) -> tuple[ModelRecord, ControlVector]:
    """Check ``src`` against ``model``, store its bytes as a blob and record it in the model's
    manifest (replacing a vector of the same name). Returns the new record and vector."""
    record = gguf_model(store, model, ControlVectorMismatch, "control vectors")
    src = Path(src).absolute()
    facts = read_vector(src)
    name = attachment_name(name, src, InvalidControlVector, "vector")
    check_vector(facts, record.name, read_header(record.path))
    sha = store.add_file(src, link=link)
    vector = ControlVector(
        name=name,
        digest=f"sha256:{sha}",
        size=src.stat().st_size,
        layers=facts.layers,
        width=facts.width,
        model_hint=facts.model_hint,
        added_at=time.time(),
    )
    vectors = [v for v in record.control_vectors if v.name != name]
    updated = msgspec.structs.replace(record, control_vectors=[*vectors, vector], modified_at=time.time())
    store.write_manifest(updated)
    return updated, vector


def remove_vector(store: Store, model: str, name: str) -> tuple[ModelRecord, ControlVector]:
    """Drop vector ``name`` from ``model`` (its blob goes once nothing else uses it)."""
    record = store.get(model)
    vector = find_vector(record, name)
    vectors = [v for v in record.control_vectors if v.name != vector.name]
    updated = msgspec.structs.replace(record, control_vectors=vectors, modified_at=time.time())
    store.write_manifest(updated)
    return updated, vector
