"""The model doctor's job: certify what a model really does, through the gateway.

It sends one small request per capability to the daemon's own port (``self_link``), in
the OpenAI dialect (thinking in Ollama's), exactly as a client would, and judges each
answer: chat, streaming, a tool call (native or emulated by the gateway), an answer
constrained by a JSON schema, embeddings for an embedding model, images for a model with a
vision projector, thinking for a template that has it. Each verdict is PASS, FAIL or N/A
with the request and answer that show it; the certificate (actors/certificates.py) is
committed to the ledger with the engine version that answered, and admission trusts it
from then on (blazar/serve/policy/certified.py). A small model that fails a probe is a
correct result, not an error: the job completes either way. ``POST /api/model-doctor``
submits it (``blazar/web/routes/admin/doctor.py``).
"""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec
import trio

from actors.certificates import (
    Certificate,
    Probe,
    Status,
    certificate_statement,
    engine_tag,
    truncate,
)
from actors.jobs import JobContext, JobOutcome, Runner
from actors.ledger import Write
from actors.runtime import Runtime
from blazar.auth.keys import LOCAL_NAME
from blazar.serve.context import ACT_AS
from blazar.serve.jobs.self_link import SelfLink
from blazar.serve.policy.certified import CERTIFYING

__all__ = ["KIND", "DoctorRequest", "Facts", "facts_of", "runner"]

KIND = "model-doctor"
PROBE_TIMEOUT_S = 300.0
"""One probe's bound (a first probe may wait for the model to load)."""

_THINKING_MARKS = ("<think>", "enable_thinking", "reasoning_content", "thinking")

_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}
_PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class DoctorRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The doctor's request body; its job carries the model's resolved name."""

    model: str


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """What decides which probes apply, read from the store."""

    model: str
    kind: str
    projector: bool
    template: str


def runner(runtime: Runtime, link: SelfLink) -> Runner:
    """Run the doctor; its probes go to the daemon's own port through ``link``."""

    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, link, ctx)

    return run


async def facts_of(runtime: Runtime, name: str) -> Facts:
    """What the store says of model ``name`` that decides which probes apply."""

    def read() -> Facts:
        record = runtime.store.get(name)
        template = ""
        if not record.files:
            template = runtime.store.info(record).chat_template or ""
        return Facts(
            model=record.name, kind=record.kind, projector=record.projector is not None, template=template
        )

    return await trio.to_thread.run_sync(read)


async def _run(runtime: Runtime, link: SelfLink, ctx: JobContext) -> JobOutcome:
    name = msgspec.json.decode(ctx.job.request, type=DoctorRequest).model
    await ctx.restart_events()
    facts = await facts_of(runtime, name)
    probes: list[Probe] = []
    # as the local token's own caller, also on an open daemon (where tokens are not read
    # unless a request acts as someone): only that caller's CERTIFYING header counts
    headers = {CERTIFYING: "1", "x-blazar-client": f"job:{ctx.job.id}", ACT_AS: LOCAL_NAME}
    async with link.client(timeout_s=PROBE_TIMEOUT_S) as client:
        client.headers.update(headers)
        steps: list[tuple[str, Callable[[httpx.AsyncClient, Facts], Awaitable[Probe]]]] = [
            ("chat", _chat),
            ("stream", _stream),
            ("tools", _tools),
            ("json_schema", _json_schema),
            ("embeddings", _embeddings),
            ("vision", _vision),
            ("thinking", _thinking),
        ]
        if facts.kind == "embedding":
            steps = [("embeddings", _embeddings)]
        for capability, step in steps:
            started = time.perf_counter()
            try:
                probe = await step(client, facts)
            except httpx.HTTPError as exc:
                probe = Probe(capability=capability, status="FAIL", detail=f"no answer: {exc!r}")
            except ValueError as exc:  # an answer that is not the JSON its route promises
                probe = Probe(capability=capability, status="FAIL", detail=f"a malformed answer: {exc}")
            probe = msgspec.structs.replace(probe, ms=round((time.perf_counter() - started) * 1000, 1))
            probes.append(probe)
            await ctx.event("probe", msgspec.to_builtins(probe))
            await ctx.progress({"done": len(probes), "of": len(steps), "last": capability})
    explained = await runtime.explain(facts.model)
    settings = {s.name: s.value for s in explained.settings}
    cert = Certificate(
        model=facts.model,
        engine=engine_tag(settings),
        created_at=time.time(),
        probes=probes,
        job_id=ctx.job.id,
    )
    await runtime.ledger.ask(Write(statements=(certificate_statement(cert),)))
    runtime.certificates.put(cert)
    return JobOutcome(result=msgspec.json.encode(cert))


