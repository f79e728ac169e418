"""``blazar why``: the story of one request, told from its ledger record.

Pure: the facts come in (the ledger's ``RequestRecord``, plus what the daemon
still holds in memory about a recent request: the requests that waited ahead of
it, the models evicted for it, how it ended), a ``Story`` comes out — the same
facts as fields for programs and as sentences for people. ``pick`` chooses the
request to explain when none is named: the last one that failed, else the
slowest recent one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from actors.engines.degrades import DEGRADES, Degrade
from actors.ledger import RequestRecord
from blazar.errors import CATALOG

__all__ = ["EngineDegrade", "Extras", "Story", "pick", "tell"]


class Extras(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon still knows of a recent request beyond its ledger record."""

    state: str | None = None
    """How it ended (done, failed, cancelled, interrupted, disconnected) or where it is now."""
    reason: str | None = None
    queue_ahead: int | None = None
    evicted: tuple[str, ...] = ()
    failover: tuple[str, ...] = ()
    """A failover chain's walk: each target passed over and why, then the one that served."""
    drafted: int | None = None
    """Tokens speculative decoding drafted for it; None: it did not speculate."""
    accepted: int | None = None
    speculation: str | None = None
    """Why the speculation governor parked its model's speculation, if it did."""
    engine_degrades: tuple[Degrade, ...] = ()
    """What its model's engine logged at start it does less than asked."""
    cache: str | None = None
    """What the semantic cache did for it: ``hit (…)``, ``miss (…)`` or ``bypass (reason)``."""


class EngineDegrade(msgspec.Struct, frozen=True, kw_only=True):
    """One way the model's engine runs with less than asked: ``X-Blazar-Warnings``'s name for
    it, what that means, and the engine's own log line (local paths replaced)."""

    name: str
    meaning: str
    line: str


class Story(msgspec.Struct, frozen=True, kw_only=True):
    trace_id: str
    started_at: float
    route: str
    dialect: str | None
    model: str | None
    key: str | None
    engine: str | None
    status: int
    outcome: str
    """ok, failed, cancelled, interrupted, disconnected, or (live) queued/running."""
    duration_ms: float
    queue_ms: float | None
    queue_ahead: int | None
    loaded: bool
    load_ms: float | None
    evicted: list[str]
    ttft_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    code: str | None
    error: str | None
    cause: str | None
    """What the error code means, from the catalog (``GET /api/errors``)."""
    slowest: str | None
    """The phase that took most of its time, when one clearly did."""
    tools: list[dict[str, Any]]
    """The MCP tool calls the gateway ran for it (``tool``, ``ok``, ``why``, ``ms``)."""
    lines: list[str]
    """The story in sentences, as ``blazar why`` prints it."""
    failover: list[str] = []
    """Asked of a failover chain: each target passed over and why, then the one that served."""
    drafted: int | None = None
    """Tokens speculative decoding drafted for it (None: it did not speculate), and kept."""
    accepted: int | None = None
    engine_degrades: list[EngineDegrade] = []
    """The panel of its model's engine degrades (the engine that serves the model now)."""
    cache: str | None = None
    """What the semantic cache did for it (hit, miss or bypass, and why); None: not asked."""


_LOADED_MS = 100.0
"""A wait for the engine longer than this means it was started for the request."""


def pick(records: Sequence[RequestRecord]) -> RequestRecord | None:
    """The request to explain when none is named: among recent requests for a model, the
    newest that failed, else the slowest. ``records`` are newest first."""
    served = [r for r in records if r.model is not None]
    failed = next((r for r in served if _failed(r)), None)
    if failed is not None:
        return failed
    return max(served, key=lambda r: r.duration_ms, default=None)


def _failed(r: RequestRecord) -> bool:
    return r.status >= 400 or r.error is not None


def _outcome(r: RequestRecord, extras: Extras | None) -> str:
    state = extras.state if extras is not None else None
    if state in ("cancelled", "interrupted", "disconnected", "queued", "running"):
        return state
    if r.status == 499:
        return "disconnected"
    return "failed" if _failed(r) else "ok"


