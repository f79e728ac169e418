"""The operator verbs on a peer: warm a model there, copy a model there.

``POST /admin/peers/PEER/warm`` loads a model on the peer now: Ollama's load request (a
generate with no prompt) sent with this daemon's key for the peer, so the peer loads it as
for any request and the answer says when it is ready; the peer is polled at once, so its
snapshot shows the model warm.

``POST /admin/peers/PEER/replicate`` puts one of this machine's models on the peer. First the
peer is asked to pull it from its own sources (its ``/api/pull``, by the model's name); when
that fails (no network there, a model only this machine has) or ``from_here`` is set, this
daemon streams the model's blobs from its store to the peer's ``POST /api/blobs/DIGEST`` (the
peer hashes the bytes as they arrive and refuses a blob whose bytes are not its digest), then
sends the manifest in its portable form (``registry.replica.Replica``) to the peer's
``POST /admin/models/install``, which installs it only once every blob is there. A pull that
brings a different file than this machine's (another digest) is replaced the same way.
The answer is NDJSON: one line per step, the last ``success`` or ``failed`` (with the peer's
``blazar_code``). Both need a key on the peer with the ``admin`` scope.

The receiving side: ``GET /admin/models/NAME/replica`` (a model's portable manifest, by which
the sender compares digests) and ``POST /admin/models/install``.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio
from quart import Response, current_app
from quart_trio import QuartTrio

from actors.peer import RELAYED_HEADER, PeerActor, PollNow
from actors.runtime import Runtime
from blazar.dialects._wire import decode_json
from blazar.errors import CATALOG, BlazarError
from blazar.web.common import NDJSON, app_runtime, json_response, read_body, stream_response
from registry.replica import Replica, install, replica_of

__all__ = ["register"]

_CHUNK = 1 << 20
_EVERY_S = 0.5
"""Least time between two progress lines of one blob."""


class _WarmBody(msgspec.Struct, kw_only=True):
    model: str
    keep_alive: str | int | float | None = None


class _ReplicateBody(msgspec.Struct, kw_only=True):
    model: str
    from_here: bool = False


def _peer(runtime: Runtime, name: str) -> PeerActor:
    actor = runtime.peers.get(name) if runtime.peers else None
    if actor is None:
        known = ", ".join(runtime.peers.actors) if runtime.peers else ""
        raise BlazarError(
            "PEER_NOT_FOUND",
            f"no peer named '{name}' (peers: {known or 'none is configured'}) — add a [[remotes]] entry "
            "to config.toml or see `blazar peers`",
        )
    return actor


def _headers() -> dict[str, str]:
    # The peer serves what this daemon asks itself: it never relays it on.
    return {RELAYED_HEADER: uuid.uuid4().hex}


def _said(resp: httpx.Response) -> tuple[str, str]:
    """The peer's error answer as (blazar_code, message), whichever dialect it answered in."""
    try:
        doc = msgspec.json.decode(resp.content)
    except msgspec.DecodeError:
        doc = None
    code, message = None, None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            code, message = err.get("blazar_code"), err.get("message")
        else:
            code, message = doc.get("blazar_code"), err
    if not isinstance(code, str) or code not in CATALOG:
        code = "KEY_SCOPE_FORBIDDEN" if resp.status_code in (401, 403) else "BAD_GATEWAY"
    return (
        code,
        message if isinstance(message, str) else f"answered {resp.status_code}",
    )


def _unreachable(peer: str, exc: httpx.HTTPError) -> BlazarError:
    return BlazarError(
        "PEER_UNAVAILABLE",
        f"peer '{peer}' cannot be reached ({type(exc).__name__}: {exc}) — see `blazar peers`",
    )


# -- warm ---------------------------------------------------------------------------------


