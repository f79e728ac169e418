"""OpenAI chat and legacy completions, as the service runs them once their route has decoded them.

llama.cpp speaks this dialect, so chat and completions are relayed as bytes: the caller's
body goes to the engine (with the model's own settings and the gateway's checks applied)
and the engine's response or SSE stream comes back as it is. A request the engine cannot
take as it came (tools its template does not know, an MCP loop, a cascade, ``n`` or
``best_of``) runs through the service's other paths. The routes are ``blazar.web.routes.openai.chat``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import msgspec

from actors.engine import EngineActor
from actors.preemption import PREEMPTIBLE_FROM
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
from blazar.dialects.model_rename import Renamer
from blazar.dialects.neutral import ChatRequest, CompletionRequest, Delta, Usage
from blazar.dialects.prompt_size import PromptSize, chat_size, completion_size
from blazar.errors import Dialect
from blazar.serve import engine_call, failover, handoff, mcp_loop, semantic_cache
from blazar.serve.candidates import fanout, translated
from blazar.serve.cards import set_stream_enders
from blazar.serve.claim import claim_engine, died_idle, preemptible_answer
from blazar.serve.context import Ask, Relayed
from blazar.serve.policy import certified, honesty, hooks, structured
from blazar.serve.policy.prompt_fit import check_prompt
from blazar.serve.relay import RenamingStream, UpstreamStream, crash_error, renamer_for, send_upstream
from blazar.serve.reply import LOADING_NS, Reply, stream_reply

__all__ = ["answer_chat", "complete_text"]


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


def _usage_reader(call: Relayed) -> Callable[[bytes], None] | None:
    """What the end of a relayed stream tells the request's card (its final event's usage)."""
    card = call.card
    if card is None:
        return None

    def read(tail: bytes) -> None:
        card.note_usage(engine_usage.of_stream_tail(tail))
        if (failure := engine_usage.stream_error(tail)) is not None:
            card.note_failure("BAD_GATEWAY", f"the engine failed mid-stream: {failure}")

    return read


def _as_translated(call: Relayed, req: ChatRequest) -> ChatRequest:
    """``req`` as a translation will run it: what only llama.cpp would have honoured when
    relayed is dropped, and named as ignored."""
    top = params.keys_of(call.body, ("",))[""]
    dropped = params.OPENAI_CHAT.dropped_when_translated(top)
    return msgspec.structs.replace(req, ignored=[*req.ignored, *dropped]) if dropped else req


@hooks.guarded  # the operator's policy hooks, outside the cache: they see its answers too
@semantic_cache.cached  # a prompt that means what a recent one meant may get its answer
async def answer_chat(runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest) -> Reply:
    """A chat request (decoded and named by its route): a cascade, candidates, an MCP loop, a
    translation when the model's template knows no tools, else the engine's own bytes."""
    strict = ask.is_strict(runtime.config.strict)
    honesty.refuse_ignored(req.ignored, strict=strict)
    if picked := await translated.answer(runtime, call, ask, _as_translated(call, req), best_of=False):
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
        return await with_mcp(runtime, call, ask, _as_translated(call, req), servers)
    if emulates_tools(req, engine):
        # The model's template knows no tools: the gateway emulates them, so it translates.
        # A chain's targets may differ there: translated, each target runs tools its own way.
        return await run_translated(runtime, call, ask, req)

    async def on(engine: EngineActor) -> Reply:
        engine_call.check_images(req, engine)
        certified.refuse_failed(runtime, engine.spec.model, certified.chat_needs(req), ask)
        return await relay_chat(runtime, call, ask, req, engine, strict=strict, alone=chain is None)

    if chain is not None:
        return await failover.relay_on_chain(runtime, call, ask, chain, on)
    assert engine is not None
    return await on(engine)  # its checks again: pure, and already passed above


def emulates_tools(req: ChatRequest, engine: EngineActor | None) -> bool:
    """Whether ``req`` offers tools that ``engine``'s template does not know (None: not known
    yet), so the gateway must emulate them."""
    return (
        bool(req.tools)
        and (engine is None or not engine.spec.native_tools)
        and (req.tool_choice is None or req.tool_choice.mode != "none")
    )


async def relay_chat(
    runtime: Runtime,
    call: Relayed,
    ask: Ask,
    req: ChatRequest,
    engine: EngineActor,
    *,
    strict: bool,
    alone: bool = True,
) -> Reply:
    """``req``, a chat request the engine runs as it is, relayed to ``engine`` (``alone``: not
    one target of a failover chain)."""
    shape = structured.wanted(req.response_format, call.body)
    outcome = _Outcome(req.ignored, req.max_tokens, req.output_param, strict, shape, chat=req)
    return await relay(
        runtime,
        call,
        ask,
        "/v1/chat/completions",
        stream=req.stream,
        engine=engine,
        size=chat_size(req),
        outcome=outcome,
        alone=alone,
    )


async def with_mcp(runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest, servers: list[str]) -> Reply:
    if not req.stream:
        loop, resp = await mcp_loop.answer(runtime, req, servers, ask)
        headers = {**loop.headers(), "X-Blazar-Mcp": loop.run.header()}
        return Reply(openai.encode_chat_response(resp, model=req.model), headers=headers)
    stream = await mcp_loop.McpStream.open(
        runtime, req, servers, _chat_encoder(req), mcp_loop.SSE_COMMENTS, ask
    )
    call.on_cleanup(stream.aclose)
    return stream_reply(stream, content_type="text/event-stream", headers=stream.headers())


async def run_translated(runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest) -> Reply:
    tr = engine_call.EngineCall(runtime, _as_translated(call, req), ask)
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


async def complete_text(runtime: Runtime, call: Relayed, ask: Ask, req: CompletionRequest) -> Reply:
    """A legacy completion (decoded and named by its route), behind the policy hooks."""
    return await hooks.through(
        runtime,
        call,
        req,
        Dialect.OPENAI,
        lambda c, r: _complete_text(runtime, c, ask, r),
        relays_body=True,
        shape="completions",
    )


async def _complete_text(runtime: Runtime, call: Relayed, ask: Ask, req: CompletionRequest) -> Reply:
    """A legacy completion: candidates, else the engine's bytes."""
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
    chain = runtime.failover.chains.get(req.model)

    async def on(engine: EngineActor) -> Reply:
        return await relay(
            runtime,
            call,
            ask,
            "/v1/completions",
            stream=req.stream,
            engine=engine,
            size=size,
            outcome=outcome,
            alone=chain is None,
        )

    if chain is not None:
        return await failover.relay_on_chain(runtime, call, ask, chain, on)
    return await on(await runtime.engine_for(req.model, ask.lane))


