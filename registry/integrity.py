"""What each stored file of a model promises, by the model's format, and whether its bytes keep it.

A manifest promises, per file, its digest and (for most files) its size: every file of a
multi-file model (``ModelRecord.files``), a LoRA adapter, and a one-file GGUF (the
record's ``size``; a split GGUF records only the parts' total, and a projector no size).
The file's own header promises more, where its format has one:

* ``gguf`` (a GGUF model, its split parts and projector, a LoRA adapter, a diffusion
  checkpoint in GGUF form): the magic, a header that parses, and tensor data that ends
  within the file;
* ``safetensors`` (a Hugging Face or MLX directory's shards, a diffusion checkpoint): the
  header's length fits the file, the header parses, and the tensors' ``data_offsets``
  end within the file;
* ``zip`` (a ``.ckpt`` checkpoint, MLX's ``weights.npz``): the central directory, which a
  zip keeps at its very end, is there;
* ``ggml-whisper`` (a whisper.cpp file): the magic and a whisper model's shape;
* ``ctranslate2`` (faster-whisper's ``model.bin``, binary version 6, what CTranslate2 4
  writes): its variable table, each variable's bytes, and the aliases after them, fit the
  file (another version is checked by size and digest only);
* ``onnx`` (a piper voice): the protobuf's top-level fields end within the file, and one of
  them is the graph;
* ``json`` (the config a format describes itself with: ``config.json``, the shard index,
  a piper voice's ``.onnx.json``): it parses.

Any other file (a tokenizer, a vocabulary) is checked by its size and digest alone.
``expected_files`` is pure (from the manifest alone); ``check_header`` reads headers and
tables only, never the weights. ``blazar doctor`` runs both on every installed model.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec

from .errors import InvalidModelFile
from .formats import INDEX_FILE, parse_safetensors_header
from .formats import NeedMoreData as SafetensorsNeedMore
from .ggml import parse_whisper_header
from .gguf import NeedMoreData as GGUFNeedMore
from .gguf import data_end, parse_header
from .store import ModelRecord

__all__ = ["Check", "ExpectedFile", "HeaderProblem", "check_header", "expected_files"]

Check = Literal["gguf", "safetensors", "zip", "ggml-whisper", "ctranslate2", "onnx", "json"]
"""Which header check a file gets (``check_header``)."""

_JSON_MAX = 64 << 20
"""A JSON file larger than this is not parsed (configs are a few KiB)."""
_GGUF_FIRST_READ = 1 << 20
_CT2_VERSION = 6
_U16, _U32 = struct.Struct("<H"), struct.Struct("<I")
_CONTAINERS: dict[str, Check] = {"gguf": "gguf", "safetensors": "safetensors", "ckpt": "zip"}
_EXTENSIONS: dict[str, Check] = {
    ".gguf": "gguf",
    ".safetensors": "safetensors",
    ".ckpt": "zip",
    ".npz": "zip",
}


class ExpectedFile(msgspec.Struct, frozen=True, kw_only=True):
    """One stored file of a model, as its manifest describes it."""

    digest: str
    """``sha256:<hex>``: the blob ``blobs/sha256-<hex>``."""
    name: str
    """What the file is to the model: its name in the model's folder (``model.bin``,
    ``en_US-joe-medium.onnx.json``), or for a GGUF model ``model file``, ``part 2 of 3``,
    ``projector``, ``LoRA adapter 'NAME'``."""
    size: int | None
    """Bytes, as the manifest records them; None: it records none for this file."""
    check: Check | None
    """The header check its format has; None: size and digest only."""


class HeaderProblem(msgspec.Struct, frozen=True, kw_only=True):
    incomplete: bool
    """True: the file is shorter than its own header says (cut short); False: its header is
    not its format's (replaced or damaged)."""
    message: str


