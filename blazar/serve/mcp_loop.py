"""The MCP tool loop, run by the gateway for a client that knows nothing of MCP.

A request that selects MCP servers (its ``"mcp"`` field, the ``x-blazar-mcp`` header, else
``mcp_default``) is offered their tools as ``mcp__<server>__<tool>`` beside its own. Each
round the model's calls to those tools are run (side by side), their results fed back as
tool messages, and the model asked again, up to the servers' ``max_rounds``; the last
allowed round may not call tools, so the answer ends in text. A call to one of the client's
own tools ends the loop and goes back to the client as usual.

One loop serves streams and whole answers: ``McpStream`` runs each round as an engine
stream through the dialect's encoder, passing the model's words on as they come and holding
back its calls to MCP tools; between rounds a ``Report`` tells the client what runs, in a
way its dialect allows (SSE comments, the Responses API's ``mcp_call`` items, nothing on
Ollama's NDJSON). A whole answer is the same stream gathered. The loop works on the neutral
request, so every dialect that translates runs the same one.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import trio

from actors.mcp_results import McpCallResult, error_result, split_qualified
from actors.runtime import Runtime
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    Delta,
    Message,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
    Usage,
)
from blazar.dialects.responses_stream import StreamEncoder as ResponsesEncoder
from blazar.errors import BlazarError
from blazar.serve import engine_call
from blazar.serve.cards import set_stream_enders
from blazar.serve.context import APPROVE_HEADER as APPROVE
from blazar.serve.context import Ask, Relayed
from blazar.serve.engine_call import StreamEncoder, Timings
from blazar.serve.mcp_compact import META, Compact, Lookup, lookup_result

__all__ = [
    "SILENT",
    "SSE_COMMENTS",
    "McpRun",
    "McpStream",
    "Report",
    "ResponsesItems",
    "answer",
    "drain",
    "selected_servers",
]

HEADER = "x-blazar-mcp"


@dataclass(slots=True)
class McpRun:
    """What the loop did: the rounds that ran tools, the calls, and each call's outcome."""

    servers: list[str]
    rounds: int = 0
    calls: int = 0
    results: list[McpCallResult] = field(default_factory=list)
    lookups: int = 0
    """Meta-calls of a compact catalog the gateway answered itself (finding, reading a schema)."""

    def header(self) -> str:
        looked = f", lookups={self.lookups}" if self.lookups else ""
        return f"rounds={self.rounds}, calls={self.calls}{looked}"


class Report(Protocol):
    """How a dialect tells its client about the tool calls the gateway runs."""

    def calling(self, call: ToolCall) -> bytes: ...
    def called(self, call: ToolCall, result: McpCallResult) -> bytes: ...
    def ended(self, run: McpRun) -> bytes: ...


class _Silent:
    def calling(self, call: ToolCall) -> bytes:
        return b""

    def called(self, call: ToolCall, result: McpCallResult) -> bytes:
        return b""

    def ended(self, run: McpRun) -> bytes:
        return b""


class _SseComments:
    """SSE comment lines, which every SSE reader skips: a person or a proxy log sees them."""

    def calling(self, call: ToolCall) -> bytes:
        return f": mcp calling {call.name}\n\n".encode()

    def called(self, call: ToolCall, result: McpCallResult) -> bytes:
        how = f"error ({result.why or 'tool'})" if result.is_error else "ok"
        return f": mcp called {call.name}: {how} in {result.elapsed_s * 1000:.0f} ms\n\n".encode()

    def ended(self, run: McpRun) -> bytes:
        return f": {HEADER} {run.header()}\n\n".encode()


class ResponsesItems:
    """The calls shown as the Responses API's ``mcp_call`` output items, as they run."""

    def __init__(self, encoder: ResponsesEncoder) -> None:
        self._encoder = encoder

    def calling(self, call: ToolCall) -> bytes:
        server, tool = split_qualified(call.name) or ("", call.name)
        return self._encoder.mcp_started(call.id, server, tool, call.arguments)

    def called(self, call: ToolCall, result: McpCallResult) -> bytes:
        error: dict[str, Any] | None = None
        if result.is_error and result.why is None:  # the tool's own error
            error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": result.text}]}
        elif result.is_error:  # one the gateway met: no answer, a refusal, a timeout
            error = {"type": "mcp_protocol_error", "code": -32000, "message": f"{result.why}: {result.text}"}
        return self._encoder.mcp_ended(call.id, result.text, error)

    def ended(self, run: McpRun) -> bytes:
        return b""


SILENT: Report = _Silent()
SSE_COMMENTS: Report = _SseComments()


class _Selection(msgspec.Struct):
    mcp: str | list[str] | None = None


