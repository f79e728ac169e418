"""The ASGI layer: a cancel from another connection never lands inside the server's send."""

from __future__ import annotations

from typing import Any

import trio

from blazar.web.app import GatewayMiddleware
from blazar.web.cards import Cards, CardState


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-length", b"2")],
        "client": ("127.0.0.1", 5000),
    }


async def test_cancel_during_final_send_lets_the_server_finish_it() -> None:
    """Hypercorn recycles a keep-alive connection inside the last send; if a cancel
    interrupted it there, the connection would never read the next request."""
    cards = Cards()
    in_final_send = trio.Event()
    server_finished: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def server_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            in_final_send.set()
            await trio.sleep(0.05)  # the server's own checkpoints while it recycles
        server_finished.append(message)

    middleware = GatewayMiddleware(app, cards=cards)

    async def cancel_when_in_final_send() -> None:
        await in_final_send.wait()
        (card,) = cards.live.values()
        assert card.end_from_outside(CardState.CANCELLED, "test")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_when_in_final_send)
        await middleware(_scope(), receive, server_send)

    assert [m.get("more_body") for m in server_finished if m["type"] == "http.response.body"] == [
        True,
        False,
    ]
    (card,) = cards.finished
    assert card.state is CardState.CANCELLED
