"""``GET /api/explain/{model}``: the settings a model runs with and where each came from.

The answer is the runtime's own launch resolution (``actors.settings``), the code
that builds the engine's command line, so it cannot drift from what the engine
gets; for a loaded engine, settings a request changed (``num_ctx``) are shown as
the request's.
"""

from __future__ import annotations

import msgspec
from quart import Response
from quart_trio import QuartTrio

from blazar.web.common import JSON, app_runtime

__all__ = ["register"]


async def explain(name: str) -> Response:
    return Response(msgspec.json.encode(await app_runtime().explain(name)), content_type=JSON)


def register(app: QuartTrio) -> None:
    app.get("/api/explain/<path:name>")(explain)
