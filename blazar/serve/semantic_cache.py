"""The semantic cache, request side: whether a chat request may be answered from the cache,
the embedding of its prompt, the lookup, and keeping its answer.

A request is looked up when ``[semantic_cache] enabled`` is on and it does not say
``X-Blazar-Cache: off``, or when it says ``X-Blazar-Cache: on``. Its last user message is
embedded on the configured model (through the runtime's claim, as ``/v1/embeddings`` is)
and compared with the prompts kept for the same key, model, lane and context
(``blazar.serve.stores.semantic``). At or above the threshold the kept answer is the
answer, with no engine call; below it the request runs as ever and its answer is kept.

What is never looked up nor kept, and why (the reason in ``X-Blazar-Cache-Reason``):
a stream (``stream``); tools offered (``tools``) or an answer that calls one
(``answer_tools``); structured output (``structured``); an MCP tool loop (``mcp``); several
candidates (``candidates``: ``n``, ``best_of``, a cascade); sampling asked to vary
(``sampling``: a temperature above 0 without a ``seed``); a stored completion (``store``);
a last message that is not a user's plain text (``prompt``); no embedding model configured
(``no_model``); the embedding call failed (``embedding_failed``: the request runs normally);
the request said ``X-Blazar-Cache: off`` (``off``). The rules are pure functions
(``read_headers``, ``bypass_reason``, ``context_of``), tested without a daemon.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.runtime import Runtime
from blazar.dialects.neutral import ChatRequest, EmbedRequest
from blazar.errors import BlazarError
from blazar.errors.describe import describe_error
from blazar.serve import vectors
from blazar.serve.candidates.choices import BEST_OF_HEADER, CASCADE_HEADER
from blazar.serve.context import Ask, Relayed
from blazar.serve.reply import Reply
from blazar.serve.stores.semantic import Bucket, SemanticCache, normalized, semantic_cache_of

__all__ = [
    "AGE_HEADER",
    "CACHE_HEADER",
    "REASON_HEADER",
    "SIMILARITY_HEADER",
    "THRESHOLD_HEADER",
    "TTL_HEADER",
    "Asked",
    "answer_tools",
    "bypass_reason",
    "cached",
    "context_of",
    "prompt_of",
    "read_headers",
    "through",
]

log = logging.getLogger("blazar.serve")

CACHE_HEADER = "x-blazar-cache"
"""Request: ``on`` or ``off``. Answer: ``hit``, ``miss`` or ``bypass``."""
TTL_HEADER = "x-blazar-cache-ttl"
THRESHOLD_HEADER = "x-blazar-cache-threshold"
REASON_HEADER = "X-Blazar-Cache-Reason"
SIMILARITY_HEADER = "X-Blazar-Cache-Similarity"
AGE_HEADER = "X-Blazar-Cache-Age"

_ON = frozenset({"on", "1", "true", "yes"})
_OFF = frozenset({"off", "0", "false", "no"})
_KEPT_HEADERS = frozenset(
    {"x-blazar-ignored", "x-blazar-changed", "x-blazar-output-cap", "x-blazar-warnings"}
)
"""An answer's headers that say something of the answer itself, given again with it."""
_VOLATILE = frozenset({"model", "messages", "stream", "stream_options", "keep_alive", "user", "metadata"})
"""Body fields that do not change the answer (``model`` is the bucket's own)."""
_MAX_TTL_S = 30 * 86400.0


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request's headers ask of the cache (None: the configured default)."""

    on: bool | None = None
    ttl_s: float | None = None
    threshold: float | None = None


def _number(raw: str, name: str, *, low: float, high: float, low_open: bool, what: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid {name} header: {raw[:40]!r} — send {what}",
            param=name,
        )
    return value


