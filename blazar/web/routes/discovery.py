"""``GET /.well-known/blazar``: what this daemon is and serves, for clients that discover it.

Its name and version, the dialects and the routes it serves (read from the routes
themselves, so the list cannot drift), the engine lanes installed here, the
``X-Blazar-*`` headers it understands and answers with (``blazar.web.headers``), and which
of its optional features are on. It says whether keys are required, never which keys,
peers or servers there are: like ``/health``, it is open.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
from quart import Response, current_app
from quart_trio import QuartTrio

from actors.engines.routing import installed as installed_lanes
from blazar import __version__
from blazar.config import Config
from blazar.web import headers
from blazar.web.asgi.replies import AUTH_KEY, JSON, app_runtime

__all__ = ["DISCOVERY_KEY", "HOT_ROUTES_KEY", "Features", "features_of", "register"]

DISCOVERY_KEY = "blazar.discovery"
HOT_ROUTES_KEY = "blazar.hot_routes"
"""The POST paths the gateway serves itself (set by ``build_gateway``)."""

_DIALECTS = {
    "openai": {"base": "/v1", "reference": "https://platform.openai.com/docs/api-reference"},
    "anthropic": {"base": "/v1/messages", "reference": "https://docs.anthropic.com/en/api/messages"},
    "ollama": {"base": "/api", "reference": "https://github.com/ollama/ollama/blob/main/docs/api.md"},
    "llamacpp": {"base": "/", "reference": "llama.cpp server's /tokenize, /detokenize, /infill, /rerank"},
}


class Features(msgspec.Struct, frozen=True, kw_only=True):
    """The optional features this daemon runs with (from its config)."""

    tls: bool
    otlp: bool
    audit_log: bool
    remotes: bool
    session_bank: bool
    mcp: bool
    failover: bool
    strict: bool
    cors_origins: bool
    workers: int
    """The data-plane worker processes (``workers``; 1: the daemon's own process)."""


def features_of(config: Config) -> Features:
    return Features(
        tls=config.tls_cert is not None and config.tls_key is not None,
        otlp=config.otel_endpoint is not None,
        audit_log=config.audit_log,
        remotes=bool(config.remotes),
        session_bank=config.session_bank,
        mcp=bool(config.mcp),
        failover=bool(config.failover),
        strict=config.strict,
        cors_origins=bool(config.cors_origins),
        workers=config.workers,
    )


def _endpoints() -> list[str]:
    found = {f"POST {path}" for path in current_app.extensions.get(HOT_ROUTES_KEY, ())}
    for rule in current_app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        for method in rule.methods or ():
            if method not in ("HEAD", "OPTIONS"):
                found.add(f"{method} {rule.rule}")
    return sorted(found, key=lambda e: (e.split(" ", 1)[1], e))


async def discovery() -> Response:
    runtime = app_runtime()
    auth = current_app.extensions.get(AUTH_KEY)
    lanes = await trio.to_thread.run_sync(installed_lanes, runtime.config.engine, runtime.config.home)
    features: Features = current_app.extensions[DISCOVERY_KEY]
    body: dict[str, Any] = {
        "object": "blazar.discovery",
        "name": "blazar",
        "version": __version__,
        "dialects": _DIALECTS,
        "endpoints": _endpoints(),
        "engines": [{"lane": name, "kind": lane.kind} for name, lane in lanes.items() if lane is not None],
        "headers": {"request": headers.REQUEST, "response": headers.RESPONSE},
        "features": {"keys": bool(auth is not None and auth.keys), **msgspec.structs.asdict(features)},
    }
    return Response(msgspec.json.encode(body), content_type=JSON)


def register(app: QuartTrio) -> None:
    app.get("/.well-known/blazar")(discovery)