def _s(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def _rate(tokens: int | None, ms: float | None) -> str:
    if not tokens or not ms:
        return ""
    return f" ({tokens / (ms / 1000):.0f} tokens/s)"


def _phases(r: RequestRecord) -> dict[str, float]:
    phases = {"waiting for a slot": r.queue_ms or 0.0, "loading the engine": r.load_ms or 0.0}
    phases["reading the prompt"] = r.prefill_ms or 0.0
    phases["generating"] = r.decode_ms or 0.0
    return phases


def _slowest(r: RequestRecord) -> str | None:
    phases = _phases(r)
    name, ms = max(phases.items(), key=lambda kv: kv[1])
    if r.duration_ms <= 0 or ms < 0.5 * r.duration_ms:
        return None
    return name


_TOOL_WHY = {
    "timeout": "timed out",
    "unavailable": "its server could not start",
    "disconnected": "its server went away",
    "protocol": "the server refused the call",
    "unknown_server": "no such server",
    "unknown_tool": "no such tool",
    "denied": "the key may not use it",
    "not_approved": "it needs approval (x-blazar-mcp-approve)",
    "bad_arguments": "the model's arguments were not a JSON object",
    "tool_error": "the tool reported an error",
}


def _tool_calls(tools: list[dict[str, Any]]) -> str:
    def one(t: dict[str, Any]) -> str:
        how = "ok" if t.get("ok") else _TOOL_WHY.get(str(t.get("why")), str(t.get("why") or "failed"))
        cut = f", {t['truncated_bytes']} bytes cut" if t.get("truncated_bytes") else ""
        return f"{t.get('tool')} ({how}, {_s(float(t.get('ms') or 0.0))}{cut})"

    return "; ".join(one(t) for t in tools)


def tell(r: RequestRecord, extras: Extras | None = None) -> Story:
    """The story of request ``r``."""
    outcome = _outcome(r, extras)
    loaded = (r.load_ms or 0.0) > _LOADED_MS
    evicted = list(extras.evicted) if extras is not None else []
    ahead = extras.queue_ahead if extras is not None else None
    code = r.blazar_code
    cause = CATALOG[code].meaning if code in CATALOG else None
    error = r.error or (extras.reason if extras is not None else None)
    slowest = _slowest(r)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at))
    who = f" with key '{r.key}'" if r.key else ""
    dialect = f" ({r.dialect})" if r.dialect else ""
    model = f" for {r.model}" if r.model else ""
    lines = [
        f"{r.trace_id}: {r.method} {r.path}{dialect}{model}{who}, at {when}: "
        f"{outcome}, status {r.status}, in {_s(r.duration_ms)}."
    ]
    walk = list(extras.failover) if extras is not None else []
    if walk:
        lines.append(f"It was asked of a failover chain: {'; '.join(walk)}.")
    cache = extras.cache if extras is not None else None
    if cache is not None:
        lines.append(_cache_line(cache))
    if r.queue_ms is not None:
        if r.queue_ms < 1 and not ahead:
            lines.append("It got an engine slot at once.")
        else:
            waited = f"{ahead} request{'s' if ahead != 1 else ''} waited ahead of it" if ahead else None
            lines.append(
                f"It waited {_s(r.queue_ms)} for an engine slot" + (f"; {waited}." if waited else ".")
            )
    if loaded:
        engine = f" ({r.engine})" if r.engine else ""
        made_room = f", after evicting {', '.join(evicted)} to make room" if evicted else ""
        lines.append(f"Its engine{engine} was started for it and took {_s(r.load_ms or 0.0)}{made_room}.")
    elif r.load_ms is not None:
        lines.append(f"Its engine{f' ({r.engine})' if r.engine else ''} was already loaded.")
    if r.prefill_ms is not None:
        tokens = f"the {r.prompt_tokens}-token prompt" if r.prompt_tokens is not None else "the prompt"
        lines.append(f"The engine read {tokens} in {_s(r.prefill_ms)}{_rate(r.prompt_tokens, r.prefill_ms)}.")
    if r.decode_ms is not None or r.completion_tokens is not None:
        n = r.completion_tokens if r.completion_tokens is not None else "some"
        took = f" in {_s(r.decode_ms)}" if r.decode_ms is not None else ""
        lines.append(f"It generated {n} tokens{took}{_rate(r.completion_tokens, r.decode_ms)}.")
    drafted = extras.drafted if extras is not None else None
    accepted = extras.accepted if extras is not None else None
    if drafted:
        kept = accepted or 0
        lines.append(
            f"Speculative decoding drafted {drafted} tokens; the model kept {kept} ({kept / drafted:.0%})."
        )
    if extras is not None and extras.speculation:
        lines.append(f"Speculation for {r.model}: the governor {extras.speculation}.")
    degrades = [
        EngineDegrade(name=d.name, meaning=DEGRADES.get(d.name, d.name), line=d.line)
        for d in (extras.engine_degrades if extras is not None else ())
    ]
    for d in degrades:
        lines.append(f"Its engine runs degraded, {d.name}: {d.meaning} (the engine said: {d.line}).")
    if r.ttft_ms is not None:
        lines.append(f"The first byte of the answer left after {_s(r.ttft_ms)}.")
    tools: list[dict[str, Any]] = msgspec.json.decode(r.tools) if r.tools else []
    if tools:
        lines.append(
            f"It ran {len(tools)} MCP tool call{'s' if len(tools) != 1 else ''}: {_tool_calls(tools)}."
        )
    if slowest is not None and outcome == "ok":
        share = _phases(r)[slowest] / r.duration_ms
        lines.append(f"Most of its time ({share:.0%}) went to {slowest}.")
    if outcome != "ok" and (code or error):
        what = f"{code}: " if code else ""
        lines.append(f"It ended with {what}{error or cause or ''}".rstrip() + ".")
        if cause and error:
            lines.append(f"{code} means: {cause}")
    return Story(
        trace_id=r.trace_id,
        started_at=r.started_at,
        route=f"{r.method} {r.path}",
        dialect=r.dialect,
        model=r.model,
        key=r.key,
        engine=r.engine,
        status=r.status,
        outcome=outcome,
        duration_ms=r.duration_ms,
        queue_ms=r.queue_ms,
        queue_ahead=ahead,
        loaded=loaded,
        load_ms=r.load_ms,
        evicted=evicted,
        ttft_ms=r.ttft_ms,
        prefill_ms=r.prefill_ms,
        decode_ms=r.decode_ms,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        code=code,
        error=error,
        cause=cause,
        slowest=slowest,
        tools=tools,
        lines=lines,
        failover=walk,
        drafted=drafted,
        accepted=accepted,
        engine_degrades=degrades,
        cache=cache,
    )


def _cache_line(cache: str) -> str:
    if cache.startswith("hit"):
        return f"The semantic cache answered it with a kept answer, no engine ran: {cache}."
    return f"The semantic cache: {cache}."
