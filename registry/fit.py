"""Memory fit: what a GGUF model needs at a given context, slot count and KV cache type.

Pure functions over a parsed GGUF header (`registry.gguf.parse_header`); the
only I/O is `read_shape`, which reads the header of a local file. A remote file
is handled without I/O here: feed its first bytes to a `PrefixReader`, which says
which byte range it wants next (an HTTP Range request) until it has the header.

The figures follow what llama.cpp allocates (checked against its load log; see
docs/fit.md):

* weights: the sum of the tensors' bytes (element count / block size * block bytes);
* KV cache: per layer, K and V rows of ``n_head_kv * head_dim`` elements in the
  cache type, for ``pad256(ctx_per_slot)`` cells in each of ``slots`` streams;
  sliding-window layers keep only ``pad256(min(cells, window + n_ubatch))``
  cells; multi-head latent attention keeps one ``kv_lora_rank + rope`` row and
  no V; recurrent layers keep a fixed f32 state per slot instead;
* compute: an estimate of llama.cpp's graph buffer (activations for one
  micro-batch, the attention mask, the output logits);
* overhead: the engine process itself, and per GPU its runtime context.

Every context here is per slot: the engine's ``-c`` is ``ctx_per_slot * slots``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import gguf.constants as _gg
import msgspec

from .errors import InvalidModelFile
from .gguf import GGUFHeader, NeedMoreData, model_info, parse_header, read_header

__all__ = [
    "CACHE_TYPES",
    "QUANT_BPW",
    "Estimate",
    "FitReport",
    "KVCache",
    "Lever",
    "Memory",
    "ModelShape",
    "NeedMoreData",
    "PrefixReader",
    "Settings",
    "bytes_per_token",
    "cache_type_problem",
    "compute_buffer",
    "default_ctx",
    "estimate",
    "fit",
    "kv_cache",
    "levers",
    "parse_shape",
    "read_shape",
    "shape_from_header",
]

MIB = 1 << 20

CACHE_TYPES = ("f16", "q8_0", "q4_0", "f32", "bf16", "q4_1", "q5_0", "q5_1", "iq4_nl")
"""KV cache element types llama.cpp accepts for ``--cache-type-k/-v``."""

QUANT_BPW: dict[str, float] = {
    "Q8_0": 8.5,
    "Q6_K": 6.59,
    "Q5_K_M": 5.69,
    "Q4_K_M": 4.85,
    "IQ4_XS": 4.25,
    "Q3_K_M": 3.91,
    "Q2_K": 3.35,
}
"""Typical bits per weight of common GGUF quantizations, largest first (the smaller-quant lever)."""

HOST_OVERHEAD = 48 * MIB
"""The engine process beyond its buffers (interpreter, llama.cpp, HTTP threads); measured ~40 MiB."""
GPU_OVERHEAD = 512 * MIB
"""Per GPU: the runtime context, library workspaces and allocator slack (not measured here: no GPU)."""
CELL_PAD = 256
"""llama.cpp rounds each stream's KV cells up to a multiple of this."""
DEFAULT_UBATCH = 512
_MAX_BATCH = 2048
_GRAPH_SLACK = MIB
_TIGHT = 0.85

# Architectures whose layers are all recurrent: no growing KV, a fixed state per slot.
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Every layer has both attention and a recurrent mixer side by side.
_PARALLEL_HYBRID_ARCHS = frozenset({"falcon-h1"})
# llama.cpp's built-in sliding-window layer patterns (layer i is SWA iff i % n < n - 1)
# for files that carry a window but no pattern key.
_SWA_PATTERNS = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3n": 5,
    "cohere2": 4,
    "gpt-oss": 2,
    "exaone4": 4,
    "llama4": 4,
}
# Windows llama.cpp sets itself when the file has none.
_SWA_DEFAULT_WINDOW = {"llama4": 8192}

CacheType = str
Verdict = Literal["fits", "offload", "no_fit"]
Device = Literal["gpu", "cpu"]


# -- the model, as far as memory is concerned -----------------------------------------