async def relay(
    runtime: Runtime,
    call: Relayed,
    ask: Ask,
    path: str,
    *,
    stream: bool,
    engine: EngineActor,
    size: PromptSize,
    outcome: _Outcome,
    alone: bool = True,
) -> Reply:
    """The request's own body on ``engine``, its answer relayed as it comes (whole or
    streamed). ``alone``: not one target of a failover chain, whose walk moves on from an
    engine that died; alone, one that died idle is claimed again (``claim.died_idle``)."""
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
    answered: tuple[int, bytes] | None = None
    if not stream and ask.tier >= PREEMPTIBLE_FROM:
        lease, answered = await preemptible_answer(runtime, engine, ask, size, path, body, again=alone)
    else:
        lease = await claim_engine(runtime, engine, ask, prompt=size)  # refused before loading
    handle = lease.handle
    headers: dict[str, str] = {}
    changed = [f"{outcome.output_param}={capped_to}"] if capped_to is not None else []
    honesty.report(
        headers,
        ignored=ignored,
        changed=changed,
        context=engine.served_ctx or engine.spec.ctx_per_slot,
        degrades=honesty.degraded(engine),
    )
    if lease.load_ns > LOADING_NS:
        headers["X-Blazar-Status"] = "loading"
    if capped:
        headers["X-Blazar-Output-Cap"] = str(spec.max_output_tokens)
    enforced = structured.enforcement(engine)
    if outcome.want is not None:
        headers[structured.HEADER] = structured.receipt(enforced, None)

    async def on_error(exc: Exception) -> bytes:
        err = await crash_error(engine, handle, exc)
        if call.card is not None:
            call.card.note_failure(err.code, err.message)
        return openai.encode_stream_error(err.code, err.message)

    rename = renamer_for(handle, spec.alias or spec.model)
    if answered is not None:
        return _whole(call, outcome, answered, headers, enforced, rename)
    try:
        await check_prompt(engine, handle, size)
        if stream and handle.request_model is None and outcome.want is None and call.handoff is not None:
            # A data-plane worker relays the engine's bytes itself (blazar/serve/handoff.py).
            grant = handoff.Grant(
                id=call.handoff.id,
                host=handle.upstream.host,
                port=handle.upstream.port,
                headers=handle.upstream.headers,
                keep=handle.upstream.max_idle,
                keep_s=handle.upstream.idle_expiry_s,
                path=path,
                body=body,
                progress=ours,
            )
            handed = handoff.HandedOff(
                call.handoff,
                grant,
                lease,
                on_end=_usage_reader(call),
                on_error=on_error,
                on_refusal=lambda status, content: handoff.ReportAnswer(
                    status=status, body=_refusal_body(call, status, content)
                ),
                card=call.card,
            )
            _stream_enders(call)
            call.on_cleanup(handed.aclose)
            said = {**headers, handoff.GRANT_HEADER: "1"}
            return stream_reply(handed, content_type="text/event-stream", headers=said)
        try:
            upstream = await send_upstream(handle, path, body)
        except UpstreamError as exc:
            err = await crash_error(engine, handle, exc)
            lease.release()
            if not (alone and died_idle(exc, err)):
                raise err from exc
            lease = await claim_engine(runtime, engine, ask, prompt=size)  # starts it again
            handle = lease.handle
            if lease.load_ns > LOADING_NS:  # the answer waited for that start
                headers["X-Blazar-Status"] = "loading"
            upstream = await send_upstream(handle, path, body)
    except UpstreamError as exc:
        lease.release()
        raise await crash_error(engine, handle, exc) from exc
    except BaseException:
        lease.release()
        raise
    if not stream or upstream.status_code != 200:
        try:
            content = await upstream.aread()
        except UpstreamError as exc:
            raise await crash_error(engine, handle, exc) from exc
        finally:
            await upstream.aclose()
            lease.release()
        return _whole(call, outcome, (upstream.status_code, content), headers, enforced, rename)

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
    _stream_enders(call)
    call.on_cleanup(relayed.aclose)
    sent: AsyncIterator[bytes] = relayed
    if outcome.want is not None:
        sent = structured.ReceiptStream(relayed, outcome.want, enforced)
    return stream_reply(sent, content_type="text/event-stream", headers=headers)


