"""``GET /v1/realtime?model=…``: OpenAI's Realtime API over a WebSocket.

The route checks the model before the upgrade (an unknown one gets a JSON error, not a
socket), accepts the subprotocol the client offered, and hands the socket to a
``blazar.serve.realtime_session.RealtimeSession``, which runs the voice loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quart import current_app, websocket
from quart_trio import QuartTrio

from blazar.dialects import realtime as rt
from blazar.errors import BlazarError
from blazar.serve.context import Ask
from blazar.serve.realtime_session import RealtimeSession
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import current_or_none
from blazar.web.asgi.replies import app_runtime, error_response

__all__ = ["DEFAULTS_KEY", "Defaults", "register"]

DEFAULTS_KEY = "blazar.realtime"


@dataclass(frozen=True)
class Defaults:
    """What a session starts with, from config.toml (``realtime_*``)."""

    transcription_model: str | None = None
    voice: str | None = None


async def realtime() -> Any:
    runtime = app_runtime()
    model = websocket.args.get("model") or None
    call = current_or_none()
    ask = ask_of(call) if call is not None else Ask()
    if model is not None:
        try:
            if call is not None:
                call.set_model(model)
            await runtime.engine_for(model)  # an unknown model is refused before the upgrade
        except BlazarError as exc:
            return error_response(exc.code, exc.message)
    defaults = current_app.extensions.get(DEFAULTS_KEY) or Defaults()
    session = rt.Session(
        id=rt.new_id("sess"),
        model=model,
        voice=defaults.voice,
        transcription_model=defaults.transcription_model,
    )
    # OpenAI's browser clients offer "realtime" beside the subprotocol that carries their key
    # (read by the gateway): the upgrade must choose one they offered.
    offered = websocket.requested_subprotocols
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    await RealtimeSession(runtime, session, ask).run(websocket.receive, websocket.send)
    return None


def register(app: QuartTrio) -> None:
    app.websocket("/v1/realtime")(realtime)
