"""``GET`` and ``POST /v1/adapters``: a model's LoRA adapters and their scales, read and
changed over HTTP (the same adapters as ``blazar lora``; ``docs/models.md#lora-adapters``).

``GET /v1/adapters?model=NAME`` lists them with the scale each starts with and, while the
model's engine runs, the scale it runs with. ``POST /v1/adapters`` with ``{"model": NAME,
"adapters": [{"name" or "id", "scale"}]}`` sets scales: kept in the store, and a running
engine restarts with them once its requests have finished (``restarting``)."""

from __future__ import annotations

from typing import Any

import msgspec
import trio
from quart import request
from quart_trio import QuartTrio

from blazar.dialects import lora
from blazar.dialects._wire import decode_json
from blazar.errors import BlazarError
from blazar.web.asgi.replies import app_runtime, json_response, read_body, set_model

__all__ = ["register"]


class _Change(msgspec.Struct, kw_only=True):
    model: str
    adapters: list[Any]
    """Entries as a request's ``lora`` gives them (``blazar.dialects.lora``): ``name`` or
    ``id``, and ``scale``."""


def _listing(record: Any, live: list[float] | None, *, restarting: bool | None = None) -> dict[str, Any]:
    data = [
        {"id": i, "name": a.name, "scale": a.scale, "rank": a.rank, "alpha": a.alpha, "size": a.size,
         "running_scale": live[i] if live is not None and i < len(live) else None}
        for i, a in enumerate(record.adapters)
    ]  # fmt: skip
    doc: dict[str, Any] = {"object": "list", "model": record.name, "running": live is not None, "data": data}
    if restarting is not None:
        doc["restarting"] = restarting
    return doc


async def list_adapters() -> Any:
    model = request.args.get("model")
    if not model:
        raise BlazarError("BAD_REQUEST", "say which model: GET /v1/adapters?model=NAME", param="model")
    set_model(model)
    runtime = app_runtime()
    record = await trio.to_thread.run_sync(runtime.store.get, model)  # 404 MODEL_NOT_FOUND
    return json_response(_listing(record, runtime.running_adapter_scales(record.name)))


async def set_adapters() -> Any:
    change = decode_json(await read_body(), _Change)
    set_model(change.model)
    if not change.adapters:
        raise BlazarError("BAD_REQUEST", "`adapters` is empty: give at least one {name or id, scale}")
    runtime = app_runtime()
    record = await trio.to_thread.run_sync(runtime.store.get, change.model)  # 404 MODEL_NOT_FOUND
    names = [adapter.name for adapter in record.adapters]
    chosen = lora.choose(change.adapters, names, model=record.name, param="adapters")
    scales: list[tuple[str | int, float]] = [(c["id"], c["scale"]) for c in chosen]
    record, restarting = await runtime.set_adapter_scales(record.name, scales)
    return json_response(_listing(record, runtime.running_adapter_scales(record.name), restarting=restarting))


def register(app: QuartTrio) -> None:
    app.get("/v1/adapters")(list_adapters)
    app.post("/v1/adapters")(set_adapters)
