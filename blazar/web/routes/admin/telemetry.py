"""``GET /metrics`` (Prometheus text) and ``GET /api/quantiles`` (latency quantiles, JSON)."""

from __future__ import annotations

from typing import cast

import msgspec
from quart import Response, current_app
from quart_trio import QuartTrio

from blazar.telemetry.metrics import CONTENT_TYPE
from blazar.telemetry.observer import Telemetry
from blazar.web.asgi.replies import JSON

__all__ = ["TELEMETRY_KEY", "register"]

TELEMETRY_KEY = "blazar.telemetry"
"""Where ``create_app`` keeps the app's ``Telemetry`` among its extensions."""


def _telemetry() -> Telemetry:
    return cast(Telemetry, current_app.extensions[TELEMETRY_KEY])


async def metrics() -> Response:
    return Response(await _telemetry().metrics.render(), content_type=CONTENT_TYPE)


async def quantiles() -> Response:
    return Response(msgspec.json.encode(_telemetry().summary()), content_type=JSON)


def register(app: QuartTrio) -> None:
    app.get("/metrics")(metrics)
    app.get("/api/quantiles")(quantiles)
