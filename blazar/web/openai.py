"""OpenAI routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

llama.cpp speaks this dialect, so chat and completions are relayed as bytes:
the caller's body goes to the engine unchanged and the engine's response or
SSE stream comes back unchanged (its ``--alias`` already names the model).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio

from actors.engine import EngineActor
from actors.runtime import Runtime
from actors.upstream import UpstreamError
from blazar.dialects import engine_usage, lora, openai, params, thinking
from blazar.dialects.llamacpp import (
    ProgressFilter,
    apply_defaults_to_body,
    ask_progress,
    cap_output_in_body,
    classify_error,
)
from blazar.dialects.neutral import ChatRequest, Delta, Usage
from blazar.dialects.prompt_size import PromptSize, chat_size, completion_size
from blazar.dialects.stored_chat import store_fields
from blazar.errors import BlazarError, Dialect
from blazar.serve import engine_call, failover, mcp_loop
from blazar.serve.candidates import fanout, translated
from blazar.serve.cards import set_stream_enders
from blazar.serve.claim import claim_engine
from blazar.serve.policy import certified, honesty, structured
from blazar.serve.policy.prompt_fit import check_prompt
from blazar.serve.relay import RenamingStream, UpstreamStream, crash_error, renamer_for, send_upstream
from blazar.web import stored_completions
from blazar.web.ask import ask_of
from blazar.web.auth import model_visible, require_model
from blazar.web.call import Call, Reply, Routes
from blazar.web.common import (
    LOADING_NS,
    app_runtime,
    json_response,
    stream_reply,
)
from blazar.web.federation import remote_models

__all__ = ["register", "register_routes"]


class _Encoder:
    """Adapts the OpenAI chunk encoder to the gateway's stream protocol."""

    def __init__(self, enc: openai.ChatStreamEncoder) -> None:
        self._enc = enc

    def start(self, prompt: Usage | None) -> bytes:
        return self._enc.start()

    def feed(self, delta: Delta) -> bytes:
        return self._enc.feed(delta)

    def finish(self, final: Delta, timings: engine_call.Timings) -> bytes:
        return self._enc.finish(final)

    def error(self, code: str, message: str) -> bytes:
        return openai.encode_stream_error(code, message)

    def keepalive(self) -> bytes:
        # An SSE comment: the stream's readers skip it.
        return b": keep-alive\n\n"


async def list_models() -> Response:
    runtime = app_runtime()
    records = await trio.to_thread.run_sync(runtime.store.list)
    chains = runtime.failover.chains
    data = [
        openai.encode_model(r.name, created=int(r.created_at))
        for r in records
        if model_visible(r.name) and r.name not in chains  # a chain of that name wins
    ]
    data += [openai.encode_model(name, created=0) for name in chains if model_visible(name)]
    include = request.args.get("include")
    if include == "remote":
        data += [m for m in remote_models(runtime) if model_visible(str(m["id"]))]
    elif include is not None:
        raise BlazarError(
            "BAD_REQUEST", f"include={include!r} is not known: write include=remote", param="include"
        )
    return json_response(openai.encode_model_list(data))


async def get_model(name: str) -> Response:
    require_model(name)
    runtime = app_runtime()
    if name in runtime.failover.chains:  # a failover chain answers as a model of its own
        return json_response(openai.encode_model(name, created=0))
    record = await trio.to_thread.run_sync(runtime.store.get, name)
    require_model(record.name)
    body = openai.encode_model(record.name, created=int(record.created_at))
    return json_response(body)


class _Outcome(NamedTuple):
    """What a relayed request's parameters come to, for its headers."""

    ignored: list[str]
    max_tokens: int | None
    output_param: str
    strict: bool
    want: structured.Wanted | None = None
    """The structure the request asks for (its receipt header says how it was held)."""
    chat: ChatRequest | None = None
    """The decoded chat request (its thinking is told to each engine its own way)."""


def _chat_encoder(req: ChatRequest) -> _Encoder:
    return _Encoder(
        openai.ChatStreamEncoder(
            completion_id=f"chatcmpl-{secrets.token_hex(12)}",
            model=req.model,
            created=int(time.time()),
            include_usage=req.include_usage,
        )
    )


def register(app: QuartTrio) -> None:
    """The model listings, served by the framework (embeddings: ``blazar.web.vectors``)."""
    app.get("/v1/models")(list_models)
    app.get("/v1/models/<path:name>")(get_model)


def _usage_reader(call: Call) -> Callable[[bytes], None] | None:
    """What the end of a relayed stream tells the request's card (its final event's usage)."""
    card = call.card
    if card is None:
        return None

    def read(tail: bytes) -> None:
        card.note_usage(engine_usage.of_stream_tail(tail))
        if (failure := engine_usage.stream_error(tail)) is not None:
            card.note_failure("BAD_GATEWAY", f"the engine failed mid-stream: {failure}")

    return read