def expected_files(record: ModelRecord) -> list[ExpectedFile]:
    """Every file ``record`` stores (its main file first, its adapters last), with what the
    manifest and the file's format promise about it. Pure."""
    if record.files:
        found = [
            ExpectedFile(digest=f.digest, name=f.name, size=f.size, check=_check_of(record, f.name))
            for f in record.files
        ]
    else:
        projector = None
        if record.projector and Path(record.projector).name.startswith("sha256-"):
            projector = "sha256:" + Path(record.projector).name.removeprefix("sha256-")
        parts = [d for d in record.blobs if d != projector]
        n = len(parts) + 1
        found = [
            ExpectedFile(
                digest=record.digest,
                name="model file" if n == 1 else f"part 1 of {n}",
                size=record.size if n == 1 else None,  # a split model records the parts' total
                check="gguf",
            )
        ]
        found += [
            ExpectedFile(digest=d, name=f"part {i} of {n}", size=None, check="gguf")
            for i, d in enumerate(parts, 2)
        ]
        if projector is not None:
            found.append(ExpectedFile(digest=projector, name="projector", size=None, check="gguf"))
    found += [
        ExpectedFile(digest=a.digest, name=f"LoRA adapter '{a.name}'", size=a.size, check="gguf")
        for a in record.adapters
    ]
    return found


def _check_of(record: ModelRecord, name: str) -> Check | None:
    """The header check of a multi-file model's file ``name``, by the model's format."""
    if name == record.entry and record.format == "diffusion":
        container = record.facts.container if record.facts else None
        if container in _CONTAINERS:
            return _CONTAINERS[container]
    if name == record.entry and record.format == "ggml-whisper":
        return "ggml-whisper"
    if record.format == "ctranslate2" and name == "model.bin":
        return "ctranslate2"
    if record.format == "onnx" and name.endswith(".onnx"):
        return "onnx"
    if name in ("config.json", INDEX_FILE) or (record.format == "onnx" and name.endswith(".onnx.json")):
        return "json"
    return _EXTENSIONS.get(os.path.splitext(name)[1].lower())


