"""Memory fit: what a GGUF model needs at a given context, slot count and KV cache type.

Pure functions over a `registry.shape.ModelShape`, the part of a GGUF header
that matters for memory (reading it from a file, local or remote, is
`registry.shape`'s job); no I/O here.

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

A multi-file speech model (whisper, piper) has no KV cache to size: its estimate
(``estimate_files``) is its weights resident, a working allowance per slot and its
host process (``SPEECH_OVERHEAD``), all from its files' sizes. A safetensors or MLX
directory and a diffusion checkpoint (``estimate_weights``) are their weight files'
bytes, a 16-bit KV cache from config.json for a text model, and allowances for
activations and the engine process (``WEIGHTS_WORK``, ``WEIGHTS_OVERHEAD``).

Every context here is per slot: the engine's ``-c`` is ``ctx_per_slot * slots``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec

from ._gguf_constants import constants as _gg
from .shape import ModelShape

__all__ = [
    "CACHE_TYPES",
    "QUANT_BPW",
    "Estimate",
    "FitReport",
    "KVCache",
    "Lever",
    "Memory",
    "Settings",
    "bytes_per_token",
    "cache_type_problem",
    "compute_buffer",
    "default_ctx",
    "estimate",
    "estimate_files",
    "estimate_weights",
    "fit",
    "fit_files",
    "fit_weights",
    "kv_cache",
    "levers",
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
SPEECH_OVERHEAD = {"stt": 128 * MIB, "tts": 96 * MIB}
"""The host process of a speech lane beyond the model: Python and, for ``stt``,
faster-whisper with CTranslate2, PyAV and tokenizers (63 MiB once imported, measured);
for ``tts`` piper with onnxruntime (47 MiB); plus room for the host's HTTP server."""
SPEECH_WIDEN = {"stt": 2, "tts": 1}
"""Resident weights per stored byte: CTranslate2 widens float16 weights to float32 on a
CPU (``compute_type="default"``; int8 would hold about half); onnxruntime keeps the
graph's weights as stored."""
SPEECH_WORK_MIN = 64 * MIB
"""Per slot, at least this much working memory for a speech model (see ``estimate_files``)."""
WEIGHTS_WORK = {"image": 2048 * MIB}
"""Activations beyond the weights and KV cache: for a text model on vLLM, SGLang or MLX
(``WEIGHTS_WORK_TEXT``), for an image model the UNet/DiT and VAE buffers of a 1024x1024
image on sd.cpp. Allowances, not measured here (no GPU)."""
WEIGHTS_WORK_TEXT = 512 * MIB
WEIGHTS_OVERHEAD = {"image": 256 * MIB}
"""The engine process beyond its buffers: sd-server's C++ process and its GPU context;
for a text lane (``WEIGHTS_OVERHEAD_TEXT``) Python, PyTorch or MLX and the CUDA or Metal
context with its graphs. Allowances."""
WEIGHTS_OVERHEAD_TEXT = 1024 * MIB
CELL_PAD = 256
"""llama.cpp rounds each stream's KV cells up to a multiple of this."""
DEFAULT_UBATCH = 512
_MAX_BATCH = 2048
_GRAPH_SLACK = MIB
_TIGHT = 0.85

CacheType = str
Verdict = Literal["fits", "offload", "no_fit"]
Device = Literal["gpu", "cpu"]


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


def estimate_files(kind: str, file_bytes: int, *, slots: int = 1, widen: int | None = None) -> Estimate:
    """A speech model's memory from its files' size: the weights resident (``SPEECH_WIDEN``
    times the bytes stored), per slot a working allowance as large as the stored bytes and
    at least ``SPEECH_WORK_MIN`` (the encoder's output for a 30 s window and the decoder's
    beam cache; onnxruntime's arena while it synthesizes), and the host (``SPEECH_OVERHEAD``).
    Measured on the CPU (docs/fit.md): whisper tiny.en peaks at 351 MiB (this: 351 MiB),
    piper's joe voice at 190 MiB (this: 220 MiB). ``widen`` replaces ``SPEECH_WIDEN`` (a
    whisper.cpp file keeps its weights as stored: 1)."""
    slots = max(1, slots)
    weights = file_bytes * (widen if widen is not None else SPEECH_WIDEN.get(kind, 1))
    compute = max(SPEECH_WORK_MIN, file_bytes) * slots
    overhead = SPEECH_OVERHEAD.get(kind, HOST_OVERHEAD)
    return Estimate(
        settings=Settings(ctx_per_slot=0, slots=slots),
        weights=weights,
        weights_by_type={kind: weights},
        kv=0,
        k=0,
        v=0,
        recurrent=0,
        compute=compute,
        overhead=overhead,
        total=weights + compute + overhead,
        cells_per_slot=0,
    )


