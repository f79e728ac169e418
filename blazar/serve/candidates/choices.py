"""Several answers for one request — ``n``, ``best_of`` and cascades — as pure decisions.

The gateway runs the candidates (``blazar.serve.candidates.fanout`` for OpenAI's relayed routes,
``blazar.serve.candidates.translated`` for the dialects that translate); what a candidate is worth,
which one wins, which seeds they get and what the response says about it are decided
here, without I/O, so they are unit-tested on their own.

A candidate is *valid* when it ended on its own (not at the output limit), said something
(text or a tool call), matches the request's JSON schema when it gave one (a JSON object
when it asked for ``json_object``) and, in a cascade, matches none of the refusal patterns.
Among valid candidates the engine's own mean log-probability per token decides when every
one of them has it; otherwise the first valid one wins. When none is valid the first one
is the answer all the same: the response says why (``why=none-valid``).
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from blazar.dialects.neutral import ResponseFormat
from blazar.errors import BlazarError

__all__ = [
    "BEST_OF_HEADER",
    "CASCADE_HEADER",
    "MAX_BEST_OF",
    "MAX_CASCADE_STEPS",
    "Candidate",
    "Pick",
    "Stats",
    "Wanted",
    "best_of",
    "best_of_header",
    "cascade_header",
    "check_schema",
    "mean_logprob",
    "pick",
    "problem",
    "refusals",
    "seeds",
    "stats_for",
    "wanted",
]

BEST_OF_HEADER = "x-blazar-best-of"
CASCADE_HEADER = "x-blazar-cascade"
MAX_BEST_OF = 4
MAX_CASCADE_STEPS = 4
"""The most models one cascade may try (its config entries are held to it too)."""
_SEED_SPACE = 2**32


@dataclass(frozen=True, slots=True)
class Candidate:
    """What one finished candidate is worth: its problem (None: valid) and, when the engine
    said, its mean log-probability per output token."""

    problem: str | None = None
    logprob: float | None = None
    judged: float | None = None
    """A judge's probability that it answers the request (``best_of_judge``), when one read it."""


@dataclass(frozen=True, slots=True)
class Pick:
    winner: int
    why: str
    """``judge`` (the one the ``best_of_judge`` found likeliest to answer), ``logprob`` (the
    likeliest of several valid ones), ``schema`` (valid by the request's
    schema where another was not), ``complete`` (ended on its own where another did not),
    ``first`` (all valid, nothing to tell them apart) or ``none-valid``."""


def check_schema(text: str, fmt: ResponseFormat | None) -> str | None:
    """Why ``text`` fails the request's output format (``schema``), or None when it passes or
    there is no format to pass."""
    if fmt is None or fmt.kind == "text":
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return "schema"
    if fmt.kind == "json_object" or fmt.schema is None:
        return None if isinstance(doc, dict) else "schema"
    import jsonschema  # here: a twentieth of a second that the daemon's start need not pay

    try:
        jsonschema.validate(doc, fmt.schema)
    except jsonschema.ValidationError:
        return "schema"
    except jsonschema.SchemaError:
        return None  # a schema the validator cannot read judges nothing; the grammar held anyway
    return None


def problem(
    *,
    text: str,
    finish_reason: str | None,
    tool_calls: int = 0,
    fmt: ResponseFormat | None = None,
    refusal: Sequence[re.Pattern[str]] = (),
) -> str | None:
    """The first reason a candidate is not a good answer, or None: ``length`` (cut at the
    output limit), ``empty``, ``schema``, ``refusal``."""
    if finish_reason == "length":
        return "length"
    if tool_calls:
        return None
    if not text.strip():
        return "empty"
    if (bad := check_schema(text, fmt)) is not None:
        return bad
    if any(p.search(text) for p in refusal):
        return "refusal"
    return None


