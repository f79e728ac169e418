"""A GGUF model's shape: what its header says about memory, read without loading it.

Pure functions over a parsed GGUF header (`registry.gguf.parse_header`); the
only I/O is `read_shape`, which reads the header of a local file (and of the
other parts of a split model). A remote file is handled without I/O here: feed
its first bytes to a `PrefixReader`, which says which byte range it wants next
(an HTTP Range request) until it has the header. What the shape costs at a
given context and slot count is `registry.fit`'s estimate.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from ._gguf_constants import constants as _gg
from .errors import InvalidModelFile
from .gguf import GGUFHeader, NeedMoreData, model_info, parse_header, read_header

__all__ = ["ModelShape", "NeedMoreData", "PrefixReader", "parse_shape", "read_shape", "shape_from_header"]

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
