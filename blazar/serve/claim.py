"""A request's claim on an engine: the runtime's protocol, with the live card kept in step.

The protocol itself (slot, eviction, ready engine, lease, release) is the runtime's
(``actors/claim.py``); this adds what the service knows about the request: its key's
scope over the model the name resolved to, its tier, fairness key, deadline and
keep-alive, and the card that shows it queued, then running.
"""

from __future__ import annotations

from actors.claim import Claim
from actors.engine import EngineActor
from actors.runtime import Runtime
from blazar.serve.cards import CardState
from blazar.serve.context import Ask

__all__ = ["Claim", "claim_engine"]


async def claim_engine(
    runtime: Runtime, engine: EngineActor, ask: Ask, *, keep_alive_s: float | None = None
) -> Claim:
    """``ask``'s claim on ``engine``. ``keep_alive_s``: from the request body (Ollama), else
    the context's own."""
    # The name asked for was checked when the route named it; the model it resolved to must
    # be in the key's scope too, or an alias would lead out of it.
    ask.check_model(engine.spec.alias or engine.spec.model)
    if keep_alive_s is None:
        keep_alive_s = ask.keep_alive_s
    live = ask.card
    if live is None:
        return await runtime.claim(
            engine.spec.model,
            tier=ask.tier,
            client=ask.client,
            deadline_s=ask.deadline_s,
            keep_alive_s=keep_alive_s,
        )
    waiter_id = live.waiter_id = runtime.admission.next_id()
    deadline_s = ask.deadline_s

    def granted(engine: EngineActor) -> None:
        live.state, live.engine = CardState.RUNNING, engine.engine_kind
        if deadline_s is not None:  # queued, admission refuses it; running, the card ends it
            live.run_until(deadline_s)

    claim = await runtime.claim(
        engine.spec.model,
        tier=ask.tier,
        client=ask.client,
        deadline_s=deadline_s,
        keep_alive_s=keep_alive_s,
        waiter_id=waiter_id,
        on_granted=granted,
    )
    live.note_claim(claim.queued_s, claim.load_ns, ahead=claim.ahead, evicted=claim.evicted)
    return claim