def selected_servers(runtime: Runtime, call: Relayed | None) -> list[str]:
    """The servers a request asks for: its body's ``"mcp": "a" | ["a", "b"] | "all" | "none"``,
    else ``x-blazar-mcp: a,b``, else the config's ``mcp_default``; narrowed to those its key
    may use (a server named outright that the key may not use is refused)."""
    selection: Any = None
    if call is not None and b'"mcp"' in call.body:  # a look before a second parse of the body
        try:
            selection = msgspec.json.decode(call.body, type=_Selection).mcp
        except msgspec.ValidationError as exc:
            raise BlazarError(
                "BAD_REQUEST", f'invalid field `mcp`: {exc} — a server name, a list, "all" or "none"'
            ) from None
        except msgspec.DecodeError:
            selection = None  # the dialect's decoder has refused the body already
    raw = call.headers.get(HEADER) if call is not None and selection is None else None
    if raw is not None:
        names = [n.strip() for n in raw.split(",") if n.strip()]
        selection = names[0] if len(names) == 1 else names
    servers = runtime.mcp.select(selection)  # an unknown name: MCP_SERVER_NOT_FOUND (404)
    grant = call.grant if call is not None else None
    if not servers or grant is None or not grant.mcp:
        return servers
    named = selection not in (None, "all")  # "all" and the default mean: those this key may use
    allowed = [s for s in servers if grant.allows_mcp(s)]
    if named and len(allowed) < len(servers):
        denied = ", ".join(repr(s) for s in servers if s not in allowed)
        raise BlazarError(
            "MCP_SERVER_DENIED",
            f"the API key '{grant.name}' may not use the MCP server {denied} — ask for another "
            "server, or have an admin widen the key's mcp: scopes",
        )
    return allowed


class _Round:
    """The dialect's encoder for one round: the model's words pass through, its calls to MCP
    tools are kept back (the client never sees them), the client's own calls pass through
    numbered from 0; the stream's head is sent once, the end only when the loop ends."""

    def __init__(self, inner: StreamEncoder) -> None:
        self.inner = inner
        self.started = False
        self.meta: frozenset[str] = frozenset()
        """The compact catalog's meta-tools, when offered: the gateway's to answer too."""
        self.reset()

    def reset(self) -> None:
        self.ours: dict[int, list[ToolCallDelta]] = {}
        self.theirs: dict[int, int] = {}
        self.final: Delta | None = None
        self.failed: BlazarError | None = None

    def start(self, prompt: Usage | None) -> bytes:
        if self.started:
            return b""
        self.started = True
        return self.inner.start(prompt)

    def feed(self, delta: Delta) -> bytes:
        if not delta.tool_calls:
            return self.inner.feed(delta) if delta.text or delta.thinking else b""
        passed: list[ToolCallDelta] = []
        for c in delta.tool_calls:
            if c.index in self.ours:
                self.ours[c.index].append(c)
            elif c.index in self.theirs:
                passed.append(msgspec.structs.replace(c, index=self.theirs[c.index]))
            elif split_qualified(c.name or "") is not None or c.name in self.meta:
                self.ours[c.index] = [c]
            else:
                self.theirs[c.index] = len(self.theirs)
                passed.append(msgspec.structs.replace(c, index=self.theirs[c.index]))
        if not (passed or delta.text or delta.thinking):
            return b""
        return self.inner.feed(msgspec.structs.replace(delta, tool_calls=passed))

    def finish(self, final: Delta, timings: Timings) -> bytes:
        self.final = final
        return self.feed(msgspec.structs.replace(final, finish_reason=None, usage=None))

    def error(self, code: str, message: str) -> bytes:
        self.failed = BlazarError(code, message)
        return self.inner.error(code, message)

    def keepalive(self) -> bytes:
        return self.inner.keepalive()

    def calls(self) -> list[ToolCall]:
        """This round's calls to MCP tools, whole."""
        return [
            ToolCall(
                id=next((f.id for f in fragments if f.id), f"call_{index}"),
                name=next((f.name for f in fragments if f.name), ""),
                arguments="".join(f.arguments for f in fragments),
            )
            for index, fragments in sorted(self.ours.items())
        ]


def _plus(a: Usage, b: Usage | None) -> Usage:
    if b is None:
        return a
    return Usage(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cached_tokens=a.cached_tokens + b.cached_tokens,
        reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens,
    )


