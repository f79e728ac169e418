"""Decisions on the wire: ``POST /v1/systemone``, a typed answer about a text in one call.

Three kinds: a label from a closed set (``labels``), a yes or no (``kind: "boolean"`` with a
``question``) and a number in a range (``kind: "number"`` with ``min`` and ``max``). The
service (``blazar.serve.decisions``) asks the engine; what is here is sans-io: the request's
checks (each refusal names its field), the prompt, the grammar that forces one label's
tokens, the scores from the engine's log-probabilities, and the answer's bytes.

Labels are scored by the probability the model gives each label's token sequence as the
whole of its answer (one short forced completion per label, the prompt read once), and the
scores are those probabilities normalised over the set, so they sum to 1.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from blazar.dialects._wire import decode_json
from blazar.dialects.neutral import DecodeError, Message
from blazar.dialects.ollama_time import parse_duration_s

__all__ = [
    "MAX_LABELS",
    "Decision",
    "DecisionRequest",
    "Method",
    "answer_messages",
    "boolean_decision",
    "constrained_label",
    "decode_request",
    "encode_response",
    "forced_grammar",
    "label_decision",
    "label_logprob",
    "labels_schema",
    "needs_end",
    "number_decision",
    "number_schema",
    "scored_labels",
]

Kind = Literal["labels", "boolean", "number"]
Method = Literal["logprobs", "constrained"]
MAX_LABELS = 64
"""The most labels one request may name: each is one short completion on the engine."""
MAX_LABEL_CHARS = 200
YES, NO = "yes", "no"


class _Body(msgspec.Struct, kw_only=True):
    model: str
    input: str
    kind: Kind | None = None
    labels: list[str] | None = None
    question: str | None = None
    min: float | None = None
    max: float | None = None
    integer: bool | None = None
    method: Literal["auto", "logprobs", "constrained"] = "auto"
    stream: bool = False
    keep_alive: str | int | float | None = None
    user: Any = None


class DecisionRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    input: str
    kind: Kind
    labels: list[str] = []
    """The closed set (``labels``), or ``["yes", "no"]`` (``boolean``)."""
    question: str | None = None
    low: float | None = None
    high: float | None = None
    integer: bool = False
    method: Literal["auto", "logprobs", "constrained"] = "auto"
    keep_alive_s: float | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine decided: a ``label`` (with ``scores`` over every label), a boolean
    ``value`` (with the ``probability`` that it is true) or a number ``value``."""

    kind: Kind
    method: Method
    label: str | None = None
    value: bool | int | float | None = None
    probability: float | None = None
    scores: dict[str, float] = {}
    clamped: bool = False
    """A number the engine gave outside the range, brought to its nearest end."""


def _refuse(message: str, param: str) -> DecodeError:
    return DecodeError(message, param=param)


def _kind_of(wire: _Body) -> Kind:
    if wire.kind is not None:
        return wire.kind
    if wire.labels is not None:
        return "labels"
    if wire.min is not None or wire.max is not None:
        return "number"
    raise _refuse(
        "missing field `labels`: send the closed set of labels to choose from (or `kind`: "
        '"boolean" with a `question`, or "number" with `min` and `max`)',
        "labels",
    )


def _checked_labels(labels: list[str] | None) -> list[str]:
    if not labels:
        raise _refuse("field `labels` is empty: send at least two labels to choose from", "labels")
    if len(labels) < 2:
        raise _refuse("field `labels` has one label: a decision needs at least two", "labels")
    if len(labels) > MAX_LABELS:
        raise _refuse(f"field `labels` has {len(labels)} labels; at most {MAX_LABELS} are scored", "labels")
    seen: set[str] = set()
    for i, label in enumerate(labels):
        if not label.strip():
            raise _refuse(f"field `labels[{i}]` is empty: every label needs text", f"labels[{i}]")
        if len(label) > MAX_LABEL_CHARS:
            raise _refuse(
                f"field `labels[{i}]` is {len(label)} characters long; at most {MAX_LABEL_CHARS}",
                f"labels[{i}]",
            )
        if label in seen:
            raise _refuse(f"field `labels` names {label!r} twice: each label once", "labels")
        seen.add(label)
    return list(labels)


