"""Preemption decisions: which running request gives its slot to a waiting interactive one.

Pure functions over immutable values, like ``actors/scheduling.py``; the admission actor
passes in what runs on a model and carries out the answer (it cancels the victims' work
and lets them queue again, at the head of their class).

The rule, most important part first:

1. Only a waiter of the ``interactive`` class (``Tier.HIGH``, by its own class, not by
   promotion) preempts, and only when it waits: ``assign`` found no slot it may take.
2. Only a request of the ``batch`` or ``background`` class (``Tier.LOW`` and below) is
   preempted, and only while it is *preemptible*: it holds its slot inside its preemptible
   window (from its grant until its engine's first output: nothing has been sent to its
   client, not even a status line), it was not granted by promotion (a request promoted by
   the starvation guards keeps its slot: no starvation by preemption), and it is not being
   preempted already.
3. One victim per waiting interactive request, less the preemptions already under way
   (a victim's slot goes to the first interactive waiter when the victim lets go).
4. A victim is only chosen when its slot, once free, may go to the interactive class (the
   reservations of ``scheduling.may_take_slot`` could hold it for the victim's own class:
   preempting it would only hand the slot back).
5. Among the candidates: the least urgent class first (``background`` before ``batch``),
   then the most recently granted (it has lost the least work).
"""

from __future__ import annotations

import msgspec

from actors.scheduling import ModelQueue, Tier, may_take_slot, order, release

__all__ = ["PREEMPTIBLE_FROM", "Running", "choose_victims"]

PREEMPTIBLE_FROM = Tier.LOW
"""The most urgent tier that may be preempted (``batch``; ``background`` too)."""


class Running(msgspec.Struct, frozen=True, kw_only=True):
    """A granted request of one model, as preemption sees it."""

    id: int
    tier: Tier
    granted_s: float
    preemptible: bool
    """Inside its preemptible window, not promoted, no output yet."""
    preempting: bool = False
    """Already told to let go (its slot is still counted until it does)."""


def choose_victims(queue: ModelQueue, running: tuple[Running, ...] | list[Running]) -> list[int]:
    """The ids of the running requests to preempt now (see the module docstring)."""
    askers = [w for w in order(queue) if w.tier == Tier.HIGH]
    wanted = len(askers) - sum(1 for r in running if r.preempting)
    if wanted <= 0 or (queue.running < queue.capacity and may_take_slot(queue, Tier.HIGH)):
        return []
    candidates = sorted(
        (r for r in running if r.preemptible and not r.preempting and r.tier >= PREEMPTIBLE_FROM),
        key=lambda r: (-int(r.tier), -r.granted_s, -r.id),
    )
    victims: list[int] = []
    for r in candidates:
        if len(victims) >= wanted:
            break
        if may_take_slot(release(queue, r.tier), Tier.HIGH):
            victims.append(r.id)
    return victims
