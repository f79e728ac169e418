"""Run a neutral chat request on an engine, for the dialects that translate.

OpenAI requests are relayed as bytes (``blazar.serve.relay``); Ollama and
Anthropic requests become a ``ChatRequest`` and come here. ``EngineCall``
prepares the engine (load, context change, lease) and then either completes
the request or streams neutral deltas, which a dialect encoder turns into its
own bytes. Timings are measured here, in the gateway.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, Protocol

import msgspec
import trio

from actors.admission import Requeue
from actors.chain_walk import ChainWalk, failover_code
from actors.context import choose_context
from actors.engine import EngineActor, EngineHandle
from actors.engines.llamacpp import LANE as LLAMACPP
from actors.errors import Preempted, UnsupportedEngine
from actors.preemption import PREEMPTIBLE_FROM
from actors.runtime import Runtime
from actors.upstream import UpstreamError, UpstreamResponse
from blazar.dialects import engine_usage, lora, thinking, tools
from blazar.dialects.llamacpp import (
    SAMPLING_DEFAULTS,
    EngineError,
    EngineStream,
    apply_defaults,
    cap_output,
    classify_error,
    engine_request,
    infill_refusal,
)
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    Delta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from blazar.dialects.prompt_size import chat_size
from blazar.errors import BlazarError
from blazar.serve.cards import set_stream_enders
from blazar.serve.claim import Claim, claim_engine, died_idle
from blazar.serve.context import Ask
from blazar.serve.failover import walk_for, walk_headers
from blazar.serve.policy import honesty, structured
from blazar.serve.policy.certified import chat_needs
from blazar.serve.policy.prompt_fit import check_prompt, ctx_ceiling
from blazar.serve.relay import close_response, crash_error, send_upstream
from blazar.serve.reply import LOADING_NS
from registry.errors import ModelKindMismatch, ModelNotFound

__all__ = [
    "EngineCall",
    "Gathered",
    "Purpose",
    "StreamEncoder",
    "Timings",
    "TranslatedStream",
    "check_images",
    "check_purpose",
    "count_tokens",
    "planned_sampling",
]


class Timings(msgspec.Struct, kw_only=True):
    """Nanosecond timings of one request, measured by the gateway."""

    started_ns: int
    load_ns: int = 0
    first_token_ns: int | None = None
    ended_ns: int | None = None

    @property
    def total_ns(self) -> int:
        return (self.ended_ns or time.perf_counter_ns()) - self.started_ns

    @property
    def prompt_eval_ns(self) -> int:
        end = self.first_token_ns or self.ended_ns or time.perf_counter_ns()
        return max(0, end - self.started_ns - self.load_ns)

    @property
    def eval_ns(self) -> int:
        if self.first_token_ns is None:
            return 0
        return max(0, (self.ended_ns or time.perf_counter_ns()) - self.first_token_ns)

    @property
    def loaded(self) -> bool:
        return self.load_ns > LOADING_NS


class StreamEncoder(Protocol):
    """What a dialect provides to render a translated stream."""

    def start(self, prompt: Usage | None) -> bytes:
        """The stream's head; ``prompt`` is the prompt's size when the engine said it."""
        ...

    def feed(self, delta: Delta) -> bytes: ...
    def finish(self, final: Delta, timings: Timings) -> bytes: ...
    def error(self, code: str, message: str) -> bytes: ...

    def keepalive(self) -> bytes:
        """Bytes the client skips, sent while the engine works without output; empty
        for a dialect that has none."""
        ...


def _engine_error(status: int, body: bytes, engine: EngineActor) -> BlazarError:
    model = engine.spec.model
    if (refused := infill_refusal(status, body)) is not None:  # only /infill answers 501
        return refused
    err = classify_error(
        status,
        body,
        ctx_limit=ctx_ceiling(engine),
        extended=bool(engine.spec.rope_scaling and engine.spec.rope_scale),
        model=model,
    )
    if err.code == "BAD_REQUEST":
        return BlazarError(err.code, f"the engine for '{model}' refused the request: {err.message}")
    if err.code == "BAD_GATEWAY":
        return BlazarError(err.code, f"the engine for '{model}' failed: {err.message}")
    return err


Purpose = Literal["chat", "embed", "embed_tokens", "rerank"]
"""What a translated request asks of the engine; a reranker serves only ``rerank``."""


def check_purpose(purpose: Purpose, engine: EngineActor) -> None:
    """A reranker only ranks, and only a reranker ranks: refused before anything loads."""
    model = engine.spec.alias or engine.spec.model
    if purpose == "rerank" and not engine.spec.reranking:
        raise BlazarError(
            "MODEL_CANNOT_RERANK",
            f"model '{model}' is not a reranker (its GGUF has no ranking head): rerank with a "
            "reranker such as bge-reranker-v2-m3, or rank with `/v1/embeddings`",
        )
    if purpose != "rerank" and engine.spec.reranking:
        what = "chat" if purpose == "chat" else "embeddings"
        raise BlazarError(
            "MODEL_IS_RERANKER",
            f"model '{model}' is a reranker: it serves `/v1/rerank`, not {what} — use another model",
        )


def check_images(req: ChatRequest, engine: EngineActor) -> None:
    """Images need a model with a vision projector (its engine starts with ``--mmproj``)."""
    if engine.spec.projector is None and any(m.images for m in req.messages):
        raise BlazarError(
            "VISION_PROJECTOR_MISSING",
            f"model '{req.model}' cannot read images: it has no vision projector — "
            "send text only, use a vision model (e.g. `blazar pull smolvlm-256m`), or give this "
            f"one its mmproj file: `blazar mmproj {req.model} FILE.gguf`",
        )


def _sampling(req: ChatRequest, engine: EngineActor | None) -> tuple[float | None, float | None]:
    temperature, top_p = req.temperature, req.top_p
    if engine is not None and engine.lane.name == LLAMACPP:
        default_t, default_p = SAMPLING_DEFAULTS
        temperature = default_t if temperature is None else temperature
        top_p = default_p if top_p is None else top_p
    return temperature, top_p


async def planned_sampling(runtime: Runtime, req: ChatRequest) -> tuple[float | None, float | None]:
    """``EngineCall.sampling`` before any engine is claimed, for a request that waits its turn (a
    queued background response says what it will sample with). A failover chain, or a model that
    cannot be served, gives the request's own: its run says the rest, or why it failed."""
    if req.model in runtime.failover.chains:
        return req.temperature, req.top_p
    try:
        engine = await runtime.engine_for(req.model)
    except (ModelNotFound, ModelKindMismatch, UnsupportedEngine):
        return req.temperature, req.top_p
    if engine.spec.defaults:
        req = apply_defaults(req, system=None, defaults=engine.spec.defaults)
    return _sampling(req, engine)