class ModelShape(msgspec.Struct, frozen=True, kw_only=True):
    """What a GGUF header says about memory: per-layer attention geometry and weight bytes."""

    architecture: str
    name: str | None = None
    file_type: str | None = None
    parameter_count: int
    context_length: int | None = None
    n_layer: int
    n_embd: int
    n_ff: int
    """Widest feed-forward activation per token (dense, or active experts for MoE)."""
    n_vocab: int
    n_head: list[int]
    n_head_kv: list[int]
    head_dim_k: list[int]
    head_dim_v: list[int]
    """0 on every layer for multi-head latent attention (V is read from the K cache)."""
    has_kv: list[bool]
    """Layers that own a KV cache (attention layers that do not share another layer's)."""
    swa: list[bool]
    swa_window: int = 0
    mla: bool = False
    recurrent: list[bool]
    recurrent_floats: int = 0
    """f32 elements of recurrent state per recurrent layer per slot (conv/shift + SSM/WKV state)."""
    weights: int
    weights_by_type: dict[str, int]
    layer_weights: list[int]
    input_weights: int
    """Token embeddings and other tensors that stay with the CPU input layer."""
    output_weights: int
    """The output layer as the GPU would hold it (a tied embedding is duplicated there)."""
    notes: list[str] = []


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    return int(value) if isinstance(value, int | float) else None


def _layered(value: Any, n: int, default: int) -> list[int]:
    """A per-layer setting: a scalar repeated, a per-layer array, or the default."""
    if isinstance(value, list) and len(value) == n:
        return [int(x) for x in value]
    if isinstance(value, list) and value:
        return [int(value[0])] * n
    scalar = _as_int(value)
    return [default if scalar is None else scalar] * n


def _layered_opt(value: Any, n: int) -> list[int | None]:
    if value is None:
        return [None] * n
    return list(_layered(value, n, 0))


def _swa_from_pattern(pattern: int, n: int) -> list[bool]:
    return [pattern == 0 or i % pattern < pattern - 1 for i in range(n)]


