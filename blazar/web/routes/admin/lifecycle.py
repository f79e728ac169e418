"""Model lifecycle routes: ``POST /api/evict``.

``{"model": NAME}`` unloads that model's engine (409 ``MODEL_BUSY`` while it
serves or has queued requests); ``{"model": null}`` or ``{}`` unloads every
idle model. The answer names what was unloaded: ``{"evicted": [NAME, …]}``.
"""

from __future__ import annotations

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, read_body

__all__ = ["register"]


class _EvictBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None


def _decode(body: bytes) -> _EvictBody:
    if not body.strip():
        return _EvictBody()
    try:
        return msgspec.json.decode(body, type=_EvictBody)
    except msgspec.ValidationError as exc:
        raise BlazarError("BAD_REQUEST", f"invalid body for /api/evict: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not valid JSON: {exc}") from None


async def evict() -> Response:
    runtime = app_runtime()
    name = _decode(await read_body()).model
    if name is None:
        return json_response({"evicted": await runtime.lifecycle.evict_idle()})
    engine = runtime.engine_if_loaded(name)
    if engine is None:
        # Not loaded: a name that is not installed at all is still a 404.
        await trio.to_thread.run_sync(runtime.store.get, name)
        return json_response({"evicted": []})
    model = engine.spec.model
    evicted = await runtime.lifecycle.unload(model, only_idle=True)
    return json_response({"evicted": [model] if evicted else []})


def register(app: QuartTrio) -> None:
    """``POST /api/evict``."""
    app.post("/api/evict")(evict)
