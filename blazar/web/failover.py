"""Failover chains in the gateway: what a walk along a chain says in the answer, and the chains' routes.

The runtime decides the order (``actors/failover.py``) and walks it for one request
(``actors/chain_walk.py``): each attempt runs up to the point where the client would get
its first byte; a failure there that is the target's benches the target and moves on, one
that is the request's own (a 4xx: a bad parameter, a prompt too long) is the answer. Once
bytes have gone to the client nothing is tried again: a stream that fails later ends with
the dialect's error event. The answer names the target that served
(``X-Blazar-Target``) and those passed over (``X-Blazar-Failover``).

``GET /api/failover`` reports the chains; ``POST /api/failover/{name}/pin`` and
``/unpin`` need an admin key (``/api/failover/`` is an admin prefix).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.chain_walk import ChainWalk
from actors.config import FailoverChain
from actors.engine import EngineActor
from actors.failover import Step
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.serve.context import Ask
from blazar.web.ask import ask_of
from blazar.web.call import Call, Reply
from blazar.web.common import app_runtime, json_response, read_body

__all__ = ["TARGET_HEADER", "failed_reply", "register", "relay_on_chain", "walk_for", "walk_headers"]

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


def failed_reply(call: Call, reply: Reply) -> tuple[str, str] | None:
    """A whole answer that came back as a 5xx was never sent: the target failed it."""
    if reply.status < 500 or not isinstance(reply.body, bytes):
        return None
    why = (call.code or "BAD_GATEWAY", call.error or f"the engine answered {reply.status}")
    call.code = call.error = None
    return why


async def relay_on_chain(
    runtime: Runtime, call: Call, chain: FailoverChain, attempt: Callable[[EngineActor], Awaitable[Reply]]
) -> Reply:
    """``attempt`` (a relayed request on one engine) on each target in turn until one answers.
    A stream is the answer once its head is back; what fails after is its own to tell."""
    walk = walk_for(runtime, chain, ask_of(call))

    async def on(step: Step, engine: EngineActor | None) -> Reply:
        assert engine is not None  # a local walk
        return await attempt(engine)

    reply = await walk.run(on, refused=lambda reply: failed_reply(call, reply))
    reply.headers = {**(reply.headers or {}), **walk_headers(walk)}
    return reply


# -- routes -----------------------------------------------------------------


class _PinBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    target: str


def _chain_named(runtime: Runtime, name: str) -> FailoverChain:
    chain = runtime.failover.get(name)
    if chain is None:
        known = ", ".join(runtime.failover.names()) or "none is configured"
        raise BlazarError(
            "FAILOVER_CHAIN_NOT_FOUND",
            f"no failover chain named '{name}' (configured: {known}) — "
            "add a [[failover]] entry to config.toml",
        )
    return chain


async def chains() -> Response:
    runtime = app_runtime()
    names = set(runtime.failover.names())
    installed = frozenset(
        r.name for r in await trio.to_thread.run_sync(runtime.store.list) if r.name in names
    )
    report = runtime.failover.report(trio.current_time(), installed)
    return json_response({"chains": report})


async def pin(name: str) -> Response:
    runtime = app_runtime()
    chain = _chain_named(runtime, name)
    try:
        body = msgspec.json.decode(await read_body(), type=_PinBody)
    except msgspec.ValidationError as exc:
        raise BlazarError(
            "BAD_REQUEST", f'invalid body for /api/failover/{name}/pin: {exc} — send {{"target": …}}'
        ) from None
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not valid JSON: {exc}") from None
    target = next((t for t in chain.parsed() if t.text == body.target), None)
    if target is None:
        raise BlazarError(
            "BAD_REQUEST",
            f"'{body.target}' is not a target of failover chain '{name}' "
            f"(its targets: {', '.join(chain.targets)})",
            param="target",
        )
    if target.peer is not None and not runtime.failover.federated:
        raise BlazarError(
            "BAD_REQUEST",
            f"cannot pin '{body.target}': no [[remotes]] entry is configured, so remote targets are "
            "not served (docs/federation.md)",
            param="target",
        )
    runtime.failover.pin(name, body.target)
    return json_response({"chain": name, "pinned": body.target})


async def unpin(name: str) -> Response:
    runtime = app_runtime()
    _chain_named(runtime, name)
    was = runtime.failover.pinned(name)
    runtime.failover.unpin(name)
    return json_response({"chain": name, "pinned": None, "was": was})


def register(app: QuartTrio) -> None:
    """``GET /api/failover``, ``POST /api/failover/<name>/pin`` and ``/unpin``."""
    app.get("/api/failover")(chains)
    app.post("/api/failover/<name>/pin")(pin)
    app.post("/api/failover/<name>/unpin")(unpin)
