"""Per-key limits as pure decisions: sliding one-minute windows and a concurrency count.

No clock, no I/O, no trio: every function takes ``now`` (seconds, any monotonic
origin), so the accounting is unit-tested with plain numbers. The gateway's auth
step (``blazar.web.middleware.auth``) owns one ``Usage`` per key and asks ``decide`` before
each request.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Decision", "Usage", "UsageView", "Verdict", "Window", "admit", "decide"]

WINDOW_S = 60.0


class Window:
    """Amounts (requests, tokens) seen over the last ``span_s`` seconds."""

    __slots__ = ("events", "span_s", "total")

    def __init__(self, span_s: float = WINDOW_S) -> None:
        self.span_s = span_s
        self.events: deque[tuple[float, int]] = deque()
        self.total = 0

    def prune(self, now: float) -> None:
        horizon = now - self.span_s
        events = self.events
        while events and events[0][0] <= horizon:
            self.total -= events.popleft()[1]

    def add(self, now: float, amount: int) -> None:
        self.prune(now)  # bounded by what a minute holds, with or without a limit to check
        if amount > 0:
            self.events.append((now, amount))
            self.total += amount

    def used(self, now: float) -> int:
        self.prune(now)
        return self.total

    def wait_s(self, now: float, limit: int) -> float | None:
        """None while the window is under ``limit`` (0: no limit); else the seconds until
        enough of it has aged out for one more unit to fit."""
        if limit <= 0:
            return None
        self.prune(now)
        excess = self.total + 1 - limit
        if excess <= 0:
            return None
        freed = 0
        for at, amount in self.events:
            freed += amount
            if freed >= excess:
                return max(at + self.span_s - now, 0.001)
        return self.span_s  # unreachable while limit >= 1: the whole window frees it


class Verdict(enum.Enum):
    ADMIT = "admit"
    WAIT = "wait"
    """Over ``max_concurrent`` and the policy is to queue: wait for a request of the key to end."""
    RATE = "rate"
    CONCURRENCY = "concurrency"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    retry_after_s: float | None = None
    reason: str = ""


@dataclass(slots=True)
class Usage:
    """One key's live accounting (per daemon boot)."""

    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)
    in_flight: int = 0
    queued: int = 0
    requests_total: int = 0
    tokens_total: int = 0
    refused_rate: int = 0
    refused_concurrency: int = 0
    refused_scope: int = 0
    last_used_at: float | None = None
    """Unix time of the last admitted request."""


_ADMIT = Decision(Verdict.ADMIT)


def decide(usage: Usage, now: float, *, rpm: int, tpm: int, max_concurrent: int, queue: bool) -> Decision:
    """May one more request of this key start now? Limits of 0 are no limit.

    Requests per minute count admitted requests; tokens per minute count the tokens of
    requests that ended in the last minute, so a key over its budget waits until enough
    of it ages out. Rate refusals come before the concurrency check, so a refused
    request never holds nor waits for a concurrency place."""
    if (wait := usage.requests.wait_s(now, rpm)) is not None:
        return Decision(Verdict.RATE, wait, f"{rpm} requests per minute")
    if (wait := usage.tokens.wait_s(now, tpm)) is not None:
        return Decision(Verdict.RATE, wait, f"{tpm} tokens per minute")
    if max_concurrent > 0 and usage.in_flight >= max_concurrent:
        if queue:
            return Decision(Verdict.WAIT)
        return Decision(Verdict.CONCURRENCY, 1.0, f"{max_concurrent} concurrent requests")
    return _ADMIT


def admit(usage: Usage, now: float, wall_s: float, *, holds_place: bool = True) -> None:
    """Account for a request that starts (after ``decide`` said ADMIT, or its wait ended).
    One that does not ``holds_place`` (a watch stream) counts towards rpm only."""
    if holds_place:
        usage.in_flight += 1
    usage.requests.add(now, 1)
    usage.requests_total += 1
    usage.last_used_at = wall_s


@dataclass(frozen=True, slots=True)
class UsageView:
    requests_total: int
    tokens_total: int
    requests_last_minute: int
    tokens_last_minute: int
    in_flight: int
    queued: int
    refused_rate: int
    refused_concurrency: int
    refused_scope: int
    last_used_at: float | None

    @classmethod
    def of(cls, usage: Usage, now: float) -> UsageView:
        return cls(
            requests_total=usage.requests_total,
            tokens_total=usage.tokens_total,
            requests_last_minute=usage.requests.used(now),
            tokens_last_minute=usage.tokens.used(now),
            in_flight=usage.in_flight,
            queued=usage.queued,
            refused_rate=usage.refused_rate,
            refused_concurrency=usage.refused_concurrency,
            refused_scope=usage.refused_scope,
            last_used_at=usage.last_used_at,
        )
