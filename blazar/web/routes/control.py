"""``POST /v1/chat/completions/control``: OpenAI chat steered by control vectors.

The route splits the body's ``control_vectors`` and ``control_vector_layers`` off
(``blazar.dialects.control``), decodes the rest as an OpenAI chat request and runs it on the
engine steered by that set (``blazar.serve.steering``). docs/api.md has the wire.
"""

from __future__ import annotations

from actors.runtime import Runtime
from blazar.dialects import control, openai
from blazar.serve.steering import answer_steered
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call, Reply, Routes

__all__ = ["CONTROL_ROUTE", "register_routes"]

CONTROL_ROUTE = "/v1/chat/completions/control"


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """The steered chat route, served by the gateway layer itself like plain chat."""

    async def steered_chat(call: Call) -> Reply:
        steering, call.body = control.split(call.body)  # the engine is sent plain chat
        req = openai.decode_chat_request(call.body)
        call.set_model(req.model)
        return await answer_steered(runtime, call, ask_of(call), req, steering)

    routes.add(CONTROL_ROUTE, steered_chat)
