"""What an engine is started with for one model: the launch spec every lane reads.

Each lane takes what applies to it (``actors.engines.llamacpp`` all of it; the
mistral.rs lane the model, slots, context, threads, GPU layers and template).
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.context import context_limit

__all__ = ["ControlLoad", "DiffusionSettings", "GpuSettings", "LaunchSpec", "LoraLoad", "SpecLoad"]

_LLAMA_BATCH = 512
"""llama.cpp's default prompt batch."""


class GpuSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the GPU serving engines (vLLM, SGLang) are started with beyond the common fields."""

    memory_fraction: float | None = None
    """The share of each GPU the engine takes at start (vLLM ``--gpu-memory-utilization``,
    SGLang ``--mem-fraction-static``): configured, else sized by the fit plan to the model's
    need; None: the lane's own default."""
    tensor_parallel: int = 1
    """GPUs the model is split over."""
    quantization: str | None = None
    """A quantization the engine applies at load (``fp8`` on a 16-bit checkpoint); a quantized
    checkpoint states its own and needs none."""
    dtype: str | None = None
    """The weights' and activations' type (``bfloat16``, ``float16``…); None: the engine's choice."""
    tool_parser: str | None = None
    """The engine's tool-call parser; None: the one known for the model's architecture."""


class DiffusionSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What stable-diffusion.cpp is started with beyond the common fields."""

    components: dict[str, str] = {}
    """Companion files of a standalone diffusion model, by sd-server's flag names (``vae``,
    ``clip_l``, ``clip_g``, ``t5xxl``, ``llm``)."""
    offload_to_cpu: bool = False
    flash_attention: bool = False
    vae_tiling: bool = False
    weight_type: str | None = None
    """Convert the weights at load (``q8_0``, ``f16``…)."""


class LoraLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A LoRA adapter the engine loads with the model (``--lora-scaled PATH SCALE``)."""

    name: str
    path: str
    scale: float = 1.0


class ControlLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A control vector the engine starts with (``--control-vector-scaled PATH STRENGTH``)."""

    name: str
    """Its name in the model's store, or ``path`` for one a request gave by its file."""
    path: str
    strength: float


class SpecLoad(msgspec.Struct, frozen=True, kw_only=True):
    """Speculative decoding the engine runs with: a draft model, or n-gram lookup."""

    draft_model: str | None = None
    """The draft's model name (for explain and metrics); None for n-gram lookup."""
    draft_path: str | None = None
    """The draft model's GGUF (``--model-draft``)."""
    ngram: str | None = None
    """llama.cpp's draftless kind (``--spec-type``): ``ngram-simple``, ``ngram-map-k``,
    ``ngram-map-k4v``, ``ngram-mod`` or ``ngram-cache``."""
    max: int = 16
    """The most tokens drafted per step."""
    min: int = 0
    """The fewest tokens a draft must have to be tried."""


