"""Per-second buckets of the last few minutes: pure code, no I/O, no clock of its own.

Each finished inference request adds itself once to the bucket of the second it
ended in (a count, its tokens, and its time to first token and per output token,
kept for the medians); the console reads the ring as one point per second
(``points``) and as rates over the last seconds (``rates``). Adding is O(1): a
bucket whose second has passed out of the ring is reset when it is reused, and a
second nobody added to reads as zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from blazar.telemetry.quantiles import quantile

__all__ = ["RATE_WINDOW_S", "SERIES_S", "SeriesRing"]

SERIES_S = 300
"""Seconds the ring keeps (one point each)."""
RATE_WINDOW_S = 10
"""Seconds the rates are averaged over."""
_KEEP_PER_SECOND = 256
"""Latency values kept per second for its medians; past this many the rest are not sampled."""


@dataclass(slots=True)
class _Bucket:
    second: int = -1
    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)

    def reset(self, second: int) -> None:
        self.second = second
        self.requests = self.errors = self.tokens_in = self.tokens_out = 0
        self.ttft.clear()
        self.tpot.clear()


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    return round(quantile(sorted(values), 0.5), 6)


class SeriesRing:
    """The last ``size`` seconds of finished inference requests; see the module docstring."""

    def __init__(self, size: int = SERIES_S) -> None:
        if size < 1:
            raise ValueError("a series ring needs at least one second")
        self.size = size
        self._buckets = [_Bucket() for _ in range(size)]

    def add(
        self,
        now_s: float,
        *,
        error: bool = False,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
    ) -> None:
        """One request that ended at ``now_s`` (unix seconds)."""
        second = math.floor(now_s)
        bucket = self._buckets[second % self.size]
        if bucket.second != second:
            bucket.reset(second)
        bucket.requests += 1
        if error:
            bucket.errors += 1
        if tokens_in:
            bucket.tokens_in += tokens_in
        if tokens_out:
            bucket.tokens_out += tokens_out
        if ttft_s is not None and len(bucket.ttft) < _KEEP_PER_SECOND:
            bucket.ttft.append(ttft_s)
        if tpot_s is not None and len(bucket.tpot) < _KEEP_PER_SECOND:
            bucket.tpot.append(tpot_s)

    def _at(self, second: int) -> _Bucket | None:
        bucket = self._buckets[second % self.size]
        return bucket if bucket.second == second else None

    def points(self, now_s: float) -> list[dict[str, Any]]:
        """One point per second, the ``size`` seconds up to ``now_s`` (its own second last),
        oldest first; a second without requests has zeros and null medians."""
        last = math.floor(now_s)
        out: list[dict[str, Any]] = []
        for second in range(last - self.size + 1, last + 1):
            b = self._at(second)
            out.append(
                {
                    "time": float(second),
                    "requests_per_s": float(b.requests) if b else 0.0,
                    "ttft_p50_s": _median(b.ttft) if b else None,
                    "tpot_p50_s": _median(b.tpot) if b else None,
                    "tokens_out_per_s": float(b.tokens_out) if b else 0.0,
                    "errors_per_s": float(b.errors) if b else 0.0,
                }
            )
        return out

    def rates(self, now_s: float, window_s: int = RATE_WINDOW_S) -> dict[str, Any]:
        """Per-second averages over the ``window_s`` seconds up to ``now_s`` (its own included)."""
        window_s = max(1, min(window_s, self.size))
        last = math.floor(now_s)
        requests = errors = tokens_in = tokens_out = 0
        for second in range(last - window_s + 1, last + 1):
            b = self._at(second)
            if b is not None:
                requests += b.requests
                errors += b.errors
                tokens_in += b.tokens_in
                tokens_out += b.tokens_out
        return {
            "window_s": window_s,
            "requests_per_s": round(requests / window_s, 3),
            "errors_per_s": round(errors / window_s, 3),
            "tokens_in_per_s": round(tokens_in / window_s, 3),
            "tokens_out_per_s": round(tokens_out / window_s, 3),
        }
