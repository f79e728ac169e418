"""``build_gateway(runtime, config)``: the HTTP gateway — the gateway layer
(``blazar.web.asgi.gateway``, which serves the hot inference routes itself) around
the Quart app of ``create_app``, which serves the rest. The daemon serves the same
gateway with its app built once it listens (``blazar.web.front``).

Every error — ours, the framework's (unknown route, wrong method, bad JSON)
and the unexpected — answers in JSON in the caller's dialect with a
``blazar_code``. Streams are never cut by a framework timeout.
"""

from __future__ import annotations

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from actors.runtime import Runtime
from blazar.config import Config
from blazar.dialects import unimplemented
from blazar.serve.cards import Cards
from blazar.telemetry.observer import Telemetry
from blazar.web.asgi.call import Call, current, current_or_none
from blazar.web.asgi.gateway import GatewayMiddleware
from blazar.web.asgi.replies import (
    AUTH_KEY,
    CARDS_KEY,
    RUNTIME_KEY,
    error_response,
    exception_reply,
    response_of,
)
from blazar.web.front import AppParts, Framework, build_telemetry, open_gateway
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.tracing import RequestTracer
from blazar.web.routes import discovery, framework_served
from blazar.web.routes.admin.telemetry import TELEMETRY_KEY
from blazar.web.routes.openai import realtime

__all__ = ["GatewayMiddleware", "build_gateway", "create_app"]


_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE", 400: "BAD_REQUEST"}
SHUTDOWN_KEY = "BLAZAR_SHUTDOWN"
"""The app config key of the event that ``POST /admin/shutdown`` sets."""


def build_gateway(
    runtime: Runtime, config: Config, *, log_dir: str | None = None, tracer: RequestTracer | None = None
) -> GatewayMiddleware:
    """The ASGI application hypercorn serves: the gateway layer, its own routes, the app
    (built here); ``tracer`` traces each request (``blazar.web.middleware.tracing``).
    ``gateway.telemetry.audit``, when there is one, is started here; close it at shutdown
    (``gateway.telemetry.close()``)."""
    gateway = open_gateway(runtime, config, log_dir=log_dir, tracer=tracer)
    assert isinstance(gateway.app, Framework)
    gateway.app = gateway.app.build()
    return gateway


def create_app(
    runtime: Runtime,
    config: Config,
    *,
    cards: Cards | None = None,
    auth: Auth | None = None,
    telemetry: Telemetry | None = None,
    parts: AppParts | None = None,
) -> QuartTrio:
    """The Quart app: every route the gateway layer does not serve itself; ``parts``, what
    it shares with the gateway (``blazar.web.front``). Without that layer in front (the
    framework's test client) the app still runs, unguarded."""
    if parts is not None:
        cards, telemetry, auth = parts.cards, parts.telemetry, parts.auth
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
    if parts is not None:
        app.extensions[discovery.HOT_ROUTES_KEY] = parts.hot_routes
        if parts.shutdown is not None:
            app.config[SHUTDOWN_KEY] = parts.shutdown
    for module in framework_served():
        module.register(app)
    return app