class EngineCall:
    """One translated request: ``prepare`` first, then ``complete`` or ``stream``."""

    def __init__(self, runtime: Runtime, req: ChatRequest, ask: Ask) -> None:
        self.runtime = runtime
        self.req = req
        self.ask = ask
        """Who asks, on what terms (tier, deadline, lane, strictness), and the card told."""
        self.timings = Timings(started_ns=time.perf_counter_ns())
        self.card = ask.card
        """The card that gets the engine's usage: the live card of the HTTP request this
        serves, or one of work that runs outside any request (a job)."""
        self.engine: EngineActor | None = None
        self.handle: EngineHandle | None = None
        self.claim: Claim | None = None
        self.context: int | None = None
        """The per-slot context the request runs with (known once the engine is claimed)."""
        self.ctx_asked: int | None = None
        """The request's ``num_ctx`` when it differs from ``context``."""
        self.output_cap: int | None = None
        """The configured output cap, when it was applied to this request."""
        self.strict = ask.is_strict(runtime is not None and runtime.config.strict)
        self.changed: list[str] = []
        """The request's parameters run with another value (``NAME=VALUE``)."""
        self._ctx_clamped = False
        self._client_ctx = req.num_ctx
        self._client_max = req.max_tokens
        self._asked = req
        """The request as it came, before one target's settings changed it (a chain's next starts here)."""
        self._chain: ChainWalk | None = None
        """The walk along a failover chain, when ``req.model`` names one."""
        self._embeddings = False
        self._purpose: Purpose = "chat"
        self._requeue: Requeue | None = None
        """Set while a preempted request claims again (at the head of its class)."""
        self._started_again = False
        """Whether the request already claimed its engine again after it died idle."""
        self.structured_valid: bool | None = None
        """Whether the whole answer passed the request's output format (None: not checked)."""

    @property
    def native_tools(self) -> bool:
        return bool(self.engine and self.engine.spec.native_tools)

    @property
    def system_turns(self) -> bool:
        return self.engine is None or self.engine.spec.system_turns

    def engine_request(self, req: ChatRequest) -> tuple[str, dict[str, Any]]:
        path, body = engine_request(
            req,
            native_tools=self.native_tools,
            system_turns=self.system_turns,
            llguidance=bool(self.engine and self.engine.spec.llguidance),
            thinking_support=self.engine.spec.thinking if self.engine else "none",
            think_effort=bool(self.engine and self.engine.spec.think_effort),
        )
        if "lora" in body and self.engine is not None:  # Ollama's options.lora
            spec = self.engine.spec
            names = [a.name for a in spec.loras]
            body["lora"] = lora.choose(
                body["lora"], names, model=spec.alias or spec.model, param="options.lora"
            )
        return path, body

    async def prepare(self, *, embeddings: bool = False, purpose: Purpose | None = None) -> EngineActor:
        """Claim the engine. ``purpose`` (``blazar.serve.vectors``): ``embed``, ``embed_tokens``
        (a vector per token: late chunking) or ``rerank``; ``embeddings`` is ``embed``."""
        honesty.refuse_ignored(self.req.ignored, strict=self.strict)
        self._purpose = purpose or ("embed" if embeddings else "chat")
        embeddings = self._embeddings = self._purpose in ("embed", "embed_tokens")
        if (chain := self.runtime.failover.chains.get(self.req.model)) is not None:
            self._chain = walk_for(self.runtime, chain, self.ask)
            return await self._prepare_next()
        engine = self.engine = await self.runtime.engine_for(self.req.model, self.ask.lane)
        await self._prepare_on(engine, embeddings)
        return engine

    async def _prepare_next(self) -> EngineActor:
        """Prepare the chain's next target, from the request as it came; a target that fails
        to is benched and the one after tried (``FAILOVER_EXHAUSTED`` when none is left)."""
        run = self._chain
        assert run is not None
        while True:
            self._reset()
            engine = await run.next()
            assert engine is not None  # a local walk
            self.engine = engine
            try:
                with trio.move_on_at(run.deadline) as scope:
                    await self._prepare_on(engine, self._embeddings)
            except Exception as exc:
                self.release()
                run.failed(exc)
                continue
            if not scope.cancelled_caught:
                return engine
            self.release()
            run.timed_out()

    def _reset(self) -> None:
        """Forget what the last target made of the request."""
        self.req, self.changed, self.output_cap, self.ctx_asked = self._asked, [], None, None
        self._ctx_clamped = False
        self.claim = self.handle = None
        self.context = None
        self.timings.ended_ns = None
        if self.card is not None:
            self.card.failed_code = self.card.failed_reason = None

    async def _prepare_on(self, engine: EngineActor, embeddings: bool) -> None:
        check_images(self.req, engine)
        if self.req.suffix is not None and "infill" not in engine.lane.capabilities:
            raise BlazarError(
                "MODEL_UNSUPPORTED_ENGINE",
                f"model '{self.req.model}' runs on {engine.lane.name}, which cannot fill in the middle "
                "(`suffix`); only llama.cpp engines do (pin the model to llamacpp to use it)",
            )
        spec = engine.spec
        check_purpose(self._purpose, engine)
        said = thinking.unheeded(self.req, support=spec.thinking)
        unheeded = [n for n in said if n not in self.req.ignored]
        if unheeded:
            # The model's template cannot think (or cannot stop): named, or refused when strict.
            honesty.refuse_ignored(unheeded, strict=self.strict)
            self.req = msgspec.structs.replace(self.req, ignored=[*self.req.ignored, *unheeded])
        if spec.system or spec.defaults:
            self.req = apply_defaults(self.req, system=spec.system, defaults=spec.defaults)
        if self._purpose == "chat":
            self.req, capped = cap_output(self.req, spec.max_output_tokens)
            self.output_cap = spec.max_output_tokens if capped else None
        ctx = self._restart_ctx(engine)
        size = chat_size(self.req)
        if self._purpose == "chat":
            self._cap_to_context(max(ctx or 0, engine.served_ctx or 0, spec.ctx_per_slot))
        needs = (
            []
            if self._purpose == "rerank"
            else chat_needs(self.req)
            if self._purpose == "chat"
            else ["embeddings"]
        )
        # The claim refuses a failed capability and a prompt too long for the context the
        # slot will hold, and restarts the engine for a larger context or embeddings, all
        # before queueing, loading or templating.
        self.claim = await claim_engine(
            self.runtime,
            engine,
            self.ask,
            keep_alive_s=self.req.keep_alive_s,
            needs=needs,
            prompt=size,
            ctx_per_slot=ctx,
            embeddings=embeddings,
            token_embeddings=self._purpose == "embed_tokens",
            requeue=self._requeue,
        )
        self.handle = self.claim.handle
        self.timings.load_ns = self.claim.load_ns
        self.context = engine.served_ctx or engine.spec.ctx_per_slot
        if self.req.num_ctx is not None and self.req.num_ctx != self.context:
            self.ctx_asked = self.req.num_ctx
        try:
            await check_prompt(engine, self.handle, size)
        except BaseException:
            self.release()
            raise

    def _restart_ctx(self, engine: EngineActor) -> int | None:
        """The per-slot context to restart the engine with for the request's ``num_ctx``;
        None when what the engine serves (or will start with) is already large enough.
        A ``num_ctx`` above what the model can serve is clamped first (strict: refused), so
        clients that vary it per request (prompt size times a margin) never restart for nothing."""
        asked = self.req.num_ctx
        if asked is None:
            return None
        spec = engine.spec
        strict = self.strict
        limit = ctx_ceiling(engine)
        choice = choose_context(asked, limit, strict=strict, model=spec.model, what="num_ctx")
        self._ctx_clamped = choice.clamped and self._client_ctx is not None
        need = choice.ctx
        serving = engine.served_ctx or spec.ctx_per_slot
        return None if serving >= need else need

    def _cap_to_context(self, ctx: int) -> None:
        """An output limit the caller set above the context: no answer can be that long."""
        assert self.engine is not None
        param = self.req.output_param
        limit = honesty.output_limit(
            self._client_max, ctx, param=param, model=self.engine.spec.model, strict=self.strict
        )
        if limit is not None:
            self.req = msgspec.structs.replace(self.req, max_tokens=limit)
            self.changed.append(f"{param}={limit}")

    def sampling(self) -> tuple[float | None, float | None]:
        """The temperature and top_p the engine samples with: the request's or the model's own,
        else the engine's defaults where they are known (llama.cpp's); None where unknown."""
        return _sampling(self.req, self.engine)

    def headers(self) -> dict[str, str]:
        """What the response says about how the request ran."""
        out: dict[str, str] = {}
        if self.timings.loaded:
            out["X-Blazar-Status"] = "loading"
        changed = self.changed
        if self._ctx_clamped and self.context is not None:
            changed = [*changed, f"options.num_ctx={self.context}"]
        honesty.report(
            out,
            ignored=self.req.ignored,
            changed=changed,
            context=self.context,
            emulated_tools=tools.emulated(self.req, native_tools=self.native_tools),
            ctx_clamped=self._ctx_clamped,
            degrades=honesty.degraded(self.engine),
        )
        if self.ctx_asked is not None:
            out["X-Blazar-Context-Asked"] = str(self.ctx_asked)
        if self.output_cap is not None:
            out["X-Blazar-Output-Cap"] = str(self.output_cap)
        if self._chain is not None:
            out.update(walk_headers(self._chain))
        if self._purpose == "chat" and structured.wanted(self.req.response_format) is not None:
            out[structured.HEADER] = structured.receipt(self.enforced(), self.structured_valid)
        return out

    def enforced(self) -> structured.Enforced:
        """How the engine is held to the request's output format."""
        emulated = tools.emulated(self.req, native_tools=self.native_tools)
        return structured.enforcement(self.engine, emulated=emulated)

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()
        self.timings.ended_ns = self.timings.ended_ns or time.perf_counter_ns()

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """A non-stream engine call; errors become ``BlazarError``."""
        assert self.engine is not None and self.handle is not None
        try:
            resp = await send_upstream(self.handle, path, msgspec.json.encode(body))
            try:
                content = await resp.aread()
            finally:
                await close_response(resp)
        except UpstreamError as exc:
            raise await crash_error(self.engine, self.handle, exc) from exc
        if resp.status_code >= 400:
            raise _engine_error(resp.status_code, content, self.engine)
        return msgspec.json.decode(content)

    async def complete(self) -> ChatResponse:
        """The whole answer. The engine is asked for a stream all the same: llama.cpp
        notices a closed connection only while it streams, so a client that goes away
        stops the engine too; and the first token is timed here."""
        while True:
            gathered = Gathered()
            try:
                with self._preemptible():
                    stream = await self.stream(gathered)
                    try:
                        async for _ in stream:
                            pass
                    finally:
                        await stream.aclose()
            except Preempted:
                await self._claim_again()
                continue
            try:
                resp = gathered.response(self.req)
            except BlazarError as exc:
                # Nothing of a whole answer has been sent: a chain's next target may give it.
                if self._chain is None or failover_code(exc) is None:
                    raise
                self._chain.failed(exc)
                await self._prepare_next()
                continue
            want = structured.wanted(self.req.response_format)
            if want is not None and not resp.tool_calls:
                self.structured_valid = structured.valid(want, resp.text)
            return resp

    def _preemptible(self) -> AbstractContextManager[None]:
        """A whole answer of a batch or background request is its slot's preemptible window:
        nothing reaches its client before it is whole (``actors/preemption.py``). Not on a
        failover chain, whose walk holds its own claims."""
        if self._chain is None and self.claim is not None and self.ask.tier >= PREEMPTIBLE_FROM:
            return self.claim.slot.preemptible()
        return nullcontext()

    async def _claim_again(self, *, preempted: bool = True) -> None:
        """Claim the same engine again: after a preemption (the engine stream closed, the
        slot released), at the head of the request's class; after the engine died idle
        (``claim.died_idle``, the claim released), as a new request, which starts it again."""
        assert self.claim is not None and self.engine is not None
        if preempted:
            self._requeue = self.claim.slot.requeue()
            if self.card is not None:
                self.card.note_preempted()
        self._reset()
        await self._prepare_on(self.engine, self._embeddings)

    async def stream(self, encoder: StreamEncoder) -> TranslatedStream:
        """Open the engine stream; errors before the first byte are raised as HTTP errors
        (on a chain, they move the request to the next target first)."""
        resp = await self._open_on_chain() if self._chain is not None else await self._open()
        stream = TranslatedStream(self, resp, encoder)
        set_stream_enders(
            self.card,
            cancelled=encoder.error,
            interrupted=lambda: encoder.finish(Delta(finish_reason="stop"), self.timings),
        )
        return stream

    async def _open_on_chain(self) -> UpstreamResponse:
        run = self._chain
        assert run is not None
        while True:
            try:
                with trio.move_on_at(run.deadline) as scope:
                    resp = await self._open()
            except Exception as exc:
                run.failed(exc)  # the request's own error is raised again
            else:
                if not scope.cancelled_caught:
                    run.succeeded()
                    return resp
                run.timed_out()
            await self._prepare_next()

    async def _open(self) -> UpstreamResponse:
        """The engine's response head of the streamed request (released on failure)."""
        assert self.engine is not None and self.handle is not None
        try:
            path, body = self.engine_request(msgspec.structs.replace(self.req, stream=True))
            resp = await send_upstream(self.handle, path, msgspec.json.encode(body))
        except UpstreamError as exc:
            self.release()
            err = await crash_error(self.engine, self.handle, exc)
            # Not on a chain, whose walk moves on by itself, nor inside a preemptible window,
            # which belongs to the slot just released.
            preemptible = self.ask.tier >= PREEMPTIBLE_FROM
            if self._chain is not None or preemptible or self._started_again or not died_idle(exc, err):
                raise err from exc
            self._started_again = True
            await self._claim_again(preempted=False)
            return await self._open()
        except BaseException:
            self.release()
            raise
        if resp.status_code >= 400:
            try:
                content = await resp.aread()
            except UpstreamError as exc:
                raise await crash_error(self.engine, self.handle, exc) from exc
            finally:
                await close_response(resp)
                self.release()
            raise _engine_error(resp.status_code, content, self.engine)
        return resp


