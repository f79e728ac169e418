"""The gateway's middleware steps, each alone: the host guard, the CORS grant and preflight,
the exchange (what the gateway sees of a request's messages and records of it), and the
order the gateway runs them in."""

from __future__ import annotations

from typing import Any, cast

import trio

from blazar.errors import BlazarError
from blazar.serve.cards import Cards, CardState
from blazar.web.asgi.call import Call
from blazar.web.asgi.gateway import GatewayMiddleware
from blazar.web.middleware.auth import Auth
from blazar.web.middleware.cors import CorsPolicy, send_preflight
from blazar.web.middleware.exchange import Exchange
from blazar.web.middleware.host_guard import HostGuard

APP = "https://app.example"
CHAT = "/v1/chat/completions"


def _call(headers: dict[str, str] | None = None, *, method: str = "POST", path: str = CHAT) -> Call:
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"method": method, "path": path, "headers": raw, "client": ("127.0.0.1", 5000)}
    return Call(scope, trace_id="blz-t-1", max_body=1 << 20)


def _collector() -> tuple[list[dict[str, Any]], Any]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return sent, send


def _exchange(call: Call, send: Any, receive: Any = None, **kw: Any) -> Exchange:
    settings: dict[str, Any] = {"grant": None, "traceparent": None, "keep_answer": False, **kw}
    return Exchange(call, receive, send, **settings)


# The host guard


def test_the_host_guard_lets_local_names_through_and_refuses_others() -> None:
    guard = HostGuard(["box.lan"])
    for host in ("127.0.0.1:11435", "localhost", "LOCALHOST:1", "[::1]:11435", "box.lan:80", ""):
        assert guard.refusal({"host": host}) is None, host
    refusal = guard.refusal({"host": "evil.example:11435"})
    assert isinstance(refusal, BlazarError) and refusal.code == "HOST_FORBIDDEN"
    assert "evil.example" in str(refusal) and "allowed_hosts" in str(refusal)


def test_the_host_guard_refuses_foreign_origins_unless_cors_grants_them() -> None:
    local = {"host": "127.0.0.1"}
    assert HostGuard().refusal({**local, "origin": "http://localhost:3000"}) is None
    assert HostGuard().refusal({**local, "origin": "vscode-webview://abc"}) is None
    for origin in (APP, "null"):
        refusal = HostGuard().refusal({**local, "origin": origin})
        assert refusal is not None and refusal.code == "HOST_FORBIDDEN" and "cors_origins" in str(refusal)
    granted = HostGuard(cors=CorsPolicy([APP]))
    assert granted.refusal({**local, "origin": APP}) is None
    # A granted origin still needs a local Host (DNS rebinding).
    assert granted.refusal({"host": "app.example", "origin": APP}) is not None


def test_the_host_guard_applies_to_loopback_binds_only() -> None:
    assert HostGuard.applies_to("127.0.0.1") and HostGuard.applies_to("127.0.0.2")
    assert HostGuard.applies_to("localhost") and HostGuard.applies_to("::1")
    assert not HostGuard.applies_to("0.0.0.0") and not HostGuard.applies_to("192.168.1.5")


# CORS


def test_the_grant_is_for_browsers_from_granted_origins_only() -> None:
    cors = CorsPolicy([APP])
    assert cors.grant_for({}) is None  # every SDK, curl and program
    assert cors.grant_for({"origin": "https://evil.example"}) is None
    grant = dict(cors.grant_for({"origin": APP}) or [])
    assert grant[b"access-control-allow-origin"] == APP.encode()
    assert grant[b"access-control-allow-credentials"] == b"true" and grant[b"vary"] == b"Origin"


def test_a_preflight_is_an_options_with_origin_and_request_method() -> None:
    cors = CorsPolicy([APP])
    asks = {"origin": APP, "access-control-request-method": "POST"}
    headers = dict(cors.preflight_for("OPTIONS", asks) or [])
    assert headers[b"access-control-allow-origin"] == APP.encode()
    assert b"POST" in headers[b"access-control-allow-methods"]
    assert cors.preflight_for("POST", asks) is None
    assert cors.preflight_for("OPTIONS", {"origin": APP}) is None  # a plain OPTIONS
    assert cors.preflight_for("OPTIONS", {"access-control-request-method": "POST"}) is None
    assert cors.preflight_for("OPTIONS", {**asks, "origin": "https://evil.example"}) is None