async def warm(peer: str) -> Response:
    runtime = app_runtime()
    body = decode_json(await read_body(), _WarmBody)
    actor = _peer(runtime, peer)
    load: dict[str, Any] = {"model": body.model}
    if body.keep_alive is not None:
        load["keep_alive"] = body.keep_alive
    started = time.monotonic()
    try:
        resp = await actor.client.post("/api/generate", json=load, headers=_headers(), timeout=None)
    except httpx.HTTPError as exc:
        actor.failed_nowait(str(exc) or type(exc).__name__)
        raise _unreachable(peer, exc) from exc
    if resp.status_code >= 400:
        code, message = _said(resp)
        hint = f" — copy it there first: `blazar replicate {body.model} --to {peer}`"
        raise BlazarError(
            code,
            f"peer '{peer}' did not load '{body.model}': {message}"
            + (hint if code == "MODEL_NOT_FOUND" else ""),
        )
    view = await actor.ask(PollNow())
    loaded = view.snapshot.loaded_model(body.model) if view.snapshot is not None else None
    return json_response(
        {
            "peer": peer,
            "model": body.model,
            "load_s": round(time.monotonic() - started, 3),
            "answer": msgspec.json.decode(resp.content),
            "state": loaded.state if loaded is not None else None,
        }
    )


# -- replicate ------------------------------------------------------------------------------


Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _their_replica(actor: PeerActor, name: str) -> Replica | None:
    resp = await actor.client.get(f"/admin/models/{name}/replica", headers=_headers(), timeout=30)
    if resp.status_code != 200:
        return None
    return msgspec.json.decode(resp.content, type=Replica)


def _same(theirs: Replica | None, ours: Replica) -> bool:
    return (
        theirs is not None and theirs.digest == ours.digest and set(theirs.digests()) == set(ours.digests())
    )


async def _pull_there(actor: PeerActor, name: str, send: Send) -> str | None:
    """Ask the peer to pull ``name`` from its own sources; None once it has, else why not."""
    request = {"model": name, "stream": True}
    try:
        async with actor.client.stream("POST", "/api/pull", json=request, headers=_headers()) as resp:
            if resp.status_code != 200:
                await resp.aread()
                code, message = _said(resp)
                return f"{code}: {message}"
            last = ""
            async for raw in resp.aiter_lines():
                if not raw.strip():
                    continue
                doc = msgspec.json.decode(raw)
                if "error" in doc:
                    return str(doc["error"])
                status = str(doc.get("status", ""))
                if status != last:
                    last = status
                    await send({"status": "peer pulling", "message": status})
            return None if last == "success" else f"the pull ended without success ({last or 'no answer'})"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"


async def _file_chunks(path: Path, sent: list[int]) -> AsyncIterator[bytes]:
    async with await trio.open_file(path, "rb") as f:
        while chunk := await f.read(_CHUNK):
            sent[0] += len(chunk)
            yield chunk


async def _send_blob(actor: PeerActor, store_path: Path, digest: str, send: Send) -> None:
    """Stream one blob to the peer's ``POST /api/blobs/DIGEST``, with a progress line now and then."""
    total = (await trio.Path(store_path).stat()).st_size
    sent = [0]
    await send({"status": "sending", "digest": digest, "total": total, "completed": 0})
    failed: list[str] = []

    async def upload() -> None:
        try:
            resp = await actor.client.post(
                f"/api/blobs/{digest}",
                content=_file_chunks(store_path, sent),
                headers=_headers(),
                timeout=None,
            )
        except httpx.HTTPError as exc:
            failed.append(f"the upload broke off ({type(exc).__name__}: {exc})")
        else:
            if resp.status_code >= 300:
                code, message = _said(resp)
                failed.append(f"{code}: {message}")
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(upload)
        while True:
            await trio.sleep(_EVERY_S)
            await send({"status": "sending", "digest": digest, "total": total, "completed": sent[0]})
    if failed:
        raise BlazarError("BAD_GATEWAY", f"peer '{actor.peer}' refused blob {digest[:19]}: {failed[0]}")
    await send({"status": "sent", "digest": digest, "total": total, "completed": total})


