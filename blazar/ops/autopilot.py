"""What observed traffic says to change: ``blazar autopilot``'s decisions, as pure functions.

The input is the ledger's request records of a window (``actors.ledger.read_requests``) and
the settings each model runs with now; the output is a list of recommendations, each a
config key, the value to give it and the evidence, that ``blazar autopilot --apply`` writes
with ``blazar config set``. Nothing here reads a file or a clock.

The rules (docs/workflows.md, "Autopilot"):

- **queueing**: a model whose requests wait for a slot (at least ``MIN_REQUESTS`` of them,
  and a quarter or more waiting over ``QUEUE_WAIT_MS``) gets more slots: twice as many, at
  most ``MAX_SLOTS`` (the fit planner still checks the memory at the next load);
- **prompts refused for length** (``PROMPT_TOO_LONG``): a longer context per slot, the next
  power of two that holds the longest refused prompt with a quarter to spare for the answer,
  never above the model's training context when it is known;
- **reloads**: a model loaded again and again (``MIN_RELOADS`` loads in the window) because it
  was unloaded while idle between uses gets a keep-alive longer than the longest such gap
  (rounded up to minutes), at most a day; one that reloads within its keep-alive was evicted
  for another model, which a keep-alive cannot fix: that is said, with no key to change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import msgspec

from actors.ledger import RequestRecord

__all__ = [
    "MAX_SLOTS",
    "MIN_RELOADS",
    "MIN_REQUESTS",
    "QUEUE_WAIT_MS",
    "Current",
    "Recommendation",
    "recommend",
]

MIN_REQUESTS = 5
"""Fewer requests than this in the window say nothing about queueing."""
QUEUE_WAIT_MS = 500.0
MAX_SLOTS = 16
MIN_RELOADS = 3
_MAX_KEEP_ALIVE_S = 86400.0

_REFUSED = re.compile(r"has (\d+) tokens but the context holds (\d+)")


class Current(msgspec.Struct, frozen=True, kw_only=True):
    """What a model runs with now (config and defaults)."""

    slots: int
    ctx: int
    """Per slot."""
    keep_alive_s: float
    training_ctx: int | None = None


class Recommendation(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    rule: str
    """``queueing``, ``context`` or ``reloads``."""
    key: str | None
    """The config key to set (``models.NAME.slots``); None: advice with nothing to set."""
    value: int | float | None
    now: int | float | None
    evidence: str


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _queueing(model: str, rows: list[RequestRecord], now: Current) -> Recommendation | None:
    waits = [r.queue_ms for r in rows if r.queue_ms is not None]
    if len(waits) < MIN_REQUESTS:
        return None
    long = [w for w in waits if w > QUEUE_WAIT_MS]
    if len(long) * 4 < len(waits) or now.slots >= MAX_SLOTS:
        return None
    slots = min(MAX_SLOTS, now.slots * 2)
    return Recommendation(
        model=model,
        rule="queueing",
        key=f'models."{model}".slots',
        value=slots,
        now=now.slots,
        evidence=(
            f"{len(long)} of {len(waits)} requests waited over {QUEUE_WAIT_MS / 1000:g} s for a slot "
            f"(median {_percentile(waits, 0.5) / 1000:.2f} s, p90 {_percentile(waits, 0.9) / 1000:.2f} s) "
            f"with {now.slots} slot{'s' if now.slots != 1 else ''}"
        ),
    )


def _context(model: str, rows: list[RequestRecord], now: Current) -> Recommendation | None:
    refused = [int(m.group(1)) for r in rows if r.error and (m := _REFUSED.search(r.error))]
    if not refused:
        return None
    longest = max(refused)
    ctx = 1 << math.ceil(math.log2(longest * 1.25))
    capped = now.training_ctx is not None and ctx > now.training_ctx
    if capped:
        assert now.training_ctx is not None
        ctx = now.training_ctx
    if ctx <= now.ctx:
        return None
    note = f", capped at the model's training context {ctx}" if capped else ""
    return Recommendation(
        model=model,
        rule="context",
        key=f'models."{model}".ctx',
        value=ctx,
        now=now.ctx,
        evidence=(
            f"{len(refused)} request{'s' if len(refused) != 1 else ''} refused as too long for "
            f"{now.ctx} tokens per slot (the longest prompt {longest} tokens){note}"
        ),
    )


def _reloads(model: str, rows: list[RequestRecord], now: Current) -> Recommendation | None:
    ordered = sorted(rows, key=lambda r: r.started_at)
    # requests that arrive while a load is under way wait for it and record it too: one load
    # is the first request of each such group (none of the others was still running)
    loads = [
        r
        for r in ordered
        if r.load_ms
        and not any(e.started_at < r.started_at < e.started_at + e.duration_ms / 1000 for e in ordered)
    ]
    if len(loads) < MIN_RELOADS:
        return None
    # The idle time before each reload: from the end of the last request that had ended when
    # it started. A load while another request was still running (a restart to run
    # differently, say) is no reload after idleness or eviction; nor is the first.
    gaps = []
    for r in loads:
        ended = [e.started_at + e.duration_ms / 1000 for e in ordered if e.started_at < r.started_at]
        before = [end for end in ended if end <= r.started_at]
        if before and len(before) == len(ended):
            gaps.append(r.started_at - max(before))
    if not gaps:
        return None
    expired = [g for g in gaps if now.keep_alive_s >= 0 and g >= now.keep_alive_s]
    evicted = len(gaps) - len(expired)
    if len(expired) >= evicted:
        longest = max(expired)
        value = min(_MAX_KEEP_ALIVE_S, 60.0 * math.ceil((longest * 1.5 + 1) / 60.0))
        if value <= now.keep_alive_s:
            return None
        return Recommendation(
            model=model,
            rule="reloads",
            key=f'models."{model}".keep_alive_s',
            value=value,
            now=now.keep_alive_s,
            evidence=(
                f"loaded {len(loads)} times in the window; {len(expired)} reload"
                f"{'s' if len(expired) != 1 else ''} came after it was unloaded idle "
                f"(keep-alive {now.keep_alive_s:g} s, idle gaps up to {longest:.0f} s)"
            ),
        )
    return Recommendation(
        model=model,
        rule="reloads",
        key=None,
        value=None,
        now=None,
        evidence=(
            f"loaded {len(loads)} times in the window; {evicted} reload{'s' if evicted != 1 else ''} "
            f"came within its keep-alive ({now.keep_alive_s:g} s), so it was evicted for another model: "
            "raise memory_budget_mb or max_loaded_models, or pin it with preload"
        ),
    )


def recommend(records: Iterable[RequestRecord], current: dict[str, Current]) -> list[Recommendation]:
    """Every recommendation the window's ``records`` support, by model then rule; a model
    not in ``current`` (no longer installed) is left out."""
    by_model: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.model is not None and r.model in current:
            by_model.setdefault(r.model, []).append(r)
    out: list[Recommendation] = []
    for model in sorted(by_model):
        rows, now = by_model[model], current[model]
        for rule in (_queueing, _context, _reloads):
            if (rec := rule(model, rows, now)) is not None:
                out.append(rec)
    return out