def pick(candidates: Sequence[Candidate]) -> Pick:
    """The winner among candidates (at least one), and why it won."""
    if not candidates:
        raise ValueError("no candidates to pick from")
    valid = [i for i, c in enumerate(candidates) if c.problem is None]
    if not valid:
        return Pick(0, "none-valid")
    if len(valid) > 1 and all(candidates[i].judged is not None for i in valid):
        best = max(valid, key=lambda i: (candidates[i].judged or 0.0, -i))
        return Pick(best, "judge")
    if len(valid) > 1 and all(candidates[i].logprob is not None for i in valid):
        best = max(valid, key=lambda i: (candidates[i].logprob or 0.0, -i))
        return Pick(best, "logprob")
    first = valid[0]
    losers = [c.problem for c in candidates if c.problem is not None]
    if not losers:
        return Pick(first, "first")
    return Pick(first, "schema" if "schema" in losers else "complete")


def rank(candidates: Sequence[Candidate], keep: int) -> list[int]:
    """The ``keep`` best candidates in order (legacy completions' ``best_of`` with ``n``):
    valid before invalid, then by log-probability (highest first, unknown last), then in the
    order they ran."""

    def key(i: int) -> tuple[int, float, int]:
        c = candidates[i]
        return (0 if c.problem is None else 1, -c.logprob if c.logprob is not None else float("inf"), i)

    return sorted(range(len(candidates)), key=key)[:keep]


def mean_logprob(logprobs: Any) -> float | None:
    """The mean log-probability per token of an OpenAI-shaped ``logprobs`` object: chat's
    ``{"content": [{"logprob": …}]}`` or legacy completions' ``{"token_logprobs": […]}``."""
    if not isinstance(logprobs, dict):
        return None
    values: list[float] = []
    content = logprobs.get("content")
    if isinstance(content, list):
        values = [float(t["logprob"]) for t in content if isinstance(t, dict) and "logprob" in t]
    elif isinstance(logprobs.get("token_logprobs"), list):
        values = [float(v) for v in logprobs["token_logprobs"] if isinstance(v, int | float)]
    return sum(values) / len(values) if values else None


def seeds(seed: int | None, count: int) -> list[int | None]:
    """One seed per candidate: distinct and reproducible from the request's seed, or none (each
    candidate then samples with the engine's own random seed)."""
    if seed is None:
        return [None] * count
    return [(seed + i) % _SEED_SPACE for i in range(count)]


def best_of_header(ran: int, pick: Pick) -> str:
    return f"ran={ran}, winner={pick.winner}, why={pick.why}"


def cascade_header(step: int, steps: int, model: str, why: str) -> str:
    return f"step={step}/{steps}, model={model}, why={why}"


# -- what a request asks for -------------------------------------------------------------


class _Fields(msgspec.Struct):
    best_of: Any = None
    cascade: Any = None


@dataclass(frozen=True, slots=True)
class Wanted:
    best_of: int | None = None
    """Candidates to run (2 to 4), or None."""
    cascade: list[str] | None = None
    """The models to try in turn, or None."""
    refusal: list[re.Pattern[str]] = field(default_factory=list)
    name: str | None = None
    """The ``[[cascade]]`` entry the cascade came from (its judge is there), or None."""


def _best_of(value: Any, source: str) -> int | None:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BlazarError("BAD_REQUEST", f"invalid {source}: a whole number from 2 to {MAX_BEST_OF}")
    if value == 1:
        return None  # one candidate: nothing to choose
    if not 2 <= value <= MAX_BEST_OF:
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid {source}: {value} is out of range — run 2 to {MAX_BEST_OF} candidates "
            "(or leave it out for one)",
            param="best_of",
        )
    return value


def _asked_best_of(field: Any, headers: Mapping[str, str]) -> int | None:
    if field is not None:
        return _best_of(field, "field `best_of`")
    if (raw := headers.get(BEST_OF_HEADER)) is not None:
        return _best_of(raw, f"header {BEST_OF_HEADER}")
    return None


