"""Peers: one actor per ``[[remotes]]`` peer, which polls what the peer publishes.

    peers (supervisor, ``actors/peers.py``)
    ├ peer[name]        → GET /api/capacity (a Blazar daemon) or GET /v1/models (pass-through)
    └ dns[name]         → resolves a ``dns`` remote again and again, adding and removing peers

A peer actor wakes every ``poll_s`` (its deadline hook), reads the peer's capacity on its own
task, and takes the answer back through its mailbox: a good answer marks the peer up and
keeps it as the last snapshot (with its time); a failure marks it down and polls again after
a backoff that doubles up to ``poll_max_s``. A peer that has no ``/api/capacity`` but answers
``/v1/models`` is a pass-through peer: any OpenAI-compatible server, routed to by model name.

Requests do not go through the actor's loop: a relay takes the peer's pooled HTTP client
(``PeerActor.relay_pool`` for a plain-HTTP peer, else ``PeerActor.client``) and reports a
failure with ``failed_nowait``, which marks the peer down at once so the next decision skips
it. Nothing here runs when no remote is configured. The set of peer actors, with the ``dns``
remotes' resolution, is ``actors/peers.py``.

The operator's verbs on a peer run on the caller's task too, with this daemon's key there
(which needs the ``admin`` scope on the peer):

- ``PeerActor.warm(model)`` loads a model on the peer now, with Ollama's load request (a
  generate with no prompt), so the peer loads it as for any request and answers once it is
  ready; the peer is polled at once, so its snapshot shows the model warm.
- ``PeerActor.start_part(part)``, ``part(id)`` and ``stop_part(id)`` run one node's part of a
  multi-node vLLM or SGLang engine on the peer (``actors/node_parts.py`` there; the head's side
  is ``actors/multinode_head.py``).
- ``PeerActor.replicate(store, model)`` puts a model of ``store`` on the peer. First the peer
  is asked to pull it from its own sources (its ``/api/pull``, by the model's name); when that
  fails (no network there, a model only this machine has), or with ``from_here``, the model's
  blobs stream from ``store`` to the peer's ``POST /api/blobs/DIGEST`` (the peer hashes the
  bytes as they arrive and refuses a blob whose bytes are not its digest), then its manifest in
  portable form (``registry.replica.Replica``) to the peer's ``POST /admin/models/install``,
  which installs it only once every blob is there. A pull that brings a different file than
  this machine's (another digest) is replaced the same way. Each step is told to
  ``on_progress`` as a dict (``status`` and, while sending, ``digest``, ``total``,
  ``completed``).

Both raise ``PeerUnavailable`` for a peer that cannot be reached and ``PeerRefused`` (with the
peer's own ``blazar_code``) for one that answers with an error.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.config import Remote
from actors.engines.multinode import NodePart, PartView
from actors.errors import PeerRefused, PeerUnavailable
from actors.federation import (
    Snapshot,
    SnapshotError,
    parse_capacity,
    parse_models,
    parse_workers,
    pool_snapshot,
)
from actors.mailbox import Envelope
from actors.upstream import UpstreamPool, pool_for_url
from registry.replica import Replica, replica_of
from registry.store import Store

if TYPE_CHECKING:
    import httpx

__all__ = [
    "PeerActor",
    "PeerStatistics",
    "PeerView",
    "PollNow",
    "Progress",
    "Replicated",
    "Warmed",
]

log = logging.getLogger("blazar.peers")

PeerState = Literal["unknown", "up", "down", "self"]
"""``self``: the peer is this daemon (its own address in a ``dns`` remote's answer, as a
Kubernetes headless service gives every pod): never routed to."""

RELAYED_HEADER = "x-blazar-relayed-by"
"""Set on every request a daemon relays: the peer serves it itself, never relays it on."""


class PollNow(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Poll the peer now; the reply is its ``PeerView`` once the poll is over."""


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A relayed request could not reach the peer: mark it down until a poll finds it up."""

    reason: str


class _Polled(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    snapshot: Snapshot | None
    error: str | None = None


PeerMessage = PollNow | Failed | _Polled


class PeerView(msgspec.Struct, frozen=True, kw_only=True):
    """One peer as ``blazar peers`` and the decision see it."""

    name: str
    remote: str
    """The ``[[remotes]]`` entry it comes from: its own name, or a ``dns`` remote's."""
    url: str
    state: PeerState
    pool: str | None
    """The router of a pool entry (``smg``); None for any other peer."""
    kind: Literal["blazar", "openai"] | None
    snapshot_age_s: float | None
    """Seconds since the last good snapshot; None: never had one."""
    last_error: str | None
    failures: int
    """Failed polls in a row."""
    snapshot: Snapshot | None


