"""``blazar quantize MODEL TYPE``: a smaller copy of a GGUF model already in the store.

Two ways to write it. llama.cpp's own quantizer (``llama-quantize`` on ``PATH``, or the
program ``BLAZAR_LLAMA_QUANTIZE`` names) writes every type llama.cpp knows and takes an
importance matrix. Where it is not installed, the types the ``gguf`` package can write
(``BUILT_IN``) are written here: the metadata is copied as it is, but for
``general.file_type`` (set to the new type), each weight matrix is quantized row block by row
block with the ``gguf`` package's code, and what must stay as it is is left alone (norms and
other 1-D tensors, a few small tensors llama.cpp also keeps, and any tensor whose rows are not a
whole number of the type's blocks). Any other type without the tool is refused with
``QUANTIZE_TOOL_MISSING``, naming where to get it.

The result goes into the store as an import does (``Store.import_file``), under a new name,
with the source's settings (system prompt, template, parameters) and vision projector.

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._names import canonical_name
from .errors import (
    AlreadyQuantized,
    InsufficientStorage,
    InvalidModelFile,
    ModelExists,
    QuantizeFailed,
    QuantizeToolMissing,
    disk_full_as,
)
from .files import shown_folder
from .gguf import GGUFHeader, TensorInfo, read_header

if TYPE_CHECKING:
    from .store import ModelRecord, Store

__all__ = [
    "BUILT_IN",
    "TOOL_ENV",
    "TOOL_TYPES",
    "default_name",
    "find_tool",
    "quantize_file",
    "quantize_model",
    "weight_types",
]

TOOL_ENV = "BLAZAR_LLAMA_QUANTIZE"
"""The environment variable naming llama.cpp's quantizer, where it is not ``llama-quantize``
on ``PATH``."""

BUILT_IN = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "BF16", "F16", "F32")
"""The types written without llama.cpp's quantizer, by the ``gguf`` package's own code."""

TOOL_TYPES = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q2_K_S", "Q3_K", "Q3_K_S", "Q3_K_M",
    "Q3_K_L", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ1_S", "IQ1_M",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_NL",
    "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE", "F16", "BF16", "F32",
)  # fmt: skip
"""The types ``llama-quantize`` takes by name."""

_FLOATS = frozenset({"F32", "F16", "BF16", "F64"})
"""Tensor types a model whose weights are all of them is not quantized yet."""
_INTEGERS = frozenset({"I8", "I16", "I32", "I64"})
_KEEP = ("norm", "ffn_gate_inp", "pos_embd", "token_types", "ssm_conv1d", "ssm_a", "ssm_d", "rel_b")
"""Parts of tensor names that stay as they are in every type (llama.cpp keeps them too)."""
_GGUF_UINT32 = 4
"""GGUF's value type number of a 32-bit unsigned integer."""
_TOOL_ADVICE = (
    "install llama.cpp's quantizer (`llama-quantize`, in llama.cpp's release archives at "
    "https://github.com/ggml-org/llama.cpp/releases, or `brew install llama.cpp`) and put it on "
    f"PATH or name it in {TOOL_ENV}"
)


def find_tool() -> str | None:
    """The path of llama.cpp's quantizer: ``BLAZAR_LLAMA_QUANTIZE`` when set (refused when it
    names nothing runnable), else ``llama-quantize`` on ``PATH``; None when neither."""
    named = os.environ.get(TOOL_ENV, "").strip()
    if named:
        found = shutil.which(named)
        if found is None:
            raise QuantizeToolMissing(f"{TOOL_ENV}={named} is not a program that can be run — {_TOOL_ADVICE}")
        return found
    return shutil.which("llama-quantize")


def _type_name(qtype: str) -> str:
    name = qtype.strip().upper()
    if name not in TOOL_TYPES:
        raise InvalidModelFile(f"'{qtype}' is not a quantization type — use one of {', '.join(TOOL_TYPES)}")
    return name


def weight_types(path: Path) -> dict[str, int]:
    """How many weight tensors (two or more dimensions, not kept as they are) of each type
    the GGUF file at ``path`` holds."""
    return _weight_types(read_header(path))


def _weight_types(header: GGUFHeader) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in header.tensors:
        if len(t.shape) >= 2 and not any(part in t.name for part in _KEEP):
            counts[t.type] = counts.get(t.type, 0) + 1
    return counts


def default_name(model: str, qtype: str) -> str:
    """``smollm2-135m-f16`` to ``smollm2-135m-q8_0``: the source's name with its precision (a
    trailing ``-f16``, ``-bf16``, ``-f32`` in its name or tag) replaced by the new type."""
    base, _, tag = canonical_name(model).partition(":")
    suffix = qtype.lower()
    if tag:
        return f"{base}:{_swap_precision(tag, suffix, sep='-')}"
    return _swap_precision(base, suffix, sep="-")


def _swap_precision(text: str, suffix: str, *, sep: str) -> str:
    for old in ("f16", "bf16", "f32", "fp16", "fp32"):
        for mark in ("-", "_", "."):
            if text.endswith(mark + old):
                return text[: -len(old)] + suffix
        if text == old:
            return suffix
    return f"{text}{sep}{suffix}"