def fit_files(est: Estimate, memory: Memory) -> FitReport:
    """``estimate_files``'s verdict against system RAM (the speech lanes run on the CPU)."""
    ram = memory.ram_available
    return FitReport(
        verdict="fits" if est.total <= ram else "no_fit",
        device="cpu",
        estimate=est,
        available=ram,
        ram_available=ram,
        n_layers=0,
        cpu_bytes=est.total,
        headroom=ram - est.total,
        tight=est.total > _TIGHT * ram if ram else True,
        notes=["a speech model: its files' bytes, a working allowance per slot and its host (docs/fit.md)"],
    )


def estimate_weights(
    kind: str, weights_bytes: int, *, kv_bytes_per_token: int, ctx_per_slot: int, slots: int = 1
) -> Estimate:
    """A safetensors or MLX directory's, or a diffusion checkpoint's, memory on its engine:
    the weight files' bytes (loaded as stored: 16-bit, or packed 4-bit for AWQ/GPTQ/MLX),
    a 16-bit KV cache of ``kv_bytes_per_token`` (from config.json; 0 for an image model) for
    ``ctx_per_slot`` tokens in each of ``slots`` sequences, and the allowances
    ``WEIGHTS_WORK`` and ``WEIGHTS_OVERHEAD``. vLLM and SGLang reserve a share of the GPU
    up front whatever this says (their memory fraction); this is what the model needs."""
    slots = max(1, slots)
    kv = max(0, kv_bytes_per_token) * max(0, ctx_per_slot) * slots
    compute = WEIGHTS_WORK.get(kind, WEIGHTS_WORK_TEXT)
    overhead = WEIGHTS_OVERHEAD.get(kind, WEIGHTS_OVERHEAD_TEXT)
    return Estimate(
        settings=Settings(ctx_per_slot=ctx_per_slot, slots=slots),
        weights=weights_bytes,
        weights_by_type={kind: weights_bytes},
        kv=kv,
        k=kv // 2,
        v=kv - kv // 2,
        recurrent=0,
        compute=compute,
        overhead=overhead,
        total=weights_bytes + kv + compute + overhead,
        cells_per_slot=ctx_per_slot,
    )


def fit_weights(est: Estimate, memory: Memory) -> FitReport:
    """``estimate_weights``'s verdict: against the GPUs' free memory when there are GPUs (the
    model is not split between GPU and RAM), else against RAM (MLX's unified memory)."""
    notes = ["weights from the files' sizes, KV cache from config.json, allowances for activations "
             "and the engine (docs/fit.md)"]  # fmt: skip
    if memory.gpu_free:
        available = max(memory.gpu_free) - GPU_OVERHEAD
        device: Device = "gpu"
    else:
        available = memory.ram_available
        device = "cpu"
        needs = (
            "sd.cpp runs on the CPU too, slowly"
            if "image" in est.weights_by_type
            else ("vLLM and SGLang need a GPU; MLX shares RAM")
        )
        notes.append(f"no GPU measured here: checked against RAM ({needs})")
    return FitReport(
        verdict="fits" if est.total <= available else "no_fit",
        device=device,
        estimate=est,
        available=available,
        ram_available=memory.ram_available,
        n_layers=0,
        gpu_bytes=est.total if device == "gpu" else 0,
        cpu_bytes=est.total if device == "cpu" else 0,
        headroom=available - est.total,
        tight=est.total > _TIGHT * available if available > 0 else True,
        notes=notes,
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
