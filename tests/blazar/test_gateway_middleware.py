"""The gateway layer: its own routes, and a cancel from another connection never lands
inside the server's send."""

from __future__ import annotations

import json
from typing import Any

import trio

from blazar.serve.cards import Cards, CardState
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.gateway import GatewayMiddleware


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


def _collector() -> tuple[list[dict[str, Any]], Any]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return sent, send


def _receiver(body: bytes) -> Any:
    """The body once, then nothing until the client goes (never, here)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await trio.sleep_forever()
        raise AssertionError

    return receive


async def _no_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    raise AssertionError("a gateway route must not reach the framework app")


async def test_a_gateway_route_answers_a_bug_with_json_500() -> None:
    routes = Routes()

    async def broken(call: Call) -> Reply:
        raise RuntimeError("boom")

    routes.add("/v1/chat/completions", broken)
    middleware = GatewayMiddleware(_no_app, routes=routes)
    sent, send = _collector()
    await middleware(_scope(), _receiver(b"{}"), send)
    start, body = sent
    assert start["status"] == 500
    error = json.loads(body["body"])["error"]
    assert error["blazar_code"] == "INTERNAL" and "RuntimeError" in error["message"]
    assert dict(start["headers"])[b"x-blazar-trace-id"].startswith(b"blz-")


async def test_other_methods_on_a_gateway_route() -> None:
    routes = Routes()

    async def never(call: Call) -> Reply:
        raise AssertionError("not for this method")

    routes.add("/v1/chat/completions", never)
    middleware = GatewayMiddleware(_no_app, routes=routes)
    for method, status in (("GET", 405), ("OPTIONS", 200)):
        sent, send = _collector()
        await middleware({**_scope(), "method": method, "headers": []}, _receiver(b""), send)
        assert sent[0]["status"] == status
        assert dict(sent[0]["headers"])[b"allow"] == b"OPTIONS, POST"


async def test_a_disconnect_mid_stream_cancels_the_route_and_closes_its_stream() -> None:
    """The client going away ends the relay at once: the stream is closed (which closes the
    upstream connection) and the ledger sees the request as ended by the client."""
    routes = Routes()
    closed = trio.Event()
    disconnect = trio.Event()

    class Endless:
        chunks = 0

        def __aiter__(self) -> Endless:
            return self

        async def __anext__(self) -> bytes:
            await trio.sleep(0.01)
            self.chunks += 1
            if self.chunks == 3:
                disconnect.set()  # the client goes away after the third chunk
            return b"data: x\n\n"

        async def aclose(self) -> None:
            closed.set()

    async def stream(call: Call) -> Reply:
        return Reply(Endless(), content_type="text/event-stream")

    routes.add("/v1/chat/completions", stream)
    cards = Cards()
    middleware = GatewayMiddleware(_no_app, cards=cards, routes=routes)
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await disconnect.wait()
        return {"type": "http.disconnect"}

    sent, send = _collector()

    with trio.fail_after(5):
        await middleware(_scope(), receive, send)
    assert closed.is_set()
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert 2 <= len(bodies) <= 3 and all(m["more_body"] for m in bodies)  # never "finished"
    (card,) = cards.finished
    assert card.state is CardState.DISCONNECTED