# -- the probes -----------------------------------------------------------------


def _na(capability: str, why: str) -> Probe:
    return Probe(capability=capability, status="N/A", detail=why)


def _error_text(resp: httpx.Response) -> str:
    try:
        doc = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        code = error.get("blazar_code") or error.get("code")
        return f"HTTP {resp.status_code} {code}: {error.get('message')}"
    return f"HTTP {resp.status_code}: {error or doc}"


async def _post(
    client: httpx.AsyncClient, capability: str, path: str, body: dict[str, Any]
) -> tuple[dict[str, Any] | None, Probe | None]:
    """The answer's JSON, or the FAIL probe of an error answer."""
    resp = await client.post(path, json=body)
    shown = truncate(json.dumps(body))
    if resp.status_code != 200:
        return None, Probe(
            capability=capability,
            status="FAIL",
            detail="the gateway answered with an error",
            request=shown,
            answer=truncate(_error_text(resp)),
        )
    return resp.json(), None


def _chat_body(facts: Facts, content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "model": facts.model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        **extra,
    }


def _message(doc: dict[str, Any]) -> dict[str, Any]:
    choices = doc.get("choices") or [{}]
    message: dict[str, Any] = choices[0].get("message") or {}
    return message


async def _chat(client: httpx.AsyncClient, facts: Facts) -> Probe:
    body = _chat_body(facts, "Say hello in one short sentence.", max_tokens=24)
    doc, failed = await _post(client, "chat", "/v1/chat/completions", body)
    if failed is not None or doc is None:
        return failed or _na("chat", "no answer")
    text = _message(doc).get("content") or ""
    status: Status = "PASS" if text.strip() else "FAIL"
    detail = "a non-empty answer" if status == "PASS" else "the answer was empty"
    return Probe(
        capability="chat",
        status=status,
        detail=detail,
        request=truncate(json.dumps(body)),
        answer=truncate(text),
    )


async def _stream(client: httpx.AsyncClient, facts: Facts) -> Probe:
    body = _chat_body(facts, "Count from one to five.", max_tokens=24, stream=True)
    shown = truncate(json.dumps(body))
    text, chunks, done = [], 0, False
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return Probe(
                capability="stream", status="FAIL", detail="the gateway answered with an error",
                request=shown, answer=truncate(_error_text(resp)),
            )  # fmt: skip
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                return Probe(
                    capability="stream", status="FAIL", detail="the stream ended with an error event",
                    request=shown, answer=truncate(data),
                )  # fmt: skip
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    chunks += 1
                    text.append(piece)
    answer = "".join(text)
    if chunks and done:
        return Probe(
            capability="stream", status="PASS", detail=f"{chunks} content chunks, then [DONE]",
            request=shown, answer=truncate(answer),
        )  # fmt: skip
    why = "no content chunk" if not chunks else "the stream did not end with [DONE]"
    return Probe(capability="stream", status="FAIL", detail=why, request=shown, answer=truncate(answer))


async def _tools(client: httpx.AsyncClient, facts: Facts) -> Probe:
    body = _chat_body(
        facts,
        "What is the weather in Paris right now? Call the get_weather tool.",
        tools=[_WEATHER_TOOL],
        max_tokens=96,
    )
    doc, failed = await _post(client, "tools", "/v1/chat/completions", body)
    if failed is not None or doc is None:
        return failed or _na("tools", "no answer")
    message = _message(doc)
    calls = message.get("tool_calls") or []
    shown = truncate(json.dumps(body))
    shown_calls = [c.get("function") for c in calls]  # the name and arguments, not the call's id
    answer = truncate(json.dumps(shown_calls) if calls else str(message.get("content") or ""))
    if not calls:
        return Probe(
            capability="tools",
            status="FAIL",
            detail="no tool call in the answer",
            request=shown,
            answer=answer,
        )
    function = calls[0].get("function") or {}
    try:
        args = json.loads(function.get("arguments") or "")
    except ValueError:
        args = None
    if function.get("name") != "get_weather":
        why = f"it called {function.get('name')!r}, not get_weather"
    elif not isinstance(args, dict) or not isinstance(args.get("city"), str):
        why = "its arguments are not an object with the required string `city`"
    else:
        return Probe(
            capability="tools", status="PASS", detail="a get_weather call with a city",
            request=shown, answer=answer,
        )  # fmt: skip
    return Probe(capability="tools", status="FAIL", detail=why, request=shown, answer=answer)


