"""A request's claim on an engine: the runtime's protocol, with the live card kept in step.

The protocol itself (what is refused before anything loads, slot, eviction, ready engine,
lease, release) is the runtime's (``actors/claim.py``); this adds what the service knows
about the request: its key's scope over the model the name resolved to, its tier, fairness
key, deadline and keep-alive, whether it is a doctor's probe, and the card that shows it
queued, then running.
"""

from __future__ import annotations

from typing import Unpack

from actors.claim import Claim, ClaimOptions, claim_on
from actors.engine import EngineActor
from actors.preflight import PromptTooLong
from actors.runtime import Runtime
from blazar.serve.cards import CardState
from blazar.serve.context import Ask
from blazar.serve.policy.prompt_fit import worded

__all__ = ["Claim", "claim_engine"]


async def claim_engine(
    runtime: Runtime, engine: EngineActor, ask: Ask, **options: Unpack[ClaimOptions]
) -> Claim:
    """``ask``'s claim on ``engine``. ``options``: what the request needs checked or changed
    before the slot (``needs``, ``prompt``, ``ctx_per_slot``, ``embeddings``…), and a
    ``keep_alive_s`` from its body (Ollama) over the context's own."""
    # The name asked for was checked when the route named it; the model it resolved to must
    # be in the key's scope too, or an alias would lead out of it.
    ask.check_model(engine.spec.alias or engine.spec.model)
    if options.get("keep_alive_s") is None:
        options["keep_alive_s"] = ask.keep_alive_s
    options["tier"], options["client"] = ask.tier, ask.client
    options["deadline_s"], options["certifying"] = ask.deadline_s, ask.certifying
    live = ask.card
    if live is not None:
        options["waiter_id"] = live.waiter_id = runtime.admission.next_id()
        deadline_s = ask.deadline_s

        def granted(engine: EngineActor) -> None:
            live.state, live.engine = CardState.RUNNING, engine.engine_kind
            if deadline_s is not None:  # queued, admission refuses it; running, the card ends it
                live.run_until(deadline_s)

        options["on_granted"] = granted
    try:
        claim = await claim_on(runtime, engine, **options)
    except PromptTooLong as exc:
        raise worded(exc) from None
    if live is not None:
        live.note_claim(claim.queued_s, claim.load_ns, ahead=claim.ahead, evicted=claim.evicted)
    return claim
