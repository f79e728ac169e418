"""``best_of`` and cascades for the dialects that translate (OpenAI chat's cascades, the
Responses API, Anthropic messages, Ollama chat), on the neutral request and answer.

``best_of``: the candidates run side by side, each an ``EngineCall`` of its own (its own
admission claim), with distinct seeds when the request gives one; ``blazar.serve.candidates.choices``
picks the winner. A cascade runs its models one after the other and stops at the first
answer that passes the request's validator, and its entry's judge (a decision model, asked
yes or no about the answer) where the config names one. Both answer whole: a stream is refused.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec
import trio

from actors.config import Cascade
from actors.runtime import Runtime
from blazar.dialects.neutral import ChatRequest, ChatResponse, Usage
from blazar.errors import BlazarError
from blazar.serve import engine_call, mcp_loop
from blazar.serve.candidates import choices
from blazar.serve.candidates.fanout import not_streamed
from blazar.serve.context import Ask, Relayed
from blazar.serve.decisions import judge_answer, last_user_text

__all__ = ["Answered", "answer", "refuse_in_background"]

Answered = tuple[engine_call.EngineCall, ChatResponse, dict[str, str]]
"""The engine call that answered (for its headers), the answer, and the headers that say
how it was chosen."""


def _wanted(runtime: Runtime, call: Relayed, model: str) -> choices.Wanted:
    cfg = runtime.config
    return choices.wanted(
        call.body,
        call.headers,
        model=model,
        cascades={c.name: (list(c.models), list(c.refusals)) for c in cfg.cascade},
        default_refusals=cfg.cascade_refusals,
    )


def refuse_in_background(runtime: Runtime, call: Relayed, model: str) -> None:
    """A background response runs as a job, one answer: ``best_of`` or a cascade is refused."""
    want = _wanted(runtime, call, model)
    if want.best_of is not None or want.cascade is not None:
        raise BlazarError(
            "BAD_REQUEST",
            "`best_of` and cascades do not run in background responses yet: send it without "
            "`background`, or without them",
        )


async def answer(
    runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest, *, best_of: bool = True
) -> Answered | None:
    """The chosen answer when the request asks for ``best_of`` (unless ``best_of`` is False:
    the route runs it itself) or a cascade; None when it asks for neither."""
    want = _wanted(runtime, call, req.model)
    if not best_of:
        want = replace(want, best_of=None)
    if want.best_of is None and want.cascade is None:
        return None
    what = "`best_of`" if want.best_of is not None else "a cascade"
    if req.stream:
        raise not_streamed(what)
    if mcp_loop.selected_servers(runtime, call):
        raise BlazarError("BAD_REQUEST", f"{what} does not combine with MCP tools yet: send one or the other")
    if want.cascade is not None:
        return await _cascade(runtime, req, ask, want)
    assert want.best_of is not None
    return await _best_of(runtime, req, ask, want.best_of)


def _judge(req: ChatRequest, resp: ChatResponse, want: choices.Wanted) -> str | None:
    return choices.problem(
        text=resp.text,
        finish_reason=resp.finish_reason,
        tool_calls=len(resp.tool_calls),
        fmt=req.response_format,
        refusal=want.refusal,
    )


async def _judged(
    runtime: Runtime, ask: Ask, cascade: Cascade, req: ChatRequest, resp: ChatResponse
) -> str | None:
    """The cascade's judge (a decision model) on an answer that passed the other checks:
    ``judge-p=P`` (escalate) when its probability of yes is under the entry's threshold."""
    assert cascade.judge is not None
    p_yes = await judge_answer(runtime, ask, cascade.judge, last_user_text(req), resp.text)
    return None if p_yes >= cascade.judge_threshold else f"judge-p={p_yes:.2f}"


def _sum(usages: list[Usage]) -> Usage:
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_tokens=sum(u.cached_tokens for u in usages),
        reasoning_tokens=sum(u.reasoning_tokens for u in usages),
    )


async def _best_of(runtime: Runtime, req: ChatRequest, ask: Ask, count: int) -> Answered:
    ran: list[tuple[engine_call.EngineCall, ChatResponse] | None] = [None] * count

    async def one(i: int, seed: int | None) -> None:
        asked = req if seed is None else msgspec.structs.replace(req, seed=seed)
        tr = engine_call.EngineCall(runtime, asked, ask)
        await tr.prepare()
        ran[i] = (tr, await tr.complete())

    async with trio.open_nursery() as nursery:
        for i, seed in enumerate(choices.seeds(req.seed, count)):
            nursery.start_soon(one, i, seed)
    done = [r for r in ran if r is not None]
    judged = [choices.Candidate(problem=_judge(req, resp, choices.Wanted())) for _, resp in done]
    if (judge := runtime.config.best_of_judge) is not None and sum(c.problem is None for c in judged) > 1:
        asked = last_user_text(req)
        judged = [
            c
            if c.problem is not None
            else replace(c, judged=await judge_answer(runtime, ask, judge, asked, r.text))
            for c, (_, r) in zip(judged, done, strict=True)
        ]
    won = choices.pick(judged)
    tr, resp = done[won.winner]
    usage = _sum([r.usage for _, r in done])
    choices.stats_for(runtime).note("best_of", candidates=count, tokens=usage.completion_tokens)
    resp = msgspec.structs.replace(resp, usage=usage)
    return tr, resp, {"X-Blazar-Best-Of": choices.best_of_header(count, won)}


async def _cascade(runtime: Runtime, req: ChatRequest, ask: Ask, want: choices.Wanted) -> Answered:
    models = want.cascade or []
    escalated: list[str] = []
    usages: list[Usage] = []
    judge = next((c for c in runtime.config.cascade if c.name == want.name and c.judge), None)
    for step, model in enumerate(models, 1):
        tr = engine_call.EngineCall(runtime, msgspec.structs.replace(req, model=model), ask)
        await tr.prepare()
        resp = await tr.complete()
        usages.append(resp.usage)
        why = _judge(req, resp, want)
        if why is None and judge is not None and step < len(models):
            why = await _judged(runtime, ask, judge, req, resp)
        if why is None or step == len(models):
            break
        escalated.append(f"{model}:{why}")
    stats = choices.stats_for(runtime)
    usage = _sum(usages)
    stats.note("cascade", candidates=len(usages), tokens=usage.completion_tokens)
    stats.escalations += len(usages) - 1
    header = choices.cascade_header(len(usages), len(models), model, why or "valid")
    if escalated:
        header += f", escalated={';'.join(escalated)}"
    return tr, msgspec.structs.replace(resp, usage=usage), {"X-Blazar-Cascade": header}