class Gathered:
    """A stream encoder that keeps the deltas, for an answer sent whole."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: dict[int, list[ToolCallDelta]] = {}
        self._final = Delta(finish_reason="stop")
        self._error: BlazarError | None = None

    def start(self, prompt: Usage | None) -> bytes:
        return b""

    def feed(self, delta: Delta) -> bytes:
        self._text.append(delta.text)
        self._thinking.append(delta.thinking)
        for c in delta.tool_calls:
            self._calls.setdefault(c.index, []).append(c)
        return b""

    def finish(self, final: Delta, timings: Timings) -> bytes:
        self.feed(final)
        self._final = final
        return b""

    def error(self, code: str, message: str) -> bytes:
        self._error = BlazarError(code, message)
        return b""

    def response(self, req: ChatRequest) -> ChatResponse:
        if self._error is not None:
            raise self._error
        calls = [
            ToolCall(
                id=next((f.id for f in fragments if f.id), f"call_{index}"),
                name=next((f.name for f in fragments if f.name), ""),
                arguments="".join(f.arguments for f in fragments),
            )
            for index, fragments in sorted(self._calls.items())
        ]
        return ChatResponse(
            id=f"chatcmpl-{secrets.token_hex(12)}",
            model=req.model,
            created=int(time.time()),
            text="".join(self._text),
            thinking="".join(self._thinking),
            tool_calls=calls,
            finish_reason=self._final.finish_reason or "stop",
            usage=self._final.usage or Usage(),
        )

    def keepalive(self) -> bytes:
        return b""


KEEPALIVE_S = 15.0
"""Longest silence on a stream while the engine works: a long prompt's evaluation
or an emulated call held back can take minutes on a CPU, longer than the read
timeouts between bytes of SDKs and reverse proxies."""


class TranslatedStream:
    """The engine's SSE parsed into deltas and re-encoded; closed exactly once."""

    def __init__(self, call: EngineCall, response: UpstreamResponse, encoder: StreamEncoder) -> None:
        self._call = call
        self._response = response
        self._encoder = encoder
        self._parser = EngineStream(call.req, native_tools=call.native_tools)
        self._iter: AsyncIterator[bytes] = self._generate()
        self._closed = False

    def __aiter__(self) -> TranslatedStream:
        return self

    async def __anext__(self) -> bytes:
        return await self._iter.__anext__()

    async def _generate(self) -> AsyncIterator[bytes]:
        call, timings, parser = self._call, self._call.timings, self._parser
        started = False
        final: Delta | None = None
        last_sent = time.monotonic()
        try:
            async for chunk in self._response.aiter_raw():
                out: list[bytes] = []
                events = parser.events
                deltas = parser.feed(chunk)
                if not started and parser.seen_event:
                    # The engine's first event comes before it evaluates the prompt and
                    # says how long the prompt is, which the stream's head reports.
                    started = True
                    out.append(self._encoder.start(parser.prompt))
                # The first token, not the first delta: an emulated tool call becomes
                # deltas only once its name is whole.
                if timings.first_token_ns is None and parser.started:
                    timings.first_token_ns = time.perf_counter_ns()
                for delta in deltas:
                    if delta.finish_reason is not None:
                        final = delta
                    else:
                        out.append(self._encoder.feed(delta))
                data, now = b"".join(out), time.monotonic()
                # The engine reports its progress through a long prompt once per batch;
                # those events, and output held back, bring nothing to send.
                if not data and started and parser.events > events and now - last_sent >= KEEPALIVE_S:
                    data = self._encoder.keepalive()
                if data:
                    last_sent = now
                    yield data
        except UpstreamError as exc:
            assert call.engine is not None and call.handle is not None
            err = await crash_error(call.engine, call.handle, exc)
            yield self._failed(err.code, err.message)
            return
        except EngineError as exc:
            yield self._failed("BAD_GATEWAY", f"the engine failed mid-stream: {exc}")
            return
        finally:
            await self.aclose()
        head = b"" if started else self._encoder.start(parser.prompt)
        final = final or Delta(finish_reason="stop")
        if call.card is not None:
            call.card.note_usage(engine_usage.of_parts(final.usage, parser.timings))
        yield head + self._encoder.finish(final, timings)

    def _failed(self, code: str, message: str) -> bytes:
        """The dialect's error event for a failure midway, noted on the card for the ledger."""
        if (card := self._call.card) is not None:
            card.note_failure(code, message)
        return self._encoder.error(code, message)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closed at once even while the prompt is read: the stream asked for progress
        # events (``engine_request``), so the engine notices at its next batch.
        await close_response(self._response)
        self._call.release()


async def count_tokens(runtime: Runtime, req: ChatRequest, ask: Ask) -> int:
    """The prompt tokens this request would use: the engine's own template and tokenizer."""
    call = EngineCall(runtime, req, ask)
    await call.prepare()
    try:
        _, body = call.engine_request(req)
        template_body: dict[str, Any] = {k: body[k] for k in ("messages", "tools") if k in body}
        prompt = (await call.post("/apply-template", template_body))["prompt"]
        tokens = (await call.post("/tokenize", {"content": prompt, "add_special": True}))["tokens"]
    finally:
        call.release()
    return len(tokens)
