"""Failover chains: which target a request for a chain goes to, and what each target's record is.

A ``[[failover]]`` chain is a model name served by the first healthy of its targets. A target
that fails (its engine crashed, its breaker is open, it would not load, it took too long to
start answering) is *benched*: passed over for ``bench_s``, doubled with each failure in a
row up to ``bench_max_s`` (anti-flap). Once the bench is over, the next request *probes* it:
tried first again, in its place; a success clears its record, a failure benches it longer.
An operator may *pin* a chain to one target: every request then goes there, benched or not,
and nothing fails over until it is unpinned.

``plan`` and ``bench_for`` are the decision, pure functions over the state. ``FailoverChains``
owns that state for the runtime. Every change to it is one synchronous step on the event loop
(no I/O, no checkpoint), so it needs no mailbox: a request reads a plan and reports what
happened without a round trip through an actor, and nothing can interleave inside a step.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from actors.config import FailoverChain, FailoverTarget

__all__ = [
    "REMOTE_REASON",
    "ChainReport",
    "FailoverChains",
    "FailoverStatistics",
    "Step",
    "TargetReport",
    "TargetState",
    "bench_for",
    "plan",
]

REMOTE_REASON = (
    "remote targets need the federation: no [[remotes]] entry is configured, so the target is skipped"
)

Action = Literal["try", "probe", "last-resort", "pinned", "skip"]


@dataclass
class TargetState:
    """What one chain knows of one of its targets."""

    failures: int = 0
    """Failures in a row (0: healthy)."""
    benched_until: float | None = None
    """``trio.current_time()`` until which it is passed over; None: not benched."""
    last_code: str | None = None
    last_error: str | None = None
    last_failed_at: float | None = None
    """Wall-clock time (``time.time()``) of the last failure."""
    crashes_seen: int = 0
    """Its engine's crash count when the chain last charged or cleared it: a higher count
    on a failed engine is a crash this chain has not counted yet."""
    served: int = 0
    failed: int = 0
    """Failures in all (the failovers away from it)."""


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """One target in the order a request tries them."""

    target: FailoverTarget
    action: Action
    """``try``: healthy; ``probe``: its bench is over; ``last-resort``: benched, tried because no
    target is left that is not; ``pinned``: the chain is pinned to it; ``skip``: not tried."""
    reason: str | None = None
    """Why it is skipped or probed."""


def bench_for(failures: int, base_s: float, max_s: float) -> float:
    """The bench after ``failures`` failures in a row: ``base_s``, doubled each time, at most ``max_s``."""
    if failures <= 0:
        return 0.0
    return min(max_s, base_s * 2.0 ** min(failures - 1, 32))


def plan(
    chain: FailoverChain,
    states: Mapping[str, TargetState],
    now: float,
    *,
    pinned: str | None = None,
    federated: bool = False,
) -> list[Step]:
    """The order a request for ``chain`` tries its targets at ``now`` (trio time).

    Healthy targets and those whose bench is over are tried in the chain's order; benched
    ones are skipped, unless every local target is benched: then they are all tried in order
    rather than refusing without trying. ``remote:`` targets are skipped without the
    federation (``federated``: ``[[remotes]]`` are configured); with it they are benched and
    probed like the others. A pin puts its target alone."""
    targets = chain.parsed()
    if pinned is not None:
        target = next(t for t in targets if t.text == pinned)
        return [Step(target=target, action="pinned", reason="the chain is pinned to it")]
    steps: list[Step] = []
    for target in targets:
        state = states.get(target.text) or TargetState()
        if target.peer is not None and not federated:
            steps.append(Step(target=target, action="skip", reason=REMOTE_REASON))
        elif state.benched_until is not None and state.benched_until > now:
            why = f"benched for {state.benched_until - now:.1f} s more after: {state.last_error}"
            steps.append(Step(target=target, action="skip", reason=why))
        elif state.failures:
            steps.append(Step(target=target, action="probe", reason=f"probed after: {state.last_error}"))
        else:
            steps.append(Step(target=target, action="try"))
    if not any(s.action in ("try", "probe") for s in steps):
        steps = [
            Step(target=s.target, action="last-resort", reason=s.reason)
            if s.target.peer is None or federated
            else s
            for s in steps
        ]
    return steps


class TargetReport(msgspec.Struct, frozen=True, kw_only=True):
    target: str
    model: str
    lane: str | None
    peer: str | None
    state: Literal["healthy", "benched", "probing", "unavailable"]
    """``probing``: failed before, its bench is over, the next request tries it."""
    pinned: bool
    failures: int
    benched_for_s: float | None
    """Seconds of bench left (``benched``)."""
    last_code: str | None
    last_error: str | None
    last_failed_at: float | None
    served: int
    failed: int
    reason: str | None = None
    """Why it is not tried now (``benched``, ``unavailable``)."""


class ChainReport(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    pinned: str | None
    timeout_s: float | None
    bench_s: float
    bench_max_s: float
    shadows_model: bool
    """An installed model has the chain's name: requests for it go to the chain."""
    targets: list[TargetReport]


