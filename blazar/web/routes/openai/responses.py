"""OpenAI Responses routes: ``/v1/responses`` and the stored responses under it.

A request becomes a neutral chat request after the items it continues (a
``previous_response_id`` chain or a ``conversation``), runs on the model's engine
like any translated request, and its answer is rendered as a Response object or
as the Responses event stream. A stored response (``store`` is the default) is
committed to the ledger before the client sees it finished.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from actors.runtime import Runtime
from blazar.dialects import responses
from blazar.dialects.neutral import ChatRequest, DecodeError
from blazar.dialects.responses import ResponsesRequest
from blazar.dialects.responses_stream import StreamEncoder, finished_response, whole_response
from blazar.errors import BlazarError, Dialect
from blazar.serve import engine_call, mcp_loop
from blazar.serve.candidates import translated
from blazar.serve.context import Relayed
from blazar.serve.jobs import background
from blazar.serve.policy import honesty, hooks
from blazar.serve.stores.responses import ResponseRow, ResponseStore, history_of, not_found, row_for, store_of
from blazar.web.asgi.ask import ask_of, current_ask
from blazar.web.asgi.call import Call, Reply, Routes, current
from blazar.web.asgi.replies import (
    app_runtime,
    json_reply,
    json_response,
    query_int,
    query_order,
    read_body,
    set_model,
    stream_reply,
    stream_response,
)

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["page_args", "register", "register_routes"]


def _headers(req: ResponsesRequest, tr: engine_call.EngineCall | None = None) -> dict[str, str]:
    headers = {"x-request-id": current().trace_id}
    if tr is not None:
        headers.update(tr.headers())  # the request's ignored parameters among them
    else:
        honesty.report(headers, ignored=req.ignored, changed=[], context=None)
    return headers


def _check_strict(runtime: Runtime, req: ResponsesRequest) -> None:
    honesty.refuse_ignored(req.ignored, strict=current_ask().is_strict(runtime.config.strict))


async def _keep(store: ResponseStore, req: ResponsesRequest, body: bytes, doc: dict[str, Any]) -> None:
    if req.store:
        await store.put(row_for(req, body, doc), conversation_items=[*req.items, *doc["output"]])


class _StoredStream:
    """A Responses event stream; the finished response is stored before the event that says
    so leaves. ``read_final``: a post hook rewrote the events, so the Response stored is read
    from the finishing event itself rather than taken from the encoder."""

    def __init__(
        self,
        inner: AsyncIterator[bytes],
        encoder: StreamEncoder,
        store: ResponseStore,
        req: ResponsesRequest,
        body: bytes,
        *,
        read_final: bool = False,
    ) -> None:
        self._inner, self._encoder, self._store = inner, encoder, store
        self._req, self._body = req, body
        self._read_final = read_final
        self._kept = False

    def __aiter__(self) -> _StoredStream:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._inner.__anext__()
        if self._encoder.final is not None and not self._kept:
            final = finished_response(chunk) if self._read_final else self._encoder.final
            if final is not None:
                self._kept = True
                await _keep(self._store, self._req, self._body, final)
        return chunk

    async def aclose(self) -> None:
        if (aclose := getattr(self._inner, "aclose", None)) is not None:
            await aclose()


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """``POST /v1/responses``, served by the gateway layer itself."""

    async def create(call: Call) -> Reply:
        req = responses.decode_request(call.body)
        call.set_model(req.model)
        _check_strict(runtime, req)
        store = store_of(runtime)
        if req.background:
            translated.refuse_in_background(runtime, call, req.model)
            await history_of(store, req)  # an unknown previous response is refused now, not later
            servers = mcp_loop.selected_servers(runtime, call)  # chosen now: the job keeps them
            asked = ask_of(call)
            doc = await background.submit(
                runtime,
                req,
                call.body,
                key=call.grant,
                servers=servers,
                approved=asked.approved,
                mcp_catalog=asked.mcp_catalog,
            )
            if not req.stream:
                return json_reply(doc, headers=_headers(req))
            return stream_reply(
                background.follow(runtime, doc["id"]), content_type="text/event-stream", headers=_headers(req)
            )
        chat = responses.chat_request(req, await history_of(store, req))
        ran = _Ran(req)

        async def run(call: Relayed, chat: ChatRequest) -> Reply:
            return await _answer(runtime, call, ran, chat)

        reply = await hooks.through(runtime, call, chat, Dialect.OPENAI, run, shape="responses")
        return await _kept(store, ran, call.body, reply)

    routes.add("/v1/responses", create)


class _Ran:
    """What ``_answer`` leaves for the store: the request with the sampling used, and the
    stream's encoder (whose finished Response is stored when no post hook redacted it)."""

    def __init__(self, req: ResponsesRequest) -> None:
        self.req = req
        self.encoder: StreamEncoder | None = None


