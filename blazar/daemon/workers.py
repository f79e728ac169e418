"""The daemon's side of ``workers`` above 1: its sockets, its workers, their restarts.

The daemon binds the public sockets as always but does not accept on them: its workers
(``blazar/daemon/worker.py``) do, each handed the sockets at spawn, and the kernel spreads
new connections among them. The daemon serves its whole app on a private Unix socket
(a Linux abstract name, so nothing is left on disk), behind the token check of
``WorkerSide``. A worker that exits (a crash, a ``kill -9``) loses only its own requests
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
from blazar.web.asgi.listen import hypercorn_config, serve
from blazar.web.asgi.workers import WorkerSide

__all__ = ["Workers", "serve_with_workers"]

log = logging.getLogger("blazar.workers")

_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_STEADY_S = 30.0
"""A worker that ran this long before it exited is restarted at the shortest backoff again."""
_STOP_GRACE_S = 5.0


def worker_config(config: Config, count: int) -> Config:
    """What each of ``count`` workers listens with: the connection caps shared among them."""
    return msgspec.structs.replace(
        config,
        max_connections=max(1, math.ceil(config.max_connections / count)),
        max_connections_per_client=max(1, math.ceil(config.max_connections_per_client / count)),
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
        self, count: int, config: Config, fds: list[int], runtime_socket: str, token: str, log_dir: str | None
    ) -> None:
        self.count = count
        self.pids: dict[int, int] = {}
        self.restarts = 0
        self._env = {
            **os.environ,
            worker.ENV_CONFIG: msgspec.json.encode(worker_config(config, count)).decode(),
            worker.ENV_SOCKET: runtime_socket.replace("\0", "@", 1),  # no NUL in an environment
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
    private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0blazar-runtime-{os.getpid()}-{secrets.token_hex(8)}"
    private.bind(name)
    inner = _inner_config(config)
    inner_h = hypercorn_config(inner)
    inner_h.bind = [f"fd://{private.detach()}"]  # the listener owns (and closes) it now
    workers = Workers(config.workers, config, [s.fileno() for s, _ in public], name, token, log_dir)
    on_workers(workers)
    try:
        async with trio.open_nursery() as nursery:
            side = WorkerSide(app, token)
            await nursery.start(
                lambda task_status: serve(
                    side, inner, inner_h, shutdown_trigger=shutdown_trigger, task_status=task_status
                )
            )
            nursery.start_soon(workers.run)
            task_status.started(binds)
            await shutdown_trigger()
            await trio.sleep_forever()  # the daemon cancels this once it has drained
    finally:
        for sock, _ in public:
            sock.close()