def best_of(body_value: Any, headers: Mapping[str, str]) -> int | None:
    """The candidates a request's ``best_of`` (a decoded body field; else the header) asks for:
    2 to 4, or None for one."""
    return _asked_best_of(body_value, headers)


def refusals(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """Refusal patterns as case-insensitive regular expressions (checked when config loads)."""
    return [re.compile(p, re.IGNORECASE) for p in patterns]


def wanted(
    body: bytes,
    headers: Mapping[str, str],
    *,
    model: str,
    cascades: dict[str, tuple[list[str], list[str]]],
    default_refusals: Sequence[str] = (),
) -> Wanted:
    """What ``body`` and ``headers`` ask for: ``best_of`` (body field, else the header), and a
    cascade (the body's ``cascade``: a list of models or a configured name; else the request's
    model naming a configured cascade). ``cascades``: name → (models, refusal patterns)."""
    fields = _Fields()
    if b'"best_of"' in body or b'"cascade"' in body:  # a look before a second parse
        try:
            fields = msgspec.json.decode(body, type=_Fields)
        except msgspec.DecodeError:
            fields = _Fields()  # the dialect's decoder has refused the body already
    best_of = _asked_best_of(fields.best_of, headers)
    models: list[str] | None = None
    patterns: Sequence[str] = default_refusals
    chosen = fields.cascade
    if chosen is None and model in cascades:
        chosen = model
    if isinstance(chosen, str):
        if chosen not in cascades:
            known = ", ".join(sorted(cascades)) or "none is configured"
            raise BlazarError(
                "CASCADE_NOT_FOUND",
                f"no [[cascade]] named {chosen!r} in config.toml ({known}) — name one, or send "
                '`cascade` as a list of models: ["cheap", "strong"]',
            )
        models, own = cascades[chosen]
        patterns = own or default_refusals
    elif chosen is not None:
        if not (isinstance(chosen, list) and chosen and all(isinstance(m, str) and m for m in chosen)):
            raise BlazarError(
                "BAD_REQUEST",
                'invalid field `cascade`: a list of model names, cheapest first (["cheap", "strong"]), '
                "or the name of a [[cascade]] entry",
                param="cascade",
            )
        models = list(chosen)
    if models is not None and len(models) > MAX_CASCADE_STEPS:
        raise BlazarError(
            "BAD_REQUEST",
            f"invalid field `cascade`: {len(models)} models — a cascade tries at most {MAX_CASCADE_STEPS}",
            param="cascade",
        )
    if models is not None and best_of is not None:
        raise BlazarError(
            "BAD_REQUEST",
            "`best_of` and `cascade` do not combine: send one of them",
            param="best_of",
        )
    return Wanted(
        best_of=best_of,
        cascade=models,
        refusal=refusals(patterns) if models else [],
        name=chosen if isinstance(chosen, str) else None,
    )


# -- what it cost ------------------------------------------------------------------------


@dataclass(slots=True)
class Stats:
    """Counters of one runtime's multi-candidate requests, served on ``/metrics``."""

    requests: dict[str, int] = field(default_factory=dict)
    """Requests by feature: ``n``, ``best_of``, ``cascade``."""
    candidates: dict[str, int] = field(default_factory=dict)
    """Candidates run (each its own admission slot) by feature."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Output tokens of all candidates, by feature (the winner's and the others')."""
    escalations: int = 0
    """Cascade steps past the first."""

    def note(self, feature: str, *, candidates: int, tokens: int) -> None:
        self.requests[feature] = self.requests.get(feature, 0) + 1
        self.candidates[feature] = self.candidates.get(feature, 0) + candidates
        self.tokens[feature] = self.tokens.get(feature, 0) + tokens


_STATS: weakref.WeakKeyDictionary[object, Stats] = weakref.WeakKeyDictionary()


def stats_for(runtime: object) -> Stats:
    """The counters kept for ``runtime`` (made on first use)."""
    stats = _STATS.get(runtime)
    if stats is None:
        stats = _STATS[runtime] = Stats()
    return stats
