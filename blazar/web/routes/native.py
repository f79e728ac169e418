"""``/health``, ``/healthz`` and ``GET /api/errors`` (the ``blazar_code`` catalog).

The gateway answers ``GET /health`` and ``GET /healthz`` itself (``register_routes``): a
daemon that is starting answers them before its framework is imported, and a client that
waits for the daemon asks them first. The framework keeps them too (HEAD, and the app
without the gateway in front)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from blazar import __version__
from blazar.errors import CATALOG
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.replies import JSON

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

    from actors.runtime import Runtime

__all__ = ["register", "register_routes"]

_HEALTH = msgspec.json.encode({"status": "ok", "version": __version__})


async def health() -> dict[str, Any]:
    return {"status": "ok", "version": __version__}


async def _health(call: Call) -> Reply:
    return Reply(_HEALTH)


async def errors() -> Response:
    from quart import Response

    return Response(
        msgspec.json.encode({"object": "list", "data": list(CATALOG.values())}), content_type=JSON
    )


def register_routes(routes: Routes, runtime: Runtime) -> None:
    routes.add_get("/health", _health)
    routes.add_get("/healthz", _health)


def register(app: QuartTrio) -> None:
    app.get("/health")(health)
    app.get("/healthz")(health)
    app.get("/api/errors")(errors)