def shape_from_header(header: GGUFHeader) -> ModelShape:
    """Memory-relevant facts of a model from its parsed header (raises InvalidModelFile)."""
    info = model_info(header)
    v = header.values
    arch = info.architecture
    notes: list[str] = []

    def get(template: str) -> Any:
        return v.get(template.format(arch=arch))

    def num(template: str, default: int = 0) -> int:
        got = _as_int(get(template))
        return default if got is None else got

    n_layer = num(_gg.Keys.LLM.BLOCK_COUNT)
    if n_layer <= 0:
        raise InvalidModelFile(f"GGUF header of a '{arch}' model has no {arch}.block_count")
    n_embd = num(_gg.Keys.LLM.EMBEDDING_LENGTH)
    n_head = _layered(get(_gg.Keys.Attention.HEAD_COUNT), n_layer, 0)
    head_kv_raw = get(_gg.Keys.Attention.HEAD_COUNT_KV)
    n_head_kv = [
        h if kv is None else kv for h, kv in zip(n_head, _layered_opt(head_kv_raw, n_layer), strict=True)
    ]
    first_head = next((h for h in n_head if h > 0), 0)
    default_hd = n_embd // first_head if first_head else 0
    hd_k = num(_gg.Keys.Attention.KEY_LENGTH, default_hd)
    hd_v = num(_gg.Keys.Attention.VALUE_LENGTH, default_hd)
    hd_k_swa = num(_gg.Keys.Attention.KEY_LENGTH_SWA, hd_k)
    hd_v_swa = num(_gg.Keys.Attention.VALUE_LENGTH_SWA, hd_v)

    # Multi-head latent attention (DeepSeek-V2/V3 layout as converted since 2025): the cache
    # holds one compressed row of kv_lora_rank + rope dims per token and layer, and no V.
    mla = num(_gg.Keys.Attention.KEY_LENGTH_MLA) > 0 and num(_gg.Keys.Attention.KV_LORA_RANK) > 0

    # Which layers are recurrent (fixed state) rather than attention (growing KV).
    recurrent = [False] * n_layer
    flags = get("{arch}.attention.recurrent_layers")
    interval = num(_gg.Keys.LLM.FULL_ATTENTION_INTERVAL)
    if arch in _RECURRENT_ARCHS:
        recurrent = [True] * n_layer
    elif isinstance(flags, list) and len(flags) == n_layer:
        recurrent = [bool(x) for x in flags]
    elif isinstance(head_kv_raw, list) and len(head_kv_raw) == n_layer and 0 in head_kv_raw:
        recurrent = [int(x) == 0 for x in head_kv_raw]
    elif interval >= 2:
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
    parallel_hybrid = arch in _PARALLEL_HYBRID_ARCHS
    attention = [parallel_hybrid or not r for r in recurrent]
    if parallel_hybrid:
        recurrent = [True] * n_layer

    # Layers without their own cache: shared-KV layers (gemma3n) and multi-token-prediction layers.
    kv_layers = n_layer - num(_gg.Keys.Attention.SHARED_KV_LAYERS) - num(_gg.Keys.LLM.NEXTN_PREDICT_LAYERS)
    has_kv = [attention[i] and i < kv_layers and n_head_kv[i] > 0 for i in range(n_layer)]

    # Sliding-window layers.
    window_raw = get(_gg.Keys.Attention.SLIDING_WINDOW)
    if isinstance(window_raw, list):
        window = max((int(w) for w in window_raw), default=0)
    else:
        window = _as_int(window_raw) or _SWA_DEFAULT_WINDOW.get(arch, 0)
    swa = [False] * n_layer
    if window > 0:
        pattern = get(_gg.Keys.Attention.SLIDING_WINDOW_PATTERN)
        if isinstance(window_raw, list) and len(window_raw) == n_layer:
            swa = [int(w) > 0 for w in window_raw]
        elif isinstance(pattern, list) and len(pattern) == n_layer:
            swa = [bool(x) for x in pattern]
        elif _as_int(pattern) is not None:
            swa = _swa_from_pattern(int(pattern), n_layer)
        elif arch in _SWA_PATTERNS:
            swa = _swa_from_pattern(_SWA_PATTERNS[arch], n_layer)
        else:
            notes.append(
                f"a sliding window of {window} is declared but not which layers use it; "
                "every layer is counted with the full context"
            )
    swa = [s and k for s, k in zip(swa, has_kv, strict=True)]

    head_dim_k = [(hd_k_swa if s else hd_k) if k else 0 for s, k in zip(swa, has_kv, strict=True)]
    head_dim_v = [
        0 if mla else ((hd_v_swa if s else hd_v) if k else 0) for s, k in zip(swa, has_kv, strict=True)
    ]

    # Recurrent state per layer and slot, as llama.cpp sizes it (f32).
    recurrent_floats = 0
    if any(recurrent):
        wkv = num(_gg.Keys.WKV.HEAD_SIZE)
        l_cache = num(_gg.Keys.ShortConv.L_CACHE)
        if wkv:
            recurrent_floats = num(_gg.Keys.LLM.TOKEN_SHIFT_COUNT, 2) * n_embd + n_embd * wkv
        else:
            d_conv = num(_gg.Keys.SSM.CONV_KERNEL)
            d_inner = num(_gg.Keys.SSM.INNER_SIZE)
            d_state = num(_gg.Keys.SSM.STATE_SIZE)
            groups = num(_gg.Keys.SSM.GROUP_COUNT)
            if l_cache:
                conv = n_embd * (l_cache - 1)
            else:
                conv = max(d_conv - 1, 0) * (d_inner + 2 * groups * d_state)
            recurrent_floats = conv + d_state * d_inner
        if recurrent_floats == 0:
            notes.append("recurrent layers without state sizes in the header; their state is not counted")

    # Feed-forward width that the compute buffer must hold per token.
    n_ff = max(_layered(get(_gg.Keys.LLM.FEED_FORWARD_LENGTH), n_layer, 0), default=0)
    experts_used = num(_gg.Keys.LLM.EXPERT_USED_COUNT)
    if experts_used:
        ff_exp = num(_gg.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, n_ff)
        shared = num(_gg.Keys.LLM.EXPERT_SHARED_COUNT) * num(
            _gg.Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, ff_exp
        )
        n_ff = max(n_ff, experts_used * ff_exp + shared)
    n_ff = max(n_ff, num(_gg.Keys.SSM.INNER_SIZE))

    weights_by_type, layer_weights, input_w, output_w, unknown = _weights(header, n_layer)
    if unknown:
        notes.append(f"tensor types of unknown size ({', '.join(sorted(unknown))}) are not counted")

    return ModelShape(
        architecture=arch,
        name=info.name,
        file_type=info.file_type,
        parameter_count=info.parameter_count,
        context_length=info.context_length,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=info.vocab_size or 0,
        n_head=n_head,
        n_head_kv=[kv if k else 0 for kv, k in zip(n_head_kv, has_kv, strict=True)],
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        has_kv=has_kv,
        swa=swa,
        swa_window=window if any(swa) else 0,
        mla=mla,
        recurrent=recurrent,
        recurrent_floats=recurrent_floats,
        weights=sum(weights_by_type.values()),
        weights_by_type=weights_by_type,
        layer_weights=layer_weights,
        input_weights=input_w,
        output_weights=output_w,
        notes=notes,
    )