class FailoverStatistics(msgspec.Struct, frozen=True, kw_only=True):
    chains: int
    failovers: dict[str, int]
    """``chain/target`` → times a request moved on from that target."""


class FailoverChains:
    """The runtime's chains and the one record of their targets' health (see the module doc)."""

    def __init__(self, chains: list[FailoverChain], *, federated: bool = False) -> None:
        self.federated = federated
        """``[[remotes]]`` are configured: ``remote:`` targets are served, not skipped."""
        self.chains: dict[str, FailoverChain] = {c.name: c for c in chains}
        """Chain name → chain: the one lookup a request for any model pays."""
        self._states: dict[str, dict[str, TargetState]] = {
            c.name: {t: TargetState() for t in c.targets} for c in chains
        }
        self._pins: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<FailoverChains chains={len(self.chains)} pinned={len(self._pins)}>"

    def get(self, name: str) -> FailoverChain | None:
        return self.chains.get(name)

    def names(self) -> list[str]:
        return list(self.chains)

    def state(self, chain: str, target: str) -> TargetState:
        return self._states[chain][target]

    def plan(self, name: str, now: float) -> list[Step]:
        return plan(
            self.chains[name], self._states[name], now, pinned=self._pins.get(name), federated=self.federated
        )

    def failed(
        self, chain: str, target: str, code: str, message: str, now: float, *, crashes: int = 0
    ) -> float:
        """``target`` failed a request of ``chain``: bench it; returns the bench in seconds."""
        c = self.chains[chain]
        state = self._states[chain][target]
        state.failures += 1
        state.failed += 1
        bench_s = bench_for(state.failures, c.bench_s, c.bench_max_s)
        state.benched_until = now + bench_s
        state.last_code, state.last_error, state.last_failed_at = code, message, time.time()
        state.crashes_seen = max(state.crashes_seen, crashes)
        return bench_s

    def served(self, chain: str, target: str, *, crashes: int = 0) -> None:
        """``target`` answered a request of ``chain``: its record is clean again."""
        state = self._states[chain][target]
        state.served += 1
        state.failures = 0
        state.benched_until = None
        state.crashes_seen = max(state.crashes_seen, crashes)

    def fresh_crash(self, chain: str, target: str, crashes: int) -> bool:
        """Whether a failed engine's ``crashes`` hold one this chain has not charged ``target``
        with. Only a healthy target is charged that way: a benched one is probed for real."""
        state = self._states[chain][target]
        return state.failures == 0 and crashes > state.crashes_seen

    def pin(self, chain: str, target: str) -> None:
        """Send every request of ``chain`` to ``target`` (a local one, or a remote one when federated)."""
        c = self.chains[chain]
        if target not in c.targets:
            raise KeyError(target)
        self._pins[chain] = target

    def unpin(self, chain: str) -> bool:
        return self._pins.pop(chain, None) is not None

    def pinned(self, chain: str) -> str | None:
        return self._pins.get(chain)

    def report(self, now: float, installed: frozenset[str] = frozenset()) -> list[ChainReport]:
        """Every chain and its targets as they stand at ``now`` (``GET /api/failover``)."""
        out = []
        for name, chain in self.chains.items():
            pinned = self._pins.get(name)
            rows = []
            steps = plan(chain, self._states[name], now, federated=self.federated)
            for step, target in zip(steps, chain.parsed(), strict=True):
                s = self._states[name][target.text]
                if target.peer is not None and not self.federated:
                    state: Literal["healthy", "benched", "probing", "unavailable"] = "unavailable"
                elif s.benched_until is not None and s.benched_until > now:
                    state = "benched"
                elif s.failures:
                    state = "probing"
                else:
                    state = "healthy"
                left = s.benched_until - now if state == "benched" and s.benched_until is not None else None
                rows.append(
                    TargetReport(
                        target=target.text,
                        model=target.model,
                        lane=target.lane,
                        peer=target.peer,
                        state=state,
                        pinned=pinned == target.text,
                        failures=s.failures,
                        benched_for_s=round(left, 3) if left is not None else None,
                        last_code=s.last_code,
                        last_error=s.last_error,
                        last_failed_at=s.last_failed_at,
                        served=s.served,
                        failed=s.failed,
                        reason=step.reason if state in ("benched", "unavailable") else None,
                    )
                )
            out.append(
                ChainReport(
                    name=name,
                    pinned=pinned,
                    timeout_s=chain.timeout_s,
                    bench_s=chain.bench_s,
                    bench_max_s=chain.bench_max_s,
                    shadows_model=name in installed,
                    targets=rows,
                )
            )
        return out

    def statistics(self) -> FailoverStatistics:
        counts = {
            f"{chain}/{target}": s.failed
            for chain, states in self._states.items()
            for target, s in states.items()
            if s.failed
        }
        return FailoverStatistics(chains=len(self.chains), failovers=counts)
