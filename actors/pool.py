"""Pools: replicas of a model behind a router built for them (SMG), and the workers this daemon
gives it.

    pools
    ├ router[name]   → ``smg launch`` on loopback under our watchdog (``start = true``); restarted
    │                  after a crash with a backoff, and never outliving the daemon
    └ workers[name]  → registers each worker with the router (``POST /workers``) and takes it
                       out (``DELETE /workers/{id}``) when it goes away

A pool entry is a ``[[remotes]]`` peer like any other (actors/peer.py): its peer actor polls the
router (its ``GET /workers`` gives the pool's models and each worker's health) and the gateway
relays requests to it; ``Pools.serving(model)`` says which pool a request for a model goes to
first. What this module adds is the router's process and the registration of the workers.

A worker is a URL (an OpenAI-compatible engine elsewhere), registered as long as the daemon
runs, or an installed model's name: its engine here, loaded when the pool starts and held
loaded (the requests the router sends it bypass this daemon's keep-alive), registered with its
port and key once ready, removed as soon as it is not (a crash, a stop), loaded again after a
backoff and registered anew. A router started here keeps its workers in memory only: after its
restart every worker is registered again.

A router started here has a control key of its own (``--control-plane-api-keys``), so that only
this daemon can add or remove its workers; its inference routes need none (it listens on
loopback, as the engines do).
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio

from actors.config import Remote
from actors.engine import EngineState
from actors.federation import SnapshotError, parse_workers
from actors.process import ChildProcess

if TYPE_CHECKING:
    import httpx

    from actors.runtime import Runtime

__all__ = ["NOT_FOUND", "PoolView", "Pools", "Registration", "RouterView", "find_smg", "router_argv"]

log = logging.getLogger("blazar.pools")

NOT_FOUND = (
    "no smg program found (looked for the pool's program, then smg beside this daemon's Python, "
    "then on PATH) — install the router with `pip install 'blazar[pool]'` (or `pip install smg`), "
    "or set program in the [[remotes]] entry"
)

_TICK_S = 0.5
"""How often the workers' engines are looked at, and the router while it starts."""
_READY_TIMEOUT_S = 60.0
_BACKOFF_S = (1.0, 30.0)
_MAX_CRASHES = 5
_CRASH_WINDOW_S = 60.0
_IN_PROGRESS = re.compile(r"with ID (\S+?)\.")


def find_smg(configured: str | None) -> str | None:
    """The ``smg`` program: ``configured``, else the one the ``pool`` extra put beside this
    Python, else ``smg`` on PATH; None when there is none."""
    if configured is not None:
        return configured if shutil.which(configured) else None
    beside = Path(sys.executable).parent / "smg"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("smg")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def router_argv(remote: Remote, program: str, *, port: int, metrics_port: int, control_key: str) -> list[str]:
    """``smg launch`` on loopback with no worker (they are registered through its API), under
    our watchdog so that it dies with the daemon."""
    flags = [
        "launch",
        *("--host", "127.0.0.1", "--port", str(port)),
        # its Prometheus listener defaults to 0.0.0.0:29000: one per router, on loopback
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)),
        *("--health-check-interval-secs", str(remote.health_check_s)),
        *("--control-plane-api-keys", f"blazar:blazar:admin:{control_key}"),
        *("--log-level", "warn"),
    ]
    if remote.policy is not None:
        flags += ["--policy", remote.policy]
    return [sys.executable, "-m", "actors.engines.watchdog", program, *flags, *remote.router_args]


class RouterView(msgspec.Struct, frozen=True, kw_only=True):
    """A router started here (``start = true``)."""

    state: Literal["stopped", "starting", "ready", "failed"]
    url: str
    pid: int | None
    restarts: int
    last_error: str | None


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    """A worker this daemon gives the router."""

    worker: str
    """As the entry names it: a URL or an installed model."""
    url: str | None
    """Where the router reaches it (a local model's engine: its port now); None: not running."""
    state: Literal["registered", "waiting", "loading", "failed"]
    id: str | None = None
    """The router's id for it."""
    error: str | None = None


class PoolView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    router: str
    models: list[str]
    started: RouterView | None
    registrations: list[Registration]


