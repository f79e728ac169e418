"""Anthropic routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Requests are translated to a neutral ``ChatRequest``, run on the model's
engine, and the neutral answer (or stream of deltas) is rendered as
Anthropic's Message object or its SSE event sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from actors.runtime import Runtime
from blazar.dialects import anthropic
from blazar.dialects.neutral import ChatRequest, Delta, Usage
from blazar.errors import Dialect
from blazar.serve import engine_call, mcp_loop
from blazar.serve.candidates import translated
from blazar.serve.context import Ask, Relayed
from blazar.serve.engine_call import Timings
from blazar.serve.policy import hooks
from blazar.web.asgi.ask import ask_of, current_ask
from blazar.web.asgi.call import Call, Reply, Routes, current
from blazar.web.asgi.replies import app_runtime, json_reply, json_response, read_body, set_model, stream_reply
from blazar.web.routes import streams

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["register", "register_routes"]


class _Encoder:
    """Adapts the dialect's stream encoder to the gateway's stream protocol."""

    def __init__(self, req: ChatRequest, message_id: str) -> None:
        self._enc = anthropic.StreamEncoder(message_id=message_id, model=req.model, request=req)

    def start(self, prompt: Usage | None) -> bytes:
        return self._enc.start(prompt)

    def feed(self, delta: Delta) -> bytes:
        return self._enc.feed(delta)

    def finish(self, final: Delta, timings: Timings) -> bytes:
        head = self._enc.feed(msgspec.structs.replace(final, finish_reason=None, usage=None))
        return head + self._enc.finish(final.finish_reason, final.usage)

    def error(self, code: str, message: str) -> bytes:
        return self._enc.error(code, message)

    def keepalive(self) -> bytes:
        return self._enc.ping()


def _stream_error(code: str, message: str) -> bytes:
    """The ``error`` event that ends an Anthropic stream cut short (a resumable one cancelled)."""
    blank = ChatRequest(model="", messages=[])
    return anthropic.StreamEncoder(message_id="", model="", request=blank).error(code, message)


def _headers(call: engine_call.EngineCall | None = None) -> dict[str, str]:
    headers = {"request-id": current().trace_id}
    if call is not None:
        headers.update(call.headers())
    return headers


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """``POST /v1/messages``, served by the gateway layer itself."""

    async def messages(call: Call) -> Reply:
        req = anthropic.decode_messages_request(call.body)
        call.set_model(req.model)
        ask = ask_of(call)
        return await hooks.through(runtime, call, req, Dialect.ANTHROPIC, lambda c, r: answer(c, ask, r))

    async def answer(call: Relayed, ask: Ask, req: ChatRequest) -> Reply:
        if picked := await translated.answer(runtime, call, ask, req):
            tr, resp, said = picked
            return json_reply(anthropic.encode_response(resp, request=req), headers={**_headers(tr), **said})
        if servers := mcp_loop.selected_servers(runtime, call):
            if not req.stream:
                loop, resp = await mcp_loop.answer(runtime, req, servers, ask)
                headers = {**_headers(), **loop.headers(), "X-Blazar-Mcp": loop.run.header()}
                return json_reply(anthropic.encode_response(resp, request=req), headers=headers)
            encoder = _Encoder(req, anthropic.message_id_for(call.trace_id))
            looped = await mcp_loop.McpStream.open(runtime, req, servers, encoder, mcp_loop.SSE_COMMENTS, ask)
            call.on_cleanup(looped.aclose)
            headers = {**_headers(), **looped.headers()}
            return stream_reply(looped, content_type="text/event-stream", headers=headers)
        tr = engine_call.EngineCall(runtime, req, ask)
        await tr.prepare()
        if not req.stream:
            resp = await tr.complete()
            return json_reply(anthropic.encode_response(resp, request=req), headers=_headers(tr))
        stream = await tr.stream(_Encoder(req, anthropic.message_id_for(call.trace_id)))
        call.on_cleanup(stream.aclose)
        return stream_reply(stream, content_type="text/event-stream", headers=_headers(tr))

    routes.add("/v1/messages", streams.resumable(runtime, _stream_error, messages))  # opted in: resumable


async def count_tokens() -> Response:
    runtime = app_runtime()
    req = anthropic.decode_count_tokens_request(await read_body())
    set_model(req.model)
    n = await engine_call.count_tokens(runtime, req, current_ask())
    return json_response(anthropic.encode_count_tokens(n), headers=_headers())


def register(app: QuartTrio) -> None:
    """Token counting, served by the framework."""
    app.post("/v1/messages/count_tokens")(count_tokens)