class Warmed(msgspec.Struct, frozen=True, kw_only=True):
    """A model loaded on a peer by ``PeerActor.warm``."""

    peer: str
    model: str
    load_s: float
    answer: Any
    """The peer's own answer to the load request (Ollama's generate, with ``done_reason``)."""
    state: str | None
    """The model's state in the peer's snapshot once polled (``ready``); None: not listed."""


class Replicated(msgspec.Struct, frozen=True, kw_only=True):
    """A model put on a peer by ``PeerActor.replicate``."""

    peer: str
    model: str
    digest: str
    via: Literal["already there", "pull", "stream"]
    """How: the peer had the same files, pulled them from its own sources, or was sent them."""


Progress = Callable[[dict[str, Any]], Awaitable[None]]
"""Where ``replicate`` tells each step, as a dict (``status`` and the step's fields)."""

_CHUNK = 1 << 20
_EVERY_S = 0.5
"""Least time between two progress reports of one blob."""


class PeerStatistics(ActorStatistics, frozen=True, kw_only=True):
    peer: str
    state: str
    polls: int
    failures: int


def _client(remote: Remote, url: str) -> httpx.AsyncClient:
    import httpx

    headers = {"Authorization": f"Bearer {remote.key}"} if remote.key else {}
    timeout = httpx.Timeout(
        connect=remote.timeout_s, read=None, write=remote.timeout_s, pool=remote.timeout_s
    )
    return httpx.AsyncClient(
        base_url=url, headers=headers, verify=remote.verify(), timeout=timeout, trust_env=False
    )


def _relay_pool(remote: Remote, url: str) -> tuple[UpstreamPool, str] | None:
    """The relayed requests' own pool, for a plain-HTTP peer: a stream's chunks cost a
    fraction of httpx's there. Over TLS they go through ``client``."""
    headers = {"Authorization": f"Bearer {remote.key}"} if remote.key else {}
    return pool_for_url(
        url, headers=headers, max_idle=64, idle_expiry_s=4.0, connect_timeout_s=remote.timeout_s
    )


