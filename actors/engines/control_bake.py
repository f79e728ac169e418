"""Control vectors for an engine that cannot load them: baked into a copy of the model.

llama.cpp applies a control vector by adding ``strength x direction.N`` to the hidden state
after block ``N`` (``--control-vector-scaled FILE STRENGTH``, within
``--control-vector-layer-range START END``). The ``xllamacpp`` wheel's parameters expose
the layer range but not the list of vectors, so the bundled host cannot pass them on. For a
``llama``-architecture model the same sum can be had from the weights: block ``N`` ends
with ``ffn_inp + ffn_down(…) [+ ffn_down.bias]`` and then the control vector, so a bias of
the summed directions on ``blk.N.ffn_down`` gives exactly the vector's result. llama.cpp
loads that bias when a ``llama`` model has it (an optional tensor).

``bake`` writes that copy: the header, metadata and tensor table as they are, the new bias
tensors appended to the table, then the tensor data unchanged and the biases after it (a
tensor's offset counts from the start of the data, so the old ones stay valid). The copy
costs the model's size on disk and in memory (the plain engine's pages are not shared).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from registry.gguf import GGUFHeader, read_header

__all__ = ["STEERABLE", "BakeError", "bake", "summed"]

STEERABLE = frozenset({"llama"})
"""Architectures whose blocks end in an ``ffn_down`` that llama.cpp gives an optional bias."""

_F32 = 0
"""GGML's type number for 32-bit floats."""
_COPY_BYTES = 8 << 20


class BakeError(Exception):
    """The vectors cannot be baked into this model (the message says why)."""


def _directions(path: str) -> tuple[int, dict[int, np.ndarray]]:
    header = read_header(path)
    if header.values.get("general.architecture") != "controlvector":
        raise BakeError(f"{path} is not a control vector")
    found: dict[int, np.ndarray] = {}
    width = 0
    for t in header.tensors:
        name, _, layer = t.name.partition(".")
        if name != "direction" or not layer.isdigit() or int(layer) == 0 or t.type != "F32":
            raise BakeError(f"{path}: tensor '{t.name}' is not a direction.N of F32")
        width = width or t.shape[0]
        if t.shape != [width]:
            raise BakeError(f"{path}: the directions have different widths")
        data = np.fromfile(path, dtype="<f4", count=width, offset=header.data_offset + t.offset)
        found[int(layer)] = found.get(int(layer), np.zeros(width, np.float32)) + data
    return width, found


def summed(
    vectors: Sequence[tuple[str, float]], *, blocks: int, width: int, layers: tuple[int, int] | None
) -> dict[int, np.ndarray]:
    """Block → the sum of ``strength x direction`` over ``vectors``, as llama.cpp adds them:
    only blocks 1 to ``blocks - 1`` within ``layers`` (default: all of them)."""
    start, end = layers or (1, blocks)
    start, end = max(start, 1), min(end, blocks - 1)
    out: dict[int, np.ndarray] = {}
    for path, strength in vectors:
        got, directions = _directions(path)
        if got != width:
            raise BakeError(f"{path} has width {got} and the model {width}")
        for layer, direction in directions.items():
            if start <= layer <= end:
                out[layer] = out.get(layer, np.zeros(width, np.float32)) + np.float32(strength) * direction
    return out


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def bake(
    model: str, vectors: Sequence[tuple[str, float]], layers: tuple[int, int] | None, folder: Path
) -> Path:
    """A copy of ``model`` under ``folder`` that runs as if started with ``vectors`` (path,
    strength) over ``layers``; ``BakeError`` when its architecture cannot be steered so."""
    header = read_header(model)
    arch = header.values.get("general.architecture")
    if arch not in STEERABLE:
        raise BakeError(
            f"the bundled engine steers {', '.join(sorted(STEERABLE))} models, and this one is {arch!r}"
        )
    width, blocks = header.values.get(f"{arch}.embedding_length"), header.values.get(f"{arch}.block_count")
    assert isinstance(width, int) and isinstance(blocks, int)
    biases = summed(vectors, blocks=blocks, width=width, layers=layers)
    names = {t.name for t in header.tensors}
    taken = [f"blk.{n}.ffn_down.bias" for n in biases if f"blk.{n}.ffn_down.bias" in names]
    if taken:
        raise BakeError(f"the model already has {taken[0]}")
    out = folder / f"{Path(model).name}.steered.gguf"
    _write(Path(model), header, biases, out)
    return out


def _write(model: Path, header: GGUFHeader, biases: dict[int, np.ndarray], out: Path) -> None:
    alignment = int(header.values.get("general.alignment") or 32)
    if any(t.n_bytes is None for t in header.tensors):
        raise BakeError("the model has a tensor type this reader cannot size")
    data_end = max((t.offset + (t.n_bytes or 0) for t in header.tensors), default=0)
    table = bytearray()
    blobs: list[bytes] = []
    at = data_end + _pad(data_end, alignment)
    for layer, bias in sorted(biases.items()):
        raw = bias.astype("<f4").tobytes()
        table += _string(f"blk.{layer}.ffn_down.bias") + struct.pack("<IQIQ", 1, bias.size, _F32, at)
        blobs.append(raw + bytes(_pad(len(raw), alignment)))
        at += len(blobs[-1])
    with open(model, "rb") as src, open(out, "wb") as dst:
        head = src.read(header.table_end)
        dst.write(head[:8] + struct.pack("<Q", header.tensor_count + len(biases)) + head[16:])
        dst.write(table)
        dst.write(bytes(_pad(header.table_end + len(table), alignment)))
        src.seek(header.data_offset)
        left = data_end
        while left > 0:
            chunk = src.read(min(left, _COPY_BYTES))
            if not chunk:
                raise BakeError("the model file ends before its tensor data does")
            dst.write(chunk)
            left -= len(chunk)
        dst.write(bytes(_pad(data_end, alignment)))
        for blob in blobs:
            dst.write(blob)
        dst.flush()
        os.fsync(dst.fileno())


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
