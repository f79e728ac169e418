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
from actors.errors import Preempted
from actors.preflight import PromptTooLong
from actors.runtime import Runtime
from actors.upstream import UpstreamError, nothing_received
from blazar.dialects.prompt_size import PromptSize
from blazar.errors import BlazarError
from blazar.serve.cards import CardState
from blazar.serve.context import Ask
from blazar.serve.policy.prompt_fit import check_prompt, worded
from blazar.serve.relay import crash_error, send_upstream

__all__ = ["Claim", "claim_engine", "died_idle", "preemptible_answer"]


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


def died_idle(exc: UpstreamError, err: BlazarError) -> bool:
    """Whether a failed send met an engine that had died before answering anything: no
    connection, or one that broke before the first byte of the answer
    (``actors.upstream.nothing_received``), to an engine that crashed. A kill -9 or the OOM
    killer between two requests leaves that window while the child's threads exit. Such a
    request claims the engine once more, which starts it again, and waits for the start
    instead of failing (once: a request that crashes the engine itself fails the second
    time)."""
    return nothing_received(exc) and err.code == "ENGINE_CRASHED"


async def preemptible_answer(
    runtime: Runtime,
    engine: EngineActor,
    ask: Ask,
    size: PromptSize,
    path: str,
    body: bytes,
    *,
    again: bool = True,
) -> tuple[Claim, tuple[int, bytes]]:
    """A whole (not streamed) answer for a batch or background request, read inside its
    slot's preemptible window: nothing reaches its client before the answer is whole, so
    an interactive request may take the slot until then (``actors/preemption.py``).
    Preempted, the engine request is closed, the slot released, and the request queues
    again at the head of its class and runs again: its client sees only a longer wait.
    Returns the claim (already released) and the engine's status and body. ``again``: an
    engine that died idle is claimed once more (``died_idle``; not on a failover chain)."""
    requeue = None
    retried = not again
    while True:
        claim = await claim_engine(runtime, engine, ask, prompt=size, requeue=requeue)
        try:
            with claim.slot.preemptible():
                await check_prompt(engine, claim.handle, size)
                upstream = await send_upstream(claim.handle, path, body)
                try:
                    content = await upstream.aread()
                finally:
                    await upstream.aclose()
            return claim, (upstream.status_code, content)
        except Preempted:
            requeue = claim.slot.requeue()
            if ask.card is not None:
                ask.card.note_preempted()
        except UpstreamError as exc:
            err = await crash_error(engine, claim.handle, exc)
            if retried or not died_idle(exc, err):
                raise err from exc
            retried, requeue = True, None  # claim again: that starts the engine again
        finally:
            claim.release()