def decode_request(body: bytes) -> DecisionRequest:
    """``POST /v1/systemone``'s body, checked; a ``DecodeError`` names the field at fault."""
    wire = decode_json(body, _Body)
    if not wire.model.strip():
        raise _refuse("field `model` is empty: name an installed chat model (see `blazar list`)", "model")
    if not wire.input.strip():
        raise _refuse("field `input` is empty: send the text to decide about", "input")
    if wire.stream:
        raise DecodeError(
            "`stream` is not supported here: a decision is answered whole, in one response — "
            "leave out `stream` (or send false)",
            code="DECISION_NOT_STREAMED",
            param="stream",
        )
    kind = _kind_of(wire)
    common: dict[str, Any] = {
        "model": wire.model,
        "input": wire.input,
        "method": wire.method,
        "keep_alive_s": parse_duration_s(wire.keep_alive),
    }
    if kind != "number":
        for name in ("min", "max", "integer"):
            if getattr(wire, name) is not None:
                raise _refuse(f'field `{name}` is for `kind: "number"` only: leave it out', name)
    if kind == "labels":
        labels = _checked_labels(wire.labels)
        return DecisionRequest(kind=kind, labels=labels, question=wire.question, **common)
    if wire.labels is not None:
        raise _refuse(f'field `labels` is for label decisions, not `kind: "{kind}"`: leave it out', "labels")
    if not (wire.question or "").strip():
        raise _refuse(f'field `question` is required with `kind: "{kind}"`: ask what to decide', "question")
    if kind == "boolean":
        return DecisionRequest(kind=kind, labels=[YES, NO], question=wire.question, **common)
    return _number_request(wire, common)


def _number_request(wire: _Body, common: dict[str, Any]) -> DecisionRequest:
    for name in ("min", "max"):
        value = getattr(wire, name)
        if value is None:
            raise _refuse(f'field `{name}` is required with `kind: "number"`: the range\'s {name}imum', name)
        if not math.isfinite(value):
            raise _refuse(f"field `{name}` must be a finite number", name)
    assert wire.min is not None and wire.max is not None
    if wire.min > wire.max:
        raise _refuse(f"field `min` ({wire.min:g}) is above `max` ({wire.max:g}): swap them", "min")
    integer = wire.integer
    if integer is None:  # whole bounds ask for a whole number unless `integer: false` says otherwise
        integer = float(wire.min).is_integer() and float(wire.max).is_integer()
    if integer and math.ceil(wire.min) > math.floor(wire.max):
        raise _refuse(f"no whole number lies between `min` ({wire.min:g}) and `max` ({wire.max:g})", "max")
    if wire.method == "logprobs":
        raise _refuse(
            'a number is decided by constrained decoding only: leave out `method` or send "constrained"',
            "method",
        )
    return DecisionRequest(
        kind="number", question=wire.question, low=wire.min, high=wire.max, integer=integer, **common
    )


