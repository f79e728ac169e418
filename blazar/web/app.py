"""``build_gateway(runtime, config)``: the HTTP gateway — the gateway layer
(``blazar.web.gateway``, which serves the hot inference routes itself) around
the Quart app of ``create_app``, which serves the rest.

Every error — ours, the framework's (unknown route, wrong method, bad JSON)
and the unexpected — answers in JSON in the caller's dialect with a
``blazar_code``. Streams are never cut by a framework timeout.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, cast

import httpx
import msgspec
import trio
from quart import Response, current_app, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from actors.ledger import read_requests
from actors.runtime import Runtime
from blazar import __version__
from blazar.config import Config
from blazar.daemon_file import write_local_token
from blazar.dialects import unimplemented
from blazar.errors import CATALOG, BlazarError
from blazar.keys import ADMIN, KeyStore, keys_path
from blazar.serve.cards import Card, Cards, CardState, CardView
from blazar.serve.jobs import register_all
from blazar.serve.jobs.self_link import SelfLink
from blazar.serve.relay import crash_error
from blazar.telemetry.audit import AuditLog
from blazar.telemetry.observer import Telemetry
from blazar.telemetry.quantiles import QuantileWindow
from blazar.web import anthropic as web_anthropic
from blazar.web import audio as web_audio
from blazar.web import batches as web_batches
from blazar.web import bench_job, model_doctor, tune_job
from blazar.web import capacity as web_capacity
from blazar.web import config_routes as web_config
from blazar.web import console_api as web_console
from blazar.web import console_page as web_console_page
from blazar.web import conversations as web_conversations
from blazar.web import diagnostics as web_diagnostics
from blazar.web import failover as web_failover
from blazar.web import federation as web_federation
from blazar.web import images as web_images
from blazar.web import jobs as web_jobs
from blazar.web import lifecycle_routes as web_lifecycle
from blazar.web import mcp_routes as web_mcp
from blazar.web import message_batches as web_message_batches
from blazar.web import ollama as web_ollama
from blazar.web import openai as web_openai
from blazar.web import pool_verbs as web_pool_verbs
from blazar.web import realtime as web_realtime
from blazar.web import responses as web_responses
from blazar.web import session_routes as web_sessions
from blazar.web import stored_completions as web_stored_completions
from blazar.web import telemetry_routes as web_telemetry
from blazar.web import utilities as web_utilities
from blazar.web import vectors as web_vectors
from blazar.web import videos as web_videos
from blazar.web.auth import is_loopback
from blazar.web.call import Call, Routes, current, current_or_none
from blazar.web.common import (
    CARDS_KEY,
    JSON,
    RUNTIME_KEY,
    app_runtime,
    error_response,
    exception_reply,
    response_of,
)
from blazar.web.gateway import GatewayMiddleware
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.cors import CorsPolicy
from blazar.web.middleware.host_guard import HostGuard
from blazar.web.middleware.tracing import RequestTracer
from blazar.web.telemetry_routes import TELEMETRY_KEY

__all__ = ["GatewayMiddleware", "build_gateway", "create_app", "link_of", "set_address"]


_AUTH_KEY = "blazar.auth"

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
    for module in (
        web_openai,
        web_ollama,
        web_anthropic,
        web_responses,
        web_audio,
        web_images,
        web_videos,
        web_utilities,
        web_vectors,
    ):
        module.register_routes(routes, runtime)
    web_federation.wrap_routes(routes, runtime)  # only with [[remotes]]
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
        tracer=tracer,
        telemetry=telemetry,
        cors=cors,
    )
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
    app.extensions[_AUTH_KEY] = auth
    app.extensions[web_realtime.DEFAULTS_KEY] = web_realtime.Defaults(
        transcription_model=config.realtime_transcription_model, voice=config.realtime_voice
    )
    _register(app)
    for module in (
        web_openai,
        web_anthropic,
        web_ollama,
        web_lifecycle,
        web_config,
        web_sessions,
        web_mcp,
        web_failover,
        web_federation,
        web_pool_verbs,
        web_capacity,
        web_diagnostics,
        web_responses,
        web_stored_completions,
        web_conversations,
        web_jobs,
        web_batches,
        web_message_batches,
        web_telemetry,
        web_console,
        web_console_page,
        web_audio,
        web_images,
        web_videos,
        web_realtime,
        model_doctor,
        bench_job,
        tune_job,
    ):
        module.register(app)
    return app


def _register(app: QuartTrio) -> None:
    """The native, admin and live-request routes."""
    app.get("/health")(health)
    app.get("/healthz")(health)
    app.get("/api/errors")(errors)
    app.get("/admin/engines")(admin_engines)
    app.get("/admin/engines/<path:name>/slots")(admin_slots)
    app.get("/admin/requests")(admin_requests)
    app.get("/admin/keys")(admin_keys)
    app.get("/v1/requests")(list_requests)
    app.get("/v1/requests/<card_id>")(get_request)
    app.post("/v1/requests/<card_id>/cancel")(cancel_request)
    app.post("/v1/requests/<card_id>/interrupt")(interrupt_request)
    app.post("/admin/models/<path:name>/unload")(admin_unload)
    app.post("/admin/models/<path:name>/forget")(admin_forget)
    app.post("/admin/models/<path:name>/adapters")(admin_adapters)
    app.post("/admin/shutdown")(admin_shutdown)
    app.post("/admin/engines/switch")(admin_switch_engines)


# -- native -----------------------------------------------------------


async def health() -> dict[str, Any]:
    return {"status": "ok", "version": __version__}


async def errors() -> Response:
    return Response(
        msgspec.json.encode({"object": "list", "data": list(CATALOG.values())}), content_type=JSON
    )


async def admin_engines() -> Response:
    return Response(msgspec.json.encode(app_runtime().statistics()), content_type=JSON)


async def admin_switch_engines() -> Response:
    """Move every engine to its lane's active version (``blazar engine use``): each drains first."""
    moved = await app_runtime().switch_engines()
    return Response(msgspec.json.encode({"moved": moved}), content_type=JSON)