class McpStream:
    """The rounds of one request as the dialect's bytes; ``open`` runs up to the first round's
    engine stream, so what fails before any byte is an HTTP error, not an error event."""

    def __init__(
        self,
        runtime: Runtime,
        req: ChatRequest,
        servers: list[str],
        encoder: StreamEncoder,
        report: Report,
        ask: Ask,
    ) -> None:
        self.runtime = runtime
        self.req = req
        self.run = McpRun(servers=servers)
        self.report = report
        self.ask = ask
        self._round = _Round(encoder)
        self._offered = False
        self._compact: Compact | None = None
        self._max_rounds = runtime.mcp.max_rounds(servers)
        self._usage = Usage()
        self._first: engine_call.EngineCall | None = None
        self._ended_ns: int | None = None
        self.failure: BlazarError | None = None
        """What ended the loop midway (an engine that failed in a later round)."""
        self._stream: engine_call.TranslatedStream | None = None
        self._iter: AsyncGenerator[bytes, None] = self._generate()

    @classmethod
    async def open(
        cls,
        runtime: Runtime,
        req: ChatRequest,
        servers: list[str],
        encoder: StreamEncoder,
        report: Report,
        ask: Ask,
    ) -> McpStream:
        self = cls(runtime, req, servers, encoder, report, ask)
        grant = ask.grant
        usable = [
            t
            for listed in await runtime.mcp.tools(servers)
            for t in listed.tools
            if grant is None or grant.allows_mcp(t.server, t.name)
        ]
        compact = {s for s in servers if (ask.mcp_catalog or runtime.mcp.catalog(s)) == "compact"}
        offered = [
            ToolSpec(name=t.qualified, description=t.description, parameters=t.input_schema)
            for t in usable
            if t.server not in compact
        ]
        if hidden := [t for t in usable if t.server in compact]:
            offered += self._offer_compact(Compact(hidden, [s for s in servers if s in compact]))
        self._offered = bool(offered)
        self.req = msgspec.structs.replace(req, tools=[*req.tools, *offered], stream=True)
        self._first = await self._start_round()
        return self

    def _offer_compact(self, catalog: Compact) -> list[ToolSpec]:
        """The meta-tools in place of ``catalog``'s tools (and the one tool a client forces)."""
        clash = sorted(META & {t.name for t in self.req.tools})
        if clash:
            raise BlazarError(
                "BAD_REQUEST",
                f"the request's own tool {clash[0]!r} has the name of a compact MCP catalog's "
                "meta-tool — rename it, or send `x-blazar-mcp-catalog: full`",
            )
        self._compact = catalog
        self._round.meta = META
        specs = catalog.specs()
        choice = self.req.tool_choice
        if choice is not None and choice.mode == "function" and choice.name:
            if (forced := catalog.spec_of(choice.name)) is not None:
                specs.append(forced)
        return specs

    def timings(self) -> Timings:
        """The whole loop's: from the first round's start to the last round's end."""
        assert self._first is not None
        first = self._first.timings
        return Timings(
            started_ns=first.started_ns,
            load_ns=first.load_ns,
            first_token_ns=first.first_token_ns,
            ended_ns=self._ended_ns,
        )

    def headers(self) -> dict[str, str]:
        """The first round's facts (loading, what was changed or ignored), and the servers."""
        assert self._first is not None
        return {**self._first.headers(), "X-Blazar-Mcp": f"servers={','.join(self.run.servers)}"}

    async def _start_round(self) -> engine_call.EngineCall:
        req = self.req
        if self.run.rounds >= self._max_rounds and self._offered:
            req = msgspec.structs.replace(req, tool_choice=ToolChoice(mode="none"))
        tr = engine_call.EngineCall(self.runtime, req, self.ask)
        await tr.prepare()
        if isinstance(self._round.inner, ResponsesEncoder):  # its Response says how it sampled
            self._round.inner.ran_with(*tr.sampling())
        self._round.reset()
        self._stream = await tr.stream(self._round)
        inner = self._round.inner
        set_stream_enders(  # ended from outside: the dialect's own end, not a round's
            self.ask.card,
            cancelled=inner.error,
            interrupted=lambda: inner.finish(Delta(finish_reason="stop"), tr.timings),
        )
        return tr

    def __aiter__(self) -> McpStream:
        return self

    async def __anext__(self) -> bytes:
        return await self._iter.__anext__()

    async def _generate(self) -> AsyncGenerator[bytes, None]:
        assert self._first is not None
        round_, first = self._round, self._first
        try:
            while True:
                assert self._stream is not None
                async for chunk in self._stream:
                    yield chunk
                if round_.failed is not None:
                    self.failure = round_.failed
                    return
                final = round_.final or Delta(finish_reason="stop")
                self._usage = _plus(self._usage, final.usage)
                ours = round_.calls()
                if not ours or round_.theirs or self.run.rounds >= self._max_rounds:
                    reason = (
                        final.finish_reason
                        if round_.theirs or final.finish_reason != "tool_calls"
                        else "stop"
                    )
                    end = msgspec.structs.replace(final, finish_reason=reason, usage=self._usage)
                    self._ended_ns = time.perf_counter_ns()
                    yield self.report.ended(self.run) + round_.inner.finish(end, self.timings())
                    return
                runs = [self._meaning(c) for c in ours]
                shown = [r for r in runs if isinstance(r, ToolCall)]
                yield b"".join(self.report.calling(c) for c in shown)
                results = await self._call_all(ours, runs)
                yield b"".join(
                    self.report.called(r, res)
                    for r, res in zip(runs, results, strict=True)
                    if isinstance(r, ToolCall)
                )
                self._feed_back(final, ours, runs, results)
                try:
                    await self._start_round()
                except BlazarError as exc:
                    self.failure = exc
                    if (card := first.card) is not None:
                        card.note_failure(exc.code, exc.message)
                    yield round_.inner.error(exc.code, exc.message)
                    return
        finally:
            await self._close_round()

    def _meaning(self, call: ToolCall) -> ToolCall | Lookup:
        """What runs for one of the model's calls: itself, or what a meta-call means."""
        if self._compact is None or call.name not in META:
            return call
        return self._compact.answer(call)

    def _feed_back(
        self,
        final: Delta,
        calls: list[ToolCall],
        runs: list[ToolCall | Lookup],
        results: list[McpCallResult],
    ) -> None:
        """The model's own calls (meta-calls as it wrote them) and their results, for its next round."""
        self.run.rounds += 1
        ran = [res for r, res in zip(runs, results, strict=True) if isinstance(r, ToolCall)]
        self.run.calls += len(ran)
        self.run.lookups += len(results) - len(ran)
        self.run.results.extend(ran)
        turn = Message(role="assistant", content=final.text, tool_calls=calls)
        fed = [
            Message(role="tool", content=_text_for_model(r), tool_call_id=c.id, tool_name=c.name)
            for c, r in zip(calls, results, strict=True)
        ]
        # The client's tool_choice was for its first turn: later rounds choose freely.
        self.req = msgspec.structs.replace(
            self.req, messages=[*self.req.messages, turn, *fed], tool_choice=None
        )

    async def _call_all(self, calls: list[ToolCall], runs: list[ToolCall | Lookup]) -> list[McpCallResult]:
        """Every call of one round, side by side (cancelled with the request); a lookup the
        gateway answered is its result already."""
        results: list[McpCallResult | None] = [
            lookup_result(asked, c) if isinstance(c, Lookup) else None
            for asked, c in zip(calls, runs, strict=True)
        ]

        async def one(i: int, c: ToolCall) -> None:
            results[i] = await self._call_one(c)

        async with trio.open_nursery() as nursery:
            for i, c in enumerate(runs):
                if isinstance(c, ToolCall):
                    nursery.start_soon(one, i, c)
        done = [r for r in results if r is not None]
        if (card := self._first.card if self._first is not None else None) is not None:
            card.note_tools([r for c, r in zip(runs, done, strict=True) if isinstance(c, ToolCall)])
        return done

    async def _call_one(self, c: ToolCall) -> McpCallResult:
        server, tool = split_qualified(c.name) or ("", c.name)
        grant = self.ask.grant
        if grant is not None and not grant.allows_mcp(server, tool):
            return error_result(
                server, tool, "denied", f"the API key '{grant.name}' may not use the tool '{c.name}'"
            )
        if self.runtime.mcp.needs_approval(server, tool) and not self.ask.approved & {c.name, tool, "*"}:
            return error_result(
                server,
                tool,
                "not_approved",
                f"the tool '{c.name}' needs approval: the request did not carry "
                f"`{APPROVE}: {c.name}`, so it was not run — answer without it",
            )
        try:
            arguments = json.loads(c.arguments) if c.arguments.strip() else {}
        except ValueError:
            return error_result(
                server, tool, "bad_arguments", f"the arguments are not JSON: {c.arguments[:200]}"
            )
        if not isinstance(arguments, dict):
            return error_result(server, tool, "bad_arguments", "the arguments must be a JSON object")
        return await self.runtime.mcp.call(c.name, arguments)

    async def aclose(self) -> None:
        """End the loop wherever it is (a client gone): the round's engine stream closes."""
        await self._iter.aclose()  # runs the loop's ``finally`` if it was suspended mid-round
        await self._close_round()

    async def _close_round(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


def _text_for_model(result: McpCallResult) -> str:
    return f"error: {result.text}" if result.is_error else result.text


async def drain(stream: McpStream) -> None:
    """Run every round of ``stream`` to its end, for an answer sent whole."""
    try:
        async for _ in stream:
            pass
    finally:
        await stream.aclose()


async def answer(
    runtime: Runtime, req: ChatRequest, servers: list[str], ask: Ask
) -> tuple[McpStream, ChatResponse]:
    """The whole answer to ``req`` with ``servers``' tools: the loop's stream, gathered."""
    gathered = engine_call.Gathered()
    stream = await McpStream.open(runtime, req, servers, gathered, SILENT, ask)
    await drain(stream)
    return stream, gathered.response(req)
