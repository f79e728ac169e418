"""The operator verbs on a peer, over HTTP: warm a model there, copy a model there.

``POST /admin/peers/PEER/warm`` (``{"model", "keep_alive"}``) loads a model on the peer now
and answers once it is ready; ``POST /admin/peers/PEER/replicate`` (``{"model",
"from_here"}``) puts one of this machine's models on the peer and answers NDJSON: one line
per step, the last ``success`` or ``failed`` (with the peer's ``blazar_code``). How each is
done is the runtime's (``PeerActor.warm`` and ``PeerActor.replicate`` in ``actors/peer.py``);
both need a key on the peer with the ``admin`` scope.

The receiving side: ``GET /admin/models/NAME/replica`` (a model's portable manifest, by which
the sender compares digests) and ``POST /admin/models/install``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
import trio
from quart import Response, current_app
from quart_trio import QuartTrio

from actors.errors import BlazarRuntimeError, PeerRefused
from actors.peer import Progress
from blazar.dialects._wire import decode_json
from blazar.errors import CATALOG, BlazarError
from blazar.web.asgi.replies import NDJSON, app_runtime, json_response, read_body, stream_response
from registry.errors import RegistryError
from registry.replica import Replica, install, replica_of

__all__ = ["register"]

log = logging.getLogger("blazar.web")


class _WarmBody(msgspec.Struct, kw_only=True):
    model: str
    keep_alive: str | int | float | None = None


class _ReplicateBody(msgspec.Struct, kw_only=True):
    model: str
    from_here: bool = False


def _code(exc: PeerRefused) -> str:
    """The peer's code where the catalog lists it (a newer peer may answer one it does not)."""
    return exc.code if exc.code in CATALOG else exc.fallback


# -- warm ---------------------------------------------------------------------------------


async def warm(peer: str) -> Response:
    runtime = app_runtime()
    body = decode_json(await read_body(), _WarmBody)
    actor = runtime.peers.require(peer)
    try:
        warmed = await actor.warm(body.model, keep_alive=body.keep_alive)
    except PeerRefused as exc:
        raise BlazarError(_code(exc), exc.message) from None
    return json_response(warmed)


# -- replicate ------------------------------------------------------------------------------


def _lines_of(work: Callable[[Progress], Awaitable[object]], peer: str) -> AsyncIterator[bytes]:
    """Run ``work`` on the app's nursery, its steps as the response's lines; a client that
    goes away cancels it. An error becomes the last line (``failed``, with its code)."""
    send_ch, recv_ch = trio.open_memory_channel[bytes](64)
    scope = trio.CancelScope()

    async def send(fields: dict[str, Any]) -> None:
        await send_ch.send(msgspec.json.encode({"peer": peer, **fields}) + b"\n")

    async def failed(code: str, message: str) -> None:
        await send({"status": "failed", "blazar_code": code, "error": message})

    async def task() -> None:
        with scope:
            async with send_ch:
                try:
                    await work(send)
                except PeerRefused as exc:
                    await failed(_code(exc), exc.message)
                except (BlazarError, BlazarRuntimeError, RegistryError) as exc:
                    await failed(exc.code, exc.message)  # a registry error: a missing blob here
                except (httpx.HTTPError, OSError) as exc:
                    await failed("PEER_UNAVAILABLE", f"{type(exc).__name__}: {exc}")
                except Exception as exc:  # a bug: named in the stream and logged, never lost
                    log.exception("replicating with peer '%s' failed", peer)
                    await failed(getattr(exc, "code", "INTERNAL"), str(exc))  # the catalog's code for a bug

    app: QuartTrio = current_app  # type: ignore[assignment]
    app.nursery.start_soon(task)  # not in the response's generator: it must not hold a nursery

    async def lines() -> AsyncIterator[bytes]:
        try:
            async with recv_ch:
                async for line in recv_ch:
                    yield line
        finally:
            scope.cancel()

    return lines()


async def replicate(peer: str) -> Response:
    runtime = app_runtime()
    body = decode_json(await read_body(), _ReplicateBody)
    actor = runtime.peers.require(peer)
    await trio.to_thread.run_sync(runtime.store.get, body.model)  # not here: a 404 before any line

    def work(send: Progress) -> Awaitable[object]:
        return actor.replicate(runtime.store, body.model, from_here=body.from_here, on_progress=send)

    return stream_response(_lines_of(work, peer), content_type=NDJSON)


# -- the receiving side ------------------------------------------------------------------------


async def replica(name: str) -> Response:
    store = app_runtime().store
    record = await trio.to_thread.run_sync(store.get, name)
    return json_response(await trio.to_thread.run_sync(replica_of, store, record))


async def install_route() -> Response:
    runtime = app_runtime()
    body = decode_json(await read_body(), Replica)
    record = await trio.to_thread.run_sync(install, runtime.store, body)
    await runtime.forget(record.name)
    return json_response({"name": record.name, "digest": record.digest, "size": record.size}, 201)


def register(app: QuartTrio) -> None:
    app.post("/admin/peers/<peer>/warm")(warm)
    app.post("/admin/peers/<peer>/replicate")(replicate)
    app.get("/admin/models/<path:name>/replica")(replica)
    app.post("/admin/models/install")(install_route)
