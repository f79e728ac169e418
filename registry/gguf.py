"""Sans-io GGUF header reader.

Reads the key/value header and the tensor table from a prefix of a GGUF file and
stops where the tensor data begins. The `gguf` package supplies the key names
and quant block sizes; its GGUFReader is not used because it decodes every
vocabulary string eagerly, which costs seconds per file in a listing.

`parse_header` keeps every scalar and every short numeric array (per-layer
settings such as head counts or sliding-window flags) for callers that need
more than `ModelInfo` holds, such as the memory fit in `registry.fit`.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Any

import msgspec

from ._gguf_constants import constants as _gg
from .errors import InvalidModelFile, ModelFileIncomplete

__all__ = [
    "GGUFHeader",
    "ModelInfo",
    "NeedMoreData",
    "TensorInfo",
    "check_complete",
    "data_end",
    "looks_like_gguf",
    "model_info",
    "parse",
    "parse_header",
    "read_header",
    "read_model_info",
]

_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_MAX_DIMS = 8
# A small model's header (vocabulary and merges included) is 1-3 MiB: one read
# of this size is parsed once, where a shorter one is parsed again after growing.
_FIRST_READ_BYTES = 4 << 20
# Numeric arrays up to this length are decoded (per-layer settings); longer ones
# (token types, scores) are only measured, which keeps a listing fast.
_SMALL_ARRAY = 4096

_VT = _gg.GGUFValueType
# Fixed-size scalar value types: struct format (little-endian).
_SCALAR_FORMATS: dict[int, str] = {
    _VT.UINT8: "<B",
    _VT.INT8: "<b",
    _VT.UINT16: "<H",
    _VT.INT16: "<h",
    _VT.UINT32: "<I",
    _VT.INT32: "<i",
    _VT.FLOAT32: "<f",
    _VT.BOOL: "<?",
    _VT.UINT64: "<Q",
    _VT.INT64: "<q",
    _VT.FLOAT64: "<d",
}
_SCALAR_SIZES = {t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()}
_U64 = struct.Struct("<Q")


class NeedMoreData(Exception):
    """The buffer is a prefix too short to hold the header; `needed` is the total size wanted."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"GGUF header needs at least {needed} bytes")
        self.needed = needed


class TensorInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    shape: list[int]
    type: str
    offset: int
    n_bytes: int | None = None


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    architecture: str
    name: str | None = None
    size_label: str | None = None
    file_type: str | None = None
    parameter_count: int
    context_length: int | None = None
    block_count: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    embedding_length: int | None = None
    feed_forward_length: int | None = None
    vocab_size: int | None = None
    rope_freq_base: float | None = None
    key_length: int | None = None
    value_length: int | None = None
    chat_template: str | None = None
    pooling_type: int | None = None
    """llama.cpp's pooling type from the header (``{arch}.pooling_type``): 1 mean, 2 CLS,
    3 last, 4 rank (a reranker's classification head); None when the file does not say."""
    token_bytes_max: int | None = None
    """The most bytes of text one vocabulary token stands for: a prompt of N bytes
    is at least N / this many tokens."""
    tensor_count: int
    tensors: list[TensorInfo] = msgspec.field(default_factory=list)
    data_offset: int

    @property
    def reranker(self) -> bool:
        """A cross-encoder that scores (query, document) pairs: llama.cpp serves it with ``--reranking``."""
        return self.pooling_type == int(_gg.PoolingType.RANK)


