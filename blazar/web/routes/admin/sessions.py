"""Saved prompt caches (``blazar session``): admin routes over ``actors/sessions.py``.

- ``GET /admin/sessions[?model=NAME]``: ``{"sessions": [...]}``, the bank's included.
- ``POST /admin/sessions/save`` ``{"model", "name", "slot"?}``: the model's slot holding the
  longest prompt (or ``slot``) saved as ``name``; the model must be loaded.
- ``POST /admin/sessions/restore`` ``{"model", "name", "slot"?}``: the session read back into
  a slot (its own, or ``slot``), loading the model if need be; refused for a session saved
  from other weights.
- ``DELETE /admin/sessions/<name>[?model=NAME]``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio

from actors.engine import EngineActor
from actors.errors import SessionError
from actors.sessions import (
    check_name,
    list_sessions,
    read_session,
    remove_session,
    restore_slot,
    save_slot,
    save_warmest,
)
from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, read_body

__all__ = ["register"]


class _SessionBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    name: str
    slot: int | None = None


def _decode(body: bytes, route: str) -> _SessionBody:
    try:
        return msgspec.json.decode(body, type=_SessionBody)
    except msgspec.ValidationError as exc:
        raise BlazarError("BAD_REQUEST", f"invalid body for {route}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not valid JSON: {exc}") from None


def _folder(engine: EngineActor) -> Path:
    if not engine.spec.slot_save_path or not engine.spec.digest:
        raise SessionError(
            "SESSION_UNSUPPORTED",
            f"the engine of '{engine.spec.model}' cannot save slots: sessions need a llama.cpp "
            "engine that generates text",
        )
    return Path(engine.spec.slot_save_path)


def _check_slot(engine: EngineActor, slot: int | None) -> None:
    if slot is not None and not 0 <= slot < engine.spec.slots:
        raise BlazarError(
            "BAD_REQUEST",
            f"slot {slot} does not exist: '{engine.spec.model}' has slots 0-{engine.spec.slots - 1}",
        )


async def list_route() -> Response:
    home = app_runtime().config.home
    model = request.args.get("model")
    if model:
        model = (await trio.to_thread.run_sync(app_runtime().store.get, model)).name
    found = await trio.to_thread.run_sync(lambda: list_sessions(home, model))
    return json_response({"sessions": found})


async def save_route() -> Response:
    body = _decode(await read_body(), "/admin/sessions/save")
    check_name(body.name)
    runtime = app_runtime()
    engine = await runtime.engine_for(body.model)
    folder = _folder(engine)
    _check_slot(engine, body.slot)
    handle = engine.ready_handle()
    if handle is None:
        raise SessionError(
            "SESSION_EMPTY",
            f"model '{engine.spec.model}' is not loaded, so no slot holds a prompt — send it a "
            "request, then save",
        )
    assert engine.spec.digest is not None
    ctx = handle.served_ctx or engine.spec.ctx_per_slot
    with engine.lease():  # no keep-alive unload while the files are written
        if body.slot is None:
            info = await save_warmest(
                handle.client, folder, slots=engine.spec.slots, name=body.name, model=engine.spec.model,
                digest=engine.spec.digest, ctx_per_slot=ctx,
            )  # fmt: skip
        else:
            saved = await save_slot(
                handle.client, folder, slot=body.slot, name=body.name, model=engine.spec.model,
                digest=engine.spec.digest, ctx_per_slot=ctx,
            )  # fmt: skip
            if saved is None:
                raise SessionError(
                    "SESSION_EMPTY",
                    f"slot {body.slot} of '{engine.spec.model}' holds no prompt — send it a request first",
                )
            info = saved
    return json_response({"session": info})


async def restore_route() -> Response:
    body = _decode(await read_body(), "/admin/sessions/restore")
    check_name(body.name)
    runtime = app_runtime()
    engine = await runtime.engine_for(body.model)
    folder = _folder(engine)
    _check_slot(engine, body.slot)
    info = await trio.to_thread.run_sync(read_session, folder, body.name)
    if info is None:
        raise SessionError(
            "SESSION_NOT_FOUND",
            f"model '{engine.spec.model}' has no session '{body.name}' — see `blazar session list`",
        )
    if info.digest != engine.spec.digest:
        raise SessionError(
            "SESSION_MODEL_MISMATCH",
            f"session '{body.name}' was saved from other weights ({info.digest[:19]}) than "
            f"'{engine.spec.model}' has now ({(engine.spec.digest or '')[:19]}): save it again",
        )
    handle = await runtime.make_ready(engine)
    ctx = handle.served_ctx or engine.spec.ctx_per_slot
    if info.tokens > ctx:
        raise SessionError(
            "BAD_REQUEST",
            f"session '{body.name}' holds {info.tokens} tokens, more than a slot of "
            f"'{engine.spec.model}' holds now ({ctx}): raise its context and retry",
        )
    slot = body.slot if body.slot is not None else (info.slot if info.slot < engine.spec.slots else 0)
    with engine.lease():
        restored = await restore_slot(handle.client, slot=slot, name=body.name)
    return json_response({"session": info, "slot": slot, "tokens_restored": restored})


async def remove_route(name: str) -> Response:
    home = app_runtime().config.home
    model = request.args.get("model")
    if model:
        model = (await trio.to_thread.run_sync(app_runtime().store.get, model)).name
    removed = await trio.to_thread.run_sync(lambda: remove_session(home, name, model))
    return json_response({"removed": removed})


def register(app: QuartTrio) -> None:
    app.get("/admin/sessions")(list_route)
    app.post("/admin/sessions/save")(save_route)
    app.post("/admin/sessions/restore")(restore_route)
    app.delete("/admin/sessions/<name>")(remove_route)