async def _answer(runtime: Runtime, call: Relayed, ran: _Ran, chat: ChatRequest) -> Reply:
    """The Response to ``chat`` (as the policy hooks left it), whole or streamed; not stored
    yet: ``_kept`` stores what the client is sent."""
    req, asked = ran.req, ask_of(current())
    response_id, created_at = responses.new_id("resp"), time.time()
    if picked := await translated.answer(runtime, call, asked, chat):
        tr, answer, said = picked
        req = ran.req = responses.sampled(req, *tr.sampling())
        doc = whole_response(
            req, answer, response_id=response_id, created_at=created_at, completed_at=time.time()
        )
        return json_reply(doc, headers={**_headers(req, tr), **said})
    if servers := mcp_loop.selected_servers(runtime, call):
        encoder = ran.encoder = StreamEncoder(
            req, response_id=response_id, created_at=created_at, clock=time.time
        )
        loop = await mcp_loop.McpStream.open(
            runtime, chat, servers, encoder, mcp_loop.ResponsesItems(encoder), asked
        )
        headers = {**_headers(req), **loop.headers()}
        if req.stream:
            call.on_cleanup(loop.aclose)
            return stream_reply(loop, content_type="text/event-stream", headers=headers)
        await mcp_loop.drain(loop)
        if loop.failure is not None:
            raise loop.failure
        assert encoder.final is not None
        return json_reply(encoder.final, headers={**headers, "X-Blazar-Mcp": loop.run.header()})
    tr = engine_call.EngineCall(runtime, chat, asked)
    await tr.prepare()
    req = ran.req = responses.sampled(req, *tr.sampling())
    if not req.stream:
        answer = await tr.complete()
        doc = whole_response(
            req, answer, response_id=response_id, created_at=created_at, completed_at=time.time()
        )
        return json_reply(doc, headers=_headers(req, tr))
    encoder = ran.encoder = StreamEncoder(
        req, response_id=response_id, created_at=created_at, clock=time.time
    )
    inner = await tr.stream(encoder)
    call.on_cleanup(inner.aclose)
    return stream_reply(inner, content_type="text/event-stream", headers=_headers(req, tr))


async def _kept(store: ResponseStore, ran: _Ran, body: bytes, reply: Reply) -> Reply:
    """``reply`` with its Response stored (``store``): a whole one now, a streamed one before
    the event that finishes it leaves. What is stored is what the client gets, after any
    post hook's redaction."""
    if reply.status != 200 or not ran.req.store:
        return reply
    if isinstance(reply.body, bytes):
        await _keep(store, ran.req, body, msgspec.json.decode(reply.body))
        return reply
    redacted = "=redact" in (reply.headers or {}).get(hooks.POLICY_HEADER, "")
    assert ran.encoder is not None
    reply.body = _StoredStream(reply.body, ran.encoder, store, ran.req, body, read_final=redacted)
    return reply


# -- stored responses (framework routes) -------------------------------------


async def _stored(response_id: str) -> ResponseRow:
    row = await store_of(app_runtime()).get(response_id)
    if row is None:
        raise not_found(response_id)
    return row


async def get_response(response_id: str) -> Response:
    from quart import request

    row = await _stored(response_id)
    if request.args.get("stream", "").lower() != "true":
        return json_response(row.response)
    if not row.background:
        raise BlazarError(
            "BAD_REQUEST",
            f"response '{response_id}' was not created with `background: true`: only background "
            "responses can be streamed again — GET it without `stream`",
        )
    raw = request.args.get("starting_after", "-1")
    if not raw.lstrip("-").isdigit():
        raise DecodeError(
            f"invalid query `starting_after`: {raw!r} is not an integer", param="starting_after"
        )
    follow = background.follow(app_runtime(), response_id, after=int(raw))
    return stream_response(follow, content_type="text/event-stream")


async def delete_response(response_id: str) -> Response:
    if not await store_of(app_runtime()).delete(response_id):
        raise not_found(response_id)
    return json_response(responses.encode_deleted(response_id))


def page_args() -> tuple[str | None, int, Literal["asc", "desc"]]:
    """``after``, ``limit`` (1 to 100, default 20) and ``order`` of a list route."""
    from quart import request

    return request.args.get("after"), query_int("limit", 20, 100), query_order()


async def input_items(response_id: str) -> Response:
    row = await _stored(response_id)
    after, limit, order = page_args()
    return json_response(responses.item_page(row.input_items, after=after, limit=limit, order=order))


async def input_tokens() -> Response:
    runtime = app_runtime()
    body = await read_body()
    req = responses.decode_request(body)
    set_model(req.model)
    chat = responses.chat_request(req, await history_of(store_of(runtime), req))
    n = await engine_call.count_tokens(runtime, msgspec.structs.replace(chat, stream=False), current_ask())
    return json_response(responses.encode_input_tokens(n), headers=_headers(req))


async def cancel_response(response_id: str) -> Response:
    row = await _stored(response_id)
    if not row.background:
        raise BlazarError(
            "BAD_REQUEST",
            f"response '{row.id}' was not created with `background: true`: only background responses "
            "can be cancelled (close the stream to stop a foreground one)",
        )
    await app_runtime().jobs.cancel(response_id)
    row = await _stored(response_id)
    if row.response.get("status") == "queued":
        # It never started, so no runner is there to say it ended: it is cancelled now.
        doc = {**row.response, "status": "cancelled"}
        await store_of(app_runtime()).update(row.id, "cancelled", doc)
        return json_response(doc)
    return json_response(row.response)


def register(app: QuartTrio) -> None:
    app.get("/v1/responses/<response_id>")(get_response)
    app.delete("/v1/responses/<response_id>")(delete_response)
    app.get("/v1/responses/<response_id>/input_items")(input_items)
    app.post("/v1/responses/<response_id>/cancel")(cancel_response)
    app.post("/v1/responses/input_tokens")(input_tokens)
