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

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.config import FailoverChain
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, read_body

__all__ = ["register"]

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