def read_headers(headers: Mapping[str, str]) -> Asked:
    """The cache headers of a request (lower-case names); a malformed one is a 400 naming it."""
    on: bool | None = None
    if (raw := headers.get(CACHE_HEADER)) is not None:
        word = raw.strip().lower()
        if word not in _ON | _OFF:
            raise BlazarError(
                "BAD_REQUEST",
                f"invalid X-Blazar-Cache header: {raw[:40]!r} — send on or off",
                param="X-Blazar-Cache",
            )
        on = word in _ON
    ttl = threshold = None
    if (raw := headers.get(TTL_HEADER)) is not None:
        ttl = _number(
            raw, "X-Blazar-Cache-TTL", low=0.0, high=_MAX_TTL_S, low_open=True, what="seconds above 0"
        )
    if (raw := headers.get(THRESHOLD_HEADER)) is not None:
        threshold = _number(
            raw,
            "X-Blazar-Cache-Threshold",
            low=0.0,
            high=1.0,
            low_open=False,
            what="a cosine similarity from 0 to 1",
        )
    return Asked(on, ttl, threshold)


def _decoded(body: bytes) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def prompt_of(req: ChatRequest) -> str | None:
    """The text compared by meaning: the last message, when it is a user's plain text."""
    if not req.messages:
        return None
    last = req.messages[-1]
    if last.role != "user" or last.images or not last.content.strip():
        return None
    return last.content