def _number_words(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def answer_messages(req: DecisionRequest) -> list[Message]:
    """The chat the engine answers: the task in the system turn, the text in the user's."""
    if req.kind == "labels":
        task = (
            "You are a classifier. Read the text and answer with exactly one of these labels, "
            f"and nothing else: {', '.join(req.labels)}."
        )
        if req.question:
            task += f" {req.question}"
    elif req.kind == "boolean":
        task = f"Read the text and answer the question with exactly one word: {YES} or {NO}."
    else:
        assert req.low is not None and req.high is not None
        what = "a whole number" if req.integer else "a number"
        task = (
            f"Read the text and answer the question with {what} from {_number_words(req.low)} to "
            f"{_number_words(req.high)}, and nothing else."
        )
    user = f"Text: {req.input}"
    if req.kind != "labels" and req.question:
        user += f"\nQuestion: {req.question}"
    return [Message(role="system", content=task), Message(role="user", content=user)]


# -- scoring by log-probabilities (llama.cpp's /completion) -----------------------------------


def needs_end(token_ids: list[list[int]]) -> bool:
    """Whether one label's tokens begin another's: then each label is scored with the end of
    the answer after it, or the shorter label could never score below the longer one."""
    for i, a in enumerate(token_ids):
        for j, b in enumerate(token_ids):
            if i != j and len(a) <= len(b) and b[: len(a)] == a:
                return True
    return False


def forced_grammar(token_ids: list[int]) -> str:
    """A GBNF grammar whose only sentence is these tokens (llama.cpp's ``<[id]>`` syntax), so
    the engine walks the label's own tokenization and reports each token's log-probability."""
    return "root ::= " + " ".join(f"<[{t}]>" for t in token_ids)


def label_logprob(doc: Any, token_ids: list[int], *, with_end: bool) -> float:
    """The label's log-probability from a forced completion's ``completion_probabilities``
    (taken before sampling: the model's own distribution, not the grammar's); ``ValueError``
    when the engine did not walk the label's tokens."""
    probs = doc.get("completion_probabilities") if isinstance(doc, dict) else None
    if not isinstance(probs, list):
        raise ValueError("the engine's answer has no `completion_probabilities`")
    want = len(token_ids) + (1 if with_end else 0)
    if len(probs) < want or [p.get("id") for p in probs[: len(token_ids)]] != token_ids:
        raise ValueError(f"the engine did not follow the label's {len(token_ids)} tokens")
    total = 0.0
    for p in probs[:want]:
        lp = p.get("logprob")
        if not isinstance(lp, int | float):
            raise ValueError(f"the engine gave no log-probability for token {p.get('id')}")
        total += float(lp)
    return total


def scored_labels(logprobs: dict[str, float]) -> dict[str, float]:
    """Each label's share of the probability the model gives the set (a softmax of the
    log-probabilities): scores in [0, 1] that sum to 1, in the labels' order."""
    top = max(logprobs.values())
    weights = {k: math.exp(v - top) for k, v in logprobs.items()}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


def label_decision(scores: dict[str, float], method: Method) -> Decision:
    """The best-scored label (ties: the first named)."""
    best = max(scores, key=lambda k: scores[k])
    return Decision(kind="labels", method=method, label=best, scores=scores)


def boolean_decision(scores: dict[str, float], method: Method) -> Decision:
    """``value`` true when yes scores at least as high as no; ``probability`` is yes's score."""
    p_yes = scores[YES]
    return Decision(kind="boolean", method=method, value=p_yes >= 0.5, probability=p_yes, scores=scores)


# -- constrained decoding --------------------------------------------------------------------


def number_schema(req: DecisionRequest) -> dict[str, Any]:
    """The JSON schema the number is decoded under (an engine grammar holds integers to the
    range; a float's range is checked after)."""
    schema: dict[str, Any] = {"type": "integer" if req.integer else "number"}
    if req.integer:
        assert req.low is not None and req.high is not None
        schema["minimum"], schema["maximum"] = math.ceil(req.low), math.floor(req.high)
    else:
        schema["minimum"], schema["maximum"] = req.low, req.high
    return schema


def labels_schema(labels: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": labels}


def constrained_label(text: str, labels: list[str]) -> str:
    """The label a constrained answer chose (``ValueError`` when it is none of them)."""
    try:
        got = msgspec.json.decode(text.strip())
    except msgspec.DecodeError:
        got = text.strip()
    if got not in labels:
        raise ValueError(f"the engine answered {text.strip()[:80]!r}, which is none of the labels")
    return str(got)


def number_decision(text: str, req: DecisionRequest) -> Decision:
    """The number a constrained answer gave, brought into the range if it strayed out."""
    try:
        got = msgspec.json.decode(text.strip())
    except msgspec.DecodeError:
        got = None
    if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(got):
        raise ValueError(f"the engine answered {text.strip()[:80]!r}, which is not a number")
    assert req.low is not None and req.high is not None
    low, high = (math.ceil(req.low), math.floor(req.high)) if req.integer else (req.low, req.high)
    value: int | float = round(got) if req.integer else float(got)
    inside = min(max(value, low), high)
    return Decision(kind="number", method="constrained", value=inside, clamped=inside != value)


def encode_response(
    decision: Decision, *, model: str, decision_id: str, prompt_tokens: int, completion_tokens: int
) -> bytes:
    """The answer: the decision, its scores and how it was made, and the tokens it took."""
    doc: dict[str, Any] = {"id": decision_id, "object": "decision", "model": model, "kind": decision.kind}
    if decision.kind == "labels":
        doc["label"] = decision.label
    else:
        doc["value"] = decision.value
    if decision.kind == "boolean":
        doc["probability"] = decision.probability
    if decision.kind != "number":
        doc["scores"] = decision.scores
    if decision.clamped:
        doc["clamped"] = True
    doc["method"] = decision.method
    doc["usage"] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return msgspec.json.encode(doc)
