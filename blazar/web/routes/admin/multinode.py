"""The worker's side of a multi-node engine, over HTTP (admin scope): a head daemon's peer link.

``POST /admin/multinode/parts`` (a ``NodePart``) starts this node's part over the model in
this daemon's store and answers its ``PartView`` (201); ``GET /admin/multinode/parts`` lists
the parts, ``GET /admin/multinode/parts/ID`` reports one (and renews its lease), ``DELETE
/admin/multinode/parts/ID`` stops it. What is done is the runtime's (``actors/node_parts.py``;
the head's side is ``actors/multinode_head.py``).
"""

from __future__ import annotations

from quart import Response
from quart_trio import QuartTrio

from actors.engines.multinode import NodePart
from actors.node_parts import ListParts, SeePart, StopPart
from blazar.dialects._wire import decode_json
from blazar.web.asgi.replies import app_runtime, json_response, read_body

__all__ = ["register"]


async def start_part() -> Response:
    part = decode_json(await read_body(), NodePart)
    return json_response(await app_runtime().parts.start(part), 201)


async def list_parts() -> Response:
    return json_response({"parts": await app_runtime().parts.ask(ListParts())})


async def see_part(part_id: str) -> Response:
    return json_response(await app_runtime().parts.ask(SeePart(id=part_id)))


async def stop_part(part_id: str) -> Response:
    return json_response(await app_runtime().parts.ask(StopPart(id=part_id)))


def register(app: QuartTrio) -> None:
    app.post("/admin/multinode/parts")(start_part)
    app.get("/admin/multinode/parts")(list_parts)
    app.get("/admin/multinode/parts/<part_id>")(see_part)
    app.delete("/admin/multinode/parts/<part_id>")(stop_part)
