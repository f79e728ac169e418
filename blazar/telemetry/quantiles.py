"""Latency quantiles over a sliding window: pure code, no I/O, no clock of its own.

Each finished inference request adds one ``Sample`` (time to first token, time
per output token, queue wait, end-to-end) to the window of its model and
temperature (``warm``: the engine was already loaded; ``cold``: the request
loaded it). A window keeps the newest ``max_requests`` samples, and of those
only the ones younger than ``max_age_s`` count; ``summary`` gives p50/p95/p99
of each measure, in milliseconds, computed when asked (adding is O(1)).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MEASURES", "QUANTILES", "QuantileWindow", "Sample", "quantile"]

QUANTILES = (0.5, 0.95, 0.99)
MEASURES = ("ttft", "tpot", "queue", "e2e")
"""Time to first token, time per output token, queue wait, end-to-end."""


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    """When the request ended (any monotonic clock the caller also passes to ``summary``)."""
    ttft_s: float | None
    tpot_s: float | None
    queue_s: float | None
    e2e_s: float


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly between the two nearest
    ranks (numpy's default, "linear"). ``ordered`` must not be empty."""
    if not ordered:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not between 0 and 1")
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _summary_of(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values.sort()
    return {f"p{round(q * 100)}": round(quantile(values, q) * 1000, 3) for q in QUANTILES}


class QuantileWindow:
    """The newest samples per (model, warm|cold); see the module docstring."""

    def __init__(self, *, max_requests: int = 1000, max_age_s: float = 300.0) -> None:
        if max_requests < 1:
            raise ValueError("max_requests must be at least 1")
        self.max_requests = max_requests
        self.max_age_s = max_age_s
        self._windows: dict[tuple[str, bool], deque[Sample]] = {}

    def add(self, model: str, sample: Sample, *, cold: bool) -> None:
        window = self._windows.get((model, cold))
        if window is None:
            window = self._windows[(model, cold)] = deque(maxlen=self.max_requests)
        window.append(sample)

    def summary(self, now_s: float) -> dict[str, dict[str, dict[str, object]]]:
        """``{model: {"warm"|"cold": {"count": n, "ttft_ms": {"p50": …, "p95": …, "p99": …}, …}}}``;
        a measure no sample had (no token generated, say) is null."""
        since = now_s - self.max_age_s
        out: dict[str, dict[str, dict[str, object]]] = {}
        for (model, cold), window in sorted(self._windows.items()):
            while window and window[0].at_s < since:
                window.popleft()
            if not window:
                continue
            live = list(window)
            entry: dict[str, object] = {"count": len(live)}
            entry["ttft_ms"] = _summary_of([s.ttft_s for s in live if s.ttft_s is not None])
            entry["tpot_ms"] = _summary_of([s.tpot_s for s in live if s.tpot_s is not None])
            entry["queue_ms"] = _summary_of([s.queue_s for s in live if s.queue_s is not None])
            entry["e2e_ms"] = _summary_of([s.e2e_s for s in live])
            out.setdefault(model, {})["cold" if cold else "warm"] = entry
        return out
