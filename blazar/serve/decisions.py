"""Decisions from an engine (``POST /v1/systemone``): a label, a yes or no, or a number.

The request is a chat request to the engine (``EngineCall``), so admission, key scopes,
failover chains, the live card and the ledger apply as for chat. Then one of two methods:

- **logprobs** (llama.cpp): the model's own probability of each label as its whole answer.
  The prompt is rendered by the model's template once; each label's tokens are forced by a
  grammar of token ids in a short ``/completion`` that reports every token's log-probability
  before sampling. The engine's prompt cache keeps the prompt between the labels, so each
  label costs its own few tokens. Scores are those probabilities normalised over the labels.
- **constrained** (any lane with JSON-schema output): one answer decoded under a schema that
  allows only the labels (or a number in range); the chosen label scores 1, the others 0.

Numbers are always constrained. The wire and the pure steps are ``blazar.dialects.decisions``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import msgspec

from actors.engine import EngineActor
from actors.engines.llamacpp import LANE as LLAMACPP
from actors.runtime import Runtime
from blazar.dialects import decisions, engine_usage
from blazar.dialects.decisions import Decision, DecisionRequest, Method
from blazar.dialects.neutral import ChatRequest, ResponseFormat
from blazar.errors import BlazarError
from blazar.serve.context import Ask
from blazar.serve.engine_call import EngineCall

__all__ = [
    "JUDGE_QUESTION",
    "Decided",
    "decide",
    "judge_answer",
    "last_user_text",
    "method_for",
    "run_decision",
]

JUDGE_QUESTION = "Does the answer correctly and completely answer the request?"
"""What a judge (a cascade's ``judge``, the ``best_of_judge``) is asked of an answer."""

_LABEL_TOKENS = 96
"""Room for the longest label as a JSON string, in a constrained answer."""
_NUMBER_TOKENS = 24


def method_for(req: DecisionRequest, engine: EngineActor) -> Method:
    """The method ``req`` runs with on ``engine``'s lane; ``MODEL_CANNOT_DECIDE`` when the
    lane has neither, or not the one the request named."""
    model = engine.spec.alias or engine.spec.model
    lane = engine.lane
    logprobs = lane.name == LLAMACPP
    constrained = "json_schema" in lane.capabilities
    want = "constrained" if req.kind == "number" else req.method
    if want == "logprobs" and not logprobs:
        raise BlazarError(
            "MODEL_CANNOT_DECIDE",
            f"model '{model}' runs on {lane.name}, which does not give token probabilities: "
            'only llama.cpp engines do — leave out `method`, or send "constrained"',
        )
    if want == "constrained" and not constrained:
        raise BlazarError(
            "MODEL_CANNOT_DECIDE",
            f"model '{model}' runs on {lane.name}, which cannot decode under a JSON schema: "
            "decide with a llama.cpp chat model",
        )
    if want == "auto" and not (logprobs or constrained):
        raise BlazarError(
            "MODEL_CANNOT_DECIDE",
            f"model '{model}' runs on {lane.name}, which gives neither token probabilities nor "
            "constrained decoding: decide with a llama.cpp chat model",
        )
    if want == "auto":
        return "logprobs" if logprobs else "constrained"
    return want


def _schema(req: DecisionRequest) -> dict[str, object]:
    return decisions.number_schema(req) if req.kind == "number" else decisions.labels_schema(req.labels)


def _held(chat: ChatRequest, req: DecisionRequest) -> ChatRequest:
    """``chat`` held to the decision's schema, with room for its answer only."""
    return msgspec.structs.replace(
        chat,
        response_format=ResponseFormat(kind="json_schema", schema=_schema(req)),
        max_tokens=_NUMBER_TOKENS if req.kind == "number" else _LABEL_TOKENS,
        # The schema's grammar lets a line break and up to 20 spaces follow the value, which a
        # small model fills to the token limit: the answer is whole at the first line break.
        stop=["\n"],
    )


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision and what it took: the engine call that made it (its ``headers()``) and the
    tokens it read and scored or generated."""

    decision: Decision
    call: EngineCall
    prompt_tokens: int
    output_tokens: int


async def decide(runtime: Runtime, req: DecisionRequest, ask: Ask) -> tuple[bytes, EngineCall]:
    """Run ``req`` on its model's engine; the answer's bytes and the call (its ``headers()``)."""
    done = await run_decision(runtime, req, ask)
    body = decisions.encode_response(
        done.decision,
        model=req.model,
        decision_id=f"decision-{secrets.token_hex(12)}",
        prompt_tokens=done.prompt_tokens,
        completion_tokens=done.output_tokens,
    )
    return body, done.call


async def run_decision(runtime: Runtime, req: DecisionRequest, ask: Ask) -> Decided:
    """``req`` decided on its model's engine, through the runtime's claim like any request."""
    planned: Method | None = None
    if req.model not in runtime.failover.chains:  # refused before anything loads
        planned = method_for(req, await runtime.engine_for(req.model, ask.lane))
    chat = ChatRequest(
        model=req.model,
        messages=decisions.answer_messages(req),
        temperature=0.0,
        keep_alive_s=req.keep_alive_s,
    )
    if planned == "constrained":  # known before the claim, so the claim checks the model can
        chat = _held(chat, req)
    call = EngineCall(runtime, chat, ask)
    await call.prepare()
    assert call.engine is not None
    try:
        method = method_for(req, call.engine)  # a failover chain's target is known only now
    except BaseException:
        call.release()
        raise
    if method == "logprobs":
        try:
            decision, prompt_tokens, output_tokens = await _by_logprobs(call, req)
        finally:
            call.release()
    else:
        decision, prompt_tokens, output_tokens = await _constrained(call, req)
    return Decided(decision=decision, call=call, prompt_tokens=prompt_tokens, output_tokens=output_tokens)


def _engine_failed(call: EngineCall, exc: ValueError) -> BlazarError:
    return BlazarError("BAD_GATEWAY", f"the engine for '{call.req.model}' failed: {exc}")


async def _by_logprobs(call: EngineCall, req: DecisionRequest) -> tuple[Decision, int, int]:
    """Each label's log-probability as the whole answer (see the module's note)."""
    _, body = call.engine_request(call.req)
    prompt = (await call.post("/apply-template", {"messages": body["messages"]}))["prompt"]
    token_ids: list[list[int]] = []
    for label in req.labels:
        doc = await call.post("/tokenize", {"content": label, "add_special": False})
        token_ids.append([int(t) for t in doc["tokens"]])
    with_end = decisions.needs_end(token_ids)
    logprobs: dict[str, float] = {}
    prompt_tokens = output_tokens = 0
    for label, ids in zip(req.labels, token_ids, strict=True):
        doc = await call.post(
            "/completion",
            {
                "prompt": prompt,
                "n_predict": len(ids) + (1 if with_end else 0),
                "grammar": decisions.forced_grammar(ids),
                "n_probs": 1,
                "post_sampling_probs": False,
                "temperature": 0.0,
                "cache_prompt": True,
            },
        )
        try:
            logprobs[label] = decisions.label_logprob(doc, ids, with_end=with_end)
        except ValueError as exc:
            raise _engine_failed(call, exc) from None
        prompt_tokens = prompt_tokens or int(doc.get("tokens_evaluated") or 0)
        output_tokens += int(doc.get("tokens_predicted") or 0)
    if call.card is not None:
        call.card.note_usage(
            engine_usage.EngineUsage(prompt_tokens=prompt_tokens, completion_tokens=output_tokens)
        )
    scores = decisions.scored_labels(logprobs)
    if req.kind == "boolean":
        return decisions.boolean_decision(scores, "logprobs"), prompt_tokens, output_tokens
    return decisions.label_decision(scores, "logprobs"), prompt_tokens, output_tokens


async def _constrained(call: EngineCall, req: DecisionRequest) -> tuple[Decision, int, int]:
    """One answer under a schema that allows only the labels, or a number in the range."""
    if call.req.response_format is None:
        call.req = _held(call.req, req)
    resp = await call.complete()
    usage = resp.usage
    try:
        if req.kind == "number":
            return decisions.number_decision(resp.text, req), usage.prompt_tokens, usage.completion_tokens
        chosen = decisions.constrained_label(resp.text, req.labels)
    except ValueError as exc:
        raise _engine_failed(call, exc) from None
    scores = {label: 1.0 if label == chosen else 0.0 for label in req.labels}
    if req.kind == "boolean":
        decision = decisions.boolean_decision(scores, "constrained")
    else:
        decision = decisions.label_decision(scores, "constrained")
    return decision, usage.prompt_tokens, usage.completion_tokens


def last_user_text(req: ChatRequest) -> str:
    """The request's last user message, the one a judge reads the answer against."""
    return next((m.content for m in reversed(req.messages) if m.role == "user"), "")


async def judge_answer(runtime: Runtime, ask: Ask, judge: str, asked: str, answer: str) -> float:
    """The judge's (a decision model's) probability that ``answer`` answers ``asked``
    correctly and completely: a yes-or-no decision, under the request's key and claim."""
    question = DecisionRequest(
        model=judge,
        input=f"Request: {asked}\n\nAnswer: {answer}",
        kind="boolean",
        labels=[decisions.YES, decisions.NO],
        question=JUDGE_QUESTION,
    )
    verdict = (await run_decision(runtime, question, ask)).decision
    return verdict.probability if verdict.probability is not None else 0.0
