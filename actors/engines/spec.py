"""What an engine is started with for one model: the launch spec every lane reads.

Each lane takes what applies to it (``actors.engines.llamacpp`` all of it; the
mistral.rs lane the model, slots, context, threads, GPU layers and template).
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.context import context_limit

__all__ = ["LaunchSpec"]

_LLAMA_BATCH = 512
"""llama.cpp's default prompt batch."""


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
    lane: str = "llamacpp"
    """Which lane runs it (``actors.engines.routing.LANES``): ``llamacpp`` or ``mistralrs``."""
    engine_version: str | None = None
    """The installed version of the lane that runs it (``blazar engine``); None: the bundled one."""
    prompt_batch: int | None = None
    """Prompt tokens the engine reads per step (``-b`` and ``-ub``); None: llama.cpp's own."""

    @property
    def prompt_step(self) -> int | None:
        """The prompt batch the engine runs with (``-b``/``-ub``). llama.cpp reads an input to
        embed or rank in one step (it refuses a longer one), so an engine that embeds or ranks
        steps by at least a slot's context; None: llama.cpp's own (512)."""
        if self.embeddings or self.reranking:
            return max(self.prompt_batch or _LLAMA_BATCH, self.ctx_per_slot)
        return self.prompt_batch

    @property
    def ctx_total(self) -> int:
        # llama.cpp divides -c among the -np slots.
        return self.ctx_per_slot * self.slots

    @property
    def ctx_limit(self) -> int | None:
        """The most one slot can hold: the training length, extended by ``rope_scale``."""
        return context_limit(self.ctx_train, self.rope_scale if self.rope_scaling else None)