def _as_translated(call: Call, req: ChatRequest) -> ChatRequest:
    """``req`` as a translation will run it: what only llama.cpp would have honoured when
    relayed is dropped, and named as ignored."""
    top = params.keys_of(call.body, ("",))[""]
    dropped = params.OPENAI_CHAT.dropped_when_translated(top)
    return msgspec.structs.replace(req, ignored=[*req.ignored, *dropped]) if dropped else req


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """Chat and completions, served by the gateway layer itself (no framework on this path)."""

    async def chat_completions(call: Call) -> Reply:
        store, metadata = store_fields(call.body)
        reply = await answer_chat(call)
        return await stored_completions.keep(runtime, call, reply, metadata) if store else reply

    async def answer_chat(call: Call) -> Reply:
        req = openai.decode_chat_request(call.body)
        call.set_model(req.model)
        ask = ask_of(call)
        strict = ask.is_strict(runtime.config.strict)
        honesty.refuse_ignored(req.ignored, strict=strict)
        if picked := await translated.answer(
            runtime, call, ask_of(call), _as_translated(call, req), best_of=False
        ):
            tr, resp, said = picked  # a cascade: the answer names the model that gave it
            body = openai.encode_chat_response(resp, model=resp.model)
            return Reply(body, headers={**tr.headers(), **said})
        chain = runtime.failover.chains.get(req.model)
        engine = None
        if chain is None:
            engine = await runtime.engine_for(req.model, ask.lane)
            engine_call.check_images(req, engine)
            certified.refuse_failed(runtime, engine.spec.model, certified.chat_needs(req), ask)
        if want := fanout.asked(call, completions=False):
            path, size = "/v1/chat/completions", chat_size(req)
            return await fanout.run_on(runtime, call, ask, chain, engine, want, path=path, size=size, req=req)
        if servers := mcp_loop.selected_servers(runtime, call):
            return await with_mcp(call, _as_translated(call, req), servers)
        if (
            req.tools
            and (engine is None or not engine.spec.native_tools)
            and (req.tool_choice is None or req.tool_choice.mode != "none")
        ):
            # The model's template knows no tools: the gateway emulates them, so it translates.
            # A chain's targets may differ there: translated, each target runs tools its own way.
            return await run_translated(call, req)
        size = chat_size(req)
        shape = structured.wanted(req.response_format, call.body)
        outcome = _Outcome(req.ignored, req.max_tokens, req.output_param, strict, shape, chat=req)

        async def on(engine: EngineActor) -> Reply:
            engine_call.check_images(req, engine)
            certified.refuse_failed(runtime, engine.spec.model, certified.chat_needs(req), ask)
            return await relay(
                call, "/v1/chat/completions", stream=req.stream, engine=engine, size=size, outcome=outcome
            )

        if chain is not None:
            return await failover.relay_on_chain(runtime, call, ask, chain, on)
        assert engine is not None
        return await relay(
            call, "/v1/chat/completions", stream=req.stream, engine=engine, size=size, outcome=outcome
        )

    async def with_mcp(call: Call, req: ChatRequest, servers: list[str]) -> Reply:
        if not req.stream:
            loop, resp = await mcp_loop.answer(runtime, req, servers, ask_of(call))
            headers = {**loop.headers(), "X-Blazar-Mcp": loop.run.header()}
            return Reply(openai.encode_chat_response(resp, model=req.model), headers=headers)
        stream = await mcp_loop.McpStream.open(
            runtime, req, servers, _chat_encoder(req), mcp_loop.SSE_COMMENTS, ask_of(call)
        )
        call.on_cleanup(stream.aclose)
        return stream_reply(stream, content_type="text/event-stream", headers=stream.headers())

    async def run_translated(call: Call, req: ChatRequest) -> Reply:
        tr = engine_call.EngineCall(runtime, _as_translated(call, req), ask_of(call))
        await tr.prepare()
        if not req.stream:
            resp = await tr.complete()
            return Reply(openai.encode_chat_response(resp, model=req.model), headers=tr.headers())
        stream = await tr.stream(_chat_encoder(req))
        call.on_cleanup(stream.aclose)
        sent: AsyncIterator[bytes] = stream
        if (want := structured.wanted(req.response_format)) is not None:
            sent = structured.ReceiptStream(stream, want, tr.enforced())
        return stream_reply(sent, content_type="text/event-stream", headers=tr.headers())

    async def completions(call: Call) -> Reply:
        req = openai.decode_completion_request(call.body)
        call.set_model(req.model)
        ask = ask_of(call)
        strict = ask.is_strict(runtime.config.strict)
        honesty.refuse_ignored(req.ignored, strict=strict)
        size = completion_size(req.prompt)
        if want := fanout.asked(call, completions=True):
            chain = runtime.failover.chains.get(req.model)
            engine = None if chain else await runtime.engine_for(req.model, ask.lane)
            return await fanout.run_on(
                runtime, call, ask, chain, engine, want, path="/v1/completions", size=size, req=req
            )
        outcome = _Outcome(req.ignored, req.max_tokens, req.output_param, strict)

        async def on(engine: EngineActor) -> Reply:
            return await relay(
                call, "/v1/completions", stream=req.stream, engine=engine, size=size, outcome=outcome
            )

        if (chain := runtime.failover.chains.get(req.model)) is not None:
            return await failover.relay_on_chain(runtime, call, ask, chain, on)
        return await on(await runtime.engine_for(req.model, ask.lane))

    async def relay(
        call: Call, path: str, *, stream: bool, engine: EngineActor, size: PromptSize, outcome: _Outcome
    ) -> Reply:
        engine_call.check_purpose("chat", engine)  # a reranker does not complete text
        # An output limit above the context is reported (strict: refused), not rewritten:
        # llama.cpp ends the answer where the context ends all the same.
        ctx = engine.served_ctx or engine.spec.ctx_per_slot
        capped_to = honesty.output_limit(
            outcome.max_tokens,
            ctx,
            param=outcome.output_param,
            model=engine.spec.model,
            strict=outcome.strict,
        )
        spec = engine.spec
        body = lora.in_body(call.body, [a.name for a in spec.loras], model=spec.alias or spec.model)
        ignored = outcome.ignored
        if outcome.chat is not None and outcome.chat.think is not None:
            if unheeded := thinking.unheeded(outcome.chat, support=spec.thinking):
                honesty.refuse_ignored(unheeded, strict=outcome.strict)
                ignored = [*ignored, *unheeded]
            told = thinking.engine_fields(outcome.chat, support=spec.thinking, reads_effort=spec.think_effort)
            body = thinking.fields_into_body(body, told)
        if spec.system or spec.defaults:  # the model's own settings (a Modelfile's SYSTEM, PARAMETERs)
            body = apply_defaults_to_body(body, system=spec.system, defaults=spec.defaults)
        body, capped = cap_output_in_body(body, spec.max_output_tokens)
        ours = False
        if stream:
            body, ours = ask_progress(body)
        lease = await claim_engine(runtime, engine, ask_of(call), prompt=size)  # refused before loading
        handle = lease.handle
        headers: dict[str, str] = {}
        changed = [f"{outcome.output_param}={capped_to}"] if capped_to is not None else []
        honesty.report(
            headers,
            ignored=ignored,
            changed=changed,
            context=engine.served_ctx or engine.spec.ctx_per_slot,
        )
        if lease.load_ns > LOADING_NS:
            headers["X-Blazar-Status"] = "loading"
        if capped:
            headers["X-Blazar-Output-Cap"] = str(spec.max_output_tokens)
        enforced = structured.enforcement(engine)
        if outcome.want is not None:
            headers[structured.HEADER] = structured.receipt(enforced, None)
        try:
            await check_prompt(engine, handle, size)
            upstream = await send_upstream(handle, path, body)
        except UpstreamError as exc:
            lease.release()
            raise await crash_error(engine, handle, exc) from exc
        except BaseException:
            lease.release()
            raise
        rename = renamer_for(handle, spec.alias or spec.model)
        if not stream or upstream.status_code != 200:
            try:
                content = await upstream.aread()
            except UpstreamError as exc:
                raise await crash_error(engine, handle, exc) from exc
            finally:
                await upstream.aclose()
                lease.release()
            if upstream.status_code >= 400:
                err = classify_error(upstream.status_code, content)
                call.code, call.error = err.code, err.message
                if err.wordings:  # a refusal OpenAI words its own way: say it so
                    content = openai.encode_error(err.code, err.message_for(Dialect.OPENAI), param=err.param)
                else:
                    content = openai.merge_error_code(content, err.code)
            if call.card is not None and upstream.status_code == 200:
                call.card.note_usage(engine_usage.of_body(content))
            if outcome.want is not None and upstream.status_code == 200:
                if (text := structured.content_of(content)) is not None:
                    ok = structured.valid(outcome.want, text)
                    headers[structured.HEADER] = structured.receipt(enforced, ok)
            if rename is not None:
                content = rename.whole(content)
            return Reply(content, upstream.status_code, headers=headers)

        async def on_error(exc: Exception) -> bytes:
            err = await crash_error(engine, handle, exc)
            if call.card is not None:
                call.card.note_failure(err.code, err.message)
            return openai.encode_stream_error(err.code, err.message)

        options: dict[str, Any] = {
            "background": runtime.start_soon,
            "progress": ProgressFilter() if ours else None,
            "on_end": _usage_reader(call),
        }
        relayed = (
            UpstreamStream(upstream, lease, on_error, **options)
            if rename is None
            else RenamingStream(upstream, lease, on_error, rename=rename, **options)
        )
        set_stream_enders(
            call.card,
            cancelled=openai.encode_stream_error,
            interrupted=lambda: b"data: [DONE]\n\n",
        )
        call.on_cleanup(relayed.aclose)
        sent: AsyncIterator[bytes] = relayed
        if outcome.want is not None:
            sent = structured.ReceiptStream(relayed, outcome.want, enforced)
        return stream_reply(sent, content_type="text/event-stream", headers=headers)

    routes.add("/v1/chat/completions", chat_completions, shared=True)  # GET lists the stored ones
    routes.add("/v1/completions", completions)