_BLOCK = re.compile(r"blk\.(\d+)\.")


def _weights(header: GGUFHeader, n_layer: int) -> tuple[dict[str, int], list[int], int, int, set[str]]:
    by_type: dict[str, int] = {}
    layers = [0] * n_layer
    input_w = output_w = 0
    embd = 0
    has_output = False
    unknown: set[str] = set()
    for t in header.tensors:
        if t.n_bytes is None:
            unknown.add(t.type)
            continue
        by_type[t.type] = by_type.get(t.type, 0) + t.n_bytes
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += t.n_bytes
        elif t.name.startswith("token_embd") or t.name.startswith("per_layer_token_embd"):
            input_w += t.n_bytes
            if t.name == "token_embd.weight":
                embd = t.n_bytes
        else:
            output_w += t.n_bytes
            has_output = has_output or t.name == "output.weight"
    if not has_output:
        # Tied embeddings: llama.cpp keeps the input copy on the CPU and puts a second one on the GPU.
        output_w += embd
    return by_type, layers, input_w, output_w, unknown


def parse_shape(buf: bytes | memoryview) -> ModelShape:
    """ModelShape from the first bytes of a GGUF file; raises NeedMoreData(needed) when short."""
    return shape_from_header(parse_header(buf))


_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def read_shape(path: str | os.PathLike[str]) -> ModelShape:
    """ModelShape of a local GGUF file (headers only). A split model's other parts are added in."""
    header = read_header(path)
    shape = shape_from_header(header)
    count = _as_int(header.values.get(_gg.Keys.Split.LLM_KV_SPLIT_COUNT)) or 1
    m = _SPLIT.match(Path(path).name)
    if count <= 1 or m is None:
        return shape
    headers = [header]
    for no in range(1, count + 1):
        part = Path(path).with_name(f"{m['stem']}-{no:05d}-of-{m['count']}.gguf")
        if part.name != Path(path).name:
            if not part.exists():
                return msgspec.structs.replace(
                    shape,
                    notes=[*shape.notes, f"split model: part {part.name} is missing; weights are partial"],
                )
            headers.append(read_header(part))
    merged = msgspec.structs.replace(header, tensors=[t for h in headers for t in h.tensors])
    return shape_from_header(merged)


class PrefixReader:
    """Sans-io reader of a GGUF header from the start of a file fetched piecewise.

    ``next_range()`` names the bytes to fetch next as ``(start, end)`` (end
    exclusive; HTTP ``Range: bytes=start-(end-1)``), ``feed()`` takes them, and
    ``shape`` is set once the header is complete. Wanted sizes grow at least
    geometrically, so a large vocabulary costs a few round trips, not many.
    """

    def __init__(self, *, total_size: int | None = None, first_bytes: int = 1 << 20) -> None:
        self.total_size = total_size
        self._buf = bytearray()
        self._wanted = first_bytes if total_size is None else min(first_bytes, total_size)
        self.header: GGUFHeader | None = None
        self.shape: ModelShape | None = None

    @property
    def received(self) -> int:
        return len(self._buf)

    def next_range(self) -> tuple[int, int] | None:
        if self.header is not None:
            return None
        return (len(self._buf), max(self._wanted, len(self._buf) + 1))

    def feed(self, data: bytes | bytearray | memoryview) -> ModelShape | None:
        """Append the next bytes of the file; returns the shape once the header is complete."""
        if self.header is not None:
            return self.shape
        self._buf += data
        try:
            header = parse_header(memoryview(self._buf))
        except NeedMoreData as more:
            if self.total_size is not None and (
                more.needed > self.total_size or self.received >= self.total_size
            ):
                raise InvalidModelFile(
                    "GGUF header is truncated or corrupt "
                    f"(needs {more.needed} bytes, file has {self.total_size})"
                ) from None
            if not data:
                raise InvalidModelFile("the file ended before its GGUF header did") from None
            target = max(more.needed, 2 * self.received)
            self._wanted = target if self.total_size is None else min(target, self.total_size)
            return None
        self._buf = bytearray()
        self.header = header
        # The second and later parts of a split model carry tensors but no model metadata.
        if _as_int(header.values.get(_gg.Keys.Split.LLM_KV_SPLIT_NO)) in (None, 0):
            self.shape = shape_from_header(header)
        return self.shape


