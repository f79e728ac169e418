"""The engines and models admin routes (``/admin/...``, an admin key's): the engines' state
and slots, the ledger's last requests, the keys, unloading and forgetting a model, its
adapters, moving engines to their active version, and stopping the daemon.
"""

from __future__ import annotations

import os
from typing import Any, cast

import httpx
import msgspec
import trio
from quart import Response, current_app, request
from quart_trio import QuartTrio

from actors.ledger import read_requests
from blazar.serve.relay import crash_error
from blazar.web.asgi.replies import AUTH_KEY, JSON, app_runtime
from blazar.web.middleware.auth import Auth

__all__ = ["register"]


async def admin_engines() -> Response:
    return Response(msgspec.json.encode(app_runtime().statistics()), content_type=JSON)


async def admin_switch_engines() -> Response:
    """Move every engine to its lane's active version (``blazar engine use``): each drains first."""
    moved = await app_runtime().switch_engines()
    return Response(msgspec.json.encode({"moved": moved}), content_type=JSON)


async def admin_slots(name: str) -> Response:
    """The engine's own view of its slots (llama.cpp ``/slots``), for diagnostics: read under a
    lease, with no admission slot (``Runtime.lease``), so that it never waits behind the
    requests it shows."""
    async with app_runtime().lease(name) as (engine, handle):
        try:
            upstream = await handle.client.get("/slots", timeout=10.0)
        except httpx.HTTPError as exc:
            raise await crash_error(engine, handle, exc) from exc
    return Response(upstream.content, upstream.status_code, content_type=JSON)


async def admin_requests() -> Response:
    """The most recent finished requests from the ledger, newest first."""
    ledger_path = app_runtime().ledger.path
    limit = min(max(request.args.get("limit", 50, type=int) or 50, 1), 1000)
    trace_id = request.args.get("trace_id")
    records = await trio.to_thread.run_sync(
        lambda: read_requests(ledger_path, limit=limit, trace_id=trace_id)
    )
    return Response(msgspec.json.encode({"object": "list", "data": records}), content_type=JSON)


async def admin_keys() -> Response:
    """Every API key (names, scopes, limits; never a secret) and its usage since boot."""
    auth = cast(Auth | None, current_app.extensions.get(AUTH_KEY))
    stats = auth.statistics() if auth is not None else {"object": "list", "auth": False, "data": []}
    return Response(msgspec.json.encode(stats), content_type=JSON)


async def admin_unload(name: str) -> dict[str, Any]:
    return {"model": name, "unloaded": await app_runtime().lifecycle.unload(name)}


async def admin_forget(name: str) -> dict[str, Any]:
    """Stop and drop the engine of a model whose file was removed or replaced."""
    await app_runtime().forget(name)
    return {"model": name, "forgotten": True}


async def admin_adapters(name: str) -> dict[str, Any]:
    """The model's LoRA adapters changed in the store: a running engine restarts with them
    once its requests have finished (``reloading``); otherwise its next start reads them."""
    return {"model": name, "reloading": await app_runtime().reload_adapters(name)}


async def admin_refresh(name: str) -> dict[str, Any]:
    """The model's files or settings changed in the store (a projector attached): a running
    engine restarts with them once its requests have finished (``restarting``)."""
    runtime = app_runtime()
    record = await trio.to_thread.run_sync(runtime.store.get, name)
    return {"model": record.name, "restarting": await runtime.refresh(record)}


async def admin_shutdown() -> dict[str, Any]:
    current_app.config["BLAZAR_SHUTDOWN"].set()
    return {"status": "stopping", "pid": os.getpid()}


def register(app: QuartTrio) -> None:
    app.get("/admin/engines")(admin_engines)
    app.get("/admin/engines/<path:name>/slots")(admin_slots)
    app.get("/admin/requests")(admin_requests)
    app.get("/admin/keys")(admin_keys)
    app.post("/admin/models/<path:name>/unload")(admin_unload)
    app.post("/admin/models/<path:name>/forget")(admin_forget)
    app.post("/admin/models/<path:name>/adapters")(admin_adapters)
    app.post("/admin/models/<path:name>/refresh")(admin_refresh)
    app.post("/admin/shutdown")(admin_shutdown)
    app.post("/admin/engines/switch")(admin_switch_engines)
