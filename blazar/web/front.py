"""The daemon's gateway, answering before its framework is imported.

Quart, with flask, werkzeug and the framework's route modules, takes about 0.3 s of CPU to
import, more than the rest of the HTTP layer together. A daemon that ``blazar run`` starts
has its first engine loading meanwhile, and the command asks only for what the gateway
serves itself (``GET /health``, then the chat). So ``open_gateway`` builds the gateway layer
with its own routes (``blazar.web.routes.gateway_served``: nothing here imports Quart) and,
for the app behind it, a ``Framework``: the Quart app of ``blazar.web.app.create_app`` once
it is built. The daemon listens with that at once. The framework's modules are imported in
a worker thread while the gateway answers, and the app is then built on the event loop
(``Framework.load``, run by the server's lifespan), as soon as a request needs it (it
waits for it) or once the start has settled: the preloaded engines are up and no request is
in flight, so that the import takes no CPU from the first engine's load.

``blazar.web.app.build_gateway`` is the same gateway with its app built at once (tests,
and whatever serves it without a lifespan).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from actors.addresses import is_loopback
from actors.runtime import Runtime
from blazar.auth.keys import KeyStore, keys_path
from blazar.config import Config
from blazar.daemon.files import write_local_token
from blazar.errors import BlazarError
from blazar.serve.cards import Cards
from blazar.serve.jobs import register_all
from blazar.serve.jobs.self_link import SelfLink
from blazar.serve.policy.hooks import open_policy_hooks
from blazar.serve.stores.semantic import open_semantic_cache
from blazar.serve.stores.streams import open_streams
from blazar.telemetry.audit import AuditLog
from blazar.telemetry.observer import Telemetry
from blazar.telemetry.quantiles import QuantileWindow
from blazar.web.asgi.call import Routes, current
from blazar.web.asgi.gateway import GatewayMiddleware, send_reply
from blazar.web.asgi.replies import exception_reply
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.cors import CorsPolicy
from blazar.web.middleware.host_guard import HostGuard
from blazar.web.middleware.tracing import RequestTracer
from blazar.web.routes import federation, gateway_served
from registry.template import import_jinja

if TYPE_CHECKING:
    from quart_trio import QuartTrio

__all__ = ["AppParts", "Framework", "build_telemetry", "open_auth", "open_gateway", "set_address"]

log = logging.getLogger("blazar.web")


class AppParts:
    """What ``create_app`` gives the Quart app beside the runtime and config: the parts the
    gateway made first and shares with it."""

    def __init__(
        self,
        *,
        cards: Cards,
        telemetry: Telemetry,
        auth: Auth,
        hot_routes: tuple[str, ...],
        shutdown: trio.Event | None,
    ) -> None:
        self.cards = cards
        self.telemetry = telemetry
        self.auth = auth
        self.hot_routes = hot_routes
        """The paths of the gateway's own POST routes (listed by ``/.well-known/blazar``)."""
        self.shutdown = shutdown
        """Set by ``POST /admin/shutdown``: the daemon then stops."""


def _import_framework() -> None:
    """Import the Quart app's modules (a worker thread runs this). Jinja first, under the
    lock that a model's template probe imports it with, which may run in another thread."""
    import_jinja()
    from blazar.web import app
    from blazar.web.routes import framework_served

    framework_served()
    del app


class Framework:
    """The ASGI app behind the gateway layer in the daemon: the Quart app once built.

    ``build`` makes it (importing what is not imported yet); ``load`` imports its modules
    in a worker thread first, so that the event loop keeps answering meanwhile. The server's
    lifespan runs ``load`` and then the app's own lifespan inside its own (the app's
    background tasks live in it). It loads when a request needs it (which waits for it), or
    once ``settled`` returns: the daemon's start is over (its preloaded engines are up and
    the requests in flight answered), so the import takes no CPU from an engine's start.
    """

    def __init__(
        self, make: Callable[[], QuartTrio], settled: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._make = make
        self._settled = settled
        self.app: QuartTrio | None = None
        self._wanted = trio.Event()
        self._built = trio.Event()
        self._failure: str | None = None

    async def wait_loaded(self) -> None:
        """Return once the app is built (or failed to)."""
        await self._built.wait()

    def build(self) -> QuartTrio:
        """The Quart app, built now if it is not yet."""
        if self.app is None:
            self.app = self._make()
            self._built.set()
        return self.app

    async def load(self) -> QuartTrio | None:
        """Import the app's modules in a worker thread, then build it here; None (logged,
        and told to the requests that wait) if that fails."""
        if self.app is None and self._failure is None:
            try:
                await trio.to_thread.run_sync(_import_framework)
                self.build()
            except Exception as exc:
                log.exception("the HTTP framework failed to load: only the gateway's own routes answer")
                self._failure = f"{type(exc).__name__}: {exc}"
                self._built.set()
        return self.app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if self.app is None:
            self._wanted.set()
            await self._built.wait()
        if self.app is None:
            error = BlazarError("INTERNAL", f"the daemon's HTTP framework failed to load ({self._failure})")
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011})
            else:
                await send_reply(exception_reply(current(), error), send)
            return
        app: Any = self.app  # an ASGI app: the scope and messages are plain dicts here
        await app(scope, receive, send)

    async def _lifespan(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The server's lifespan: its start completes at once (the server listens without
        waiting for the app); the app is loaded, then runs its own lifespan until the
        server's ends."""
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        await send({"type": "lifespan.startup.complete"})
        to_app, app_receive = trio.open_memory_channel[dict[str, Any]](1)
        started, stopped = trio.Event(), trio.Event()

        async def app_send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind.startswith("lifespan.startup."):
                started.set()
                if kind.endswith(".failed"):
                    log.error("the HTTP framework's start failed: %s", message.get("message", ""))
            elif kind.startswith("lifespan.shutdown."):
                stopped.set()

        async def settle() -> None:
            if self._settled is not None:
                await self._settled()
            self._wanted.set()

        async def run_app() -> None:
            await self._wanted.wait()
            app: Any = await self.load()
            if app is not None:
                await to_app.send({"type": "lifespan.startup"})
                await app(scope, app_receive.receive, app_send)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(settle)
            nursery.start_soon(run_app)
            await receive()  # lifespan.shutdown
            if started.is_set():
                await to_app.send({"type": "lifespan.shutdown"})
                await stopped.wait()
            nursery.cancel_scope.cancel()
        await send({"type": "lifespan.shutdown.complete"})


