"""Does a version of a lane really work? A capability probe against a real model, and the gate.

``probe`` starts the lane's engine for a model through the same engine actor the daemon
uses, and checks what the lane claims: start and health, a chat answer, a stream, a tool
call the way the gateway emulates one (an answer constrained to the tool's JSON shape), a
JSON-schema answer, embeddings (after a restart with them on), and the decode speed of
fixed-length answers (several rounds, so that one slow answer does not decide). ``gate`` is
the regression decision on those speeds.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from actors.config import EngineConfig
from actors.engine import EngineActor, EngineHandle, EnsureReady, Reconfigure
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec
from actors.errors import BlazarRuntimeError

__all__ = ["Check", "ProbeReport", "gate", "probe"]

_HI = [{"role": "user", "content": "Say hello."}]
_TOOL_SHAPE = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
_ANSWER_SHAPE = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
_SPEED_TOKENS = 32


class Check(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ok: bool | None
    """None: not applicable (the lane does not claim it)."""
    detail: str


class ProbeReport(msgspec.Struct, frozen=True, kw_only=True):
    lane: str
    kind: str
    release: str | None
    version: str | None
    """What the engine reported itself as."""
    model: str
    checks: list[Check]
    decode_tps: float | None
    """The median of ``rates``."""
    passed: bool
    rates: list[float] = []
    """Tokens per second of each timed answer, in order (empty when one failed)."""


def gate(new: Sequence[float], current: Sequence[float], margin: float) -> tuple[bool, str]:
    """May a version whose timed answers ran at ``new`` tokens per second replace one that ran at
    ``current``? Their medians are compared, so one answer slowed by other work on the machine
    does not decide; the new median must not fall more than ``margin`` below the current one."""
    if not new:
        return False, "the new version's decode speed could not be measured"
    if not current:
        return True, f"{statistics.median(new):.1f} tok/s; no speed of the current version to compare with"
    ours, theirs = statistics.median(new), statistics.median(current)
    ratio = ours / theirs if theirs > 0 else 1.0
    ok = ratio >= 1 - margin
    return ok, (
        f"{ours:.1f} tok/s against {theirs:.1f} for the current version (medians of {len(new)} and "
        f"{len(current)} answers): the new one runs at {ratio:.0%} of its speed, "
        f"{'within' if ok else 'below'} the {margin:.0%} margin (at least {1 - margin:.0%})"
    )


async def _chat(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    payload = {"messages": _HI, "temperature": 0, **body}
    try:
        resp = await client.post("/v1/chat/completions", json=payload, timeout=120)
    except httpx.RemoteProtocolError:  # a kept-alive connection the engine closed meanwhile: once more
        resp = await client.post("/v1/chat/completions", json=payload, timeout=120)
    if resp.status_code != 200:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    return dict(resp.json())


def _content(doc: dict[str, Any]) -> str:
    return str(((doc.get("choices") or [{}])[0].get("message") or {}).get("content") or "")


async def _answer(client: httpx.AsyncClient) -> str:
    text = _content(await _chat(client, max_tokens=8))
    if not text.strip():
        raise RuntimeError("an empty answer")
    return repr(text[:60])


async def _stream(client: httpx.AsyncClient) -> str:
    try:
        return await _stream_once(client)
    except httpx.RemoteProtocolError:  # as in ``_chat``: once more on a fresh connection
        return await _stream_once(client)


async def _stream_once(client: httpx.AsyncClient) -> str:
    pieces, done = 0, False
    body = {"messages": _HI, "max_tokens": 8, "temperature": 0, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body, timeout=120) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}")
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: ") and '"content"' in line:
                pieces += 1
    if pieces < 2 or not done:
        raise RuntimeError(f"{pieces} content chunks, [DONE] {'seen' if done else 'missing'}")
    return f"{pieces} chunks, then [DONE]"


async def _constrained(client: httpx.AsyncClient, schema: dict[str, Any], prompt: str) -> dict[str, Any]:
    fmt = {"type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}
    doc = await _chat(
        client, messages=[{"role": "user", "content": prompt}], max_tokens=48, response_format=fmt
    )
    return dict(json.loads(_content(doc)))


async def _tool(client: httpx.AsyncClient) -> str:
    call = await _constrained(client, _TOOL_SHAPE, "What is the weather in Paris? Call get_weather.")
    if call["name"] != "get_weather" or not isinstance(call["arguments"]["city"], str):
        raise RuntimeError(f"not a get_weather call: {call}")
    return f"get_weather({json.dumps(call['arguments'])})"


async def _schema(client: httpx.AsyncClient) -> str:
    doc = await _constrained(client, _ANSWER_SHAPE, "How many legs has a cat? Answer in JSON.")
    if not isinstance(doc["answer"], int):
        raise RuntimeError(f"not the schema's shape: {doc}")
    return json.dumps(doc)


async def _decode_rate(client: httpx.AsyncClient) -> float:
    """Tokens per second of one fixed-length answer, as the engine timed it where it says."""
    t0 = time.perf_counter()
    doc = await _chat(client, max_tokens=_SPEED_TOKENS, ignore_eos=True)
    rate = (doc.get("timings") or {}).get("predicted_per_second")
    if not isinstance(rate, int | float):
        n = int((doc.get("usage") or {}).get("completion_tokens") or _SPEED_TOKENS)
        rate = n / (time.perf_counter() - t0)
    return float(rate)


class _Probed:
    """One version's engine while it is probed: the checks so far and its decode rates."""

    def __init__(self, lane: Lane, engine: EngineActor) -> None:
        self.lane, self.engine = lane, engine
        self.handle: EngineHandle | None = None
        self.version: str | None = None
        self.checks: list[Check] = []
        self.rates: list[float] = []
        self.speed_error: str | None = None

    async def check(self, name: str, claimed: bool, fn: Callable[[], Awaitable[str]]) -> None:
        if not claimed:
            self.checks.append(Check(name=name, ok=None, detail=f"{self.lane.name} does not claim it"))
            return
        try:
            self.checks.append(Check(name=name, ok=True, detail=await fn()))
        except (httpx.HTTPError, BlazarRuntimeError, RuntimeError, ValueError, LookupError, TypeError) as exc:
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            self.checks.append(Check(name=name, ok=False, detail=message))

    async def capabilities(self) -> None:
        if self.handle is None:
            return
        client, caps = self.handle.client, self.lane.capabilities
        await self.check("chat", "chat" in caps, lambda: _answer(client))
        await self.check("stream", "chat" in caps, lambda: _stream(client))
        await self.check("tool call", "json_schema" in caps, lambda: _tool(client))
        await self.check("json schema", "json_schema" in caps, lambda: _schema(client))

    async def measure(self) -> None:
        """One decode-speed round (none after a failed one: its speed is not known)."""
        if self.handle is None or self.speed_error is not None:
            return
        try:
            self.rates.append(await _decode_rate(self.handle.client))
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            self.speed_error = str(exc) or type(exc).__name__

    async def embeddings(self) -> None:
        """Last: the engine restarts with embeddings on."""
        if self.handle is None:
            return

        async def run() -> str:
            await self.engine.ask(Reconfigure(embeddings=True))
            again = await self.engine.ask(EnsureReady())
            resp = await again.client.post("/v1/embeddings", json={"input": "hello"}, timeout=60)
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            vector = resp.json()["data"][0]["embedding"]
            if not isinstance(vector, list) or not vector:
                raise RuntimeError("no vector")
            return f"{len(vector)} dimensions"

        await self.check("embeddings", "embeddings" in self.lane.capabilities, run)

    def report(self, spec: LaunchSpec) -> ProbeReport:
        checks = list(self.checks)
        if self.handle is not None:
            if self.speed_error is not None or not self.rates:
                checks.append(Check(name="decode speed", ok=False, detail=self.speed_error or "not measured"))
            else:
                spread = f", {min(self.rates):.1f}-{max(self.rates):.1f}" if len(self.rates) > 1 else ""
                checks.append(Check(name="decode speed", ok=True, detail=(
                    f"{statistics.median(self.rates):.1f} tok/s (median of {len(self.rates)} answers of "
                    f"{_SPEED_TOKENS} tokens{spread})")))  # fmt: skip
        return ProbeReport(
            lane=self.lane.name,
            kind=self.lane.kind,
            release=self.lane.release,
            version=self.version,
            model=spec.model,
            checks=checks,
            decode_tps=statistics.median(self.rates) if self.rates and self.speed_error is None else None,
            rates=list(self.rates) if self.speed_error is None else [],
            passed=bool(checks) and all(c.ok is not False for c in checks),
        )


