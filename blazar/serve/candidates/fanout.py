"""``n`` and ``best_of`` on OpenAI's relayed routes (chat and legacy completions).

Each candidate is the caller's body with ``n: 1`` (and its own seed), relayed to the engine
under its own admission claim, side by side. llama.cpp can answer ``n`` itself, but its
choices then share one slot's claim while using several and its usage counts one choice,
so the gateway runs the candidates instead: admission sees every slot, usage sums them.
The candidates' bodies are the engine's own, so ``logprobs`` and llama.cpp's extensions
keep working; ``best_of`` asks the engine for log-probabilities to rank by (and takes them
out again when the caller did not ask for them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec
import trio

from actors.config import FailoverChain
from actors.engine import EngineActor
from actors.engines.llamacpp import LANE as LLAMACPP
from actors.runtime import Runtime
from actors.upstream import UpstreamError
from blazar.dialects import engine_usage, lora
from blazar.dialects.llamacpp import apply_defaults_to_body, cap_output_in_body, classify_error
from blazar.dialects.neutral import ChatRequest, CompletionRequest, ResponseFormat
from blazar.dialects.prompt_size import PromptSize
from blazar.errors import BlazarError, Dialect
from blazar.serve import failover, mcp_loop
from blazar.serve.candidates import choices
from blazar.serve.claim import claim_engine
from blazar.serve.context import Ask, Relayed
from blazar.serve.decisions import judge_answer, last_user_text
from blazar.serve.engine_call import check_images
from blazar.serve.policy import honesty
from blazar.serve.policy.certified import chat_needs, refuse_failed
from blazar.serve.policy.prompt_fit import check_prompt, refuse_if_too_long
from blazar.serve.relay import close_response, crash_error, send_upstream
from blazar.serve.reply import LOADING_NS, Reply

__all__ = ["Asked", "asked", "not_streamed", "run", "run_on"]


class _Fields(msgspec.Struct):
    n: Any = None
    best_of: Any = None
    seed: Any = None
    logprobs: Any = None


@dataclass(frozen=True, slots=True)
class Asked:
    n: int
    best_of: int | None
    seed: int | None
    logprobs: bool


def not_streamed(what: str) -> BlazarError:
    return BlazarError(
        "CANDIDATES_NOT_STREAMED",
        f"{what} needs the whole answers before one is sent, so it cannot stream: send the "
        "request without `stream` (or leave the option out to stream one answer)",
        param="stream",
    )


def asked(call: Relayed, *, completions: bool) -> Asked | None:
    """The candidates an OpenAI body asks for, or None for one answer (``n`` is range-checked
    by the dialect's decoder; ``best_of`` here, also from the ``x-blazar-best-of`` header)."""
    body = call.body
    if b'"n"' not in body and b'"best_of"' not in body and choices.BEST_OF_HEADER not in call.headers:
        return None
    try:
        fields = msgspec.json.decode(body, type=_Fields)
    except msgspec.DecodeError:
        return None
    n = fields.n if isinstance(fields.n, int) and not isinstance(fields.n, bool) else 1
    best_of = choices.best_of(fields.best_of, call.headers)
    if completions and best_of is not None and best_of < n:
        raise BlazarError(
            "BAD_REQUEST",
            f"best_of must be at least n: best_of={best_of} cannot choose {n} answers — raise best_of "
            "or lower n",
            param="best_of",
        )
    if not completions and best_of is not None and n > 1:
        raise BlazarError(
            "BAD_REQUEST",
            "`best_of` chooses one answer: send it with `n: 1` (or without `n`)",
            param="best_of",
        )
    if n == 1 and best_of is None:
        return None
    seed = fields.seed if isinstance(fields.seed, int) and not isinstance(fields.seed, bool) else None
    return Asked(n=n, best_of=best_of, seed=seed, logprobs=fields.logprobs not in (None, False, 0))


async def run_on(
    runtime: Runtime,
    call: Relayed,
    ask: Ask,
    chain: FailoverChain | None,
    engine: EngineActor | None,
    want: Asked,
    *,
    path: str,
    size: PromptSize,
    req: ChatRequest | CompletionRequest,
) -> Reply:
    """The candidates on ``engine``, or on a failover chain's targets in turn (all of one
    request's candidates on one target: a target that fails any of them passes them all on)."""
    what = "`best_of`" if want.best_of is not None else "`n` above 1"
    if req.stream:
        raise not_streamed(what)
    if mcp_loop.selected_servers(runtime, call):
        raise BlazarError("BAD_REQUEST", f"{what} does not combine with MCP tools yet: send one or the other")
    if isinstance(req, ChatRequest) and req.tools and (engine is None or not engine.spec.native_tools):
        raise BlazarError(
            "BAD_REQUEST",
            f"'{req.model}' may run tool calls emulated, one answer at a time: send `n`/`best_of` "
            "without `tools`, or use a model with a tool template",
        )

    async def attempt(target: EngineActor) -> Reply:
        if isinstance(req, ChatRequest):
            check_images(req, target)
            refuse_failed(runtime, target.spec.model, chat_needs(req), ask)
        return await run(runtime, call, ask, target, want, path=path, size=size, req=req)

    if chain is not None:
        return await failover.relay_on_chain(runtime, call, ask, chain, attempt)
    assert engine is not None
    return await run(runtime, call, ask, engine, want, path=path, size=size, req=req)


async def run(
    runtime: Runtime,
    call: Relayed,
    ask: Ask,
    engine: EngineActor,
    want: Asked,
    *,
    path: str,
    size: PromptSize,
    req: ChatRequest | CompletionRequest,
) -> Reply:
    """Run the candidates on ``engine``, merge or choose, and answer as the engine would have
    for one (``run_on`` has checked the request)."""
    fmt = req.response_format if isinstance(req, ChatRequest) else None
    ignored, max_tokens, output_param = req.ignored, req.max_tokens, req.output_param
    completions = path == "/v1/completions"
    count = want.best_of or want.n
    strict = ask.is_strict(runtime.config.strict)
    ctx = engine.served_ctx or engine.spec.ctx_per_slot
    capped_to = honesty.output_limit(
        max_tokens, ctx, param=output_param, model=engine.spec.model, strict=strict
    )
    spec = engine.spec
    body = lora.in_body(call.body, [a.name for a in spec.loras], model=spec.alias or spec.model)
    if spec.system or spec.defaults:
        body = apply_defaults_to_body(body, system=spec.system, defaults=spec.defaults)
    body, capped = cap_output_in_body(body, spec.max_output_tokens)
    refuse_if_too_long(engine, size)
    base: dict[str, Any] = msgspec.json.decode(body)
    for key in ("n", "best_of", "cascade"):
        base.pop(key, None)
    ranked = want.best_of is not None and not want.logprobs and engine.lane.name == LLAMACPP
    if ranked:  # llama.cpp's log-probabilities to rank by, taken out of the answer again
        base["logprobs"] = 1 if completions else True
    docs: list[dict[str, Any]] = [{}] * count
    loaded = [False]

    async def one(i: int, seed: int | None) -> None:
        sent = dict(base)
        if seed is not None:
            sent["seed"] = seed
        claim = await claim_engine(runtime, engine, ask)
        try:
            loaded[0] = loaded[0] or claim.load_ns > LOADING_NS
            await check_prompt(engine, claim.handle, size)
            resp = await send_upstream(claim.handle, path, msgspec.json.encode(sent))
            try:
                content = await resp.aread()
            finally:
                await close_response(resp)
        except UpstreamError as exc:
            raise await crash_error(engine, claim.handle, exc) from exc
        finally:
            claim.release()
        if resp.status_code >= 400:
            err = classify_error(resp.status_code, content)
            raise BlazarError(err.code, err.message_for(Dialect.OPENAI), param=err.param)
        if call.card is not None:
            call.card.note_usage(engine_usage.of_body(content))
        docs[i] = msgspec.json.decode(content)

    async with trio.open_nursery() as nursery:
        for i, seed in enumerate(choices.seeds(want.seed, count)):
            nursery.start_soon(one, i, seed)
    headers: dict[str, str] = {}
    changed = [f"{output_param}={capped_to}"] if capped_to is not None else []
    honesty.report(headers, ignored=ignored, changed=changed, context=ctx, degrades=honesty.degraded(engine))
    if loaded[0]:
        headers["X-Blazar-Status"] = "loading"
    if capped:
        headers["X-Blazar-Output-Cap"] = str(spec.max_output_tokens)
    kept = list(range(count))
    if want.best_of is not None:
        judged = [_judge(d, fmt, completions=completions) for d in docs]
        judge = runtime.config.best_of_judge
        if judge is not None and isinstance(req, ChatRequest) and want.n == 1:
            judged = await _judged(runtime, ask, judge, req, docs, judged)
        if want.n == 1:
            won = choices.pick(judged)
            kept = [won.winner]
            headers["X-Blazar-Best-Of"] = choices.best_of_header(count, won)
        else:
            kept = choices.rank(judged, want.n)
            headers["X-Blazar-Best-Of"] = f"ran={count}, kept={','.join(map(str, kept))}, why=rank"
    merged = _merge([docs[i] for i in kept], docs, strip_logprobs=ranked)
    if engine.lane.request_model is not None:  # an engine that names the model its own way
        merged["model"] = spec.alias or spec.model
    tokens = sum(_usage(d).get("completion_tokens", 0) for d in docs)
    choices.stats_for(runtime).note("best_of" if want.best_of else "n", candidates=count, tokens=tokens)
    return Reply(msgspec.json.encode(merged), headers=headers)


def _usage(doc: dict[str, Any]) -> dict[str, Any]:
    usage = doc.get("usage")
    return usage if isinstance(usage, dict) else {}


def _first_choice(doc: dict[str, Any]) -> dict[str, Any]:
    found = doc.get("choices") or [{}]
    return found[0] if isinstance(found[0], dict) else {}


def _judge(doc: dict[str, Any], fmt: ResponseFormat | None, *, completions: bool) -> choices.Candidate:
    choice = _first_choice(doc)
    if completions:
        text, calls = str(choice.get("text") or ""), 0
    else:
        message = choice.get("message") or {}
        text, calls = str(message.get("content") or ""), len(message.get("tool_calls") or [])
    why = choices.problem(text=text, finish_reason=choice.get("finish_reason"), tool_calls=calls, fmt=fmt)
    return choices.Candidate(problem=why, logprob=choices.mean_logprob(choice.get("logprobs")))


async def _judged(
    runtime: Runtime,
    ask: Ask,
    judge: str,
    req: ChatRequest,
    docs: list[dict[str, Any]],
    judged: list[choices.Candidate],
) -> list[choices.Candidate]:
    """The valid candidates as ``best_of_judge`` reads them (when more than one is valid)."""
    if sum(c.problem is None for c in judged) < 2:
        return judged
    asked = last_user_text(req)
    out = []
    for doc, c in zip(docs, judged, strict=True):
        if c.problem is None:
            text = str((_first_choice(doc).get("message") or {}).get("content") or "")
            c = replace(c, judged=await judge_answer(runtime, ask, judge, asked, text))
        out.append(c)
    return out


def _merge(kept: list[dict[str, Any]], ran: list[dict[str, Any]], *, strip_logprobs: bool) -> dict[str, Any]:
    """One response: the first kept candidate's envelope, the kept choices numbered 0…, and
    usage summed over every candidate that ran (each read the prompt in its own slot)."""
    out = dict(kept[0])
    picked = []
    for index, doc in enumerate(kept):
        choice = dict(_first_choice(doc))
        choice["index"] = index
        if strip_logprobs:
            choice["logprobs"] = None
        picked.append(choice)
    out["choices"] = picked
    usage: dict[str, Any] = {}
    for doc in ran:
        for key, value in _usage(doc).items():
            if isinstance(value, int) and not isinstance(value, bool):
                usage[key] = usage.get(key, 0) + value
            elif isinstance(value, dict):
                inner = usage.setdefault(key, {})
                for k, v in value.items():
                    if isinstance(v, int) and not isinstance(v, bool):
                        inner[k] = inner.get(k, 0) + v
    if usage:
        out["usage"] = usage
    out.pop("timings", None)  # one engine call's timings would describe only one candidate
    return out