# -- settings, estimates ------------------------------------------------------------


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """How an engine would run the model. ``ctx_per_slot`` is per slot, as everywhere in Blazar."""

    ctx_per_slot: int
    slots: int = 1
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    flash_attn: bool = True
    """llama.cpp's default (auto) turns it on wherever the backend supports it."""
    n_ubatch: int = DEFAULT_UBATCH
    unified_kv: bool = False
    """One KV stream shared by all slots (``--kv-unified``); the server default is one per slot."""


class KVCache(msgspec.Struct, frozen=True, kw_only=True):
    k: int
    v: int
    recurrent: int
    """Fixed recurrent state (Mamba/RWKV and hybrids): per slot, does not grow with context."""
    cells_per_stream: int
    swa_cells_per_stream: int | None
    streams: int
    per_layer: list[int]
    """KV + recurrent bytes of each layer (for placing layers on a GPU)."""

    @property
    def kv(self) -> int:
        return self.k + self.v

    @property
    def total(self) -> int:
        return self.k + self.v + self.recurrent


class Estimate(msgspec.Struct, frozen=True, kw_only=True):
    settings: Settings
    weights: int
    weights_by_type: dict[str, int]
    kv: int
    k: int
    v: int
    recurrent: int
    compute: int
    overhead: int
    total: int
    cells_per_slot: int
    swa_cells_per_slot: int | None = None


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _cache_type(name: str) -> _gg.GGMLQuantizationType:
    try:
        return _gg.GGMLQuantizationType[name.upper()]
    except KeyError:
        raise ValueError(f"unknown KV cache type '{name}' (use one of {', '.join(CACHE_TYPES)})") from None


def _row_bytes(cache_type: str, n: int) -> int:
    block, size = _gg.GGML_QUANT_SIZES[_cache_type(cache_type)]
    return n // block * size


def cache_type_problem(
    shape: ModelShape, cache_type_k: str, cache_type_v: str, *, flash_attn: bool = True
) -> str | None:
    """Why llama.cpp would refuse these KV cache types for this model, or None when it would not."""
    for role, name, dims in (("K", cache_type_k, shape.head_dim_k), ("V", cache_type_v, shape.head_dim_v)):
        block = _gg.GGML_QUANT_SIZES[_cache_type(name)][0]
        bad = sorted({d for d in dims if d and d % block})
        if bad:
            return f"{role} cache type {name} needs head sizes divisible by {block}; this model has {bad[0]}"
    if not flash_attn and _gg.GGML_QUANT_SIZES[_cache_type(cache_type_v)][0] > 1:
        return f"a quantized V cache ({cache_type_v}) needs flash attention"
    return None