async def _json_schema(client: httpx.AsyncClient, facts: Facts) -> Probe:
    body = _chat_body(
        facts,
        "Describe a person named Ada who is 36 years old, as JSON with her name and age.",
        max_tokens=96,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": _PERSON_SCHEMA, "strict": True},
        },
    )
    doc, failed = await _post(client, "json_schema", "/v1/chat/completions", body)
    if failed is not None or doc is None:
        return failed or _na("json_schema", "no answer")
    text = _message(doc).get("content") or ""
    shown, answer = truncate(json.dumps(body)), truncate(text)
    try:
        value = json.loads(text)
    except ValueError:
        return Probe(
            capability="json_schema",
            status="FAIL",
            detail="the answer is not JSON",
            request=shown,
            answer=answer,
        )
    if not isinstance(value, dict) or set(value) != {"name", "age"}:
        why = "the answer is not an object with exactly `name` and `age`"
    elif not isinstance(value["name"], str) or not isinstance(value["age"], int):
        why = "`name` is not a string or `age` not an integer"
    else:
        return Probe(
            capability="json_schema",
            status="PASS",
            detail="JSON that matches the schema",
            request=shown,
            answer=answer,
        )
    return Probe(capability="json_schema", status="FAIL", detail=why, request=shown, answer=answer)


async def _embeddings(client: httpx.AsyncClient, facts: Facts) -> Probe:
    if facts.kind != "embedding":
        return _na("embeddings", "not an embedding model (it does not claim embeddings)")
    body = {"model": facts.model, "input": ["a cat sat on the mat", "stock prices fell sharply"]}
    doc, failed = await _post(client, "embeddings", "/v1/embeddings", body)
    if failed is not None or doc is None:
        return failed or _na("embeddings", "no answer")
    rows = doc.get("data") or []
    vectors = [row.get("embedding") or [] for row in rows]
    dims = sorted({len(v) for v in vectors})
    shown = truncate(json.dumps(body))
    answer = f"{len(vectors)} vectors of dimensions {dims}"
    ok = len(vectors) == 2 and len(dims) == 1 and dims[0] > 0 and vectors[0] != vectors[1]
    if ok:
        return Probe(
            capability="embeddings",
            status="PASS",
            detail="two distinct vectors",
            request=shown,
            answer=answer,
        )
    return Probe(
        capability="embeddings",
        status="FAIL",
        detail="not two distinct vectors of one size",
        request=shown,
        answer=answer,
    )


def _red_png(size: int = 32) -> bytes:
    """A plain red square, as PNG (made here: no image file ships with the daemon)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * size for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def _vision(client: httpx.AsyncClient, facts: Facts) -> Probe:
    if not facts.projector:
        return _na("vision", "no vision projector")
    url = "data:image/png;base64," + base64.b64encode(_red_png()).decode()
    content = [
        {"type": "text", "text": "What color is this image? Answer with one word."},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    body = _chat_body(facts, content, max_tokens=16)
    doc, failed = await _post(client, "vision", "/v1/chat/completions", body)
    if failed is not None or doc is None:
        return failed or _na("vision", "no answer")
    text = _message(doc).get("content") or ""
    shown = truncate(json.dumps(body).replace(url, "data:image/png;base64,…"))
    if "red" in text.lower():
        return Probe(
            capability="vision",
            status="PASS",
            detail="it named the red square's color",
            request=shown,
            answer=truncate(text),
        )
    return Probe(
        capability="vision",
        status="FAIL",
        detail="it did not name the color of a red square",
        request=shown,
        answer=truncate(text),
    )


async def _thinking(client: httpx.AsyncClient, facts: Facts) -> Probe:
    if not any(mark in facts.template for mark in _THINKING_MARKS):
        return _na("thinking", "the chat template has no thinking section")
    body = {
        "model": facts.model,
        "messages": [{"role": "user", "content": "Is 17 a prime number? Think, then answer yes or no."}],
        "think": True,
        "stream": False,
        "options": {"num_predict": 256, "temperature": 0},
    }
    resp = await client.post("/api/chat", json=body)
    shown = truncate(json.dumps(body))
    if resp.status_code != 200:
        return Probe(
            capability="thinking", status="FAIL", detail="the gateway answered with an error",
            request=shown, answer=truncate(_error_text(resp)),
        )  # fmt: skip
    message = resp.json().get("message") or {}
    thinking = str(message.get("thinking") or "")
    answer = truncate(f"thinking: {thinking!r} content: {message.get('content')!r}")
    if thinking.strip():
        return Probe(
            capability="thinking",
            status="PASS",
            detail="a separate thinking part",
            request=shown,
            answer=answer,
        )
    return Probe(
        capability="thinking",
        status="FAIL",
        detail="no thinking part in the answer",
        request=shown,
        answer=answer,
    )
