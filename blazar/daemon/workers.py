"""The daemon's side of ``workers`` above 1: its sockets, its workers, their restarts.

The daemon binds the public sockets as always but does not accept on them: its workers
(``blazar/daemon/worker.py``) do, each handed the sockets at spawn, and the kernel spreads
new connections among them. The daemon serves its whole app to them over the channel
(``blazar/web/asgi/channel.py``), and their clients' WebSockets on a private HTTP socket
behind the token check of ``WorkerSide``: two Unix sockets with Linux abstract names, so
nothing is left on disk. A worker that exits (a crash, a ``kill -9``) loses only its own requests
(their slots are freed as each of its connections to the runtime closes) and is started
again after a short backoff; the sockets stay open here, so the other workers go on
accepting meanwhile. Each worker's stdin is a pipe held here: the daemon gone, however
it ended, the workers see end-of-file and exit.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.utils import repr_socket_addr

from blazar.config import Config
from blazar.daemon import worker
from blazar.web.asgi.channel import serve_channel
from blazar.web.asgi.listen import hypercorn_config, serve
from blazar.web.asgi.workers import WorkerSide

__all__ = ["Workers", "serve_with_workers"]

log = logging.getLogger("blazar.workers")

_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_STEADY_S = 30.0
"""A worker that ran this long before it exited is restarted at the shortest backoff again."""
_STOP_GRACE_S = 5.0


def worker_config(config: Config, count: int) -> Config:
    """What each of ``count`` workers listens with. The cap on connections in all is shared
    among them. The cap per client address is whole in each: the kernel hands a new
    connection to whichever worker accepts first, so one client's connections are not
    spread evenly, and a share of its cap would refuse a client that is under it."""
    total = max(1, math.ceil(config.max_connections / count))
    return msgspec.structs.replace(
        config,
        max_connections=total,
        max_connections_per_client=min(config.max_connections_per_client, total),
    )


def _inner_config(config: Config) -> Config:
    """The runtime's listener for its workers: plain (they end TLS), every worker connection
    from one address (so no per-address cap), room for each request in flight and the idle
    connections the workers keep."""
    room = 4 * config.max_connections + 64
    return msgspec.structs.replace(
        config,
        tls_cert=None,
        tls_key=None,
        max_connections=room,
        max_connections_per_client=room,
        keep_alive_timeout_s=max(config.keep_alive_timeout_s, 60.0),
    )


class Workers:
    """The worker processes: each kept running until the daemon stops; their pids by index."""

    def __init__(
        self,
        count: int,
        config: Config,
        fds: list[int],
        sockets: tuple[str, str],
        token: str,
        log_dir: str | None,
    ) -> None:
        self.count = count
        self.pids: dict[int, int] = {}
        self.restarts = 0
        self._env = {
            **os.environ,
            worker.ENV_CONFIG: msgspec.json.encode(worker_config(config, count)).decode(),
            # no NUL in an environment: a Linux abstract name goes as @name
            worker.ENV_SOCKET: sockets[0].replace("\0", "@", 1),
            worker.ENV_CHANNEL: sockets[1].replace("\0", "@", 1),
            worker.ENV_TOKEN: token,
            worker.ENV_FDS: ",".join(map(str, fds)),
            worker.ENV_LOG_DIR: log_dir or "",
        }
        self._fds = fds

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for index in range(self.count):
                nursery.start_soon(self._keep, index)

    async def _keep(self, index: int) -> None:
        attempt = 0
        while True:
            started = trio.current_time()
            code = await self._run_one(index)
            if trio.current_time() - started >= _STEADY_S:
                attempt = 0
            delay = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
            attempt += 1
            self.restarts += 1
            log.warning("worker %d exited (%s); starting it again in %g s", index, _exit_said(code), delay)
            await trio.sleep(delay)

    async def _run_one(self, index: int) -> int:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "blazar.daemon.worker"],
            stdin=subprocess.PIPE,
            pass_fds=self._fds,
            env={**self._env, worker.ENV_INDEX: str(index)},
        )
        self.pids[index] = proc.pid
        log.info("worker %d started (pid %d)", index, proc.pid)
        try:
            return await proc.wait()
        finally:
            self.pids.pop(index, None)
            with trio.CancelScope(shield=True):
                await _stop(proc)


async def _stop(proc: trio.Process) -> None:
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(_STOP_GRACE_S):
        await proc.wait()
        return
    proc.kill()
    await proc.wait()


def _private_socket(what: str) -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0blazar-{what}-{os.getpid()}-{secrets.token_hex(8)}"
    sock.bind(name)
    return sock, name


def _exit_said(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


async def serve_with_workers(
    app: Any,
    config: Config,
    hconfig: HypercornConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    log_dir: str | None = None,
    on_workers: Callable[[Workers], None] = lambda workers: None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind the public sockets, serve ``app`` to the workers, run them; ``task_status`` gets
    the bound URLs as ``serve`` gives them."""
    sockets = hconfig.create_sockets()
    public = [(s, True) for s in sockets.secure_sockets] + [(s, False) for s in sockets.insecure_sockets]
    binds = []
    for sock, secure in public:
        sock.listen(hconfig.backlog)
        binds.append(f"{'https' if secure else 'http'}://{repr_socket_addr(sock.family, sock.getsockname())}")
    token = secrets.token_urlsafe(32)
    private, name = _private_socket("runtime")
    channel, channel_name = _private_socket("channel")
    inner = _inner_config(config)
    inner_h = hypercorn_config(inner)
    inner_h.bind = [f"fd://{private.detach()}"]  # the listener owns (and closes) it now
    fds = [s.fileno() for s, _ in public]
    workers = Workers(config.workers, config, fds, (name, channel_name), token, log_dir)
    on_workers(workers)
    max_frame = int(config.max_body_mb * 1024 * 1024) + 1024 * 1024  # a request's body and its head
    try:
        async with trio.open_nursery() as nursery:
            side = WorkerSide(app, token)
            await nursery.start(
                lambda task_status: serve(
                    side, inner, inner_h, shutdown_trigger=shutdown_trigger, task_status=task_status
                )
            )
            await nursery.start(
                lambda task_status: serve_channel(
                    app, token, channel, max_frame=max_frame, task_status=task_status
                )
            )
            nursery.start_soon(workers.run)
            task_status.started(binds)
            await shutdown_trigger()
            await trio.sleep_forever()  # the daemon cancels this once it has drained
    finally:
        for sock, _ in public:
            sock.close()