async def test_send_preflight_answers_204_without_a_body() -> None:
    sent, send = _collector()
    await send_preflight([(b"vary", b"Origin")], send)
    assert sent == [
        {"type": "http.response.start", "status": 204, "headers": [(b"vary", b"Origin")]},
        {"type": "http.response.body", "body": b"", "more_body": False},
    ]


# The exchange


async def test_the_head_of_an_answer_is_stamped() -> None:
    sent, send = _collector()
    grant = CorsPolicy([APP]).grant_for({"origin": APP})
    exchange = _exchange(_call(), send, grant=grant, traceparent=b"00-ab-cd-01")
    head = [(b"content-type", b"application/json"), (b"x-blazar-ctx-clamped", b"1")]
    await exchange.send({"type": "http.response.start", "status": 201, "headers": head})
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == exchange.status == 201 and exchange.started
    assert headers[b"x-blazar-trace-id"] == b"blz-t-1" and headers[b"traceparent"] == b"00-ab-cd-01"
    assert headers[b"access-control-allow-origin"] == APP.encode()
    exposed = headers[b"access-control-expose-headers"].split(b", ")
    assert b"x-blazar-trace-id" in exposed and b"x-blazar-ctx-clamped" in exposed
    assert b"connection" not in headers  # no body: read whole from the start


async def test_an_answer_before_the_whole_body_closes_the_connection() -> None:
    sent, send = _collector()
    messages = [{"type": "http.request", "body": b"{}", "more_body": True}]

    async def receive() -> dict[str, Any]:
        return messages.pop()

    exchange = _exchange(_call({"content-length": "4"}), send, receive)
    assert not exchange.body_done
    await exchange.receive()
    assert not exchange.body_done  # more to come
    await exchange.send({"type": "http.response.start", "status": 413, "headers": []})
    assert dict(sent[0]["headers"])[b"connection"] == b"close"


async def test_sending_counts_the_answer_and_the_card() -> None:
    cards = Cards()
    call = _call({"content-length": "2"})
    call.card = cards.open(call.trace_id, CHAT)
    _, send = _collector()
    exchange = _exchange(call, send, keep_answer=True)
    await exchange.send({"type": "http.response.start", "status": 200, "headers": []})
    await exchange.send({"type": "http.response.body", "body": b"", "more_body": True})
    assert exchange.first_body_s is None  # an empty body is no first byte
    for chunk in (b"data: a\n\n", b"data: bb\n\n"):
        await exchange.send({"type": "http.response.body", "body": chunk, "more_body": True})
    assert not exchange.done
    await exchange.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert exchange.done and exchange.sent == 19 and exchange.first_body_s is not None
    assert call.card.chunks == 2 and call.card.bytes_out == 19 and call.card.first_byte_s is not None
    assert exchange.answer == [b"data: a\n\n", b"data: bb\n\n"]


async def test_what_arrives_while_waiting_for_the_client_to_go_is_kept_for_the_route() -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.request", "body": b"}", "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    exchange = _exchange(_call({"content-length": "2"}), None, receive)
    await exchange.client_gone()
    assert exchange.disconnected and exchange.body_done
    assert [m.get("body") for m in (await exchange.receive(), await exchange.receive())] == [b"{", b"}"]
    assert exchange.early == []


def test_the_record_of_a_request_that_sent_nothing_is_499() -> None:
    call = _call()
    call.model, call.key = "m", "ci"
    record = _exchange(call, None).record()
    assert record.status == 499 and record.bytes_out == 0 and record.ttft_ms is None
    assert (record.trace_id, record.method, record.path, record.key) == ("blz-t-1", "POST", CHAT, "ci")
    assert record.model == "m" and record.client == "127.0.0.1" and record.blazar_code is None