class LaunchSpec(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    """The engine's name: the canonical model name, or ``NAME@LANE`` for an engine that runs
    the model on another lane beside its own."""
    alias: str | None = None
    """The name replies carry (``--alias``) when not ``model``: the model asked for."""
    path: str
    ctx_per_slot: int
    slots: int
    kind: str = "chat"
    """What the model does (``registry.kinds``): ``chat``, ``embedding``, ``rerank``, ``stt``, ``tts``,
    ``image``."""
    embeddings: bool = False
    token_embeddings: bool = False
    """With ``embeddings``: the engine pools nothing (``--pooling none``) and answers a vector per
    token, which the gateway pools itself (late chunking needs them; see docs/api.md)."""
    reranking: bool = False
    """The model is a reranker (GGUF pooling type rank): the engine starts with ``--reranking``
    and serves ``/v1/rerank``, not chat nor embeddings."""
    native_tools: bool = False
    """The chat template handles tools itself; otherwise the gateway emulates them."""
    system_turns: bool = True
    """The chat template keeps a system turn after the first user turn; otherwise the
    gateway writes such turns into the user's text."""
    thinking: str = "none"
    """What the chat template does about reasoning on this lane (``registry.template.Thinking``):
    ``none``, ``always`` or ``switchable``; ``none`` on a lane that cannot control it."""
    think_effort: bool = False
    """The chat template reads ``reasoning_effort`` (a level goes to it, not to a token budget)."""
    llguidance: bool = False
    """The engine reads llguidance grammars (the xllamacpp wheel's build does)."""
    token_bytes_max: int | None = None
    """The most bytes of text one token of the model's vocabulary stands for."""
    chat_template: str | None = None
    """A Jinja chat template replacing the GGUF's own (from the model's settings)."""
    system: str | None = None
    """Default system prompt from the model's settings (applied by the gateway)."""
    defaults: dict[str, Any] = {}
    """Default sampling options from the model's settings (Ollama option names)."""
    threads: int | None = None
    extra_args: list[str] = []
    gpu_layers: int | None = None
    """Layers to offload (``-ngl``) on a GPU build of ``llama-server``; None: CPU only."""
    projector: str | None = None
    """The vision projector (mmproj) file: the engine then reads images."""
    ctx_train: int | None = None
    """The model's training context (GGUF header); None when the file does not say."""
    ctx_asked: int | None = None
    """The configured per-slot context when it was clamped to ``ctx_limit``."""
    rope_scaling: str | None = None
    """Context extension (``yarn``, ``linear``) passed to the engine; None: none."""
    rope_scale: float | None = None
    """The extension factor that goes with ``rope_scaling``."""
    max_output_tokens: int | None = None
    """Output cap the gateway sets on requests that give none; None: no cap."""
    idle_sleep_s: int | None = None
    """Seconds idle before the engine sleeps (``--sleep-idle-seconds``); None: never."""
    lane: str = "llamacpp"
    """Which lane runs it (``actors.engines.routing.LANES``): ``llamacpp`` or ``mistralrs``."""
    engine_version: str | None = None
    """The installed version of the lane that runs it (``blazar engine``); None: the bundled one."""
    prompt_batch: int | None = None
    """Prompt tokens the engine reads per step (``-b`` and ``-ub``); None: llama.cpp's own."""
    micro_batch: int | None = None
    """The physical batch (``-ub``) when smaller than ``prompt_batch``; None: the same."""
    kv_cache: str | None = None
    """The KV cache's type (``-ctk``/``-ctv``: ``f16``, ``q8_0``, ``q4_0``); None: the engine's own."""
    flash_attn: str | None = None
    """Flash attention (``-fa on|off|auto``); None: the engine's own choice."""
    architecture: str | None = None
    """The model's architecture as its files name it (GGUF ``general.architecture``, config.json's
    ``architectures``, a diffusion family): lanes pick parsers and roles by it."""
    gpu: GpuSettings = GpuSettings()
    diffusion: DiffusionSettings = DiffusionSettings()
    rpc: list[str] = []
    """``host:port`` of each llama.cpp ``rpc-server`` the model's layers are split over
    (``--rpc``); empty: this machine alone."""
    tensor_split: list[int] = []
    """With ``rpc``: layers per device (``--tensor-split``), the workers first, from the fit plan."""
    loras: list[LoraLoad] = []
    """LoRA adapters loaded with the model, numbered by the engine in this order."""
    control_vectors: list[ControlLoad] = []
    """Control vectors the engine adds to the model's hidden state (an engine of its own per set:
    ``actors/control.py``); empty for a model's own engine."""
    control_layers: tuple[int, int] | None = None
    """The blocks they apply to (``--control-vector-layer-range``); None: all."""
    speculation: SpecLoad | None = None
    """Speculative decoding; None: off (not configured, refused, or parked by the governor)."""
    digest: str | None = None
    """The model's main blob (``sha256:…``): saved sessions name the weights they were made from."""
    slot_save_path: str | None = None
    """Where a llama.cpp engine saves and restores slots (``--slot-save-path``): the model's
    sessions folder; None: slots are not saved."""

    @property
    def prompt_step(self) -> int | None:
        """The prompt batch the engine runs with (``-b``/``-ub``). llama.cpp reads an input to
        embed or rank in one step (it refuses a longer one), so an engine that embeds or ranks
        steps by at least a slot's context; None: llama.cpp's own (512)."""
        if self.embeddings or self.reranking:
            return max(self.prompt_batch or _LLAMA_BATCH, self.ctx_per_slot)
        return self.prompt_batch

    @property
    def micro_step(self) -> int | None:
        """The physical batch (``-ub``): ``micro_batch`` within the prompt step, else the step."""
        step = self.prompt_step
        if self.micro_batch is None or self.embeddings or self.reranking:
            return step
        return min(self.micro_batch, step) if step else self.micro_batch

    @property
    def ctx_total(self) -> int:
        # llama.cpp divides -c among the -np slots.
        return self.ctx_per_slot * self.slots

    @property
    def ctx_limit(self) -> int | None:
        """The most one slot can hold: the training length, extended by ``rope_scale``."""
        return context_limit(self.ctx_train, self.rope_scale if self.rope_scaling else None)
