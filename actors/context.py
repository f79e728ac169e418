"""How much context a slot gets: the request or config asks, the model's training length
(or a configured extension of it) decides.

llama.cpp's server caps each slot at the training length whatever ``-c`` says, while
the KV cache is still allocated for the whole ``-c``: asking for more than the model
can serve costs memory and buys nothing. So a context above the limit is clamped
here, before the engine starts, and the clamp is reported; ``strict`` refuses instead.
Pure functions, no I/O.
"""

from __future__ import annotations

import math

import msgspec

from actors.errors import ContextTooLarge

__all__ = [
    "ContextChoice",
    "choose_context",
    "context_limit",
    "describe_clamp",
    "rope_factor",
    "slot_ceiling",
]


class ContextChoice(msgspec.Struct, frozen=True, kw_only=True):
    ctx: int
    """The per-slot context the engine is asked for."""
    asked: int
    """What the config or the request asked for."""
    limit: int | None
    """The most a slot can hold: the training length, or the extended length; None: unknown."""

    @property
    def clamped(self) -> bool:
        return self.ctx < self.asked


def rope_factor(
    trained: int | None, scaling: str | None, scale: float | None, ctx: int | None
) -> float | None:
    """The extension factor the engine gets: the configured one, or just enough for ``ctx``."""
    if scaling is None:
        return None
    if scale is not None:
        return scale
    if trained and ctx and ctx > trained:
        return math.ceil(ctx / trained * 100) / 100
    return None


def context_limit(trained: int | None, factor: float | None) -> int | None:
    """The most one slot can hold."""
    if trained is None:
        return None
    return int(trained * factor) if factor else trained


def slot_ceiling(limit: int | None, started: int, served: int | None) -> int | None:
    """The most one slot of a running engine can hold: what the model can serve (``limit``),
    or less when the child caps its slots (``served``) below what it was started with
    (``started``)."""
    if served is not None and served < started:
        return served
    return limit


def choose_context(asked: int, limit: int | None, *, strict: bool, model: str, what: str) -> ContextChoice:
    """``asked`` per slot, clamped to ``limit``; ``strict`` raises ``ContextTooLarge`` instead.
    ``what`` names the setting in the refusal (``ctx``, ``num_ctx``)."""
    if limit is None or asked <= limit:
        return ContextChoice(ctx=asked, asked=asked, limit=limit)
    if strict:
        raise ContextTooLarge(
            f"{what} {asked} exceeds the {limit}-token context '{model}' can serve — lower {what} to "
            f'{limit} or less, or extend the model with rope_scaling under [models."{model}"] '
            "(strict mode refuses what it would otherwise clamp)"
        )
    return ContextChoice(ctx=limit, asked=asked, limit=limit)


def describe_clamp(asked: int, ctx: int, *, trained: int | None, extended: bool) -> str | None:
    """One line for logs and ``blazar plan`` when ``asked`` was lowered to ``ctx``."""
    if ctx >= asked:
        return None
    if extended:
        return f"clamped from {asked} to {ctx} (the extended length); raise rope_scale to extend further"
    what = "training length" if trained == ctx else "the most the model can serve"
    return f"clamped from {asked} to {ctx} ({what}); set rope_scaling to extend"
