"""Refuse a prompt that cannot fit one slot's context before the engine is asked to template it.

An engine handed a conversation far larger than its context spends minutes in
its chat template and tokenizer before it can say no, and nothing it does
there checks whether the client is still waiting. So the gateway refuses what
is sure not to fit, from a lower bound on the prompt's tokens
(``blazar.dialects.prompt_size``): the text's bytes over the vocabulary's
longest token are known without the engine; the tokens the template adds per
turn are measured once per model on a running engine, and only when a request
has enough turns for them to matter. Equivalently, the engine is never asked
to template more than ``ctx * token_bytes_max`` bytes of text.
"""

from __future__ import annotations

import logging

import httpx

from actors.engine import EngineActor, EngineHandle
from actors.engines.llamacpp import LaunchSpec
from blazar.dialects.llamacpp import context_advice
from blazar.dialects.prompt_size import PromptSize
from blazar.errors import BlazarError, Dialect

__all__ = ["check_prompt", "ctx_ceiling", "refuse_if_too_long", "template_byte_cap", "turn_tokens"]

log = logging.getLogger("blazar.web")

_MOST_TOKENS_PER_TURN = 16
"""More than any chat template adds around one message: below this many tokens a turn
cannot push a prompt over the context, so the per-turn cost is not worth measuring."""
_turn_tokens: dict[tuple[str, str | None], int] = {}
"""Tokens a template adds per turn, by (model file, template override)."""


def ctx_ceiling(engine: EngineActor) -> int | None:
    """The most a slot of ``engine`` can hold: what the model can serve, or less when the
    running child caps its slots below what it was started with."""
    served, spec = engine.served_ctx, engine.spec
    if served is not None and served < spec.ctx_per_slot:
        return served
    return spec.ctx_limit


def _serving(engine: EngineActor) -> int:
    return engine.served_ctx or engine.spec.ctx_per_slot


def template_byte_cap(engine: EngineActor) -> int | None:
    """The most bytes of message text that can fit one slot's context (None: unknown)."""
    longest = engine.spec.token_bytes_max
    return _serving(engine) * longest if longest else None


def refuse_if_too_long(
    engine: EngineActor, size: PromptSize, *, ctx: int | None = None, message_tokens: int = 0
) -> None:
    """Raise ``PROMPT_TOO_LONG`` when the prompt is sure to exceed one slot's context
    (``ctx``: what the slot will hold, when the engine is about to change it)."""
    spec = engine.spec
    floor = size.token_floor(token_bytes_max=spec.token_bytes_max, message_tokens=message_tokens)
    ctx = ctx or _serving(engine)
    if floor <= ctx:
        return
    advice = context_advice(
        floor,
        ctx,
        limit=ctx_ceiling(engine),
        extended=bool(spec.rope_scaling and spec.rope_scale),
        model=spec.model,
    )
    # Anthropic's and OpenAI's words, which their clients look for; "at least", since
    # the count is a bound, not the engine's own.
    raise BlazarError(
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


async def turn_tokens(handle: EngineHandle, spec: LaunchSpec) -> int:
    """The tokens the model's chat template adds around one turn, at least; measured on the
    engine with one-letter messages and remembered for the model.

    The conversations measured end with a user turn: a last assistant turn is taken
    for the start of the answer (no end marker), so it would look cheaper than it is.
    """
    key = (spec.path, spec.chat_template)
    if (known := _turn_tokens.get(key)) is not None:
        return known
    user, assistant = {"role": "user", "content": "a"}, {"role": "assistant", "content": "a"}
    try:
        base = await _count(handle, [user])
        users = await _count(handle, [user, user])
        pair = await _count(handle, [user, assistant, user])
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        log.warning("could not measure the chat template of '%s': %r", spec.model, exc)
        return 0
    # Less the letters themselves, which may have merged with the markers around them.
    measured = _turn_tokens[key] = max(0, min(users - base - 1, (pair - base - 2) // 2))
    return measured


async def _count(handle: EngineHandle, messages: list[dict[str, str]]) -> int:
    templated = await handle.client.post("/apply-template", json={"messages": messages}, timeout=10.0)
    prompt = templated.raise_for_status().json()["prompt"]
    tokens = await handle.client.post(
        "/tokenize", json={"content": prompt, "add_special": True}, timeout=10.0
    )
    return len(tokens.raise_for_status().json()["tokens"])


async def check_prompt(engine: EngineActor, handle: EngineHandle, size: PromptSize) -> None:
    """The check with the template's per-turn cost, once the engine is ready; free for a
    prompt with too few turns for that cost to matter."""
    spec = engine.spec
    floor = size.token_floor(token_bytes_max=spec.token_bytes_max)
    if size.turns == 0 or floor + size.turns * _MOST_TOKENS_PER_TURN <= _serving(engine):
        return
    refuse_if_too_long(engine, size, message_tokens=await turn_tokens(handle, spec))