class GGUFHeader(msgspec.Struct, frozen=True, kw_only=True):
    """Everything before the tensor data: metadata values and the tensor table."""

    version: int
    values: dict[str, Any]
    """Scalars, strings and numeric arrays of at most 4096 entries (as lists), by key."""
    array_lengths: dict[str, int]
    """The length of every array in the header, decoded or not."""
    token_bytes: int | None = None
    """The longest vocabulary string, in bytes as stored."""
    token_chars: int | None = None
    """The longest vocabulary string, in characters."""
    tensor_count: int
    tensors: list[TensorInfo]
    data_offset: int
    table_start: int = 0
    """Where the tensor table begins (the metadata ends): a writer that adds tensors copies
    the bytes before it and the table as they are."""
    table_end: int = 0
    """Where the tensor table ends, before the padding up to ``data_offset``."""


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise NeedMoreData(self.pos + n)

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALAR_FORMATS[vtype]
        size = _SCALAR_SIZES[vtype]
        self._need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self) -> int:
        return int(self.scalar(_VT.UINT32))

    def u64(self) -> int:
        return int(self.scalar(_VT.UINT64))

    def string(self) -> str:
        n = self.u64()
        self._need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` strings (a merges table holds tens of thousands: one tight loop)."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        read_length = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise NeedMoreData(pos + 8)
            (n,) = read_length(buf, pos)
            pos += 8 + n
            if pos > end:
                raise NeedMoreData(pos)
        self.pos = pos

    def skip(self, n: int) -> None:
        self._need(n)
        self.pos += n


def _value_type(raw: int) -> int:
    try:
        return _VT(raw)
    except ValueError:
        raise InvalidModelFile(f"GGUF header holds an unknown value type {raw}") from None


def _read_value(cur: _Cursor) -> tuple[Any, int | None]:
    """Return (scalar value, None) or (array or None, array length).

    Short numeric arrays come back as lists; long ones and string arrays are skipped.
    """
    vtype = _value_type(cur.u32())
    if vtype == _VT.STRING:
        return cur.string(), None
    if vtype != _VT.ARRAY:
        return cur.scalar(vtype), None
    etype = _value_type(cur.u32())
    count = cur.u64()
    if etype in _SCALAR_SIZES:
        size = count * _SCALAR_SIZES[etype]
        if count <= _SMALL_ARRAY:
            cur._need(size)
            fmt = f"<{count}{_SCALAR_FORMATS[etype][1:]}"
            items = list(struct.unpack_from(fmt, cur.buf, cur.pos))
            cur.pos += size
            return items, count
        cur.skip(size)
    elif etype == _VT.STRING:
        cur.skip_strings(count)
    else:
        # Nested arrays occur in no known model; refuse rather than guess their layout.
        raise InvalidModelFile("GGUF header holds a nested array, which is not supported")
    return None, count


def _quant_name(file_type: Any) -> str | None:
    if not isinstance(file_type, int):
        return None
    try:
        name = _gg.LlamaFileType(file_type).name
    except ValueError:
        return None
    for prefix in ("MOSTLY_", "ALL_"):
        name = name.removeprefix(prefix)
    return name


def _tensor_type(raw: int) -> tuple[str, int | None, int | None]:
    """Return the type's name and its (block size, bytes per block) when known."""
    try:
        qtype = _gg.GGMLQuantizationType(raw)
    except ValueError:
        return f"type{raw}", None, None
    block, type_size = _gg.GGML_QUANT_SIZES.get(qtype, (None, None))
    return qtype.name, block, type_size


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_header(buf: bytes | memoryview) -> GGUFHeader:
    """Parse the metadata and tensor table held in `buf` (a prefix of the file is enough).

    Raises NeedMoreData when `buf` ends before the tensor table does, and
    InvalidModelFile when the bytes are not a GGUF file this reader understands.
    """
    cur = _Cursor(buf)
    cur._need(4)
    if bytes(buf[:4]) != _MAGIC:
        raise InvalidModelFile("not a GGUF file (bad magic bytes)")
    cur.pos = 4
    version = cur.u32()
    if version not in _SUPPORTED_VERSIONS:
        raise InvalidModelFile(
            f"unsupported GGUF version {version} (this reader handles little-endian v2 and v3)"
        )
    tensor_count = cur.u64()
    kv_count = cur.u64()

    values: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    longest: tuple[int, int] | None = None
    for _ in range(kv_count):
        key = cur.string()
        if key == _gg.Keys.Tokenizer.LIST:
            longest, count = _scan_vocabulary(cur)
            array_lengths[key] = count
            continue
        value, length = _read_value(cur)
        if length is not None:
            array_lengths[key] = length
        if value is not None:
            values[key] = value

    table_start = cur.pos
    tensors: list[TensorInfo] = []
    for _ in range(tensor_count):
        tname = cur.string()
        n_dims = cur.u32()
        if n_dims > _MAX_DIMS:
            raise InvalidModelFile(f"tensor '{tname}' claims {n_dims} dimensions")
        shape = [cur.u64() for _ in range(n_dims)]
        type_name, block, type_size = _tensor_type(cur.u32())
        offset = cur.u64()
        n_elements = math.prod(shape)
        n_bytes = None
        if block and type_size is not None:
            n_bytes = n_elements // block * type_size
        tensors.append(TensorInfo(name=tname, shape=shape, type=type_name, offset=offset, n_bytes=n_bytes))

    alignment = _opt_int(values.get(_gg.Keys.General.ALIGNMENT)) or _gg.GGUF_DEFAULT_ALIGNMENT
    data_offset = -(-cur.pos // alignment) * alignment
    return GGUFHeader(
        version=version,
        values=values,
        array_lengths=array_lengths,
        token_bytes=longest[0] if longest else None,
        token_chars=longest[1] if longest else None,
        tensor_count=tensor_count,
        tensors=tensors,
        data_offset=data_offset,
        table_start=table_start,
        table_end=cur.pos,
    )


def _scan_vocabulary(cur: _Cursor) -> tuple[tuple[int, int] | None, int]:
    """Skip the token strings, measuring the longest in bytes and in characters; returns
    those two (None for an array that is not of strings) and the array's length."""
    start = cur.pos
    vtype = _value_type(cur.u32())
    if vtype != _VT.ARRAY or _value_type(cur.u32()) != _VT.STRING:
        cur.pos = start
        _, length = _read_value(cur)
        return None, length or 0
    count = cur.u64()
    most_bytes = most_chars = 0
    buf, pos, end = cur.buf, cur.pos, len(cur.buf)
    read_length = _U64.unpack_from
    for _ in range(count):
        if pos + 8 > end:
            raise NeedMoreData(pos + 8)
        (n,) = read_length(buf, pos)
        pos += 8
        if pos + n > end:
            raise NeedMoreData(pos + n)
        # Characters never outnumber bytes: only a longer string can hold more of them.
        if n > most_chars:
            chars = len(bytes(buf[pos : pos + n]).decode("utf-8", "replace"))
            most_chars = chars if chars > most_chars else most_chars
            most_bytes = n if n > most_bytes else most_bytes
        pos += n
    cur.pos = pos
    return (most_bytes, most_chars), count


def _token_bytes_max(header: GGUFHeader) -> int | None:
    """The most bytes of text one token decodes to. Byte-level BPE vocabularies (``gpt2``)
    spell every byte as one character; the others (SentencePiece's ``▁`` for a space,
    ``<0x0A>`` for a byte) never decode to more bytes than they are stored in."""
    if header.token_bytes is None:
        return None
    if header.values.get(_gg.Keys.Tokenizer.MODEL) == "gpt2" and header.token_chars is not None:
        return max(1, header.token_chars)
    return max(1, header.token_bytes)


def model_info(header: GGUFHeader) -> ModelInfo:
    """The facts `blazar show` and the store cache keep, taken from a parsed header."""
    values = header.values
    arch = values.get(_gg.Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        raise InvalidModelFile("GGUF header has no general.architecture")

    def arch_int(template: str) -> int | None:
        # Per-layer arrays are not single facts; ModelInfo leaves them out.
        return _opt_int(values.get(template.format(arch=arch)))

    def text(key: str) -> str | None:
        value = values.get(key)
        return value if isinstance(value, str) else None

    vocab_size = arch_int(_gg.Keys.LLM.VOCAB_SIZE)
    if vocab_size is None:
        vocab_size = header.array_lengths.get(_gg.Keys.Tokenizer.LIST)
    rope_base = values.get(_gg.Keys.Rope.FREQ_BASE.format(arch=arch))

    return ModelInfo(
        architecture=arch,
        name=text(_gg.Keys.General.NAME),
        size_label=text(_gg.Keys.General.SIZE_LABEL),
        file_type=_quant_name(values.get(_gg.Keys.General.FILE_TYPE)),
        parameter_count=sum(math.prod(t.shape) for t in header.tensors),
        context_length=arch_int(_gg.Keys.LLM.CONTEXT_LENGTH),
        block_count=arch_int(_gg.Keys.LLM.BLOCK_COUNT),
        head_count=arch_int(_gg.Keys.Attention.HEAD_COUNT),
        head_count_kv=arch_int(_gg.Keys.Attention.HEAD_COUNT_KV),
        embedding_length=arch_int(_gg.Keys.LLM.EMBEDDING_LENGTH),
        feed_forward_length=arch_int(_gg.Keys.LLM.FEED_FORWARD_LENGTH),
        vocab_size=vocab_size,
        rope_freq_base=float(rope_base) if isinstance(rope_base, int | float) else None,
        key_length=arch_int(_gg.Keys.Attention.KEY_LENGTH),
        value_length=arch_int(_gg.Keys.Attention.VALUE_LENGTH),
        chat_template=text(_gg.Keys.Tokenizer.CHAT_TEMPLATE),
        pooling_type=arch_int(_gg.Keys.LLM.POOLING_TYPE),
        token_bytes_max=_token_bytes_max(header),
        tensor_count=header.tensor_count,
        tensors=header.tensors,
        data_offset=header.data_offset,
    )


def parse(buf: bytes | memoryview) -> ModelInfo:
    """Parse the GGUF header and tensor table held in `buf` (a prefix of the file is enough).

    Raises NeedMoreData when `buf` ends before the tensor table does, and
    InvalidModelFile when the bytes are not a GGUF file this reader understands.
    """
    return model_info(parse_header(buf))


def data_end(header: GGUFHeader | ModelInfo) -> int:
    """The least size of a file holding this header: where the tensor data that ends last ends.

    Tensor offsets count from the aligned start of the data section (`data_offset`); the
    padding after the last tensor is not required, as llama.cpp does not require it. A
    tensor of a type whose size the `gguf` package does not know is left out, which keeps
    the result a lower bound.
    """
    ends = (header.data_offset + t.offset + t.n_bytes for t in header.tensors if t.n_bytes is not None)
    return max(ends, default=0)


def check_complete(
    header: GGUFHeader | ModelInfo, size: int, what: str, advice: str = "re-download it"
) -> None:
    """Raise ModelFileIncomplete when a file of `size` bytes cannot hold the tensors its header
    lists, which is what a download or copy that stopped early looks like. Reads nothing."""
    expected = data_end(header)
    if size < expected:
        raise ModelFileIncomplete(what, expected=expected, found=size, advice=advice)


def looks_like_gguf(path: str | os.PathLike[str]) -> bool:
    """True when the file starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


def read_model_info(path: str | os.PathLike[str]) -> ModelInfo:
    """Read just enough of a GGUF file to parse its header; never reads the tensor data."""
    header = read_header(path)
    try:
        return model_info(header)
    except InvalidModelFile as exc:
        raise InvalidModelFile(f"{os.fspath(path)}: {exc.message}") from None


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read just enough of a GGUF file to parse its metadata and tensor table."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = f.read(_FIRST_READ_BYTES)
            while True:
                try:
                    return parse_header(buf)
                except NeedMoreData as more:
                    if more.needed > size or len(buf) >= size:
                        raise InvalidModelFile(
                            f"{os.fspath(path)}: GGUF header is truncated or corrupt "
                            f"(needs {more.needed} bytes, file has {size})"
                        ) from None
                    # Grow geometrically so a large vocabulary costs a few reads, not many.
                    target = min(size, max(more.needed, 2 * len(buf)))
                    buf += f.read(target - len(buf))
    except InvalidModelFile as exc:
        if not exc.message.startswith(os.fspath(path)):
            raise InvalidModelFile(f"{os.fspath(path)}: {exc.message}") from None
        raise
    except OSError as exc:
        raise InvalidModelFile(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from exc
