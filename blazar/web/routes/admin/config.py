"""Config reload and explicit loads: ``POST /admin/config/reload``, ``POST /admin/models/NAME/load``.

``/admin/config/reload`` reads ``config.toml`` again (as strictly as at start) and applies
what can change while the daemon runs (``actors/reload.py`` says which keys): the answer
names the keys applied, the models whose engines restart with new settings once their
requests end, and the keys that wait for a daemon restart. A file that does not load is
refused with 422 ``CONFIG_INVALID`` and changes nothing.

``/admin/models/NAME/load`` makes a model's engine ready now (``Runtime.load``: through the
request protocol, as a request would), optionally with another per-slot context (``ctx``,
clamped to what the model can serve as a request's ``num_ctx`` is) and slot count
(``slots``): the engine restarts with them once its requests end. The answer is the model's
ready card: lane and version, context, slots, the memory estimate, the models evicted to make
room and the load time. ``keep_alive_s`` arms its idle timer as a request's keep-alive would;
``vision`` refuses a model without a vision projector.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.reload import apply_config
from blazar.config import ConfigError, load_config, resolve_paths
from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, read_body

__all__ = ["register"]


class _LoadBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ctx: Annotated[int, msgspec.Meta(ge=256)] | None = None
    slots: Annotated[int, msgspec.Meta(ge=1, le=256)] | None = None
    keep_alive_s: float | None = None
    vision: bool = False


async def reload() -> Response:
    runtime = app_runtime()
    paths = resolve_paths()
    try:
        config = await trio.to_thread.run_sync(load_config, paths)
    except ConfigError as exc:
        raise BlazarError(
            "CONFIG_INVALID", f"{exc} — the daemon keeps running with its current settings"
        ) from None
    reloaded = await apply_config(runtime, config.runtime(paths))
    return json_response(msgspec.to_builtins(reloaded))


async def load(name: str) -> Response:
    runtime = app_runtime()
    body = await read_body()
    try:
        asked = msgspec.json.decode(body or b"{}", type=_LoadBody)
    except msgspec.ValidationError as exc:
        raise BlazarError("BAD_REQUEST", f"invalid body for /admin/models/NAME/load: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not valid JSON: {exc}") from None
    card = await runtime.load(
        name, ctx=asked.ctx, slots=asked.slots, keep_alive_s=asked.keep_alive_s, vision=asked.vision
    )
    return json_response(msgspec.to_builtins(card))


def register(app: QuartTrio) -> None:
    """``POST /admin/config/reload`` and ``POST /admin/models/NAME/load``."""
    app.post("/admin/config/reload")(reload)
    app.post("/admin/models/<path:name>/load")(load)
