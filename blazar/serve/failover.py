"""A request's walk along a failover chain, as the service layer runs it and the answer tells it.

The walk is the runtime's (``actors/chain_walk.py``); this makes one for a request's
context (its key's scope, its card) and says in the answer's headers which target served
(``X-Blazar-Target``) and which were passed over, with their codes (``X-Blazar-Failover``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from actors.chain_walk import ChainWalk
from actors.config import FailoverChain
from actors.engine import EngineActor
from actors.failover import Step
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.serve.context import Ask, Relayed
from blazar.serve.reply import Reply

__all__ = [
    "FAILED_OVER_HEADER",
    "TARGET_HEADER",
    "failed_reply",
    "relay_on_chain",
    "walk_for",
    "walk_headers",
]

TARGET_HEADER = "X-Blazar-Target"
FAILED_OVER_HEADER = "X-Blazar-Failover"


def walk_for(runtime: Runtime, chain: FailoverChain, ask: Ask, *, remote: bool = False) -> ChainWalk:
    """``ask``'s walk along ``chain``: targets outside its key's scope are skipped, and its card
    is told each step. A pinned lane does not apply: the targets name their own."""
    if ask.lane is not None:
        raise BlazarError(
            "BAD_REQUEST",
            f"x-blazar-engine does not apply to the failover chain '{chain.name}': its targets name "
            "their lanes (MODEL@LANE) — drop the header, or ask for a target's model directly",
        )
    card = ask.card
    return ChainWalk(
        runtime,
        chain,
        check=ask.check_model,
        note=card.failover.append if card is not None else None,
        remote=remote,
    )


def walk_headers(walk: ChainWalk) -> dict[str, str]:
    """What the answer says about the walk: the target that served, those passed over."""
    out = {TARGET_HEADER: walk.target} if walk.target is not None else {}
    if walk.passed:
        out[FAILED_OVER_HEADER] = ", ".join(f"{t}={code}" for t, code, _ in walk.passed)
    return out


def failed_reply(call: Relayed, reply: Reply) -> tuple[str, str] | None:
    """A whole answer that came back as a 5xx was never sent: the target failed it."""
    if reply.status < 500 or not isinstance(reply.body, bytes):
        return None
    why = (call.code or "BAD_GATEWAY", call.error or f"the engine answered {reply.status}")
    call.code = call.error = None
    return why


async def relay_on_chain(
    runtime: Runtime,
    call: Relayed,
    ask: Ask,
    chain: FailoverChain,
    attempt: Callable[[EngineActor], Awaitable[Reply]],
) -> Reply:
    """``attempt`` (a relayed request on one engine) on each target in turn until one answers.
    A stream is the answer once its head is back; what fails after is its own to tell."""
    walk = walk_for(runtime, chain, ask)

    async def on(step: Step, engine: EngineActor | None) -> Reply:
        assert engine is not None  # a local walk
        return await attempt(engine)

    reply = await walk.run(on, refused=lambda reply: failed_reply(call, reply))
    reply.headers = {**(reply.headers or {}), **walk_headers(walk)}
    return reply