class _Router:
    """``smg launch`` as a supervised child: restarted after a crash (the wait doubling from
    1 s to 30 s), given up after 5 crashes within a minute."""

    def __init__(self, remote: Remote, *, run_dir: Path, grace_s: float) -> None:
        self.remote = remote
        self.port = remote.port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = secrets.token_hex(24)
        self.control = {"Authorization": f"Bearer {self.key}"}
        self.run_dir = run_dir
        self.grace_s = grace_s
        self.state: Literal["stopped", "starting", "ready", "failed"] = "stopped"
        self.generation = 0
        """Counts the starts that became ready: a new one has no workers yet."""
        self.pid: int | None = None
        self.restarts = 0
        self.last_error: str | None = None

    def view(self) -> RouterView:
        return RouterView(
            state=self.state, url=self.url, pid=self.pid, restarts=self.restarts, last_error=self.last_error
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        name = self.remote.name
        crashes: list[float] = []
        delay = _BACKOFF_S[0]
        while True:
            program = find_smg(self.remote.program)
            if program is None:
                self.state, self.last_error = "failed", NOT_FOUND
                log.error("pool '%s': %s", name, NOT_FOUND)
                return
            argv = router_argv(
                self.remote, program, port=self.port, metrics_port=_free_port(), control_key=self.key
            )
            pidfile = self.run_dir / "engines" / f"pool-{name}.pid"
            child = await ChildProcess.spawn(argv, name=f"router[{name}]", pidfile=pidfile)
            self.pid, self.state = child.pid, "starting"
            log.info("pool '%s': router starting on %s (pid %d)", name, self.url, child.pid)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_ready, child)
                    code = await child.serve()
                    nursery.cancel_scope.cancel()
            finally:
                await child.stop(self.grace_s)
                self.pid = None
            tail = child.stderr_tail.summary() or child.stdout_tail.summary()
            self.state, self.last_error = "failed", f"the router exited with status {code}: {tail}"
            now = trio.current_time()
            crashes = [t for t in crashes if now - t < _CRASH_WINDOW_S] + [now]
            if len(crashes) > _MAX_CRASHES:
                log.error(
                    "pool '%s': %s — given up after %d exits within a minute",
                    name,
                    self.last_error,
                    len(crashes),
                )
                return
            log.warning("pool '%s': %s; restarting in %g s", name, self.last_error, delay)
            await trio.sleep(delay)
            self.restarts += 1
            delay = min(delay * 2, _BACKOFF_S[1])

    async def _until_ready(self, child: ChildProcess) -> None:
        import httpx

        async with httpx.AsyncClient(base_url=self.url, trust_env=False, timeout=2.0) as client:
            with trio.move_on_after(_READY_TIMEOUT_S):
                while child.returncode is None:
                    try:
                        if (await client.get("/health")).status_code == 200:
                            self.state, self.last_error = "ready", None
                            self.generation += 1
                            log.info("pool '%s': router ready", self.remote.name)
                            return
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(_TICK_S / 2)
        if child.returncode is None:
            self.last_error = f"the router did not answer GET /health within {_READY_TIMEOUT_S:g} s"
            await child.stop(self.grace_s)


class _Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.local = not name.startswith(("http://", "https://"))
        self.model = name
        """A local worker's canonical model name, once a load has resolved it."""
        self.url: str | None = None if self.local else name
        self.key: str | None = None
        self.id: str | None = None
        self.registered = False
        self.loading = False
        self.next_load = -math.inf
        self.delay = _BACKOFF_S[0]
        self.error: str | None = None

    def view(self) -> Registration:
        if self.registered:
            state: Literal["registered", "waiting", "loading", "failed"] = "registered"
        elif self.loading:
            state = "loading"
        else:
            state = "failed" if self.error else "waiting"
        return Registration(worker=self.name, url=self.url, state=state, id=self.id, error=self.error)


