"""What format a model is in, from its own files' headers: never by loading weights.

Five kinds are told apart, so that routing can pick a lane:

* ``gguf``: a file that starts with the GGUF magic (llama.cpp, mistral.rs);
* ``safetensors``: a Hugging Face directory, ``config.json`` beside ``*.safetensors``
  shards (vLLM, SGLang), plain or quantized (``quantization_config.quant_method``:
  ``awq``, ``gptq``, ``fp8``, ``compressed-tensors``…);
* ``mlx``: a directory written by ``mlx_lm`` (MLX): its shards say
  ``{"format": "mlx"}`` in their metadata (Hugging Face's say ``pt``), or its
  ``config.json`` has MLX's own ``quantization`` block (``bits`` and ``group_size``,
  no ``quant_method``), or it holds a legacy ``weights.npz`` and no shards;
* ``diffusion``: one checkpoint file (``.safetensors``, ``.ckpt`` or ``.gguf``) whose
  tensors are an image model's: a UNet or DiT (``model.diffusion_model.*``, or a
  standalone Flux/SD3 transformer's blocks) — stable-diffusion.cpp's input;
* ``ggml-whisper``: a whisper.cpp model file (``ggml-*.bin``, ``registry.ggml``).

A safetensors file starts with an 8-byte little-endian header length, then that
many bytes of JSON: per tensor its dtype, shape and byte range, and an optional
``__metadata__`` map. Only that header is read. A ``.ckpt`` is a zip holding a
pickle: its names are searched as bytes, never unpickled. ``parse_safetensors_header``
and ``classify_tensors`` are pure; ``detect`` does the reading.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from . import gguf
from .errors import InvalidModelFile
from .ggml import read_whisper_header

__all__ = [
    "DIFFUSION_PREFIXES",
    "INDEX_FILE",
    "Format",
    "ModelFormat",
    "NeedMoreData",
    "SafetensorsHeader",
    "Tensor",
    "classify_tensors",
    "detect",
    "parse_safetensors_header",
    "read_safetensors_header",
]

Format = Literal["gguf", "safetensors", "mlx", "diffusion", "ggml-whisper"]

_HEADER_MAX = 100 << 20
"""A safetensors header longer than this is not one (real ones are well under 10 MiB)."""
_CKPT_PICKLE_MAX = 64 << 20


class NeedMoreData(Exception):
    """The buffer is a prefix too short to hold the header; ``needed`` is the size wanted."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"safetensors header needs {needed} bytes")
        self.needed = needed


class Tensor(msgspec.Struct, frozen=True):
    dtype: str
    shape: list[int]


class SafetensorsHeader(msgspec.Struct, frozen=True, kw_only=True):
    tensors: dict[str, Tensor]
    metadata: dict[str, str]
    data_offset: int
    """Where the tensor data begins: 8 + the header's length."""
    data_end: int = 0
    """Where the data the header declares ends (``data_offset`` + the largest end of a tensor's
    ``data_offsets``): the least size of a complete file."""


class ModelFormat(msgspec.Struct, frozen=True, kw_only=True):
    format: Format
    architecture: str | None
    """``LlamaForCausalLM`` (config.json's first architecture), ``llama`` (GGUF), or for a
    diffusion checkpoint ``sd1``, ``sd2``, ``sdxl``, ``sd3``, ``flux`` or ``unet``/``dit``."""
    quantization: str | None
    """``awq``, ``gptq``, ``fp8``, … (config.json), ``4bit`` (MLX), the GGUF file type
    (``Q4_K_M``); None for plain weights (``dtype`` says which)."""
    parameters: int | None
    """Weights counted from the tensors' shapes (packed 4-bit tensors unpacked)."""
    size_bytes: int
    files: list[str]
    """The files that make up the model, relative to ``path`` for a directory."""
    dtype: str | None = None
    """The most common tensor dtype by element count (``BF16``, ``F16``, ``I32``…)."""
    container: str | None = None
    """For ``diffusion``: the file's own format (``safetensors``, ``ckpt``, ``gguf``)."""
    context_length: int | None = None
    """Training context (config.json ``max_position_embeddings``, or the GGUF's)."""
    kv_bytes_per_token: int | None = None
    """KV cache bytes one token takes in a 16-bit cache, from config.json (layers * KV
    heads * head size * K and V * 2 bytes): with ``size_bytes``, what a fit plan needs
    for a GPU engine's memory fraction. None when config.json does not say."""

    @property
    def lane_format(self) -> str:
        """The key routing matches against a lane's formats: ``safetensors`` for plain
        weights, ``safetensors:awq`` for a quantized checkpoint, else ``format``."""
        if self.format == "safetensors" and self.quantization:
            return f"safetensors:{self.quantization}"
        return self.format


