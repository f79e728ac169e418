"""``build_gateway(runtime, config)``: the HTTP gateway — the gateway layer
(``blazar.web.asgi.gateway``, which serves the hot inference routes itself) around
the Quart app of ``create_app``, which serves the rest.

Every error — ours, the framework's (unknown route, wrong method, bad JSON)
and the unexpected — answers in JSON in the caller's dialect with a
``blazar_code``. Streams are never cut by a framework timeout.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from actors.addresses import is_loopback
from actors.runtime import Runtime
from blazar.auth.keys import KeyStore, keys_path
from blazar.config import Config
from blazar.daemon.files import write_local_token
from blazar.dialects import unimplemented
from blazar.serve.cards import Cards
from blazar.serve.jobs import register_all
from blazar.serve.jobs.self_link import SelfLink
from blazar.serve.policy.hooks import open_policy_hooks
from blazar.serve.stores.semantic import open_semantic_cache
from blazar.serve.stores.streams import open_streams
from blazar.telemetry.audit import AuditLog
from blazar.telemetry.observer import Telemetry
from blazar.telemetry.quantiles import QuantileWindow
from blazar.web.asgi.call import Call, Routes, current, current_or_none
from blazar.web.asgi.gateway import GatewayMiddleware
from blazar.web.asgi.replies import (
    AUTH_KEY,
    CARDS_KEY,
    RUNTIME_KEY,
    error_response,
    exception_reply,
    response_of,
)
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.cors import CorsPolicy
from blazar.web.middleware.host_guard import HostGuard
from blazar.web.middleware.tracing import RequestTracer
from blazar.web.routes import FRAMEWORK_SERVED, GATEWAY_SERVED, discovery, federation
from blazar.web.routes.admin.telemetry import TELEMETRY_KEY
from blazar.web.routes.openai import realtime

__all__ = ["GatewayMiddleware", "build_gateway", "create_app", "link_of", "set_address"]


_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE", 400: "BAD_REQUEST"}


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


def build_gateway(
    runtime: Runtime, config: Config, *, log_dir: str | None = None, tracer: RequestTracer | None = None
) -> GatewayMiddleware:
    """The ASGI application hypercorn serves: the gateway layer, its own routes, the app;
    ``tracer`` traces each request (``blazar.web.middleware.tracing``).
    ``gateway.telemetry.audit``, when there is one, is started here; close it at shutdown
    (``gateway.telemetry.close()``)."""
    cards = Cards()
    routes = Routes()
    open_streams(runtime, config.streams)  # resumable streams, for the routes that offer them
    open_semantic_cache(runtime, config.semantic_cache, trio.current_time)
    open_policy_hooks(runtime, config.hooks)  # none configured: nothing kept, nothing done
    for module in GATEWAY_SERVED:
        module.register_routes(routes, runtime)
    federation.wrap_routes(routes, runtime)  # only with [[remotes]]
    telemetry = build_telemetry(runtime, config, log_dir)
    cors = CorsPolicy(config.cors_origins)
    auth = open_auth(runtime, config)
    gateway = GatewayMiddleware(
        create_app(runtime, config, cards=cards, telemetry=telemetry, auth=auth),
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
    gateway.app.extensions[discovery.HOT_ROUTES_KEY] = tuple(routes.post)
    if telemetry.audit is not None:
        telemetry.audit.start()
    # the doctor's probes and benchmarks go over HTTP to the daemon's own port, as clients would
    link = link_of(gateway.app)
    link.headers.update(auth.local_headers())
    # batch items and async transcriptions run through the whole gateway, as the same
    # requests over HTTP would
    register_all(runtime, app=gateway, headers=auth.local_headers(), link=link, record=gateway.record_job)
    return gateway


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


def create_app(
    runtime: Runtime,
    config: Config,
    *,
    cards: Cards | None = None,
    auth: Auth | None = None,
    telemetry: Telemetry | None = None,
) -> QuartTrio:
    """The Quart app: every route the gateway layer does not serve itself. Without that
    layer in front (the framework's test client) the app still runs, unguarded."""
    cards = cards if cards is not None else Cards()
    telemetry = telemetry if telemetry is not None else build_telemetry(runtime, config)
    app = QuartTrio("blazar")
    app.config.update(
        RESPONSE_TIMEOUT=None,  # long generations must not be cut
        BODY_TIMEOUT=60,
        MAX_CONTENT_LENGTH=None,  # enforced while reading, chunked bodies included
        PROVIDE_AUTOMATIC_OPTIONS=True,
    )
    max_body = int(config.max_body_mb * 1024 * 1024)

    # -- cross-cutting ----------------------------------------------------

    @app.before_request
    async def _before() -> None:
        call = current_or_none()
        if call is None:  # no gateway layer in front: a call for this task
            call = Call(request.scope, trace_id="blz-direct", max_body=max_body).__enter__()
        if request.url_rule is not None:
            call.route = request.url_rule.rule  # the template: a bounded metrics label

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL")
        if status == 404 and (missing := unimplemented.lookup(request.path)) is not None:
            message = (
                f"{request.method} {request.path} is part of the {missing.dialect} API but Blazar "
                f"does not implement it: {missing.reason}"
            )
            return error_response("NOT_IMPLEMENTED", message)
        if status == 404:
            message = f"no route {request.method} {request.path} — see docs/api.md for the routes"
        elif status == 405:
            message = f"{request.path} does not accept {request.method}"
        else:
            message = exc.description or exc.name
        return error_response(code, message)

    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:
        return response_of(exception_reply(current(), exc))

    app.extensions[RUNTIME_KEY] = runtime
    app.extensions[CARDS_KEY] = cards
    app.extensions[TELEMETRY_KEY] = telemetry
    app.extensions[AUTH_KEY] = auth
    app.extensions[discovery.DISCOVERY_KEY] = discovery.features_of(config)
    app.extensions[realtime.DEFAULTS_KEY] = realtime.Defaults(
        transcription_model=config.realtime_transcription_model, voice=config.realtime_voice
    )
    for module in FRAMEWORK_SERVED:
        module.register(app)
    return app


SELF_LINK = "BLAZAR_SELF_LINK"
"""The app config key that holds the daemon's ``SelfLink`` to its own port."""


def link_of(app: QuartTrio) -> SelfLink:
    link = app.config.get(SELF_LINK)
    if not isinstance(link, SelfLink):
        link = SelfLink({})
        app.config[SELF_LINK] = link
    return link


def set_address(app: QuartTrio, url: str, tls_cert: str | None) -> None:
    link = link_of(app)
    link.url, link.tls_cert = url, tls_cert
