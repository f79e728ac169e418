"""``blazar serve``: the runtime, the gateway, and the daemon's files.

The daemon writes ``run/daemon.json`` (pid, address) once it listens, logs to
``logs/daemon.log`` (rotated by size), and shuts down cleanly on SIGTERM,
SIGINT or ``POST /admin/shutdown``: hypercorn drains, then the runtime stops
every engine child.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from actors.admission import Draining
from actors.runtime_open import open_runtime
from blazar.config import Config, ConfigError, Paths, load_config, resolve_paths
from blazar.daemon.client import CliError, find_daemon
from blazar.daemon.files import remove_daemon_info, remove_local_token, write_daemon_info
from blazar.telemetry.scrub import ScrubFilter, scrub
from registry.files import shown_folder

if TYPE_CHECKING:
    from blazar.web.middleware.tracing import RequestTracer

__all__ = [
    "BindError",
    "LogFile",
    "StartRefused",
    "open_bind_refusal",
    "run_server",
    "serve_foreground",
    "setup_logging",
]

log = logging.getLogger("blazar.daemon.serve")


class BindError(Exception):
    pass


class StartRefused(Exception):
    """The daemon would start in a state the operator did not ask for (e.g. open to the network)."""


def serve_foreground(
    *,
    host: str | None = None,
    port: int | None = None,
    preload: list[str] | None = None,
    insecure_open: bool = False,
    log_stderr: bool = False,
) -> None:
    """``blazar serve``: the config with these options over it, then the daemon until it stops.
    Exits 3 when the address is taken and 2 when the start is refused; raises ``CliError``
    when a daemon already runs."""
    paths = resolve_paths()
    config = load_config(paths)
    config = msgspec.structs.replace(
        config,
        host=host or config.host,
        port=config.port if port is None else port,
        preload=list(dict.fromkeys([*(preload or []), *config.preload])),
        insecure_open=insecure_open or config.insecure_open,
    )
    running = find_daemon(paths)
    if running is not None:
        raise CliError(f"a daemon already runs at {running.url} (pid {running.pid}) — `blazar stop` it first")
    setup_logging(paths, config, to_stderr=log_stderr or sys.stderr.isatty())
    try:
        trio.run(run_server, config, paths)
    except BindError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(3)
    except StartRefused as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)


def open_bind_refusal(config: Config, paths: Paths) -> str | None:
    """Why the daemon must not start as configured, or None: a non-loopback bind with no API
    key lets anyone who reaches the port run, pull and delete models."""
    from actors.addresses import is_loopback
    from blazar.auth.keys import KeyStore, keys_path

    if is_loopback(config.host) or config.insecure_open:
        return None
    store = KeyStore(keys_path(paths.data_dir))
    try:
        if store.count() > 0:
            return None
    finally:
        store.close()
    return (
        f"refusing to listen on {config.host}: the address is reachable from other machines and no "
        "API key exists, so anyone who reaches the port could use, pull and delete every model — "
        "add a key first (`blazar keys add NAME`), or bind 127.0.0.1, or accept an open daemon "
        "explicitly with `blazar serve --insecure-open` (config: insecure_open = true)"
    )


class LogFile(logging.handlers.RotatingFileHandler):
    """The daemon's log file, which a full (or unwritable) disk never turns into a crash nor
    into a traceback per line: the lines that cannot be written are dropped, stderr says so
    once, and again once they are written again."""

    def __init__(self, path: str, *, max_bytes: int, backups: int, shown: str = "the daemon log") -> None:
        # delay: opened at the first line, so a disk that refuses it cannot stop the start
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, delay=True)
        self.shown = shown
        self.failing = False

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if self.failing and self.stream is not None:
            self.failing = False
            _say(f"blazar: writing {self.shown} again")

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)
            return
        # Drop the stream: what it buffered could not be written; the next line reopens it.
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        if not self.failing:
            self.failing = True
            why = exc.strerror or type(exc).__name__
            _say(f"blazar: cannot write {self.shown} ({why}): its lines are lost until it can be written")


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def setup_logging(paths: Paths, config: Config, *, to_stderr: bool) -> None:
    with contextlib.suppress(OSError):  # a disk that refuses the folder: the handler says so
        Path(paths.log_dir).mkdir(parents=True, exist_ok=True)
    handler = LogFile(
        paths.log_file,
        max_bytes=int(config.log_max_mb * 1024 * 1024),
        backups=3,
        shown=f"the daemon log (daemon.log in {shown_folder(paths.log_dir, paths.data_dir)})",
    )
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(fmt)
    # On the handlers, not the root logger: a logger's filters skip records that other
    # loggers propagate to it, a handler's see every record it writes.
    scrubber = ScrubFilter()
    handler.addFilter(scrubber)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if to_stderr:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(fmt)
        console.addFilter(scrubber)
        root.addHandler(console)
    root.setLevel(logging.INFO)
    for noisy in ("hypercorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def run_server(config: Config, paths: Paths) -> None:
    """Serve until SIGTERM/SIGINT or an admin shutdown. Raises ``BindError`` and ``StartRefused``."""
    if (refusal := open_bind_refusal(config, paths)) is not None:
        raise StartRefused(refusal)
    try:
        await _serve(config, paths)
    except BaseExceptionGroup as group:
        # Nurseries wrap errors in groups; a lone BindError is what the caller handles.
        leaves = list(_leaves(group))
        if len(leaves) == 1 and isinstance(leaves[0], OSError) and leaves[0].errno == errno.EADDRINUSE:
            raise BindError(
                f"{config.host}:{config.port} is already in use — is another daemon running? "
                "try `blazar ps` or `blazar serve --port N`"
            ) from None
        raise


def _self_url(host: str, port: int, tls_cert: str | None) -> str:
    """Where the daemon reaches its own port (a wildcard bind is reached on loopback)."""
    if host in ("0.0.0.0", "", "*"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls_cert else 'http'}://{shown}:{port}"


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


async def _serve(config: Config, paths: Paths) -> None:
    shutdown = trio.Event()
    tracer = _open_tracer(config)  # before any engine starts: a missing extra fails fast
    async with open_runtime(config.runtime(paths)) as runtime:
        if runtime.reaped_orphans:
            log.warning("reaped engine processes left by a previous crash: %s", runtime.reaped_orphans)
        # The HTTP layer takes a tenth of a second or more to import. Imported once the
        # runtime runs (which waits for the first preloaded engine's process to spawn,
        # see `Runtime.preload`), it overlaps that engine's start instead of delaying it;
        # and the framework behind the gateway's own routes is imported once the daemon
        # listens (`blazar.web.front`).
        from blazar.web.asgi.listen import hypercorn_config, serve
        from blazar.web.front import open_gateway, set_address

        asgi = open_gateway(runtime, config, log_dir=paths.log_dir, tracer=tracer, shutdown=shutdown)
        hconfig = hypercorn_config(config)
        _raise_open_files_limit(config.max_connections)
        async with trio.open_nursery() as outer:
            outer.start_soon(_watch_signals, shutdown)
            outer.start_soon(_freeze_once_started, asgi.app)
            async with trio.open_nursery() as web:
                if config.workers > 1:
                    from blazar.daemon.workers import serve_with_workers

                    binds = await web.start(
                        lambda task_status: serve_with_workers(
                            asgi,
                            config,
                            hconfig,
                            shutdown_trigger=shutdown.wait,
                            log_dir=paths.log_dir,
                            task_status=task_status,
                        )
                    )
                else:
                    binds = await web.start(
                        lambda task_status: serve(
                            asgi, config, hconfig, shutdown_trigger=shutdown.wait, task_status=task_status
                        )
                    )
                port = int(binds[0].rsplit(":", 1)[1]) if binds else config.port
                write_daemon_info(paths, config.host, port, tls_cert=config.tls_cert)
                set_address(asgi, _self_url(config.host, port, config.tls_cert), config.tls_cert)
                log.info("blazar listening on %s (pid %d)", binds, os.getpid())
                try:
                    await shutdown.wait()
                finally:
                    remove_daemon_info(paths)
                    if asgi.auth is not None:
                        remove_local_token(paths.run_dir, asgi.auth.local_token)
                log.info("shutting down: draining %d requests, then stopping engines", asgi.in_flight)
                with trio.move_on_after(1.0):
                    await runtime.admission.ask(Draining())  # queued and new requests: 503 SHUTTING_DOWN
                # hypercorn would also wait out idle keep-alive connections; once the
                # requests in flight are done there is nothing left worth waiting for.
                with trio.move_on_after(config.drain_grace_s):
                    await asgi.wait_idle()
                web.cancel_scope.cancel()
            outer.cancel_scope.cancel()
        if asgi.telemetry is not None:
            asgi.telemetry.close()  # the audit lines still queued
    if tracer is not None:
        with trio.move_on_after(5.0):
            await trio.to_thread.run_sync(tracer.shutdown, abandon_on_cancel=True)
    log.info("stopped")


def _raise_open_files_limit(max_connections: int) -> None:
    """Room for every connection the caps allow, plus the engines', the ledger's and the
    refusals' own descriptors: past the soft limit accepts fail and clients wait unanswered."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + 512
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
        if target < wanted:
            log.warning(
                "the open-files limit (%d) is below max_connections + 512: lower max_connections or "
                "raise `ulimit -n`",
                target,
            )


def _open_tracer(config: Config) -> RequestTracer | None:
    from blazar.web.middleware.tracing import TracingUnavailable, endpoint_from, open_tracer

    endpoint = endpoint_from(config.otel_endpoint)
    if endpoint is None:
        return None
    try:
        tracer = open_tracer(endpoint, service_name=config.otel_service_name, scrub=scrub)
    except TracingUnavailable as exc:
        raise ConfigError(str(exc)) from None
    log.info("exporting request traces to %s", endpoint)
    return tracer


async def _freeze_once_started(framework: object) -> None:
    """Once the daemon has started (its framework built), move every object it made so far
    out of the garbage collector's sight (``gc.freeze``): a full collection then walks what
    requests made since, not the whole program. It stops every stream while it runs: at 256
    streams, 64 ms a time before and 14 to 18 ms after, every few seconds."""
    wait_loaded = getattr(framework, "wait_loaded", None)
    if wait_loaded is not None:
        await wait_loaded()
    freeze_heap()


def freeze_heap() -> None:
    """Collect what is garbage now, then freeze the rest (a process's start is over)."""
    gc.collect()
    gc.freeze()


async def _watch_signals(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            shutdown.set()
            return