# -- safetensors ---------------------------------------------------------------

_U64 = struct.Struct("<Q")


def parse_safetensors_header(buf: bytes | memoryview) -> SafetensorsHeader:
    """The tensor table of a safetensors file from a prefix of it.

    Raises NeedMoreData when ``buf`` ends inside the header and InvalidModelFile
    when the bytes are not a safetensors header."""
    if len(buf) < 8:
        raise NeedMoreData(8)
    (length,) = _U64.unpack_from(buf, 0)
    if length < 2 or length > _HEADER_MAX:
        raise InvalidModelFile(f"not a safetensors file (header length {length})")
    if len(buf) < 8 + length:
        raise NeedMoreData(8 + length)
    raw = bytes(buf[8 : 8 + length])
    if raw[:1] != b"{":
        raise InvalidModelFile("not a safetensors file (header is not a JSON object)")
    try:
        doc = msgspec.json.decode(raw.rstrip(b" "))
    except msgspec.DecodeError as exc:
        raise InvalidModelFile(f"safetensors header is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidModelFile("safetensors header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    tensors: dict[str, Tensor] = {}
    end = 0
    for name, entry in doc.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("dtype"), str)
            and isinstance(entry.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
        ):
            raise InvalidModelFile(f"safetensors header: tensor {name!r} has no dtype and shape")
        tensors[name] = Tensor(dtype=entry["dtype"], shape=list(entry["shape"]))
        span = entry.get("data_offsets")
        if isinstance(span, list) and len(span) == 2 and all(isinstance(o, int) for o in span):
            if not 0 <= span[0] <= span[1]:
                raise InvalidModelFile(f"safetensors header: tensor {name!r} has data_offsets {span}")
            end = max(end, span[1])
    meta = {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
    return SafetensorsHeader(
        tensors=tensors, metadata=meta, data_offset=8 + length, data_end=8 + length + end
    )


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read just the header of a safetensors file (two reads: the length, then the JSON)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            try:
                return parse_safetensors_header(head)
            except NeedMoreData as more:
                if more.needed > size:
                    raise InvalidModelFile(
                        f"{os.fspath(path)}: safetensors header is truncated "
                        f"(needs {more.needed} bytes, the file has {size})"
                    ) from None
                return parse_safetensors_header(head + f.read(more.needed - 8))
    except InvalidModelFile as exc:
        if exc.message.startswith(os.fspath(path)):
            raise
        raise InvalidModelFile(f"{os.fspath(path)}: {exc.message}") from None
    except OSError as exc:
        raise InvalidModelFile(f"{os.fspath(path)}: cannot read it ({exc.strerror})") from None


# -- diffusion checkpoints -------------------------------------------------------

DIFFUSION_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
"""Tensor-name prefixes of a full SD checkpoint's UNet or DiT (original layout)."""
# A standalone Flux or SD3 transformer (sd.cpp's --diffusion-model) has no prefix:
# its blocks are named directly.
_DIT_BLOCKS = ("double_blocks.", "single_blocks.", "joint_blocks.")
_UNET_BLOCKS = ("input_blocks.", "middle_block.", "output_blocks.")


def _diffusion_arch(names: Iterable[str]) -> str | None:
    """The image model family of a checkpoint from its tensor names; None: not one."""
    seen = set()
    for name in names:
        for prefix in DIFFUSION_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                seen.add("prefixed")
                break
        head = name.split(".", 1)[0] + "."
        if head in _DIT_BLOCKS or head in _UNET_BLOCKS:
            seen.add(head)
        elif name.startswith("conditioner.embedders.1."):
            seen.add("sdxl-clip-g")
        elif name.startswith("cond_stage_model.transformer."):
            seen.add("clip-l")
        elif name.startswith("cond_stage_model.model."):
            seen.add("open-clip")
        elif name.startswith("label_emb."):
            seen.add("label_emb")
    if "double_blocks." in seen or "single_blocks." in seen:
        return "flux"
    if "joint_blocks." in seen:
        return "sd3"
    unet = bool(seen & set(_UNET_BLOCKS))
    if not unet:
        return "dit" if "prefixed" in seen else None
    if "prefixed" not in seen and "label_emb" not in seen:
        return None  # UNet-shaped names alone (some other network): not claimed
    if "sdxl-clip-g" in seen or "label_emb" in seen:
        return "sdxl"
    if "open-clip" in seen:
        return "sd2"
    if "clip-l" in seen:
        return "sd1"
    return "unet"


def classify_tensors(names: Iterable[str]) -> str | None:
    """The diffusion family (``sd1``, ``sdxl``, ``flux``…) of a tensor table; None: not an
    image model's. Pure: the names come from any header."""
    return _diffusion_arch(names)


_CKPT_MARKERS = (
    *(p + b for p in DIFFUSION_PREFIXES for b in (*_UNET_BLOCKS, *_DIT_BLOCKS, "label_emb.")),
    *_DIT_BLOCKS,
    "cond_stage_model.transformer.",
    "cond_stage_model.model.",
    "conditioner.embedders.1.",
)


def _ckpt_names(path: Path) -> list[str]:
    """Stand-in tensor names for a ``.ckpt`` (a zip holding a pickle): each known name
    prefix its pickle's bytes contain. The pickle is searched, never unpickled."""
    try:
        with zipfile.ZipFile(path) as zf:
            pickles = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
            if not pickles or pickles[0].file_size > _CKPT_PICKLE_MAX:
                return []
            data = zf.read(pickles[0])
    except (OSError, zipfile.BadZipFile):
        return []
    return [marker + "x" for marker in _CKPT_MARKERS if marker.encode() in data]


# -- counting --------------------------------------------------------------------

_PACKED_SUFFIXES = (".qweight",)
_SKIP_SUFFIXES = (".qzeros", ".scales", ".g_idx", ".biases", ".weight_scale", ".input_scale",
                  ".weight_scale_inv", ".weight_zero_point", ".weight_g_idx")  # fmt: skip


def _count(tensors: Mapping[str, Tensor], *, packed_bits: int | None, mlx: bool) -> tuple[int, Counter[str]]:
    """Parameters (packed integer tensors unpacked to their weight count) and the element
    count per dtype."""
    params = 0
    by_dtype: Counter[str] = Counter()
    for name, t in tensors.items():
        n = math.prod(t.shape)
        by_dtype[t.dtype] += n
        if name.endswith(_SKIP_SUFFIXES):
            continue
        if packed_bits and t.dtype in ("I32", "U32") and (name.endswith(_PACKED_SUFFIXES) or mlx):
            n = n * 32 // packed_bits
        params += n
    return params, by_dtype


def _dominant(by_dtype: Counter[str]) -> str | None:
    return by_dtype.most_common(1)[0][0] if by_dtype else None


# -- directories -----------------------------------------------------------------


def _config(folder: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidModelFile(f"{folder / 'config.json'}: not readable JSON ({exc})") from None
    return doc if isinstance(doc, dict) else None


def _mlx_quant(config: Mapping[str, Any]) -> dict[str, Any] | None:
    q = config.get("quantization")
    qc = config.get("quantization_config")
    if isinstance(q, dict) and "bits" in q and not (isinstance(qc, dict) and "quant_method" in qc):
        return q
    return None


def _hf_quant(config: Mapping[str, Any]) -> str | None:
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        qc = (config.get("text_config") or {}).get("quantization_config")
    if isinstance(qc, dict) and isinstance(qc.get("quant_method"), str):
        return str(qc["quant_method"]).lower()
    return None


def _architecture(config: Mapping[str, Any]) -> str | None:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    kind = config.get("model_type")
    return kind if isinstance(kind, str) else None


def _context_length(config: Mapping[str, Any]) -> int | None:
    for source in (config, config.get("text_config") or {}):
        value = source.get("max_position_embeddings") if isinstance(source, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def _kv_bytes_per_token(config: Mapping[str, Any]) -> int | None:
    text = config.get("text_config")
    source = text if isinstance(text, dict) and "num_hidden_layers" in text else config
    layers, heads, hidden = (
        source.get(k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size")
    )
    if not (isinstance(layers, int) and isinstance(heads, int) and layers > 0 and heads > 0):
        return None
    kv_heads = source.get("num_key_value_heads") or heads
    head_dim = source.get("head_dim") or (hidden // heads if isinstance(hidden, int) else None)
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        return None
    return layers * kv_heads * head_dim * 2 * 2


INDEX_FILE = "model.safetensors.index.json"
"""The shard index of a sharded Hugging Face checkpoint: its ``weight_map`` names the shards."""


def _shards(folder: Path) -> list[Path]:
    """The weight shards of a directory: those its index names when it has one (a repo may
    also carry other ``.safetensors``, e.g. Mistral's ``consolidated.safetensors``, the same
    weights again), else every top-level ``*.safetensors``."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidModelFile(f"{index}: not readable JSON ({exc})") from None
        names = sorted(set((doc.get("weight_map") or {}).values())) if isinstance(doc, dict) else []
        if names:
            missing = [n for n in names if not (folder / n).is_file()]
            if missing:
                raise InvalidModelFile(
                    f"{folder}: the shard index names {', '.join(missing[:3])}, which is not there — "
                    "download the missing shards"
                )
            return [folder / n for n in names]
    return sorted(p for p in folder.glob("*.safetensors") if p.is_file())


def _detect_dir(folder: Path) -> ModelFormat:
    config = _config(folder)
    shards = _shards(folder)
    npz = folder / "weights.npz"
    if config is None:
        if len(shards) == 1:
            return _detect_file(shards[0], root=folder)
        raise InvalidModelFile(
            f"{folder}: no config.json — a model directory needs the Hugging Face config.json "
            "beside its *.safetensors files"
        )
    if not shards and not npz.is_file():
        raise InvalidModelFile(f"{folder}: config.json but no *.safetensors or weights.npz beside it")
    headers = [read_safetensors_header(p) for p in shards]
    mlx_meta = any(h.metadata.get("format") == "mlx" for h in headers)
    mlx_q = _mlx_quant(config)
    is_mlx = mlx_meta or mlx_q is not None or (not shards and npz.is_file())
    tensors: dict[str, Tensor] = {}
    for h in headers:
        tensors.update(h.tensors)
    if is_mlx:
        bits = int(mlx_q["bits"]) if mlx_q and isinstance(mlx_q.get("bits"), int) else None
        mode = str(mlx_q.get("mode", "affine")) if mlx_q else "affine"
        quant = None if bits is None else (f"{bits}bit" if mode == "affine" else mode)
        fmt: Format = "mlx"
        params, by_dtype = _count(tensors, packed_bits=bits, mlx=True)
    else:
        quant = _hf_quant(config)
        qc = config.get("quantization_config") or {}
        bits = qc.get("bits") if isinstance(qc, dict) and isinstance(qc.get("bits"), int) else None
        fmt = "safetensors"
        params, by_dtype = _count(
            tensors, packed_bits=bits or (4 if quant in ("awq", "gptq") else None), mlx=False
        )
    files = [p.relative_to(folder).as_posix() for p in shards] or ([npz.name] if npz.is_file() else [])
    files = ["config.json", *files]
    size = sum((folder / f).stat().st_size for f in files)
    return ModelFormat(
        format=fmt,
        architecture=_architecture(config),
        quantization=quant,
        parameters=params if tensors else None,
        size_bytes=size,
        files=files,
        dtype=_dominant(by_dtype),
        context_length=_context_length(config),
        kv_bytes_per_token=_kv_bytes_per_token(config),
    )


# -- single files ------------------------------------------------------------------


def _detect_gguf(path: Path, name: str) -> ModelFormat:
    header = gguf.read_header(path)
    arch = classify_tensors(t.name for t in header.tensors)
    size = path.stat().st_size
    if arch is not None:
        params = sum(math.prod(t.shape) for t in header.tensors)
        return ModelFormat(format="diffusion", architecture=arch, quantization=None, parameters=params,
                           size_bytes=size, files=[name], container="gguf")  # fmt: skip
    try:
        info = gguf.model_info(header)
    except InvalidModelFile:
        params = sum(math.prod(t.shape) for t in header.tensors)
        return ModelFormat(format="gguf", architecture=None, quantization=None, parameters=params,
                           size_bytes=size, files=[name])  # fmt: skip
    return ModelFormat(
        format="gguf",
        architecture=info.architecture,
        quantization=info.file_type,
        parameters=info.parameter_count,
        size_bytes=size,
        files=[name],
        context_length=info.context_length,
    )


def _detect_file(path: Path, *, root: Path | None = None) -> ModelFormat:
    name = path.name if root is None else path.relative_to(root).as_posix()
    if gguf.looks_like_gguf(path):
        return _detect_gguf(path, name)
    whisper = read_whisper_header(path)
    if whisper is not None:
        return ModelFormat(format="ggml-whisper", architecture="whisper", quantization=whisper.quantization,
                           parameters=None, size_bytes=path.stat().st_size, files=[name],
                           context_length=whisper.n_text_ctx)  # fmt: skip
    if zipfile.is_zipfile(path):
        names = _ckpt_names(path)
        arch = classify_tensors(names)
        if arch is None:
            raise InvalidModelFile(f"{path}: a pickled checkpoint without a diffusion model's tensors")
        return ModelFormat(format="diffusion", architecture=arch, quantization=None, parameters=None,
                           size_bytes=path.stat().st_size, files=[name], container="ckpt")  # fmt: skip
    header = read_safetensors_header(path)
    arch = classify_tensors(header.tensors)
    params, by_dtype = _count(header.tensors, packed_bits=None, mlx=False)
    if arch is None:
        raise InvalidModelFile(
            f"{path}: a lone safetensors file that is not a diffusion checkpoint — a text model "
            "needs its directory (config.json and tokenizer beside the shards)"
        )
    return ModelFormat(
        format="diffusion",
        architecture=arch,
        quantization=None,
        parameters=params,
        size_bytes=path.stat().st_size,
        files=[name],
        dtype=_dominant(by_dtype),
        container="safetensors",
    )


def detect(path: str | os.PathLike[str]) -> ModelFormat:
    """The format of the model at ``path`` (a file or a directory), from headers alone.

    Raises InvalidModelFile, with what to do next, for anything it does not recognise."""
    p = Path(path)
    if p.is_dir():
        return _detect_dir(p)
    if not p.is_file():
        raise InvalidModelFile(f"{p}: no such file or directory")
    return _detect_file(p)
