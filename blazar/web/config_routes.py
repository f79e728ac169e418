"""Config reload and explicit loads: ``POST /admin/config/reload``, ``POST /admin/models/NAME/load``.

``/admin/config/reload`` reads ``config.toml`` again (as strictly as at start) and applies
what can change while the daemon runs (``actors/reload.py`` says which keys): the answer
names the keys applied, the models whose engines restart with new settings once their
requests end, and the keys that wait for a daemon restart. A file that does not load is
refused with 422 ``CONFIG_INVALID`` and changes nothing.

``/admin/models/NAME/load`` makes a model's engine ready now, optionally with another
per-slot context (``ctx``, clamped to what the model can serve as a request's ``num_ctx``
is) and slot count (``slots``): the engine restarts with them once its requests end. The
answer is the model's ready card: lane and version, context, slots, the memory estimate,
the models evicted to make room and the load time. ``keep_alive_s`` arms its idle timer as
a request's keep-alive would; ``vision`` refuses a model without a vision projector.
"""

from __future__ import annotations

import time
from typing import Annotated

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.context import choose_context
from actors.engine import Reconfigure
from actors.reload import apply_config
from blazar.config import ConfigError, load_config, resolve_paths
from blazar.errors import BlazarError
from blazar.serve.prompt_fit import ctx_ceiling
from blazar.web.common import app_runtime, json_response, read_body

__all__ = ["register"]


class _LoadBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ctx: Annotated[int, msgspec.Meta(ge=256)] | None = None
    slots: Annotated[int, msgspec.Meta(ge=1, le=256)] | None = None
    keep_alive_s: float | None = None
    vision: bool = False


class ReadyCard(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    engine: str
    lane: str
    version: str | None
    pid: int | None
    slots: int
    ctx_per_slot: int
    """What the running engine serves per slot."""
    ctx_asked: int | None
    """The context asked for, when it was lowered to what the model can serve."""
    memory_bytes: int | None
    """The estimated footprint at these settings (None: unknown)."""
    evicted: list[str]
    load_s: float
    keep_alive_s: float | None
    vision: bool


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
    engine = await runtime.engine_for(name)
    spec = engine.spec
    if asked.vision and spec.projector is None:
        raise BlazarError(
            "VISION_PROJECTOR_MISSING",
            f"model '{spec.model}' reads no images (it has no vision projector) — pick a model that "
            "has one (`blazar show NAME` lists its capabilities)",
        )
    ctx, clamped = None, None
    if asked.ctx is not None:
        choice = choose_context(
            asked.ctx, ctx_ceiling(engine), strict=runtime.config.strict, model=spec.model, what="ctx"
        )
        ctx, clamped = choice.ctx, (asked.ctx if choice.clamped else None)
    slots = asked.slots if asked.slots is not None and asked.slots != spec.slots else None
    if slots is not None or (ctx is not None and ctx != (engine.served_ctx or spec.ctx_per_slot)):
        base = msgspec.structs.replace(spec, slots=slots) if slots is not None else None
        await engine.ask(Reconfigure(ctx_per_slot=ctx, spec=base))
    started = time.monotonic()
    handle, evicted = await runtime.ready(engine)
    load_s = time.monotonic() - started
    model = engine.spec.model
    runtime.lifecycle.touch_nowait(model, asked.keep_alive_s)
    card = ReadyCard(
        model=model,
        engine=engine.engine_kind,
        lane=engine.spec.lane,
        version=engine.version,
        pid=handle.pid,
        slots=engine.spec.slots,
        ctx_per_slot=engine.served_ctx or engine.spec.ctx_per_slot,
        ctx_asked=clamped,
        memory_bytes=runtime.memory.footprint(model),
        evicted=list(evicted),
        load_s=round(load_s, 3),
        keep_alive_s=asked.keep_alive_s,
        vision=engine.spec.projector is not None,
    )
    return json_response(msgspec.to_builtins(card))


def register(app: QuartTrio) -> None:
    """``POST /admin/config/reload`` and ``POST /admin/models/NAME/load``."""
    app.post("/admin/config/reload")(reload)
    app.post("/admin/models/<path:name>/load")(load)