def kv_cache(shape: ModelShape, settings: Settings) -> KVCache:
    """KV cache and recurrent state bytes for ``settings`` (exact for what llama.cpp allocates)."""
    if settings.ctx_per_slot < 1 or settings.slots < 1:
        raise ValueError("ctx_per_slot and slots must be at least 1")
    streams = 1 if settings.unified_kv else settings.slots
    cells = _pad(settings.ctx_per_slot * (settings.slots if settings.unified_kv else 1), CELL_PAD)
    swa_cells: int | None = None
    if any(shape.swa):
        n_ub = min(settings.n_ubatch, cells * streams)
        reach = shape.swa_window * (settings.slots if settings.unified_kv else 1) + n_ub
        swa_cells = _pad(min(cells, reach), CELL_PAD)
    k = v = 0
    per_layer = [0] * shape.n_layer
    state = shape.recurrent_floats * 4 * settings.slots
    recurrent = 0
    for i in range(shape.n_layer):
        if shape.has_kv[i]:
            layer_cells = (swa_cells if shape.swa[i] and swa_cells is not None else cells) * streams
            lk = _row_bytes(settings.cache_type_k, shape.n_head_kv[i] * shape.head_dim_k[i]) * layer_cells
            lv = _row_bytes(settings.cache_type_v, shape.n_head_kv[i] * shape.head_dim_v[i]) * layer_cells
            k += lk
            v += lv
            per_layer[i] += lk + lv
        if shape.recurrent[i]:
            recurrent += state
            per_layer[i] += state
    return KVCache(
        k=k,
        v=v,
        recurrent=recurrent,
        cells_per_stream=cells,
        swa_cells_per_stream=swa_cells,
        streams=streams,
        per_layer=per_layer,
    )


def compute_buffer(shape: ModelShape, settings: Settings) -> int:
    """Estimated size of llama.cpp's compute (graph) and output buffers.

    Activations of one micro-batch (about 12 bytes per feed-forward unit, 20 per
    embedding unit and 8 per KV row element per token, fitted to measurements),
    the attention mask of each KV cache (f16 with flash attention, f32 without),
    the K·Q scores when flash attention is off, and the output logits (one row
    per slot).
    """
    total_ctx = settings.ctx_per_slot * settings.slots
    n_ub = max(1, min(settings.n_ubatch, _MAX_BATCH, total_ctx))
    kvc = kv_cache(shape, settings)
    kv_row = max((h * d for h, d in zip(shape.n_head_kv, shape.head_dim_k, strict=True)), default=0)
    per_token = 12 * shape.n_ff + 20 * shape.n_embd + 8 * kv_row
    size = n_ub * per_token
    if any(shape.has_kv):
        mask_elem = 2 if settings.flash_attn else 4
        full = any(k and not s for k, s in zip(shape.has_kv, shape.swa, strict=True))
        if full:
            size += kvc.cells_per_stream * n_ub * mask_elem
        if kvc.swa_cells_per_stream is not None:
            size += kvc.swa_cells_per_stream * n_ub * mask_elem
        if not settings.flash_attn:
            size += max(shape.n_head, default=0) * kvc.cells_per_stream * n_ub * 4
    size += shape.n_vocab * 4 * settings.slots
    return size + _GRAPH_SLACK


def estimate(shape: ModelShape, settings: Settings) -> Estimate:
    """Weights + KV + compute + process overhead, all in host terms (one device)."""
    kvc = kv_cache(shape, settings)
    compute = compute_buffer(shape, settings)
    total = shape.weights + kvc.total + compute + HOST_OVERHEAD
    return Estimate(
        settings=settings,
        weights=shape.weights,
        weights_by_type=dict(shape.weights_by_type),
        kv=kvc.kv,
        k=kvc.k,
        v=kvc.v,
        recurrent=kvc.recurrent,
        compute=compute,
        overhead=HOST_OVERHEAD,
        total=total,
        cells_per_slot=kvc.cells_per_stream
        if not settings.unified_kv
        else kvc.cells_per_stream // settings.slots,
        swa_cells_per_slot=kvc.swa_cells_per_stream,
    )


# -- verdict and levers --------------------------------------------------------------


class Memory(msgspec.Struct, frozen=True, kw_only=True):
    """Memory available to a new engine: system RAM and, per GPU, free VRAM."""

    ram_available: int
    gpu_free: list[int] = []