def build_telemetry(runtime: Runtime, config: Config, log_dir: str | None = None) -> Telemetry:
    """Metrics, quantiles and (with ``audit_log`` on and a ``log_dir``) the audit log, not yet started."""
    audit = None
    if config.audit_log and log_dir is not None:
        audit = AuditLog(
            Path(log_dir) / "audit.jsonl",
            max_bytes=int(config.audit_max_mb * 1024 * 1024),
            backups=config.audit_keep,
            prompts=config.audit_prompts,
        )
    window = QuantileWindow(max_requests=config.quantiles_window, max_age_s=config.quantiles_window_s)
    return Telemetry(runtime, quantiles=window, audit=audit)


def open_auth(runtime: Runtime, config: Config) -> Auth:
    """The auth step over ``keys.db``, with a fresh local token in the run dir for the CLI."""
    token = "blz-local-" + secrets.token_urlsafe(32)
    write_local_token(runtime.config.run_dir, token)
    return Auth(
        KeyStore(keys_path(runtime.config.home)),
        local_token=token,
        closed_when_empty=not is_loopback(config.host) and not config.insecure_open,
        queue_over_concurrency=config.key_concurrency == "queue",
    )


def open_gateway(
    runtime: Runtime,
    config: Config,
    *,
    log_dir: str | None = None,
    tracer: RequestTracer | None = None,
    shutdown: trio.Event | None = None,
) -> GatewayMiddleware:
    """The ASGI application the daemon serves: the gateway layer, its own routes, and the
    Quart app as a ``Framework`` not built yet; ``tracer`` traces each request
    (``blazar.web.middleware.tracing``). ``gateway.telemetry.audit``, when there is one, is
    started here; close it at shutdown (``gateway.telemetry.close()``)."""
    cards = Cards()
    routes = Routes()
    open_streams(runtime, config.streams)  # resumable streams, for the routes that offer them
    open_semantic_cache(runtime, config.semantic_cache, trio.current_time)
    open_policy_hooks(runtime, config.hooks)  # none configured: nothing kept, nothing done
    for module in gateway_served():
        module.register_routes(routes, runtime)
    federation.wrap_routes(routes, runtime)  # only with [[remotes]]
    telemetry = build_telemetry(runtime, config, log_dir)
    cors = CorsPolicy(config.cors_origins)
    auth = open_auth(runtime, config)
    # the doctor's probes and benchmarks go over HTTP to the daemon's own port, as clients would
    link = SelfLink(dict(auth.local_headers()))
    hot = tuple(routes.post)
    parts = AppParts(cards=cards, telemetry=telemetry, auth=auth, hot_routes=hot, shutdown=shutdown)

    def make() -> QuartTrio:
        from blazar.web.app import create_app

        return create_app(runtime, config, parts=parts)

    async def settled() -> None:
        await runtime.preloaded.wait()
        await gateway.wait_idle()

    gateway = GatewayMiddleware(
        Framework(make, settled),
        runtime.ledger,
        cards,
        routes=routes,
        guard=HostGuard(config.allowed_hosts, cors) if HostGuard.applies_to(config.host) else None,
        auth=auth,
        max_body=int(config.max_body_mb * 1024 * 1024),
        max_head=config.max_header_kb * 1024,
        tracer=tracer,
        telemetry=telemetry,
        cors=cors,
    )
    gateway.link = link
    if telemetry.audit is not None:
        telemetry.audit.start()
    # batch items and async transcriptions run through the whole gateway, as the same
    # requests over HTTP would
    register_all(runtime, app=gateway, headers=auth.local_headers(), link=link, record=gateway.record_job)
    return gateway


def set_address(gateway: GatewayMiddleware, url: str, tls_cert: str | None) -> None:
    """Where the daemon listens, once it does: its own port, for what calls it as a client."""
    if gateway.link is not None:
        gateway.link.url, gateway.link.tls_cert = url, tls_cert