class PeerActor(Actor[PeerMessage]):
    def __init__(self, name: str, url: str, remote: Remote, *, instance: str | None = None) -> None:
        super().__init__(f"peer[{name}]")
        self.peer = name
        self.instance = instance
        """This daemon's id for this boot: a peer that publishes the same one is this daemon."""
        self.url = url.rstrip("/")
        self.remote = remote
        self.client = _client(remote, self.url)
        """The pooled client for this peer, with this daemon's key for it."""
        self.relay_pool = _relay_pool(remote, self.url)
        """For the requests relayed to a plain-HTTP peer: the pool and the URL's path prefix."""
        self.control: dict[str, str] = {}
        """Headers of a pool router's worker API (the control key of a router started here)."""
        self.state: PeerState = "unknown"
        self.snapshot: Snapshot | None = None
        self.snapshot_at: float | None = None
        """``time.time()`` of the last good snapshot."""
        self.last_error: str | None = None
        self.failures = 0
        self._polls = 0
        self._polling = False
        self._next_poll = -math.inf
        self._waiting: list[Envelope[PeerMessage]] = []

    def __repr__(self) -> str:
        return f"<PeerActor {self.peer} {self.state} failures={self.failures}>"

    async def on_start(self) -> None:
        if self.client.is_closed:  # restarted by its supervisor: the last run closed it
            self.client = _client(self.remote, self.url)
            self.relay_pool = _relay_pool(self.remote, self.url)

    async def on_stop(self) -> None:
        self.cancel_tasks()  # a poll in flight must not send on the client closed here
        if self.relay_pool is not None:
            await self.relay_pool[0].aclose()
        with trio.move_on_after(1):
            await self.client.aclose()

    def failed_nowait(self, reason: str) -> None:
        try:
            self.tell_nowait(Failed(reason=reason))
        except Exception:  # stopped, or a full mailbox: the next poll says the same
            pass

    def dispatch(self, env: Envelope[PeerMessage]) -> None:
        message = env.message
        match message:
            case PollNow():
                self._waiting.append(env)
                self._next_poll = -math.inf
            case Failed(reason=reason):
                self._down(reason)
                env.answer(None)
            case _Polled(snapshot=snapshot, error=error):
                self._polling = False
                if snapshot is not None and self.instance is not None and snapshot.instance == self.instance:
                    if self.state != "self":
                        log.info("peer '%s' is this daemon itself: not routed to", self.peer)
                    self.state, self.snapshot, self.snapshot_at = "self", None, None
                    self.failures, self.last_error = 0, None
                    self._next_poll = trio.current_time() + self.remote.poll_max_s
                elif snapshot is not None:
                    if self.state != "up":
                        log.info("peer '%s' is up (%s)", self.peer, snapshot.kind)
                    self.state, self.snapshot, self.snapshot_at = "up", snapshot, time.time()
                    self.failures, self.last_error = 0, None
                    self._next_poll = trio.current_time() + self.remote.poll_s
                else:
                    self._down(error or "no answer")
                waiting, self._waiting = self._waiting, []
                for w in waiting:
                    w.answer(self.view())
                env.answer(None)
            case _:
                assert_never(message)

    def _down(self, reason: str) -> None:
        if self.state != "down":
            log.warning("peer '%s' is down: %s", self.peer, reason)
        self.state, self.last_error = "down", reason
        self.failures += 1
        backoff = min(self.remote.poll_max_s, self.remote.poll_s * 2 ** min(self.failures - 1, 16))
        self._next_poll = trio.current_time() + backoff

    def next_deadline(self) -> float:
        return math.inf if self._polling else self._next_poll

    def on_deadline(self) -> None:
        self._start_poll()

    def settle(self) -> None:
        if self._waiting and not self._polling:
            self._start_poll()

    def _start_poll(self) -> None:
        if self._polling:
            return
        self._polling = True
        self._polls += 1
        self.start_soon(self._poll)

    async def _poll(self) -> None:
        import httpx

        snapshot: Snapshot | None = None
        error: str | None = None
        try:
            with trio.fail_after(self.remote.timeout_s * 2):
                snapshot = await self._read()
        except trio.TooSlowError:
            error = f"no answer within {self.remote.timeout_s * 2:g} s"
        except (httpx.HTTPError, OSError, SnapshotError) as exc:
            error = _describe(exc)
        except RuntimeError:
            if not self.client.is_closed:
                raise
            return  # stopping: ``on_stop`` closed the client between two requests of the poll
        await self.tell(_Polled(snapshot=snapshot, error=error))

    async def _read(self) -> Snapshot:
        t = self.remote.timeout_s
        if self.remote.pool is not None:
            return await self._read_pool()
        resp = await self.client.get("/api/capacity", timeout=t)
        if resp.status_code == 200:
            try:
                return parse_capacity(resp.content)
            except SnapshotError:
                pass  # some other server's /api/capacity: read it as a pass-through peer
        elif resp.status_code in (401, 403):
            raise SnapshotError(f"the peer refused this daemon's key ({resp.status_code}): check key")
        models = await self.client.get("/v1/models", timeout=t)
        if models.status_code != 200:
            raise SnapshotError(f"GET /v1/models answered {models.status_code}")
        return parse_models(models.content)

    async def _read_pool(self) -> Snapshot:
        """A pool router: its workers (``GET /workers``) give its models and their health; a
        router without that list is read as any pass-through peer (``GET /v1/models``)."""
        t = self.remote.timeout_s
        resp = await self.client.get("/workers", timeout=t, headers=self.control)
        if resp.status_code == 200:
            return pool_snapshot(parse_workers(resp.content))
        models = await self.client.get("/v1/models", timeout=t)
        if models.status_code != 200:
            raise SnapshotError(
                f"GET /workers answered {resp.status_code}, GET /v1/models {models.status_code}"
            )
        return parse_models(models.content)

    def view(self) -> PeerView:
        age = time.time() - self.snapshot_at if self.snapshot_at is not None else None
        return PeerView(
            name=self.peer,
            remote=self.remote.name,
            url=self.url,
            pool=self.remote.pool,
            state=self.state,
            kind=self.snapshot.kind if self.snapshot is not None else None,
            snapshot_age_s=round(age, 3) if age is not None else None,
            last_error=self.last_error,
            failures=self.failures,
            snapshot=self.snapshot,
        )

    # -- the operator's verbs (on the caller's task) ----------------------------------

    async def warm(self, model: str, *, keep_alive: str | float | None = None) -> Warmed:
        """Load ``model`` on the peer now (``keep_alive`` as Ollama takes it); returns once the
        peer has it ready, and this actor has polled the peer again."""
        import httpx

        load: dict[str, Any] = {"model": model}
        if keep_alive is not None:
            load["keep_alive"] = keep_alive
        started = time.monotonic()
        try:
            resp = await self.client.post("/api/generate", json=load, headers=_own(), timeout=None)
        except httpx.HTTPError as exc:
            self.failed_nowait(str(exc) or type(exc).__name__)
            raise PeerUnavailable(
                f"peer '{self.peer}' cannot be reached ({type(exc).__name__}: {exc}) — see `blazar peers`"
            ) from exc
        if resp.status_code >= 400:
            code, message, fallback = _said(resp)
            hint = f" — copy it there first: `blazar replicate {model} --to {self.peer}`"
            raise PeerRefused(
                code,
                f"peer '{self.peer}' did not load '{model}': {message}"
                + (hint if code == "MODEL_NOT_FOUND" else ""),
                fallback=fallback,
            )
        view = await self.ask(PollNow())
        loaded = view.snapshot.loaded_model(model) if view.snapshot is not None else None
        return Warmed(
            peer=self.peer,
            model=model,
            load_s=round(time.monotonic() - started, 3),
            answer=msgspec.json.decode(resp.content),
            state=loaded.state if loaded is not None else None,
        )

    async def replicate(
        self, store: Store, model: str, *, from_here: bool = False, on_progress: Progress | None = None
    ) -> Replicated:
        """Put ``store``'s ``model`` on the peer (the module doc says how); each step goes to
        ``on_progress``, the last with the status ``success``. Raises ``ModelNotFound`` for a
        model ``store`` lacks, before anything is sent."""
        import httpx

        send = on_progress or _ignore
        record = await trio.to_thread.run_sync(store.get, model)
        replica = await trio.to_thread.run_sync(replica_of, store, record)
        try:
            via = await self._replicate(store, replica, from_here, send)
        except httpx.HTTPError as exc:
            raise PeerUnavailable(f"{type(exc).__name__}: {exc}") from exc
        await send({"status": "success", "via": via, "digest": replica.digest})
        return Replicated(peer=self.peer, model=record.name, digest=replica.digest, via=via)

    async def _replicate(
        self, store: Store, replica: Replica, from_here: bool, send: Progress
    ) -> Literal["already there", "pull", "stream"]:
        if _same(await self._their_replica(replica.name), replica):
            # Nothing to do; a pull there would replace the files with themselves, and unload them.
            return "already there"
        if not from_here:
            await send({"status": "asking the peer to pull it from its own sources"})
            why = await self._pull_there(replica.name, send)
            if why is None:
                theirs = await self._their_replica(replica.name)
                if _same(theirs, replica):
                    await self.ask(PollNow())  # its snapshot lists the model now
                    return "pull"
                got = theirs.digest if theirs is not None else "nothing"
                why = f"it pulled {got}, not this machine's {replica.digest}"
            await send({"status": f"the peer's pull failed ({why}); streaming the model from here"})
        await self._stream_there(store, replica, send)
        await self.ask(PollNow())  # its snapshot lists the model now
        return "stream"

    async def _their_replica(self, name: str) -> Replica | None:
        resp = await self.client.get(f"/admin/models/{name}/replica", headers=_own(), timeout=30)
        if resp.status_code != 200:
            return None
        return msgspec.json.decode(resp.content, type=Replica)

    async def _pull_there(self, name: str, send: Progress) -> str | None:
        """Ask the peer to pull ``name`` from its own sources; None once it has, else why not."""
        import httpx

        request = {"model": name, "stream": True}
        try:
            async with self.client.stream("POST", "/api/pull", json=request, headers=_own()) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    code, message, fallback = _said(resp)
                    return f"{code or fallback}: {message}"
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
                if last == "success":
                    return None
                return f"the pull ended without success ({last or 'no answer'})"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"

    async def _stream_there(self, store: Store, replica: Replica, send: Progress) -> None:
        for digest in replica.digests():
            head = await self.client.head(f"/api/blobs/{digest}", headers=_own(), timeout=30)
            if head.status_code == 200:
                await send({"status": "already there", "digest": digest})
                continue
            if head.status_code != 404:
                code, message, fallback = _said(head)
                hint = (
                    " — the key this daemon presents there needs the admin scope (on that peer: "
                    "`blazar keys add NAME --scope chat,admin`)"
                    if head.status_code in (401, 403)
                    else ""
                )
                raise PeerRefused(
                    code, f"peer '{self.peer}' refused to receive blobs ({message}){hint}", fallback=fallback
                )
            await self._send_blob(store.blob_path(digest), digest, send)
        resp = await self.client.post(
            "/admin/models/install", content=msgspec.json.encode(replica), headers=_own(), timeout=120
        )
        if resp.status_code >= 300:
            code, message, fallback = _said(resp)
            raise PeerRefused(
                code, f"peer '{self.peer}' did not install '{replica.name}': {message}", fallback=fallback
            )

    async def _send_blob(self, path: Path, digest: str, send: Progress) -> None:
        """Stream one blob to the peer's ``POST /api/blobs/DIGEST``, reporting now and then."""
        import httpx

        total = (await trio.Path(path).stat()).st_size
        sent = [0]
        await send({"status": "sending", "digest": digest, "total": total, "completed": 0})
        failed: list[str] = []

        async def upload() -> None:
            try:
                resp = await self.client.post(
                    f"/api/blobs/{digest}", content=_file_chunks(path, sent), headers=_own(), timeout=None
                )
            except httpx.HTTPError as exc:
                failed.append(f"the upload broke off ({type(exc).__name__}: {exc})")
            else:
                if resp.status_code >= 300:
                    code, message, fallback = _said(resp)
                    failed.append(f"{code or fallback}: {message}")
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(upload)
            while True:
                await trio.sleep(_EVERY_S)
                await send({"status": "sending", "digest": digest, "total": total, "completed": sent[0]})
        if failed:
            raise PeerRefused(
                None, f"peer '{self.peer}' refused blob {digest[:19]}: {failed[0]}", fallback="BAD_GATEWAY"
            )
        await send({"status": "sent", "digest": digest, "total": total, "completed": total})

    async def start_part(self, part: NodePart) -> PartView:
        """Have the peer's daemon start its part of a multi-node engine (``actors/node_parts.py``);
        its view once the process runs there."""
        body = msgspec.json.encode(part)
        resp = await self._parts_call("POST", "/admin/multinode/parts", content=body)
        if resp.status_code >= 300:
            code, message, fallback = _said(resp)
            raise PeerRefused(
                code, f"peer '{self.peer}' did not start rank {part.rank} of '{part.model}': {message}",
                fallback=fallback,
            )  # fmt: skip
        return msgspec.json.decode(resp.content, type=PartView)

    async def part(self, part_id: str) -> PartView | None:
        """The part as the peer reports it now (asking renews its lease there); None: the peer no
        longer has it."""
        resp = await self._parts_call("GET", f"/admin/multinode/parts/{part_id}")
        if resp.status_code == 404:
            return None
        if resp.status_code >= 300:
            code, message, fallback = _said(resp)
            raise PeerRefused(code, f"peer '{self.peer}': {message}", fallback=fallback)
        return msgspec.json.decode(resp.content, type=PartView)

    async def stop_part(self, part_id: str) -> None:
        """Stop the part there (one the peer no longer has is stopped already)."""
        resp = await self._parts_call("DELETE", f"/admin/multinode/parts/{part_id}")
        if resp.status_code >= 300 and resp.status_code != 404:
            code, message, fallback = _said(resp)
            raise PeerRefused(
                code, f"peer '{self.peer}' did not stop part {part_id}: {message}", fallback=fallback
            )

    async def _parts_call(self, method: str, path: str, content: bytes | None = None) -> httpx.Response:
        import httpx

        closed = self.client.is_closed  # the peers stop before the engines: a head's shutdown
        client = _client(self.remote, self.url) if closed else self.client
        try:
            return await client.request(
                method, path, content=content, headers=_own(), timeout=self.remote.timeout_s * 6
            )
        except httpx.HTTPError as exc:
            self.failed_nowait(_describe(exc))
            raise PeerUnavailable(
                f"peer '{self.peer}' cannot be reached ({_describe(exc)}) — is its daemon running? "
                "see `blazar peers`"
            ) from exc
        finally:
            if closed:
                await client.aclose()

    def statistics(self) -> PeerStatistics:
        return PeerStatistics(
            **self.actor_fields(), peer=self.peer, state=self.state, polls=self._polls, failures=self.failures
        )


