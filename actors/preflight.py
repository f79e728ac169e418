"""The refusals a claim makes before anything loads: certificates and prompt fit.

``Runtime.claim`` runs these for every request that names what it needs (``ClaimOptions``
``needs``, ``prompt``, ``ctx_per_slot``), on the engine it would use, before queueing for a
slot, starting a child or restarting one with a larger context, so an embedding program
is refused exactly where the gateway is.

* **Certificates.** ``blazar model-doctor`` stores, per model, which capabilities passed. A
  request that needs one the newest certificate marks FAIL (tools, a JSON schema, images,
  thinking, embeddings) is refused with ``CAPABILITY_VERIFIED_FAILED``, naming the evidence,
  instead of getting an answer that silently ignores what it asked. ``[admission]
  trust_certificates = false`` (or a model's ``trust_certificate``) turns this off; a model
  never certified is never refused; the doctor's own probes (``certifying``) always pass.
* **Prompt fit.** An engine handed a conversation far larger than its context spends minutes
  in its chat template and tokenizer before it can say no, and nothing it does there checks
  whether the caller still waits. So a prompt that is sure not to fit is refused from a lower
  bound on its tokens: its text's bytes over the vocabulary's longest token, known without
  the engine, plus the tokens the template adds per turn, measured once per model on a
  running engine and only when a prompt has enough turns for them to matter
  (``check_prompt``, after the engine is ready).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from actors.certificates import CertificateBook, Probe
from actors.config import RuntimeConfig
from actors.context import slot_ceiling
from actors.engine import EngineActor, EngineHandle
from actors.engines.llamacpp import LaunchSpec
from actors.errors import BlazarRuntimeError

if TYPE_CHECKING:
    pass

__all__ = [
    "CapabilityFailed",
    "PromptBound",
    "PromptTooLong",
    "check_certificates",
    "check_prompt",
    "ctx_ceiling",
    "refuse_if_too_long",
    "serving_ctx",
    "template_byte_cap",
    "turn_tokens",
]

log = logging.getLogger("actors.preflight")

_MOST_TOKENS_PER_TURN = 16
"""More than any chat template adds around one message: below this many tokens a turn
cannot push a prompt over the context, so the per-turn cost is not worth measuring."""
_turn_tokens: dict[tuple[str, str | None], int] = {}
"""Tokens a template adds per turn, by (model file, template override)."""

_WHAT = {
    "tools": "tool calls",
    "json_schema": "JSON-constrained answers (response_format / format)",
    "vision": "images",
    "thinking": "thinking",
    "embeddings": "embeddings",
}


class PromptBound(Protocol):
    """What a claim needs to know of a prompt: a lower bound on its tokens."""

    @property
    def turns(self) -> int: ...

    def token_floor(self, *, token_bytes_max: int | None, message_tokens: int = 0) -> int: ...


class PromptTooLong(BlazarRuntimeError):
    """A prompt that is sure to exceed one slot's context."""

    code = "PROMPT_TOO_LONG"

    def __init__(self, floor: int, ctx: int, *, limit: int | None, extended: bool, model: str) -> None:
        super().__init__(
            f"prompt is too long: at least {floor} tokens > {ctx} maximum — shorten it, or raise "
            f"the context ({'at most to ' + str(limit) + ', ' if limit and limit > ctx else ''}"
            f'`ctx` under [models."{model}"] in config.toml)'
        )
        self.floor, self.ctx, self.limit, self.extended, self.model = floor, ctx, limit, extended, model


class CapabilityFailed(BlazarRuntimeError):
    """The model's certificate says it fails a capability the request needs."""

    code = "CAPABILITY_VERIFIED_FAILED"


def check_certificates(
    config: RuntimeConfig,
    book: CertificateBook,
    model: str,
    needs: Sequence[str],
    *,
    certifying: bool = False,
) -> None:
    """Raise ``CapabilityFailed`` when ``model``'s certificate in ``book`` fails one of
    ``needs`` and the config trusts certificates; ``certifying``: the doctor's own probe."""
    if not needs or certifying:
        return
    override = config.models.get(model)
    trusted = config.admission.trust_certificates
    if override is not None and override.trust_certificate is not None:
        trusted = override.trust_certificate
    if not trusted:
        return
    for capability in needs:
        probe = book.failed(model, capability)
        if probe is not None:
            raise CapabilityFailed(_certificate_message(book, model, probe))


def _certificate_message(book: CertificateBook, model: str, probe: Probe) -> str:
    cert = book.get(model)
    engine = f" on {cert.engine}" if cert is not None else ""
    evidence = probe.answer.replace("\n", " ")
    if len(evidence) > 160:
        evidence = evidence[:159] + "…"
    return (
        f"model '{model}' failed the {probe.capability} check of its certificate{engine}: "
        f"{_WHAT.get(probe.capability, probe.capability)} would not be honoured ({probe.detail}; "
        f"answer: {evidence or '(empty)'}) — use another model, re-certify with "
        f"`blazar model-doctor {model}`, or send it anyway with [admission] trust_certificates = false "
        f'(or [models."{model}"] trust_certificate = false)'
    )


def ctx_ceiling(engine: EngineActor) -> int | None:
    """The most a slot of ``engine`` can hold (``actors.context.slot_ceiling``)."""
    return slot_ceiling(engine.spec.ctx_limit, engine.spec.ctx_per_slot, engine.served_ctx)


def serving_ctx(engine: EngineActor) -> int:
    """The per-slot context ``engine`` serves (or will start with)."""
    return engine.served_ctx or engine.spec.ctx_per_slot


def template_byte_cap(engine: EngineActor) -> int | None:
    """The most bytes of message text that can fit one slot's context (None: unknown)."""
    longest = engine.spec.token_bytes_max
    return serving_ctx(engine) * longest if longest else None


def refuse_if_too_long(
    engine: EngineActor, prompt: PromptBound, *, ctx: int | None = None, message_tokens: int = 0
) -> None:
    """Raise ``PromptTooLong`` when ``prompt`` is sure to exceed one slot's context
    (``ctx``: what the slot will hold, when the engine is about to change it)."""
    spec = engine.spec
    floor = prompt.token_floor(token_bytes_max=spec.token_bytes_max, message_tokens=message_tokens)
    ctx = ctx or serving_ctx(engine)
    if floor > ctx:
        extended = bool(spec.rope_scaling and spec.rope_scale)
        raise PromptTooLong(floor, ctx, limit=ctx_ceiling(engine), extended=extended, model=spec.model)


async def turn_tokens(handle: EngineHandle, spec: LaunchSpec) -> int:
    """The tokens the model's chat template adds around one turn, at least; measured on the
    engine with one-letter messages and remembered for the model.

    The conversations measured end with a user turn: a last assistant turn is taken
    for the start of the answer (no end marker), so it would look cheaper than it is.
    """
    key = (spec.path, spec.chat_template)
    if (known := _turn_tokens.get(key)) is not None:
        return known
    import httpx

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


async def check_prompt(engine: EngineActor, handle: EngineHandle, prompt: PromptBound) -> None:
    """The check with the template's per-turn cost, once the engine is ready; free for a
    prompt with too few turns for that cost to matter."""
    spec = engine.spec
    floor = prompt.token_floor(token_bytes_max=spec.token_bytes_max)
    if prompt.turns == 0 or floor + prompt.turns * _MOST_TOKENS_PER_TURN <= serving_ctx(engine):
        return
    refuse_if_too_long(engine, prompt, message_tokens=await turn_tokens(handle, spec))
