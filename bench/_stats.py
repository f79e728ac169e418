"""Percentiles and run summaries (median, min and max over runs)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

__all__ = ["Summary", "percentile", "ratio", "summarize"]

Summary = dict[str, float | int | None]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(values: Iterable[float | None]) -> Summary:
    """Median, min and max of per-run figures (runs without a figure are left out)."""
    data = [v for v in values if v is not None and not math.isnan(v)]
    if not data:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(data), "min": min(data), "max": max(data), "n": len(data)}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b