async def admin_slots(name: str) -> Response:
    """The engine's own view of its slots (llama.cpp ``/slots``), for diagnostics: read under a
    lease, with no admission slot (``Runtime.lease``), so that it never waits behind the
    requests it shows."""
    async with app_runtime().lease(name) as (engine, handle):
        try:
            upstream = await handle.client.get("/slots", timeout=10.0)
        except httpx.HTTPError as exc:
            raise await crash_error(engine, handle, exc) from exc
    return Response(upstream.content, upstream.status_code, content_type=JSON)


async def admin_requests() -> Response:
    """The most recent finished requests from the ledger, newest first."""
    ledger_path = app_runtime().ledger.path
    limit = min(max(request.args.get("limit", 50, type=int) or 50, 1), 1000)
    trace_id = request.args.get("trace_id")
    records = await trio.to_thread.run_sync(
        lambda: read_requests(ledger_path, limit=limit, trace_id=trace_id)
    )
    return Response(msgspec.json.encode({"object": "list", "data": records}), content_type=JSON)


async def admin_keys() -> Response:
    """Every API key (names, scopes, limits; never a secret) and its usage since boot."""
    auth = cast(Auth | None, current_app.extensions.get(_AUTH_KEY))
    stats = auth.statistics() if auth is not None else {"object": "list", "auth": False, "data": []}
    return Response(msgspec.json.encode(stats), content_type=JSON)


# -- live requests ----------------------------------------------------


def _cards() -> Cards:
    return cast(Cards, current_app.extensions[CARDS_KEY])


def _card_view(card: Card) -> CardView:
    position = None
    if card.state is CardState.QUEUED and card.model and card.waiter_id is not None:
        position = app_runtime().admission.position(card.model, card.waiter_id)
    return card.view(position)


def _own(card: Card) -> bool:
    """A key sees and ends only its own requests; an admin key (and the local token) all."""
    grant = current().grant
    return grant is None or grant.allows_family(ADMIN) or card.key == grant.name


def _find_card(card_id: str) -> Card:
    card = _cards().get(card_id)
    if card is None or not _own(card):
        raise BlazarError("NOT_FOUND", f"no request {card_id} — see GET /v1/requests for the live ones")
    return card


async def list_requests() -> Response:
    model, state = request.args.get("model"), request.args.get("state")
    views = [
        _card_view(c)
        for c in _cards().all()
        if _own(c) and (model is None or c.model == model) and (state is None or c.state == state)
    ]
    return Response(msgspec.json.encode({"object": "list", "data": views}), content_type=JSON)


async def get_request(card_id: str) -> Response:
    return Response(msgspec.json.encode(_card_view(_find_card(card_id))), content_type=JSON)


async def cancel_request(card_id: str) -> Response:
    card = _find_card(card_id)
    ended = card.end_from_outside(CardState.CANCELLED, "cancelled by POST /v1/requests/{id}/cancel")
    return Response(msgspec.json.encode({"id": card_id, "cancelled": ended}), content_type=JSON)


async def interrupt_request(card_id: str) -> Response:
    card = _find_card(card_id)
    ended = card.end_from_outside(CardState.INTERRUPTED, "interrupted by POST /v1/requests/{id}/interrupt")
    return Response(msgspec.json.encode({"id": card_id, "interrupted": ended}), content_type=JSON)


async def admin_unload(name: str) -> dict[str, Any]:
    return {"model": name, "unloaded": await app_runtime().lifecycle.unload(name)}


async def admin_forget(name: str) -> dict[str, Any]:
    """Stop and drop the engine of a model whose file was removed or replaced."""
    await app_runtime().forget(name)
    return {"model": name, "forgotten": True}


async def admin_adapters(name: str) -> dict[str, Any]:
    """The model's LoRA adapters changed in the store: a running engine restarts with them
    once its requests have finished (``reloading``); otherwise its next start reads them."""
    return {"model": name, "reloading": await app_runtime().reload_adapters(name)}


async def admin_shutdown() -> dict[str, Any]:
    current_app.config["BLAZAR_SHUTDOWN"].set()
    return {"status": "stopping", "pid": os.getpid()}


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
