"""The MCP tool loop, run by the gateway for a client that knows nothing of MCP.

A request that selects MCP servers (its ``"mcp"`` field, the ``x-blazar-mcp`` header, else
``mcp_default``) is
offered their tools as ``mcp__<server>__<tool>`` beside its own. Each round the model's
calls to those tools are run (side by side), their results fed back as tool messages, and
the model asked again, up to the servers' ``max_rounds``; the last allowed round may not
call tools, so the answer ends in text. A call to one of the client's own tools ends the
loop and goes back to the client as usual. The loop works on the neutral request and
answer, so every dialect that translates (OpenAI chat, Anthropic messages, Ollama chat,
the Responses API) runs the same one; only whole answers for now (a stream is refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from actors.mcp_results import split_qualified
from actors.runtime import Runtime
from blazar.dialects.neutral import ChatRequest, ChatResponse, Message, ToolCall, ToolChoice, ToolSpec
from blazar.errors import BlazarError
from blazar.web import translate
from blazar.web.call import Call

__all__ = ["McpRun", "answer", "selected_servers"]

HEADER = "x-blazar-mcp"


@dataclass(slots=True)
class McpRun:
    servers: list[str]
    rounds: int = 0
    calls: int = 0

    def header(self) -> str:
        return f"rounds={self.rounds}, calls={self.calls}"


class _Selection(msgspec.Struct):
    mcp: str | list[str] | None = None


def selected_servers(runtime: Runtime, call: Call | None) -> list[str]:
    """The servers a request asks for: its body's ``"mcp": "a" | ["a", "b"] | "all" | "none"``,
    else ``x-blazar-mcp: a,b``, else the config's ``mcp_default``."""
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
    return runtime.mcp.select(selection)  # an unknown name: MCP_SERVER_NOT_FOUND (404)


async def answer(
    runtime: Runtime, req: ChatRequest, servers: list[str]
) -> tuple[translate.EngineCall, ChatResponse, McpRun]:
    """The whole answer to ``req`` with ``servers``' tools, the loop run here; the last
    round's engine call (for its headers) and what the loop did."""
    run = McpRun(servers=servers)
    if req.stream:
        raise BlazarError(
            "BAD_REQUEST",
            "MCP tools run only on whole answers for now: send the request without `stream`, "
            "or without x-blazar-mcp",
        )
    offered = [
        ToolSpec(name=t.qualified, description=t.description, parameters=t.input_schema)
        for listed in await runtime.mcp.tools(servers)
        for t in listed.tools
    ]
    req = msgspec.structs.replace(req, tools=[*req.tools, *offered])
    max_rounds = runtime.mcp.max_rounds(servers)
    while True:
        if run.rounds >= max_rounds and offered:
            req = msgspec.structs.replace(req, tool_choice=ToolChoice(mode="none"))
        tr = translate.EngineCall(runtime, req)
        await tr.prepare()
        resp = await tr.complete()
        ours = [c for c in resp.tool_calls if split_qualified(c.name) is not None]
        if not ours or len(ours) < len(resp.tool_calls) or run.rounds >= max_rounds:
            return tr, resp, run
        results = await _call_all(runtime, ours)
        run.rounds += 1
        run.calls += len(ours)
        turn = Message(role="assistant", content=resp.text, tool_calls=resp.tool_calls)
        fed = [Message(role="tool", content=text, tool_call_id=c.id, tool_name=c.name) for c, text in results]
        # The client's tool_choice was for its first turn: later rounds choose freely.
        req = msgspec.structs.replace(req, messages=[*req.messages, turn, *fed], tool_choice=None)


async def _call_all(runtime: Runtime, calls: list[ToolCall]) -> list[tuple[ToolCall, str]]:
    """Every call of one round, side by side; each result as the text the model reads."""
    texts: list[str] = [""] * len(calls)

    async def one(i: int, c: ToolCall) -> None:
        try:
            arguments = json.loads(c.arguments) if c.arguments.strip() else {}
        except ValueError:
            texts[i] = f"error: the arguments are not JSON: {c.arguments[:200]}"
            return
        if not isinstance(arguments, dict):
            texts[i] = "error: the arguments must be a JSON object"
            return
        result = await runtime.mcp.call(c.name, arguments)
        texts[i] = f"error: {result.text}" if result.is_error else result.text

    async with trio.open_nursery() as nursery:
        for i, c in enumerate(calls):
            nursery.start_soon(one, i, c)
    return list(zip(calls, texts, strict=True))