def test_the_record_takes_a_failure_after_the_head_from_the_card() -> None:
    cards = Cards()
    call = _call()
    call.card = cards.open(call.trace_id, CHAT)
    call.card.note_failure("ENGINE_CRASHED", "the engine died with key sk-abcdefghijklmnopqrstuvwx")
    exchange = _exchange(call, None)
    exchange.status = 200
    record = exchange.record()
    assert record.status == 200 and record.blazar_code == "ENGINE_CRASHED"
    assert record.error is not None and "sk-abcdefghijklmnopqrstuvwx" not in record.error  # scrubbed
    call.code, call.error = "BAD_REQUEST", "no"  # the request's own code wins
    assert exchange.record().blazar_code == "BAD_REQUEST"


# The order the gateway runs the steps in


class _Auth:
    """Records the key step's calls; refuses when told to."""

    def __init__(self, events: list[str], refuse: bool = False) -> None:
        self.events = events
        self.refuse = refuse

    async def enter(self, call: Call, gone: Any = None) -> BlazarError | None:
        self.events.append("auth.enter")
        return BlazarError("UNAUTHORIZED", "no key") if self.refuse else None

    def leave(self, call: Call) -> None:
        self.events.append("auth.leave")


class _Guard(HostGuard):
    def __init__(self, events: list[str]) -> None:
        super().__init__(cors=CorsPolicy([APP]))
        self.events = events

    def refusal(self, headers: Any) -> BlazarError | None:
        self.events.append("guard")
        return super().refusal(headers)


def _receiver() -> Any:
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await trio.sleep_forever()
        raise AssertionError

    return receive


async def test_the_host_guard_runs_before_the_key_and_a_refusal_gets_no_grant() -> None:
    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("a refused request must not reach a route")

    gateway = GatewayMiddleware(
        app,
        guard=_Guard(events),
        auth=cast(Auth, _Auth(events)),
        cors=CorsPolicy([APP]),
    )
    sent, send = _collector()
    headers = [(b"host", b"evil.example"), (b"origin", APP.encode())]  # a listed origin, rebound
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": headers, "client": None}
    await gateway(scope, _receiver(), send)
    assert events == ["guard", "auth.leave"]  # never asked for a key; its place (none) freed
    start = sent[0]
    assert start["status"] == 403
    assert b"access-control-allow-origin" not in dict(start["headers"])
    assert dict(start["headers"])[b"x-blazar-trace-id"].startswith(b"blz-")


async def test_a_preflight_passes_the_key_step_and_never_reaches_the_app() -> None:
    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("a preflight is the gateway's to answer")

    cards = Cards()
    gateway = GatewayMiddleware(
        app,
        cards=cards,
        guard=_Guard(events),
        auth=cast(Auth, _Auth(events)),
        cors=CorsPolicy([APP]),
    )
    sent, send = _collector()
    headers = [
        (b"host", b"127.0.0.1"),
        (b"origin", APP.encode()),
        (b"access-control-request-method", b"POST"),
    ]
    scope = {"type": "http", "method": "OPTIONS", "path": CHAT, "headers": headers, "client": None}
    await gateway(scope, _receiver(), send)
    assert events == ["guard", "auth.enter", "auth.leave"]
    assert sent[0]["status"] == 204
    assert b"x-blazar-trace-id" not in dict(sent[0]["headers"])  # sent as the policy made it
    assert not cards.live and not cards.finished  # only a POST opens a card


async def test_a_request_ended_from_outside_before_its_head_is_answered_by_the_gateway() -> None:
    cards = Cards()
    started = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.set()
        await trio.sleep_forever()

    gateway = GatewayMiddleware(app, cards=cards)
    sent, send = _collector()
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": CHAT, "headers": [], "client": None}

    async def cancel() -> None:
        await started.wait()
        (card,) = cards.live.values()
        card.end_from_outside(CardState.CANCELLED, "by the operator")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel)
        await gateway(scope, _receiver(), send)
    assert sent[0]["status"] == 499
    (card,) = cards.finished
    assert card.state is CardState.CANCELLED and card.status == 499
    assert gateway.in_flight == 0