class Lever(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["ctx", "cache_type", "slots", "quant"]
    change: str
    """The setting to change, e.g. ``--ctx 2048``, ``--cache-type q8_0`` or ``quant Q4_K_M``."""
    settings: Settings
    weights: int
    kv: int
    total: int
    verdict: Verdict
    gpu_layers: int | None = None
    note: str | None = None


class FitReport(msgspec.Struct, frozen=True, kw_only=True):
    verdict: Verdict
    device: Device
    estimate: Estimate
    available: int
    """RAM (CPU) or free VRAM across GPUs, less the per-GPU runtime overhead."""
    ram_available: int
    n_layers: int
    """Layers llama.cpp can offload: the repeating blocks plus the output layer."""
    gpu_layers: int | None = None
    gpu_bytes: int = 0
    cpu_bytes: int = 0
    headroom: int = 0
    tight: bool = False
    """More than 85% of the available memory would be in use."""
    levers: list[Lever] = []
    notes: list[str] = []


class _Placement(msgspec.Struct, frozen=True):
    verdict: Verdict
    gpu_layers: int | None
    gpu_bytes: int
    cpu_bytes: int
    available: int
    used: int


def _place(shape: ModelShape, est: Estimate, kvc: KVCache, memory: Memory) -> _Placement:
    ram = memory.ram_available
    if not memory.gpu_free:
        verdict: Verdict = "fits" if est.total <= ram else "no_fit"
        return _Placement(verdict, None, 0, est.total, ram, est.total)
    budget = sum(max(0, free - GPU_OVERHEAD) for free in memory.gpu_free)
    n = shape.n_layer
    layer = [w + kv for w, kv in zip(shape.layer_weights, kvc.per_layer, strict=True)]
    host_base = shape.input_weights + HOST_OVERHEAD
    best: _Placement | None = None
    for gpu_layers in range(n + 1, -1, -1):
        on_gpu = min(gpu_layers, n)
        gpu = sum(layer[n - on_gpu :]) + (shape.output_weights if gpu_layers > n else 0)
        cpu = host_base + sum(layer[: n - on_gpu]) + (0 if gpu_layers > n else shape.output_weights)
        if gpu_layers > 0:
            gpu += est.compute
        if gpu_layers <= n:
            cpu += est.compute
        else:
            cpu += shape.n_vocab * 4 * est.settings.slots + _GRAPH_SLACK
        if gpu <= budget:
            verdict = "fits" if gpu_layers > n else "offload"
            if cpu > ram:
                verdict = "no_fit"
            best = _Placement(verdict, gpu_layers, gpu, cpu, budget, gpu)
            break
    assert best is not None  # gpu_layers == 0 always fits the GPU budget
    return best


def _report_place(shape: ModelShape, settings: Settings, memory: Memory) -> tuple[Estimate, _Placement]:
    est = estimate(shape, settings)
    return est, _place(shape, est, kv_cache(shape, settings), memory)


def _scaled(shape: ModelShape, factor: float) -> ModelShape:
    return msgspec.structs.replace(
        shape,
        weights=int(shape.weights * factor),
        weights_by_type={k: int(b * factor) for k, b in shape.weights_by_type.items()},
        layer_weights=[int(w * factor) for w in shape.layer_weights],
        input_weights=int(shape.input_weights * factor),
        output_weights=int(shape.output_weights * factor),
    )


def _lever(
    kind: Literal["ctx", "cache_type", "slots", "quant"],
    change: str,
    shape: ModelShape,
    settings: Settings,
    memory: Memory,
    note: str | None = None,
) -> Lever:
    est, place = _report_place(shape, settings, memory)
    return Lever(
        kind=kind,
        change=change,
        settings=settings,
        weights=est.weights,
        kv=est.kv + est.recurrent,
        total=est.total,
        verdict=place.verdict,
        gpu_layers=place.gpu_layers,
        note=note,
    )


def _first_fitting(candidates: Sequence[Any], make: Callable[[Any], Lever], *, want: Verdict) -> Lever | None:
    """The first candidate whose verdict is at least ``want``; else the last one tried."""
    rank = {"fits": 2, "offload": 1, "no_fit": 0}
    last: Lever | None = None
    for c in candidates:
        last = make(c)
        if rank[last.verdict] >= rank[want]:
            return last
    return last


def levers(shape: ModelShape, settings: Settings, memory: Memory, current: Verdict) -> list[Lever]:
    """What each lever would give.

    When the model does not fit entirely, each lever is pushed to its mildest
    setting that makes it fit (or as far as it goes); when it fits, each lever
    shows one step down and what it would save.
    """
    want: Verdict = "fits"
    out: list[Lever] = []
    searching = current != "fits"

    # Smaller context per slot: halve until it fits, not below 1024 (or one halving).
    ctxs: list[int] = []
    c = settings.ctx_per_slot // 2
    while c >= min(1024, settings.ctx_per_slot // 2) and c >= 256:
        ctxs.append(c)
        if not searching:
            break
        c //= 2
    lever = _first_fitting(
        ctxs,
        lambda c: _lever(
            "ctx", f"--ctx {c}", shape, msgspec.structs.replace(settings, ctx_per_slot=c), memory
        ),
        want=want,
    )
    if lever is not None:
        out.append(lever)

    # Quantized KV cache.
    for ct in ("q8_0", "q4_0"):
        if settings.cache_type_k == ct and settings.cache_type_v == ct:
            continue
        if not any(shape.has_kv):
            break
        problem = cache_type_problem(shape, ct, ct, flash_attn=settings.flash_attn)
        if problem is None:
            s = msgspec.structs.replace(settings, cache_type_k=ct, cache_type_v=ct)
            out.append(_lever("cache_type", f"--cache-type {ct}", shape, s, memory))

    # Fewer slots.
    slot_counts = list(range(settings.slots - 1, 0, -1)) if searching else [max(1, settings.slots // 2)]
    if settings.slots > 1:
        lever = _first_fitting(
            slot_counts,
            lambda n: _lever(
                "slots", f"--slots {n}", shape, msgspec.structs.replace(settings, slots=n), memory
            ),
            want=want,
        )
        if lever is not None:
            out.append(lever)

    # Smaller quantization of the weights (scaled by typical bits per weight).
    if shape.parameter_count and shape.weights:
        bpw_now = shape.weights * 8 / shape.parameter_count
        smaller = [(q, b) for q, b in QUANT_BPW.items() if b < bpw_now * 0.97]
        if not searching:
            smaller = smaller[:1]
        lever = _first_fitting(
            smaller,
            lambda qb: _lever(
                "quant",
                f"quant {qb[0]}",
                _scaled(shape, qb[1] / bpw_now),
                settings,
                memory,
                note=f"about {qb[1]} bits per weight vs {bpw_now:.2f} now",
            ),
            want=want,
        )
        if lever is not None:
            out.append(lever)
    return out


def fit(shape: ModelShape, settings: Settings, memory: Memory) -> FitReport:
    """Estimate, placement and verdict for ``settings`` against ``memory``, with levers."""
    problem = cache_type_problem(
        shape, settings.cache_type_k, settings.cache_type_v, flash_attn=settings.flash_attn
    )
    est, place = _report_place(shape, settings, memory)
    notes = list(shape.notes)
    if problem:
        notes.append(f"llama.cpp would refuse this setting: {problem}")
    notes.append("compute buffer is an estimate that errs high (by 5-10% where measured; see docs/fit.md)")
    if memory.gpu_free:
        notes.append(
            f"GPU runtime overhead counted as {GPU_OVERHEAD // MIB} MiB per GPU (an allowance, not measured)"
        )
    available = place.available
    return FitReport(
        verdict=place.verdict,
        device="gpu" if memory.gpu_free else "cpu",
        estimate=est,
        available=available,
        ram_available=memory.ram_available,
        n_layers=shape.n_layer + 1,
        gpu_layers=place.gpu_layers,
        gpu_bytes=place.gpu_bytes,
        cpu_bytes=place.cpu_bytes,
        headroom=available - place.used,
        tight=place.used > _TIGHT * available if available else True,
        levers=levers(shape, settings, memory, place.verdict),
        notes=notes,
    )


def default_ctx(shape: ModelShape, cap: int = 4096) -> int:
    """Blazar's default per-slot context: the training context, capped (4096 by default)."""
    return min(shape.context_length or cap, cap)


def bytes_per_token(shape: ModelShape, cache_type: str = "f16") -> int:
    """KV bytes one token adds across all full-attention layers (the textbook figure)."""
    return sum(
        _row_bytes(cache_type, h * dk) + _row_bytes(cache_type, h * dv)
        for h, dk, dv, k in zip(
            shape.n_head_kv, shape.head_dim_k, shape.head_dim_v, shape.has_kv, strict=True
        )
        if k
    )