class _Registrar:
    """Keeps the router's worker list what the entry names (see the module doc)."""

    def __init__(self, runtime: Runtime, remote: Remote, router: _Router | None) -> None:
        self.runtime = runtime
        self.remote = remote
        self.router = router
        self.workers = [_Worker(w) for w in remote.workers]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        import httpx

        router = self.router
        if router is not None:
            url, headers = router.url, router.control
        else:
            assert self.remote.url is not None
            url = self.remote.url
            headers = {"Authorization": f"Bearer {self.remote.key}"} if self.remote.key else {}
        generation = 0
        async with (
            httpx.AsyncClient(
                base_url=url,
                headers=headers,
                verify=self.remote.verify(),
                trust_env=False,
                timeout=self.remote.timeout_s,
            ) as client,
            trio.open_nursery() as nursery,
        ):
            task_status.started()
            try:
                while True:
                    if router is not None and router.state != "ready":
                        await trio.sleep(_TICK_S)
                        continue
                    if router is not None and router.generation != generation:
                        generation = router.generation
                        for w in self.workers:  # a new router knows none of them
                            w.registered, w.id = False, None
                    for w in self.workers:
                        await self._settle(client, nursery, w)
                    await trio.sleep(_TICK_S)
            finally:
                if router is None:  # a router of its own keeps going: take our engines out of it
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        for w in self.workers:
                            if w.local and w.registered:
                                await self._remove(client, w)

    async def _settle(self, client: httpx.AsyncClient, nursery: trio.Nursery, w: _Worker) -> None:
        if w.local:
            where = self._engine_of(w)
            if where is None:
                if w.registered:
                    log.info("pool '%s': %s stopped: taken out of the router", self.remote.name, w.name)
                    await self._remove(client, w)
                w.url = None
                if not w.loading and trio.current_time() >= w.next_load:
                    w.loading = True
                    nursery.start_soon(self._load, w)
                return
            if w.registered and where[0] != w.url:  # started again on another port
                await self._remove(client, w)
            w.url, w.key = where
        if not w.registered:
            await self._add(client, w)

    def _engine_of(self, w: _Worker) -> tuple[str, str | None] | None:
        """A local worker's engine URL and key, while it is ready; else None."""
        engine = self.runtime.engine_named(w.model)
        handle = engine.ready_handle() if engine is not None else None
        if engine is None or handle is None or engine.state is not EngineState.READY:
            return None
        auth = handle.client.headers.get("authorization", "")
        return handle.base_url, (auth.removeprefix("Bearer ") or None)

    async def _load(self, w: _Worker) -> None:
        try:
            card = await self.runtime.load(w.name, keep_alive_s=-1)
        except Exception as exc:
            w.error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            w.next_load = trio.current_time() + w.delay
            log.warning(
                "pool '%s': cannot load %s (%s); trying again in %g s",
                self.remote.name,
                w.name,
                w.error,
                w.delay,
            )
            w.delay = min(w.delay * 2, _BACKOFF_S[1])
        else:
            w.model, w.error, w.delay = card.model, None, _BACKOFF_S[0]
        finally:
            w.loading = False

    async def _add(self, client: httpx.AsyncClient, w: _Worker) -> None:
        import httpx

        assert w.url is not None
        spec: dict[str, Any] = {"url": w.url}
        if w.key is not None:
            spec["api_key"] = w.key
        try:
            resp = await client.post("/workers", json=spec)
            if resp.status_code in (200, 201, 202):
                w.id = _field(resp, "worker_id")
            elif (found := _IN_PROGRESS.search(resp.text)) is not None:
                w.id = found.group(1)  # an add of that URL is under way (the router retries it)
            else:
                w.id = await self._id_of(client, w.url)
                if w.id is None:
                    raise SnapshotError(f"POST /workers answered {resp.status_code}: {resp.text[:200]}")
        except (httpx.HTTPError, SnapshotError) as exc:
            if w.error != str(exc):
                log.warning("pool '%s': cannot register %s: %s", self.remote.name, w.url, exc)
            w.error = str(exc)
            return
        w.registered, w.error = True, None
        log.info("pool '%s': registered %s (%s)", self.remote.name, w.url, w.name)

    async def _remove(self, client: httpx.AsyncClient, w: _Worker) -> None:
        import httpx

        w.registered = False
        try:
            wid = w.id or (await self._id_of(client, w.url) if w.url is not None else None)
            if wid is not None:
                await client.delete(f"/workers/{wid}")
        except (httpx.HTTPError, SnapshotError) as exc:
            log.warning("pool '%s': cannot take %s out: %s", self.remote.name, w.url, exc)
        w.id = None

    async def _id_of(self, client: httpx.AsyncClient, url: str) -> str | None:
        resp = await client.get("/workers")
        if resp.status_code != 200:
            return None
        return next((x.id for x in parse_workers(resp.content) if x.url == url), None)


def _field(resp: httpx.Response, name: str) -> str | None:
    try:
        doc = resp.json()
    except ValueError:
        return None
    value = doc.get(name) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


class Pools:
    """The pool entries of ``[[remotes]]``: their routers started here and their workers."""

    def __init__(self, remotes: list[Remote], *, run_dir: Path, grace_s: float) -> None:
        self.remotes = [r for r in remotes if r.pool is not None]
        self.routers = {r.name: _Router(r, run_dir=run_dir, grace_s=grace_s) for r in self.remotes if r.start}
        self.registrars: dict[str, _Registrar] = {}

    def __repr__(self) -> str:
        return f"<Pools {len(self.remotes)} ({len(self.routers)} started here)>"

    def __bool__(self) -> bool:
        return bool(self.remotes)

    @property
    def started(self) -> dict[str, tuple[str, dict[str, str]]]:
        """Each router started here: its URL and the headers of its worker API."""
        return {name: (r.url, r.control) for name, r in self.routers.items()}

    def serving(self, model: str) -> Remote | None:
        """The pool that requests for ``model`` go to first, if one serves it."""
        bare = model.removesuffix(":latest")
        return next(
            (r for r in self.remotes if any(m.removesuffix(":latest") == bare for m in r.pool_models())), None
        )

    async def run(
        self, runtime: Runtime, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            for router in self.routers.values():
                await nursery.start(router.run)
            for remote in self.remotes:
                if remote.workers:
                    registrar = _Registrar(runtime, remote, self.routers.get(remote.name))
                    self.registrars[remote.name] = registrar
                    await nursery.start(registrar.run)
            task_status.started()

    def views(self) -> list[PoolView]:
        out = []
        for r in self.remotes:
            router = self.routers.get(r.name)
            registrar = self.registrars.get(r.name)
            out.append(
                PoolView(
                    name=r.name,
                    router=r.pool or "",
                    models=r.pool_models(),
                    started=router.view() if router is not None else None,
                    registrations=[w.view() for w in registrar.workers] if registrar is not None else [],
                )
            )
        return out
