"""A prompt too long for the context, refused in the words the caller's API uses.

The check itself is the runtime's (``actors/preflight.py``: a claim refuses a prompt sure
not to fit before anything loads); this turns its ``PromptTooLong`` into the gateway's
error: Anthropic's and OpenAI's words, which their clients look for, with advice that
offers only what can work (a larger context up to what the model can serve, else a
shorter prompt or context extension).
"""

from __future__ import annotations

from actors.engine import EngineActor, EngineHandle
from actors.preflight import PromptBound, PromptTooLong, ctx_ceiling, template_byte_cap
from actors.preflight import check_prompt as _check_prompt
from actors.preflight import refuse_if_too_long as _refuse_if_too_long
from blazar.dialects.llamacpp import context_advice
from blazar.errors import BlazarError, Dialect

__all__ = ["check_prompt", "ctx_ceiling", "refuse_if_too_long", "template_byte_cap", "worded"]


def worded(exc: PromptTooLong) -> BlazarError:
    """The runtime's refusal as the gateway answers it; "at least", since the count is a
    bound, not the engine's own."""
    floor, ctx = exc.floor, exc.ctx
    advice = context_advice(floor, ctx, limit=exc.limit, extended=exc.extended, model=exc.model)
    return BlazarError(
        "PROMPT_TOO_LONG",
        f"prompt is too long: at least {floor} tokens > {ctx} maximum — {advice}",
        param="messages",
        wordings={
            Dialect.OPENAI: (
                f"This model's maximum context length is {ctx} tokens. However, your messages "
                f"resulted in at least {floor} tokens. Please reduce the length of the messages "
                f"— {advice}"
            ),
        },
    )


def refuse_if_too_long(
    engine: EngineActor, size: PromptBound, *, ctx: int | None = None, message_tokens: int = 0
) -> None:
    """``PROMPT_TOO_LONG`` when the prompt is sure to exceed one slot's context."""
    try:
        _refuse_if_too_long(engine, size, ctx=ctx, message_tokens=message_tokens)
    except PromptTooLong as exc:
        raise worded(exc) from None


async def check_prompt(engine: EngineActor, handle: EngineHandle, size: PromptBound) -> None:
    """The check with the template's per-turn cost, once the engine is ready."""
    try:
        await _check_prompt(engine, handle, size)
    except PromptTooLong as exc:
        raise worded(exc) from None