def _probe_spec(lane: Lane, spec: LaunchSpec) -> LaunchSpec:
    return msgspec.structs.replace(spec, slots=1, embeddings=False, engine_version=lane.release)


@asynccontextmanager
async def _opened(lane: Lane, spec: LaunchSpec, config: EngineConfig) -> AsyncIterator[_Probed]:
    """``spec``'s model started on ``lane`` (one slot, its own child and run dir), stopped after."""
    with tempfile.TemporaryDirectory(prefix="blazar-probe-") as run_dir:
        engine = EngineActor(spec, config, run_dir=Path(run_dir), lane=lane)
        probed = _Probed(lane, engine)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            try:
                try:
                    with trio.fail_after(config.start_timeout_s + 10):
                        probed.handle = await engine.ask(EnsureReady())
                    probed.checks.append(
                        Check(name="start and health", ok=True, detail=f"pid {probed.handle.pid}")
                    )
                    probed.version = await trio.to_thread.run_sync(lane.version)
                except (BlazarRuntimeError, trio.TooSlowError, httpx.HTTPError) as exc:
                    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                    # The operator's own check: the child's last words belong in it, where a
                    # client's error leaves them out.
                    said = getattr(exc, "stderr_tail", "") or _last_line(engine.statistics().stderr_tail)
                    detail = f"{message} ({said})" if said else message
                    probed.checks.append(Check(name="start and health", ok=False, detail=detail))
                    probed.handle = None
                yield probed
            finally:
                nursery.cancel_scope.cancel()


async def probe(
    lane: Lane, spec: LaunchSpec, config: EngineConfig, *, rounds: int = 3, speed_only: bool = False
) -> ProbeReport:
    """Start ``spec``'s model on ``lane`` (one slot, its own child), check it, stop it.

    ``speed_only``: start and health and the timed answers, nothing else: what the gate needs
    of the version already serving (its capabilities are not in question, and checking its
    embeddings would cost the time of a second start)."""
    spec = _probe_spec(lane, spec)
    async with _opened(lane, spec, config) as probed:
        if not speed_only:
            await probed.capabilities()
        for _ in range(rounds):
            await probed.measure()
        if not speed_only:
            await probed.embeddings()
    return probed.report(spec)


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""
