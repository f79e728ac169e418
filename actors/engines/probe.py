"""Does a version of a lane really work? A capability probe against a real model, and the gate.

``probe`` starts the lane's engine for a model through the same engine actor the daemon
uses, and checks what the lane claims: start and health, a chat answer, a stream, a tool
call the way the gateway emulates one (an answer constrained to the tool's JSON shape), a
JSON-schema answer, embeddings (after a restart with them on), and the decode speed of a
fixed-length answer. ``gate`` is the regression decision on that speed.
"""

from __future__ import annotations

import json
import tempfile
import time
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
    passed: bool


def gate(new_tps: float | None, current_tps: float | None, margin: float) -> tuple[bool, str]:
    """May a version with decode speed ``new_tps`` replace one with ``current_tps``?"""
    if new_tps is None:
        return False, "the new version's decode speed could not be measured"
    if current_tps is None:
        return True, f"{new_tps:.1f} tok/s; no speed of the current version to compare with"
    floor = current_tps * (1 - margin)
    verdict = "within" if new_tps >= floor else "below"
    return new_tps >= floor, (
        f"{new_tps:.1f} tok/s against {current_tps:.1f} for the current version: {verdict} the "
        f"{margin:.0%} margin (at least {floor:.1f})"
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


async def _run_checks(
    lane: Lane, engine: EngineActor, handle: EngineHandle
) -> tuple[list[Check], float | None]:
    client, checks = handle.client, []

    async def check(name: str, claimed: bool, fn: Any) -> None:
        if not claimed:
            checks.append(Check(name=name, ok=None, detail=f"{lane.name} does not claim it"))
            return
        try:
            checks.append(Check(name=name, ok=True, detail=await fn()))
        except (httpx.HTTPError, BlazarRuntimeError, RuntimeError, ValueError, LookupError, TypeError) as exc:
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            checks.append(Check(name=name, ok=False, detail=message))

    async def chat() -> str:
        text = _content(await _chat(client, max_tokens=8))
        if not text.strip():
            raise RuntimeError("an empty answer")
        return repr(text[:60])

    async def stream() -> str:
        try:
            return await stream_once()
        except httpx.RemoteProtocolError:  # as in ``_chat``: once more on a fresh connection
            return await stream_once()

    async def stream_once() -> str:
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

    async def constrained(schema: dict[str, Any], prompt: str) -> dict[str, Any]:
        fmt = {"type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}
        doc = await _chat(
            client, messages=[{"role": "user", "content": prompt}], max_tokens=48, response_format=fmt
        )
        return dict(json.loads(_content(doc)))

    async def tool() -> str:
        call = await constrained(_TOOL_SHAPE, "What is the weather in Paris? Call get_weather.")
        if call["name"] != "get_weather" or not isinstance(call["arguments"]["city"], str):
            raise RuntimeError(f"not a get_weather call: {call}")
        return f"get_weather({json.dumps(call['arguments'])})"

    async def schema() -> str:
        doc = await constrained(_ANSWER_SHAPE, "How many legs has a cat? Answer in JSON.")
        if not isinstance(doc["answer"], int):
            raise RuntimeError(f"not the schema's shape: {doc}")
        return json.dumps(doc)

    caps = lane.capabilities
    await check("chat", "chat" in caps, chat)
    await check("stream", "chat" in caps, stream)
    await check("tool call", "json_schema" in caps, tool)
    await check("json schema", "json_schema" in caps, schema)
    speed = None
    try:
        rates = []
        for _ in range(2):
            t0 = time.perf_counter()
            doc = await _chat(client, max_tokens=_SPEED_TOKENS, ignore_eos=True)
            timings = doc.get("timings") or {}
            rate = timings.get("predicted_per_second")
            if not isinstance(rate, int | float):
                n = int((doc.get("usage") or {}).get("completion_tokens") or _SPEED_TOKENS)
                rate = n / (time.perf_counter() - t0)
            rates.append(float(rate))
        speed = max(rates)
        checks.append(
            Check(name="decode speed", ok=True, detail=f"{speed:.1f} tok/s ({_SPEED_TOKENS} tokens)")
        )
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        checks.append(Check(name="decode speed", ok=False, detail=str(exc)))

    async def embeddings() -> str:  # last: the engine restarts with them on
        await engine.ask(Reconfigure(embeddings=True))
        again = await engine.ask(EnsureReady())
        resp = await again.client.post("/v1/embeddings", json={"input": "hello"}, timeout=60)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        vector = resp.json()["data"][0]["embedding"]
        if not isinstance(vector, list) or not vector:
            raise RuntimeError("no vector")
        return f"{len(vector)} dimensions"

    await check("embeddings", "embeddings" in caps, embeddings)
    return checks, speed


async def probe(lane: Lane, spec: LaunchSpec, config: EngineConfig) -> ProbeReport:
    """Start ``spec``'s model on ``lane`` (one slot, its own child), check it, stop it."""
    spec = msgspec.structs.replace(spec, slots=1, embeddings=False, engine_version=lane.release)
    checks: list[Check] = []
    speed = version = None
    with tempfile.TemporaryDirectory(prefix="blazar-probe-") as run_dir:
        engine = EngineActor(spec, config, run_dir=Path(run_dir), lane=lane)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            try:
                with trio.fail_after(config.start_timeout_s + 10):
                    handle = await engine.ask(EnsureReady())
                checks.append(Check(name="start and health", ok=True, detail=f"pid {handle.pid}"))
                version = await trio.to_thread.run_sync(lane.version)
                found, speed = await _run_checks(lane, engine, handle)
                checks += found
            except (BlazarRuntimeError, trio.TooSlowError, httpx.HTTPError) as exc:
                message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                checks.append(Check(name="start and health", ok=False, detail=message))
            finally:
                nursery.cancel_scope.cancel()
    return ProbeReport(
        lane=lane.name,
        kind=lane.kind,
        release=lane.release,
        version=version,
        model=spec.model,
        checks=checks,
        decode_tps=speed,
        passed=bool(checks) and all(c.ok is not False for c in checks),
    )