def check_header(path: str | os.PathLike[str], check: Check) -> HeaderProblem | None:
    """What is wrong with the file at ``path`` by its own header (``check``); None: nothing
    the header can tell. Reads headers and tables, never the weights; OSError propagates."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        match check:
            case "gguf":
                return _gguf(f, size)
            case "safetensors":
                return _safetensors(f, size)
            case "zip":
                return _zip(f, size)
            case "ggml-whisper":
                return _ggml_whisper(f, size)
            case "ctranslate2":
                return _ctranslate2(f, size)
            case "onnx":
                return _onnx(f, size)
            case "json":
                return _json(f, size)
    return None


def _short(message: str) -> HeaderProblem:
    return HeaderProblem(incomplete=True, message=message)


def _bad(message: str) -> HeaderProblem:
    return HeaderProblem(incomplete=False, message=message)


def _gguf(f: BinaryIO, size: int) -> HeaderProblem | None:
    buf = f.read(_GGUF_FIRST_READ)
    if buf[:4] != b"GGUF":
        return _short(f"{size} bytes: too short for a GGUF file") if size < 4 else _bad("not a GGUF file")
    while True:
        try:
            header = parse_header(buf)
            break
        except GGUFNeedMore as more:
            if more.needed > size:
                return _short(f"the file ends inside its GGUF header ({size} bytes; it needs {more.needed})")
            more_bytes = f.read(min(size, max(more.needed, 2 * len(buf))) - len(buf))
            if not more_bytes:  # shrank while read
                return _short(f"the file ends inside its GGUF header ({len(buf)} bytes read)")
            buf += more_bytes
        except InvalidModelFile as exc:
            return _bad(f"its GGUF header does not parse ({exc.message})")
    end = data_end(header)
    if size < end:
        return _short(f"{size} bytes, and its GGUF header lists tensor data up to byte {end}")
    return None


def _safetensors(f: BinaryIO, size: int) -> HeaderProblem | None:
    buf = f.read(8)
    try:
        try:
            header = parse_safetensors_header(buf)
        except SafetensorsNeedMore as more:
            if more.needed > size:
                return _short(
                    f"the file ends inside its safetensors header ({size} bytes; it needs {more.needed})"
                )
            header = parse_safetensors_header(buf + f.read(more.needed - len(buf)))
    except SafetensorsNeedMore:  # shrank while read
        return _short("the file ends inside its safetensors header")
    except InvalidModelFile as exc:
        return _bad(exc.message)
    if size < header.data_end:
        return _short(
            f"{size} bytes, and its safetensors header declares tensor data up to byte {header.data_end}"
        )
    return None


def _zip(f: BinaryIO, size: int) -> HeaderProblem | None:
    try:
        with zipfile.ZipFile(f) as zf:
            zf.infolist()
    except (zipfile.BadZipFile, ValueError, struct.error):
        f.seek(0)
        if f.read(4) == b"PK\x03\x04":
            return _short(f"{size} bytes, and the zip's central directory, kept at its end, is missing")
        return _bad("not a zip file (a .ckpt checkpoint or .npz is one)")
    return None


def _ggml_whisper(f: BinaryIO, size: int) -> HeaderProblem | None:
    head = f.read(48)
    if len(head) < 48:
        return _short(f"{size} bytes: too short for a whisper.cpp header")
    if parse_whisper_header(head) is None:
        return _bad("not a whisper.cpp ggml file (its magic or its shape is not a whisper model's)")
    return None


class _End(Exception):
    """The file ended where its own table says more follows."""


def _take(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) < n:
        raise _End
    return data


def _ctranslate2(f: BinaryIO, size: int) -> HeaderProblem | None:
    """CTranslate2's ``model.bin``: u32 version, the spec's name and revision, u32 variable
    count, per variable its name, u8 rank, u32 dims, u8 type, u32 byte count and the bytes,
    then u32 alias count and the aliases (name pairs); strings are a u16 length (with the
    NUL) and the bytes."""

    def string() -> None:
        (n,) = _U16.unpack(_take(f, 2))
        _take(f, n)

    try:
        (version,) = _U32.unpack(_take(f, 4))
        if version != _CT2_VERSION:
            return None  # another layout: its size and digest are what is checked
        string()
        _take(f, 4)
        (count,) = _U32.unpack(_take(f, 4))
        for _ in range(count):
            string()
            (rank,) = _take(f, 1)
            _take(f, 4 * rank + 1)
            (n,) = _U32.unpack(_take(f, 4))
            if f.tell() + n > size:
                raise _End
            f.seek(n, os.SEEK_CUR)
        (aliases,) = _U32.unpack(_take(f, 4))
        for _ in range(2 * aliases):
            string()
    except _End:
        return _short(f"{size} bytes, and its CTranslate2 variable table says more follows")
    return None


def _varint(f: BinaryIO) -> int:
    value = shift = 0
    while True:
        (byte,) = _take(f, 1)
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


_ONNX_GRAPH = 7
"""``ModelProto.graph``: every ONNX model has one."""


def _onnx(f: BinaryIO, size: int) -> HeaderProblem | None:
    """An ONNX model is one protobuf message: its top-level fields are walked (the graph,
    nearly all of the file, is skipped by its length), never parsed."""
    fields = set()
    try:
        while f.tell() < size:
            key = _varint(f)
            field, wire = key >> 3, key & 7
            if field == 0:
                return _bad("not an ONNX model (its protobuf has a field numbered 0)")
            if wire == 0:
                _varint(f)
            elif wire in (1, 2, 5):
                n = {1: 8, 5: 4}.get(wire) or _varint(f)
                if f.tell() + n > size:
                    raise _End
                f.seek(n, os.SEEK_CUR)
            else:
                return None  # groups (wire types 3, 4) are not ONNX's: no verdict
            fields.add(field)
    except _End:
        return _short(f"{size} bytes, and its protobuf's last field runs past the end")
    except ValueError:
        return _bad("not an ONNX model (its protobuf does not parse)")
    if _ONNX_GRAPH not in fields:
        return _bad("not an ONNX model (it holds no graph)")
    return None


def _json(f: BinaryIO, size: int) -> HeaderProblem | None:
    if size > _JSON_MAX:
        return None
    try:
        json.loads(f.read())
    except (ValueError, UnicodeDecodeError) as exc:
        return _bad(f"not valid JSON ({exc})")
    return None
