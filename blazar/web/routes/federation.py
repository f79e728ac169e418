"""Federation in the gateway: the inference routes, wrapped so a request can be served by a peer.

With ``[[remotes]]`` configured, the inference routes are wrapped (``wrap_routes``): before a
request reaches its local handler, its ``model`` is read. ``remote:PEER/MODEL`` goes to that
peer; a model this daemon does not have, or has cold while a peer has it warm, goes to the
peer the decision picks (``actors/federation.py``, which gathers its inputs from the
runtime too); anything else (and every request another daemon relayed here) is served here
as before. Without remotes nothing is wrapped. The relay itself is
``blazar.serve.federation``. A pool's model (a ``[[remotes]]`` entry with ``pool``) goes to the
pool's router before anything else (``to_pool``). ``GET /api/peers`` (with the pools: their
routers started here and the workers registered with them) and ``/api/route/{model}`` report.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from actors.chain_walk import FailoverExhausted
from actors.config import FailoverChain
from actors.engine import EngineState
from actors.failover import Step
from actors.federation import LOCAL, decision_for
from actors.peer import RELAYED_HEADER, PeerView
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.serve import federation
from blazar.serve.failover import failed_reply, walk_for, walk_headers
from blazar.serve.federation import peer_targets, relay, split_remote
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.auth import model_visible
from blazar.web.asgi.call import Call, Handler, Reply, Routes
from blazar.web.asgi.replies import app_runtime, json_response
from blazar.web.routes.vectors import RERANK_ROUTES

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

__all__ = ["FEDERATED_PATHS", "register", "remote_models", "split_remote", "wrap_routes"]

FEDERATED_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/api/chat",
    "/api/generate",
    "/v1/embeddings",
    "/api/embed",
    "/api/embeddings",
    *RERANK_ROUTES,
    "/api/rerank",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
)
"""The routes whose requests may be relayed (each peer serves the same ones)."""


async def route(runtime: Runtime, call: Call, local: Handler) -> Reply:
    """Serve ``call`` here with ``local``, or relay it to a peer (see the module doc)."""
    model = federation.model_of(call.body, call.headers.get("content-type", "application/json"))
    if model is None or RELAYED_HEADER in call.headers:
        return await local(call)
    if (chain := runtime.failover.chains.get(model)) is not None:
        if any(t.peer is not None for t in chain.parsed()):
            return await walk_chain(runtime, call, chain, local)
        return await local(call)  # all its targets are here: the chain's own walk
    remote = split_remote(model)
    if remote is not None:
        peer, name = remote
        call.set_model(model)
        call.check_model(name)
        return await relay(call, peer_targets(runtime, call, peer, name))
    if (pool := runtime.pools.serving(model)) is not None and federation.speaks_openai(call):
        return await to_pool(runtime, call, pool.name, model, local)
    engine = runtime.engine_named(model)
    if engine is not None and engine.state in (EngineState.READY, EngineState.STARTING):
        return await local(call)  # warm here: local wins, no census, no peer consulted
    decision = await decision_for(runtime, model)
    if decision.winner == LOCAL:
        return await local(call)
    targets = federation.targets(runtime, call, decision, model)
    here = any(c.where == LOCAL and c.rank is not None for c in decision.candidates)
    if not targets:
        down = [c.where for c in decision.candidates if c.skipped and c.skipped.startswith("down")]
        elsewhere = [c.where for c in decision.candidates if c.rank is not None and c.where != LOCAL]
        call.set_model(model)
        if elsewhere and not here:  # only pass-through peers have it, and this route is not OpenAI's
            raise BlazarError(
                "MODEL_NOT_FOUND",
                f"model '{model}' is not installed here; the pass-through peer {', '.join(elsewhere)} has "
                "it, which is reached only through OpenAI's routes "
                f"({', '.join(sorted(federation.OPENAI_PATHS))})",
            )
        if down and not here:
            raise BlazarError(
                "PEER_UNAVAILABLE",
                f"model '{model}' is not installed here and no reachable peer has it (down: "
                f"{', '.join(down)}) — see `blazar peers` and `blazar route {model}`",
            )
        return await local(call)  # nowhere else: the local handler says MODEL_NOT_FOUND
    call.set_model(model)
    if call.card is not None:
        call.card.failover.append(f"federation: {decision.why}")
    try:
        return await relay(call, targets)
    except BlazarError as exc:
        if exc.code != "PEER_UNAVAILABLE" or not here:
            raise
        if call.card is not None:
            call.card.failover.append(f"federation: served here after the peers failed: {exc.message}")
        return await local(call)  # installed here (cold): the next candidate after the peers


async def to_pool(runtime: Runtime, call: Call, pool: str, model: str, local: Handler) -> Reply:
    """A request for a pool's model: to its router first, which picks the replica; served here
    only when the router cannot be reached (and the model is installed here)."""
    actor = runtime.peers.get(pool)
    call.set_model(model)
    if actor is not None and actor.state != "down":
        try:
            return await relay(call, [(actor, model)])
        except BlazarError as exc:
            if exc.code != "PEER_UNAVAILABLE":
                raise
            reason = exc.message
    else:
        reason = f"pool '{pool}' is down ({actor.last_error if actor is not None else 'not started'})"
    if call.card is not None:
        call.card.failover.append(f"pool: served here, the router could not be reached: {reason}")
    return await local(call)


async def walk_chain(runtime: Runtime, call: Call, chain: FailoverChain, local: Handler) -> Reply:
    """A request for a chain with ``remote:`` targets, walked here: each target in the order
    the chain's plan gives, a local one through the route's own handler (the body naming the
    target's model, ``x-blazar-engine`` its lane), a remote one relayed; a failure before the
    answer starts benches the target and moves on, as on a chain of local targets."""
    ask = ask_of(call)
    walk = walk_for(runtime, chain, ask, remote=True)
    body = call.body

    async def attempt(step: Step, engine: object) -> Reply:
        target = step.target
        call.headers.pop("x-blazar-engine", None)
        if target.peer is not None:
            return await relay(call, peer_targets(runtime, call, target.peer, target.model))
        call.body = body if target.model == chain.name else federation.rewrite_model(body, target.model)
        if target.lane is not None:
            call.headers["x-blazar-engine"] = target.lane
        call.asked = ask.but(lane=target.lane)  # the route's handler runs on the target's lane
        return await local(call)

    call.set_model(chain.name)
    try:
        reply = await walk.run(attempt, refused=lambda reply: failed_reply(call, reply))
    except FailoverExhausted:
        call.set_model(chain.name)
        raise
    reply.headers = {**(reply.headers or {}), **walk_headers(walk)}
    return reply


def wrap_routes(routes: Routes, runtime: Runtime) -> None:
    """Put the federation in front of the inference routes (only with ``[[remotes]]``)."""
    if not runtime.peers:
        return
    for path in FEDERATED_PATHS:
        local = routes.post.get(path)
        if local is not None:
            routes.post[path] = _wrapped(runtime, local)


def _wrapped(runtime: Runtime, local: Handler) -> Handler:
    async def handler(call: Call) -> Reply:
        return await route(runtime, call, local)

    return handler


# -- routes -----------------------------------------------------------------------------------------


def _visible(view: PeerView) -> PeerView:
    """``view`` with only the models the caller's key may use (as its own listings do)."""
    snap = view.snapshot
    if snap is None:
        return view
    snap = msgspec.structs.replace(
        snap,
        loaded=[m for m in snap.loaded if model_visible(m.model)],
        installed=[m for m in snap.installed if model_visible(m.name)],
    )
    return msgspec.structs.replace(view, snapshot=snap)


async def peers() -> Response:
    runtime = app_runtime()
    views = await runtime.peers.poll_all() if runtime.peers else []
    doc = {"peers": [_visible(v) for v in views], "pools": runtime.pools.views(), "polled_at": time.time()}
    return json_response(doc)


async def route_of(model: str) -> Response:
    runtime = app_runtime()
    return json_response(await decision_for(runtime, model))


def remote_models(runtime: Runtime) -> list[dict[str, object]]:
    """The peers' models for ``/v1/models?include=remote``: ``remote:PEER/MODEL``, marked."""
    out: list[dict[str, object]] = []
    for view in runtime.peers.views():
        if view.snapshot is None:
            continue
        for m in view.snapshot.installed:
            if not model_visible(m.name):
                continue
            out.append(
                {
                    "id": f"remote:{view.name}/{m.name}",
                    "object": "model",
                    "created": 0,
                    "owned_by": view.name,
                    "blazar_peer": view.name,
                    "blazar_peer_state": view.state,
                }
            )
    return out


def register(app: QuartTrio) -> None:
    """``GET /api/peers`` and ``GET /api/route/<model>``."""
    app.get("/api/peers")(peers)
    app.get("/api/route/<path:model>")(route_of)
