"""What a request's HTTP headers say about its claim on an engine.

The request protocol itself (slot, eviction, ready engine, lease, release) is
the runtime's (``actors/claim.py``); this module only reads the headers into its
arguments and keeps the live request card in step.
"""

from __future__ import annotations

import trio

from actors.claim import Claim
from actors.engine import EngineActor
from actors.runtime import Runtime
from actors.scheduling import Tier, parse_tier
from blazar.errors import BlazarError
from blazar.keys import LOCAL_NAME
from blazar.serve.cards import CardState
from blazar.web.auth import presented_secret, secret_tag
from blazar.web.call import Call, current_or_none
from blazar.web.common import keep_alive_header

__all__ = ["Claim", "claim_engine"]


def _client_key(call: Call) -> str:
    """Who a request is, for admission's per-client fairness: its key's name; never a secret
    (a bearer token that is no key counts by a hash of it)."""
    headers = call.headers
    if call.key is not None:
        if call.key != LOCAL_NAME:  # the local token: the CLI, keyless batch items — told apart below
            return "key:" + call.key
    elif (secret := presented_secret(headers)) is not None:
        return "tok:" + secret_tag(secret)
    if client := headers.get("x-blazar-client"):
        return "client:" + client
    return f"addr:{call.client or '?'}"


def _deadline_s(call: Call) -> float | None:
    raw = call.headers.get("x-blazar-deadline-ms")
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise BlazarError(
            "BAD_REQUEST", f"X-Blazar-Deadline-Ms must be a number of milliseconds, got {raw!r}"
        ) from None
    if ms <= 0:
        raise BlazarError("BAD_REQUEST", "X-Blazar-Deadline-Ms must be positive")
    return trio.current_time() + ms / 1000


async def claim_engine(
    runtime: Runtime, engine: EngineActor, *, keep_alive_s: float | None = None, tier: Tier | None = None
) -> Claim:
    """The current request's claim on ``engine``. ``keep_alive_s``: from the request
    body (Ollama), else the X-Blazar-Keep-Alive header. ``tier`` overrides the priority
    header; work that runs outside any request (a job) claims at ``tier`` as client ``job``."""
    call = current_or_none()
    if call is None:
        return await runtime.claim(
            engine.spec.model, tier=tier or Tier.NORMAL, client="job", keep_alive_s=keep_alive_s
        )
    # The name asked for was checked when the route named it; the model it resolved to must
    # be in the key's scope too, or an alias would lead out of it.
    call.check_model(engine.spec.alias or engine.spec.model)
    if keep_alive_s is None and (header := call.headers.get("x-blazar-keep-alive")):
        keep_alive_s = keep_alive_header(header)
    live = call.card
    waiter_id = runtime.admission.next_id()
    if live is not None:
        live.waiter_id = waiter_id
    deadline_s = _deadline_s(call)

    def granted(engine: EngineActor) -> None:
        if live is not None:
            live.state, live.engine = CardState.RUNNING, engine.engine_kind
            if deadline_s is not None:  # queued, admission refuses it; running, the card ends it
                live.run_until(deadline_s)

    claim = await runtime.claim(
        engine.spec.model,
        tier=tier if tier is not None else parse_tier(call.headers.get("x-blazar-priority")),
        client=_client_key(call),
        deadline_s=deadline_s,
        keep_alive_s=keep_alive_s,
        waiter_id=waiter_id,
        on_granted=granted,
    )
    if live is not None:
        live.note_claim(claim.queued_s, claim.load_ns, ahead=claim.ahead, evicted=claim.evicted)
    return claim