def _own() -> dict[str, str]:
    # The peer serves what this daemon asks itself: it never relays it on.
    return {RELAYED_HEADER: uuid.uuid4().hex}


def _said(resp: httpx.Response) -> tuple[str | None, str, str]:
    """The peer's error answer, whichever dialect it answered in: (its ``blazar_code`` or None,
    its message, the code to answer where it gave none)."""
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
    fallback = "KEY_SCOPE_FORBIDDEN" if resp.status_code in (401, 403) else "BAD_GATEWAY"
    return (
        code if isinstance(code, str) and code else None,
        message if isinstance(message, str) else f"answered {resp.status_code}",
        fallback,
    )


def _same(theirs: Replica | None, ours: Replica) -> bool:
    return (
        theirs is not None and theirs.digest == ours.digest and set(theirs.digests()) == set(ours.digests())
    )


async def _file_chunks(path: Path, sent: list[int]) -> AsyncIterator[bytes]:
    async with await trio.open_file(path, "rb") as f:
        while chunk := await f.read(_CHUNK):
            sent[0] += len(chunk)
            yield chunk


async def _ignore(_fields: dict[str, Any]) -> None:
    pass


def _describe(exc: BaseException) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}" if str(exc) else "cannot connect"
    return str(exc) or type(exc).__name__