async def _stream_there(runtime: Runtime, actor: PeerActor, replica: Replica, send: Send) -> None:
    store = runtime.store
    for digest in replica.digests():
        head = await actor.client.head(f"/api/blobs/{digest}", headers=_headers(), timeout=30)
        if head.status_code == 200:
            await send({"status": "already there", "digest": digest})
            continue
        if head.status_code != 404:
            code, message = _said(head)
            hint = (
                " — the key this daemon presents there needs the admin scope (on that peer: "
                "`blazar keys add NAME --scope chat,admin`)"
                if head.status_code in (401, 403)
                else ""
            )
            raise BlazarError(code, f"peer '{actor.peer}' refused to receive blobs ({message}){hint}")
        await _send_blob(actor, store.blob_path(digest), digest, send)
    resp = await actor.client.post(
        "/admin/models/install", content=msgspec.json.encode(replica), headers=_headers(), timeout=120
    )
    if resp.status_code >= 300:
        code, message = _said(resp)
        raise BlazarError(code, f"peer '{actor.peer}' did not install '{replica.name}': {message}")


async def _replicate(runtime: Runtime, actor: PeerActor, body: _ReplicateBody, send: Send) -> None:
    record = await trio.to_thread.run_sync(runtime.store.get, body.model)
    replica = await trio.to_thread.run_sync(replica_of, runtime.store, record)
    if _same(await _their_replica(actor, record.name), replica):
        # Nothing to do; a pull there would replace the files with themselves, and unload them.
        await send({"status": "success", "via": "already there", "digest": replica.digest})
        return
    if not body.from_here:
        await send({"status": "asking the peer to pull it from its own sources"})
        why = await _pull_there(actor, record.name, send)
        if why is None:
            theirs = await _their_replica(actor, record.name)
            if _same(theirs, replica):
                await actor.ask(PollNow())  # its snapshot lists the model now
                await send({"status": "success", "via": "pull", "digest": replica.digest})
                return
            got = theirs.digest if theirs is not None else "nothing"
            why = f"it pulled {got}, not this machine's {replica.digest}"
        await send({"status": f"the peer's pull failed ({why}); streaming the model from here"})
    await _stream_there(runtime, actor, replica, send)
    await actor.ask(PollNow())  # its snapshot lists the model now
    await send({"status": "success", "via": "stream", "digest": replica.digest})


def _lines_of(work: Callable[[Send], Awaitable[None]], peer: str) -> AsyncIterator[bytes]:
    """Run ``work`` on the app's nursery, its lines as the response's body; a client that
    goes away cancels it. An error becomes the last line (``failed``, with its code)."""
    send_ch, recv_ch = trio.open_memory_channel[bytes](64)
    scope = trio.CancelScope()

    async def send(fields: dict[str, Any]) -> None:
        await send_ch.send(msgspec.json.encode({"peer": peer, **fields}) + b"\n")

    async def task() -> None:
        with scope:
            async with send_ch:
                try:
                    await work(send)
                except (BlazarError, httpx.HTTPError, OSError) as exc:
                    code = exc.code if isinstance(exc, BlazarError) else "PEER_UNAVAILABLE"
                    message = exc.message if isinstance(exc, BlazarError) else f"{type(exc).__name__}: {exc}"
                    await send({"status": "failed", "blazar_code": code, "error": message})
                except Exception as exc:  # a registry error (a missing blob here): named, never lost
                    code = getattr(exc, "code", "INTERNAL")  # the catalog's code for a bug of ours
                    await send({"status": "failed", "blazar_code": code, "error": str(exc)})

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
    actor = _peer(runtime, peer)
    await trio.to_thread.run_sync(runtime.store.get, body.model)  # not here: a 404 before any line
    work = functools.partial(_replicate, runtime, actor, body)
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