def bypass_reason(req: ChatRequest, doc: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """Why the request may not be answered from the cache nor feed it (None: it may).
    ``doc`` is its decoded body; ``headers`` has lower-case names."""
    if req.stream:
        return "stream"
    if req.tools or doc.get("tools") or doc.get("functions"):
        return "tools"
    if (req.response_format is not None and req.response_format.kind != "text") or doc.get("format"):
        return "structured"
    if doc.get("mcp") not in (None, "none") or "x-blazar-mcp" in headers:
        return "mcp"
    n = doc.get("n")
    if (isinstance(n, int) and n > 1) or doc.get("best_of") or BEST_OF_HEADER in headers:
        return "candidates"
    if doc.get("cascade") or CASCADE_HEADER in headers:
        return "candidates"
    if req.temperature is not None and req.temperature > 0 and req.seed is None:
        return "sampling"
    if doc.get("store") is True:
        return "store"
    if prompt_of(req) is None:
        return "prompt"
    return None


def context_of(doc: Mapping[str, Any]) -> str:
    """A digest of what, besides the last message, decides the answer: the earlier messages
    and every other field of the body (sampling, limits, system prompt, thinking, options)."""
    rest = {k: v for k, v in doc.items() if k not in _VOLATILE}
    messages = doc.get("messages")
    rest["messages"] = messages[:-1] if isinstance(messages, list) else None
    return hashlib.sha256(msgspec.json.encode(rest, order="sorted")).hexdigest()[:32]


def answer_tools(body: bytes) -> bool:
    """The answer calls a tool (OpenAI's ``choices[].message`` or Ollama's ``message``)."""
    doc = _decoded(body)
    messages = [c.get("message") for c in doc.get("choices") or [] if isinstance(c, dict)]
    messages.append(doc.get("message"))
    return any(isinstance(m, dict) and m.get("tool_calls") for m in messages)


def _said(outcome: str, reason: str | None = None, similarity: float | None = None) -> dict[str, str]:
    headers = {"X-Blazar-Cache": outcome}
    if reason is not None:
        headers[REASON_HEADER] = reason
    if similarity is not None:
        headers[SIMILARITY_HEADER] = f"{similarity:.4f}"
    return headers


def _with(reply: Reply, headers: dict[str, str]) -> Reply:
    reply.headers = {**(reply.headers or {}), **headers}
    return reply


Run = Callable[[], Awaitable[Reply]]


async def through(runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest, run: Run) -> Reply:
    """``run()``'s answer, or the cache's for a prompt that means the same; named in headers."""
    cache = semantic_cache_of(runtime)
    if cache is None:
        return await run()
    headers = call.headers
    named = any(h in headers for h in (CACHE_HEADER, TTL_HEADER, THRESHOLD_HEADER))
    asked = read_headers(headers) if named else Asked()
    on = cache.config.enabled if asked.on is None else asked.on
    if not on:
        if asked.on is None:  # not asked for, not configured: no header, no cost
            return await run()
        return await _bypass(runtime, cache, call, req, run, "off")
    if not cache.usable:
        return await _bypass(runtime, cache, call, req, run, "no_model")
    doc = _decoded(call.body)
    if (reason := bypass_reason(req, doc, headers)) is not None:
        return await _bypass(runtime, cache, call, req, run, reason)
    prompt = prompt_of(req)
    assert prompt is not None and cache.config.model is not None
    try:
        # The cache's own work: not the request's card, lane or key scope.
        embedded, _ = await vectors.embed(
            runtime,
            EmbedRequest(model=cache.config.model, inputs=[prompt]),
            ask.but(card=None, lane=None, grant=None),
        )
        vector = normalized(embedded.embeddings[0])
    except Exception as exc:
        described = describe_error(exc)
        if described is None:  # not an answer but a bug: the log has it
            log.warning("semantic cache: the embedding failed", exc_info=exc)
        code = described.code if described is not None else "INTERNAL"
        return await _bypass(runtime, cache, call, req, run, f"embedding_failed; code={code}")
    bucket = Bucket(
        owner=call.grant.name if call.grant is not None else "",
        model=req.model,
        lane=ask.lane or "",
        context=context_of(doc),
    )
    ttl_s = asked.ttl_s if asked.ttl_s is not None else cache.config.ttl_s
    threshold = asked.threshold if asked.threshold is not None else cache.config.threshold
    found = cache.nearest(bucket, vector, max_age_s=ttl_s)
    if found is not None and found.similarity >= threshold:
        ask.check_model(req.model)  # the key's scope now, as an engine call would check it
        cache.note(_named(runtime, req.model), "hit")
        _note_card(call, f"hit (similarity {found.similarity:.4f}, {found.age_s:.1f} s old)")
        said = {**found.entry.headers, **_said("hit", similarity=found.similarity)}
        said[AGE_HEADER] = f"{found.age_s:.1f}"
        return Reply(found.entry.body, content_type=found.entry.content_type, headers=said)
    reply = await run()
    similarity = found.similarity if found is not None else None
    if reply.status != 200 or not isinstance(reply.body, bytes):
        cache.note(_named(runtime, req.model), "miss")
        _note_card(call, "miss (the answer failed: not kept)")
        return _with(reply, _said("miss", "failed", similarity))
    if answer_tools(reply.body):
        cache.note(_named(runtime, req.model), "bypass", "answer_tools")
        _note_card(call, "bypass (answer_tools)")
        return _with(reply, _said("bypass", "answer_tools", similarity))
    kept = {k: v for k, v in (reply.headers or {}).items() if k.lower() in _KEPT_HEADERS}
    cache.put(
        bucket,
        vector,
        reply.body,
        content_type=reply.content_type,
        headers=kept,
        ttl_s=ttl_s,
        model=_named(runtime, req.model),
    )
    cache.note(_named(runtime, req.model), "miss")
    why = "empty" if found is None else "below_threshold"
    _note_card(call, f"miss ({why}; kept for {ttl_s:g} s)")
    return _with(reply, _said("miss", why, similarity))


def _named(runtime: Runtime, name: str) -> str:
    """The canonical name of a model a request resolved (``x:latest`` is ``x``), for the counts."""
    engine = runtime.engine_named(name)
    return engine.spec.model if engine is not None else name


async def _bypass(
    runtime: Runtime, cache: SemanticCache, call: Relayed, req: ChatRequest, run: Run, reason: str
) -> Reply:
    reply = await run()  # counted once answered: a model name that fails adds no series
    cache.note(_named(runtime, req.model), "bypass", reason.split(";", 1)[0])
    _note_card(call, f"bypass ({reason})")
    return _with(reply, _said("bypass", reason))


def _note_card(call: Relayed, told: str) -> None:
    if call.card is not None:
        call.card.cache = told


Answer = Callable[[Runtime, Relayed, Ask, ChatRequest], Awaitable[Reply]]


def cached(answer: Answer) -> Answer:
    """``answer`` (a chat request's whole service) behind the semantic cache."""

    @functools.wraps(answer)
    async def run(runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest) -> Reply:
        return await through(runtime, call, ask, req, lambda: answer(runtime, call, ask, req))

    return run