def quantize_model(
    store: Store,
    model: str,
    qtype: str,
    *,
    name: str | None = None,
    imatrix: Path | None = None,
    allow_requantize: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> ModelRecord:
    """``model`` (a GGUF model of the store) quantized to ``qtype``, stored under ``name``
    (``default_name`` when None) as a new model; returns its record.

    Refused: a name already installed (``MODEL_EXISTS``), a source whose weights are already
    quantized unless ``allow_requantize`` (``ALREADY_QUANTIZED``), a type or an ``imatrix``
    that needs llama.cpp's quantizer where it is not installed (``QUANTIZE_TOOL_MISSING``),
    less free disk than the result needs. ``on_progress(done, total)`` counts tensors (the
    built-in writer) as they are written."""
    kind = _type_name(qtype)
    record = store.get(model)
    if record.format != "gguf" or record.files:
        raise InvalidModelFile(
            f"model '{record.name}' is a {record.format} model: `blazar quantize` takes a GGUF model"
        )
    target = canonical_name(name or default_name(record.name, kind))
    src = Path(record.path)
    header = read_header(src)
    if int(header.values.get("split.count") or 1) > 1:
        raise InvalidModelFile(
            f"model '{record.name}' is split in parts: merge them first (`llama-gguf-split --merge`), "
            "import the merged file, and quantize that"
        )
    types = _weight_types(header)
    quantized = sorted(t for t in types if t not in _FLOATS)
    if quantized and not allow_requantize:
        raise AlreadyQuantized(
            f"model '{record.name}' is already quantized ({', '.join(quantized)}): quantizing it "
            "again adds a second rounding to the first, worse than quantizing its f16/bf16/f32 "
            "original — import that original (`blazar import FILE --name NAME`), or pass "
            "--allow-requantize to go on anyway"
        )
    tool = find_tool()
    if tool is None and imatrix is not None:
        raise QuantizeToolMissing(f"--imatrix is read by llama.cpp's quantizer alone — {_TOOL_ADVICE}")
    if tool is None and kind not in BUILT_IN:
        raise QuantizeToolMissing(
            f"{kind} is written by llama.cpp's quantizer, which is not installed; without it "
            f"Blazar writes {', '.join(BUILT_IN)} — {_TOOL_ADVICE}"
        )
    if imatrix is not None and not Path(imatrix).is_file():
        raise InvalidModelFile(f"no such file: {imatrix} (--imatrix takes llama-imatrix's output)")
    if store.find(target) is not None:
        raise ModelExists(target)
    store.partial_dir.mkdir(parents=True, exist_ok=True)
    tmp = store.partial_dir / f"quantize-{uuid.uuid4().hex}.gguf"
    where = shown_folder(store.partial_dir, store.root.parent)
    try:
        need = 2 * record.size if tool is not None else _planned_bytes(header, kind)
        free = shutil.disk_usage(store.partial_dir).free
        if need > free:
            raise InsufficientStorage(
                f"quantizing '{record.name}' to {kind} needs about {need / 1e6:,.0f} MB in {where}; "
                f"{free / 1e6:,.0f} MB are free — free space there, then retry"
            )
        with disk_full_as(f"the {kind} copy of '{record.name}'", where=where, needed_bytes=need):
            if tool is not None:
                _run_tool(tool, src, tmp, kind, imatrix=imatrix, allow_requantize=allow_requantize)
            else:
                quantize_file(src, tmp, kind, on_progress=on_progress)
            projector = Path(record.projector) if record.projector else None
            return store.import_file(
                tmp, target, source=f"quantize:{record.name}:{kind}", settings=record.settings,
                projector=projector,
            )  # fmt: skip
    finally:
        tmp.unlink(missing_ok=True)


def tool_argv(
    tool: str, src: Path, dst: Path, kind: str, *, imatrix: Path | None, allow_requantize: bool
) -> list[str]:
    """llama-quantize's command line: its options before the input, output and type."""
    argv = [tool]
    if allow_requantize:
        argv.append("--allow-requantize")
    if imatrix is not None:
        argv += ["--imatrix", str(imatrix)]
    return [*argv, str(src), str(dst), kind]


def _run_tool(
    tool: str, src: Path, dst: Path, kind: str, *, imatrix: Path | None, allow_requantize: bool
) -> None:
    argv = tool_argv(tool, src, dst, kind, imatrix=imatrix, allow_requantize=allow_requantize)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", check=False)
    except OSError as exc:
        raise QuantizeToolMissing(f"cannot run {tool}: {exc.strerror or exc} — {_TOOL_ADVICE}") from None
    if done.returncode != 0 or not dst.is_file():
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        said = lines[-1] if lines else f"exit status {done.returncode}"
        raise QuantizeFailed(f"llama-quantize could not write {kind}: {said}")


# -- the built-in writer ----------------------------------------------------------------------


def _plan(tensor: TensorInfo, kind: str) -> Any:
    """The type ``tensor`` is written in for ``kind``."""
    import gguf

    target = gguf.GGMLQuantizationType[kind]
    source = _source_type(tensor)
    if source == target or len(tensor.shape) < 2 or any(part in tensor.name for part in _KEEP):
        return source
    if source.name in _INTEGERS:
        return source
    block, _ = gguf.GGML_QUANT_SIZES[target]
    if int(tensor.shape[0]) % block != 0:
        return source  # rows that are not a whole number of blocks
    return target


def _source_type(tensor: TensorInfo) -> Any:
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType[tensor.type]
    except KeyError:
        qtype = None
    if qtype is None or tensor.n_bytes is None:
        raise InvalidModelFile(
            f"{tensor.name} is of a tensor type ({tensor.type}) only llama.cpp's quantizer reads "
            f"— {_TOOL_ADVICE}"
        )
    return qtype


def _out_bytes(tensor: TensorInfo, qtype: Any) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(tensor.shape) // block * size


def _planned_bytes(header: GGUFHeader, kind: str) -> int:
    return sum(_out_bytes(t, _plan(t, kind)) for t in header.tensors) + 2 * header.data_offset


def _kv_spans(buf: bytes) -> list[tuple[str, int, int]]:
    """Each metadata entry of the GGUF file whose first bytes are ``buf``: its key, and where
    its bytes (key, type and value) begin and end."""
    from .gguf import _Cursor, _read_value

    cur = _Cursor(buf)
    cur.pos = 16
    count = cur.u64()
    spans = []
    for _ in range(count):
        start = cur.pos
        key = cur.string()
        _read_value(cur)
        spans.append((key, start, cur.pos))
    return spans


def _u32_entry(key: str, value: int) -> bytes:
    raw = key.encode()
    return struct.pack(f"<Q{len(raw)}sII", len(raw), raw, _GGUF_UINT32, value)


def quantize_file(
    src: Path, dst: Path, kind: str, *, on_progress: Callable[[int, int], None] | None = None
) -> None:
    """Write ``src`` (a GGUF file) again at ``dst`` with its weights in ``kind`` (one of
    ``BUILT_IN``), by the ``gguf`` package's quantization code. The metadata (a vocabulary of
    tens of thousands of strings) is copied as bytes, but for ``general.file_type`` and
    ``general.quantization_version``; one tensor is held in memory at a time."""
    import gguf
    import numpy as np

    if kind not in BUILT_IN:
        raise QuantizeToolMissing(
            f"{kind} is not one of the types written without llama-quantize: {BUILT_IN}"
        )
    try:
        header = read_header(src)
    except InvalidModelFile as exc:
        raise InvalidModelFile(f"cannot read {src} as GGUF: {exc.message}") from None
    with open(src, "rb") as f:
        head = f.read(header.table_start)
    alignment = int(header.values.get(gguf.Keys.General.ALIGNMENT) or gguf.GGUF_DEFAULT_ALIGNMENT)
    changed = (gguf.Keys.General.FILE_TYPE, gguf.Keys.General.QUANTIZATION_VERSION)
    entries = [head[a:b] for key, a, b in _kv_spans(head) if key not in changed]
    file_type = "ALL_F32" if kind == "F32" else f"MOSTLY_{kind}"
    entries.append(_u32_entry(gguf.Keys.General.FILE_TYPE, int(gguf.LlamaFileType[file_type])))
    if kind not in _FLOATS:
        entries.append(_u32_entry(gguf.Keys.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION))

    plans = [(t, _plan(t, kind)) for t in header.tensors]
    table = bytearray()
    at = 0
    for tensor, qtype in plans:
        raw = tensor.name.encode()
        table += struct.pack(f"<Q{len(raw)}sI", len(raw), raw, len(tensor.shape))
        table += struct.pack(f"<{len(tensor.shape)}QIQ", *tensor.shape, int(qtype), at)
        at += _padded(_out_bytes(tensor, qtype), alignment)
    out = bytearray(struct.pack("<4sIQQ", b"GGUF", 3, len(plans), len(entries)))
    for entry in entries:
        out += entry
    out += table
    out += bytes(_padded(len(out), alignment) - len(out))

    source = np.memmap(src, dtype=np.uint8, mode="r")
    with open(dst, "wb") as w:
        w.write(out)
        for done, (tensor, qtype) in enumerate(plans, start=1):
            start = header.data_offset + tensor.offset
            data = source[start : start + (tensor.n_bytes or 0)]
            if qtype != _source_type(tensor):
                rows = data.reshape(-1, len(data) // math.prod(tensor.shape[1:]))
                try:
                    values = gguf.quants.dequantize(rows, _source_type(tensor))
                except NotImplementedError:
                    raise InvalidModelFile(
                        f"{tensor.name} is {tensor.type}, which only llama.cpp's quantizer reads — "
                        f"{_TOOL_ADVICE}"
                    ) from None
                quantized = gguf.quants.quantize(values.astype(np.float32, copy=False), qtype)
                data = np.ascontiguousarray(quantized).view(np.uint8).reshape(-1)
            w.write(data.data)
            w.write(bytes(_padded(len(data), alignment) - len(data)))
            if on_progress is not None:
                on_progress(done, len(plans))


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment
