"""``blazar quantize MODEL TYPE``: a smaller copy of a GGUF model already in the store.

Two ways to write it. llama.cpp's own quantizer (``llama-quantize`` on ``PATH``, or the
program ``BLAZAR_LLAMA_QUANTIZE`` names) writes every type llama.cpp knows and takes an
importance matrix. Where it is not installed, the types the ``gguf`` package can write
(``BUILT_IN``) are written here: the file is read with ``gguf.GGUFReader`` and written again
with ``gguf.GGUFWriter``, its metadata kept and ``general.file_type`` set, each weight matrix
quantized row block by row block, and what must stay as it is left alone (norms and other
1-D tensors, a few small tensors llama.cpp also keeps, and any tensor whose rows are not a
whole number of the type's blocks). Any other type without the tool is refused with
``QUANTIZE_TOOL_MISSING``, naming where to get it.

The result goes into the store as an import does (``Store.import_file``), under a new name,
with the source's settings (system prompt, template, parameters) and vision projector.

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import os
import shutil
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
from .gguf import read_header

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
    counts: dict[str, int] = {}
    for t in read_header(path).tensors:
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
    if int(read_header(src).values.get("split.count") or 1) > 1:
        raise InvalidModelFile(
            f"model '{record.name}' is split in parts: merge them first (`llama-gguf-split --merge`), "
            "import the merged file, and quantize that"
        )
    types = weight_types(src)
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
        need = 2 * record.size if tool is not None else _planned_bytes(src, kind)
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


def _plan(tensor: Any, kind: str) -> Any:
    """The type ``tensor`` (a ``gguf.ReaderTensor``) is written in for ``kind``."""
    import gguf

    target = gguf.GGMLQuantizationType[kind]
    source = tensor.tensor_type
    if source == target or len(tensor.shape) < 2 or any(part in tensor.name for part in _KEEP):
        return source
    if source.name in _INTEGERS:
        return source
    block, _ = gguf.GGML_QUANT_SIZES[target]
    if int(tensor.shape[0]) % block != 0:
        return source  # rows that are not a whole number of blocks
    return target


def _out_bytes(tensor: Any, qtype: Any) -> int:
    import gguf

    if qtype == tensor.tensor_type:
        return int(tensor.n_bytes)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(tensor.n_elements) // block * size


def _planned_bytes(src: Path, kind: str) -> int:
    import gguf

    reader = gguf.GGUFReader(src)
    return sum(_out_bytes(t, _plan(t, kind)) for t in reader.tensors) + 2 * int(reader.tensors[0].data_offset)


def quantize_file(
    src: Path, dst: Path, kind: str, *, on_progress: Callable[[int, int], None] | None = None
) -> None:
    """Write ``src`` (a GGUF file) again at ``dst`` with its weights in ``kind`` (one of
    ``BUILT_IN``), by the ``gguf`` package alone. One tensor is held in memory at a time."""
    import gguf
    import numpy as np

    if kind not in BUILT_IN:
        raise QuantizeToolMissing(
            f"{kind} is not one of the types written without llama-quantize: {BUILT_IN}"
        )
    try:
        reader = gguf.GGUFReader(src)
    except (ValueError, OSError) as exc:
        raise InvalidModelFile(f"cannot read {src} as GGUF: {exc}") from None
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    skipped = {
        gguf.Keys.General.ARCHITECTURE,
        gguf.Keys.General.FILE_TYPE,
        gguf.Keys.General.QUANTIZATION_VERSION,
    }
    for field in reader.fields.values():
        if field.name in skipped or field.name.startswith("GGUF."):
            continue  # the writer writes these itself, or they change below
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = int(field.contents())
        first = field.types[0]
        sub = field.types[-1] if first == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), first, sub_type=sub)
    file_type = "ALL_F32" if kind == "F32" else f"MOSTLY_{kind}"
    writer.add_file_type(int(gguf.LlamaFileType[file_type]))
    if kind not in _FLOATS:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    plans = [(t, _plan(t, kind)) for t in reader.tensors]
    for tensor, qtype in plans:
        shape = [int(n) for n in reversed(tensor.shape)]  # numpy order: the row length last
        writer.add_tensor_info(
            tensor.name, shape, np.dtype(np.float32), _out_bytes(tensor, qtype), raw_dtype=qtype
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for done, (tensor, qtype) in enumerate(plans, start=1):
        if qtype == tensor.tensor_type:
            data = tensor.data
        else:
            try:
                values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            except NotImplementedError:
                raise InvalidModelFile(
                    f"{tensor.name} is {tensor.tensor_type.name}, which only llama.cpp's quantizer "
                    f"reads — {_TOOL_ADVICE}"
                ) from None
            data = gguf.quants.quantize(values.astype(np.float32, copy=False), qtype)
        writer.write_tensor_data(np.ascontiguousarray(data).view(np.uint8))
        if on_progress is not None:
            on_progress(done, len(plans))
    writer.close()
