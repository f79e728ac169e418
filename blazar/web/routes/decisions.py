"""``POST /v1/systemone``: a typed decision about a text (a label, a yes or no, a number),
answered whole. It decodes (``blazar.dialects.decisions``), runs ``blazar.serve.decisions``
and sends the answer; docs/api.md (Decisions) has the wire."""

from __future__ import annotations

from actors.runtime import Runtime
from blazar.dialects import decisions
from blazar.serve.decisions import decide
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Reply, Routes

__all__ = ["DECISION_ROUTE", "register_routes"]

DECISION_ROUTE = "/v1/systemone"


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """The decision route, served by the gateway layer itself like the other inference routes."""

    async def systemone(call: Call) -> Reply:
        req = decisions.decode_request(call.body)
        call.set_model(req.model)
        body, engine_call = await decide(runtime, req, ask_of(call))
        return Reply(body, headers=engine_call.headers())

    routes.add(DECISION_ROUTE, systemone)
