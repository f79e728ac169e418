"""``/health``, ``/healthz`` and ``GET /api/errors`` (the ``blazar_code`` catalog)."""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response
from quart_trio import QuartTrio

from blazar import __version__
from blazar.errors import CATALOG
from blazar.web.asgi.replies import JSON

__all__ = ["register"]


async def health() -> dict[str, Any]:
    return {"status": "ok", "version": __version__}


async def errors() -> Response:
    return Response(
        msgspec.json.encode({"object": "list", "data": list(CATALOG.values())}), content_type=JSON
    )


def register(app: QuartTrio) -> None:
    app.get("/health")(health)
    app.get("/healthz")(health)
    app.get("/api/errors")(errors)