def _whole(
    call: Relayed,
    outcome: _Outcome,
    answered: tuple[int, bytes],
    headers: dict[str, str],
    enforced: structured.Enforced,
    rename: Renamer | None,
) -> Reply:
    """A whole (not streamed) answer of the engine, as the client gets it."""
    status, content = answered
    if status >= 400:
        content = _refusal_body(call, status, content)
    if call.card is not None and status == 200:
        call.card.note_usage(engine_usage.of_body(content))
    if outcome.want is not None and status == 200:
        if (text := structured.content_of(content)) is not None:
            ok = structured.valid(outcome.want, text)
            headers[structured.HEADER] = structured.receipt(enforced, ok)
    if rename is not None:
        content = rename.whole(content)
    return Reply(content, status, headers=headers)


def _stream_enders(call: Relayed) -> None:
    set_stream_enders(
        call.card,
        cancelled=openai.encode_stream_error,
        interrupted=lambda: b"data: [DONE]\n\n",
    )


def _refusal_body(call: Relayed, status: int, content: bytes) -> bytes:
    """An engine's refusal (``status`` 400 or more) as OpenAI words it, with its ``blazar_code``."""
    if status < 400:
        return content
    err = classify_error(status, content)
    call.code, call.error = err.code, err.message
    if err.wordings:  # a refusal OpenAI words its own way: say it so
        return openai.encode_error(err.code, err.message_for(Dialect.OPENAI), param=err.param)
    return openai.merge_error_code(content, err.code)
