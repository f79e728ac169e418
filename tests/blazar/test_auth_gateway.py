"""API keys through the real gateway (hypercorn in-process, the instant upstream as engine):
who gets in, which routes and models a key reaches, and its limits."""

from __future__ import annotations

import stat
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from blazar.auth.keys import KeyStore, keys_path, parse_scopes
from blazar.web.asgi.ask import _client_key
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.gateway import GatewayMiddleware
from blazar.web.middleware.auth import Auth
from tests.instant import MODEL, Gateway, instant_config, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
ANTHROPIC = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
OLLAMA = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": False}


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def local_token(home: Path) -> dict[str, str]:
    return bearer((home / "run" / "local.token").read_text())


@asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[Gateway]:
    async with serve_gateway(instant_config(**settings)) as gw:
        with trio.fail_after(60):
            yield gw


@pytest.fixture
def keys(instant_home: Path) -> KeyStore:
    return KeyStore(keys_path(instant_home))


async def test_without_keys_the_loopback_daemon_is_open(instant_home: Path) -> None:
    async with gateway() as gw:
        r = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        assert (await gw.client.get("/admin/engines")).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "shape"),
    [
        ("GET", "/v1/models", None, "openai"),
        ("POST", "/v1/chat/completions", CHAT, "openai"),
        ("POST", "/v1/messages", ANTHROPIC, "anthropic"),
        ("GET", "/api/tags", None, "ollama"),
        ("POST", "/api/chat", OLLAMA, "ollama"),
        ("GET", "/admin/engines", None, "openai"),
    ],
)
async def test_once_a_key_exists_every_route_needs_one(
    instant_home: Path, keys: KeyStore, method: str, path: str, body: Any, shape: str
) -> None:
    keys.add("alice")
    async with gateway() as gw:
        r = await gw.client.request(method, path, json=body)
        assert r.status_code == 401, r.text
        doc = r.json()
        if shape == "anthropic":
            assert doc["type"] == "error" and doc["error"]["type"] == "authentication_error"
        elif shape == "ollama":
            assert isinstance(doc["error"], str)
        else:
            assert doc["error"]["type"] == "authentication_error"
        code = doc["error"]["blazar_code"] if shape == "openai" else doc["blazar_code"]
        assert code == "UNAUTHORIZED"
        assert "blazar keys add" in r.text
        for open_path in ("/health", "/healthz"):
            assert (await gw.client.get(open_path)).status_code == 200


async def test_a_wrong_key_is_refused_and_never_echoed(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("alice")
    wrong = secret[:-6] + "XXXXXX"
    async with gateway() as gw:
        for headers in (bearer(wrong), {"x-api-key": wrong}, {"authorization": f"Basic {secret}"}):
            r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["blazar_code"] == "UNAUTHORIZED"
            assert wrong not in r.text and secret not in r.text and wrong[4:12] not in r.text
        log = instant_home / "logs"
        assert not log.exists() or all(wrong not in p.read_text() for p in log.iterdir())


async def test_a_key_works_as_bearer_and_as_x_api_key(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("alice")
    async with gateway() as gw:
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
        assert r.status_code == 200, r.text
        r = await gw.client.post("/v1/messages", json=ANTHROPIC, headers={"x-api-key": secret})
        assert r.status_code == 200, r.text
        r = await gw.client.post("/api/chat", json=OLLAMA, headers=bearer(secret))
        assert r.status_code == 200, r.text


async def test_keys_added_rotated_and_removed_while_running_count_at_once(
    instant_home: Path, keys: KeyStore
) -> None:
    async with gateway() as gw:
        assert (await gw.client.get("/v1/models")).status_code == 200
        cli = KeyStore(keys_path(instant_home))  # another connection, as the CLI's
        _, old = cli.add("alice")
        assert (await gw.client.get("/v1/models")).status_code == 401
        assert (await gw.client.get("/v1/models", headers=bearer(old))).status_code == 200
        _, new = cli.rotate("alice")
        assert (await gw.client.get("/v1/models", headers=bearer(old))).status_code == 401
        assert (await gw.client.get("/v1/models", headers=bearer(new))).status_code == 200
        cli.add("bob")
        cli.remove("alice")
        assert (await gw.client.get("/v1/models", headers=bearer(new))).status_code == 401
        cli.remove("bob", force=True)
        assert (await gw.client.get("/v1/models")).status_code == 200  # no key left: open again


async def test_an_expired_key_is_refused_with_a_clear_message(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("old", expires_at=time.time() - 1)
    async with gateway() as gw:
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
        assert r.status_code == 401
        error = r.json()["error"]
        assert error["blazar_code"] == "KEY_EXPIRED" and "'old' expired at" in error["message"]
        r = await gw.client.post("/v1/messages", json=ANTHROPIC, headers={"x-api-key": secret})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


async def test_a_route_family_outside_the_key_s_scope_is_forbidden(
    instant_home: Path, keys: KeyStore
) -> None:
    _, embed_only = keys.add("embedder", families=("embeddings",))
    _, default = keys.add("default")
    _, admin = keys.add("root", families=("admin",))
    async with gateway() as gw:
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(embed_only))
        assert r.status_code == 403
        error = r.json()["error"]
        assert error["blazar_code"] == "KEY_SCOPE_FORBIDDEN" and "--scope chat" in error["message"]
        r = await gw.client.post("/v1/messages", json=ANTHROPIC, headers={"x-api-key": embed_only})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = await gw.client.post(
            "/api/generate", json={"model": MODEL, "prompt": "x"}, headers=bearer(embed_only)
        )
        assert r.status_code == 403 and r.json()["blazar_code"] == "KEY_SCOPE_FORBIDDEN"
        # admin routes and model verbs need `admin`, which the default scope leaves out
        for method, path in (("GET", "/admin/engines"), ("POST", "/api/pull"), ("DELETE", "/api/delete")):
            r = await gw.client.request(method, path, json={"model": "x"}, headers=bearer(default))
            assert r.status_code == 403, (path, r.text)
        assert (await gw.client.get("/admin/engines", headers=bearer(admin))).status_code == 200
        assert (
            await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(admin))
        ).status_code == 403
        # listings are for every key
        assert (await gw.client.get("/v1/models", headers=bearer(embed_only))).status_code == 200


async def test_a_model_outside_the_key_s_scope_is_forbidden_and_unlisted(
    instant_home: Path, keys: KeyStore
) -> None:
    _, other = keys.add("other", models=("qwen*",))
    _, mine = keys.add("mine", models=("smollm2*",))
    async with gateway() as gw:
        # load the model, so that /api/ps has it
        assert (
            await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(mine))
        ).status_code == 200
        for path, names in (
            ("/v1/models", lambda d: [m["id"] for m in d["data"]]),
            ("/api/tags", lambda d: [m["name"] for m in d["models"]]),
            ("/api/ps", lambda d: [m["name"] for m in d["models"]]),
            ("/api/capacity", lambda d: [m["name"] for m in d["installed"]]),
            ("/api/capacity", lambda d: [m["model"] for m in d["models"]]),
        ):
            listed: Callable[[Any], list[str]] = names
            shown = listed((await gw.client.get(path, headers=bearer(mine))).json())
            assert [n.removesuffix(":latest") for n in shown] == [MODEL], path
            assert listed((await gw.client.get(path, headers=bearer(other))).json()) == [], path
        for method, path, body, code_of in (
            ("POST", "/v1/chat/completions", CHAT, lambda d: d["error"]["blazar_code"]),
            ("POST", "/v1/completions", {"model": MODEL, "prompt": "x"}, lambda d: d["error"]["blazar_code"]),
            ("POST", "/v1/messages", ANTHROPIC, lambda d: d["error"]["blazar_code"]),
            ("POST", "/api/chat", OLLAMA, lambda d: d["blazar_code"]),
            ("POST", "/api/show", {"model": MODEL}, lambda d: d["blazar_code"]),
            ("GET", f"/v1/models/{MODEL}", None, lambda d: d["error"]["blazar_code"]),
        ):
            r = await gw.client.request(method, path, json=body, headers=bearer(other))
            assert r.status_code == 403, (path, r.text)
            assert code_of(r.json()) == "MODEL_NOT_IN_SCOPE", path
            assert "qwen*" in r.text


async def test_requests_per_minute_answer_429_with_retry_after(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("slow", rpm=2)
    async with gateway() as gw:
        for _ in range(2):
            assert (await gw.client.get("/v1/models", headers=bearer(secret))).status_code == 200
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
        assert r.status_code == 429 and r.json()["error"]["blazar_code"] == "RATE_LIMITED"
        assert 0 < int(r.headers["retry-after"]) <= 60
        assert "2 requests per minute" in r.json()["error"]["message"]
        r = await gw.client.post("/v1/messages", json=ANTHROPIC, headers={"x-api-key": secret})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
        (slow,) = stats["data"]
        assert slow["usage"]["requests_total"] == 2 and slow["usage"]["refused_rate"] == 2
        assert secret not in str(stats) and "digest" not in slow


async def _stream_until_first_chunk(
    client: httpx.AsyncClient, headers: dict[str, str], started: trio.Event
) -> int:
    body = {**CHAT, "stream": True, "max_tokens": 40, "bench_interval_ms": 50}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        async for _ in r.aiter_bytes():
            started.set()
        return r.status_code


async def test_a_key_over_max_concurrent_is_refused(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("one", max_concurrent=1)
    async with gateway() as gw, trio.open_nursery() as nursery:
        started = trio.Event()
        nursery.start_soon(_stream_until_first_chunk, gw.client, bearer(secret), started)
        await started.wait()
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
        assert r.status_code == 429, r.text
        assert (
            r.json()["error"]["blazar_code"] == "KEY_CONCURRENCY_LIMITED" and r.headers["retry-after"] == "1"
        )
        stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
        assert stats["data"][0]["usage"]["in_flight"] == 1
        assert stats["data"][0]["usage"]["refused_concurrency"] == 1
        nursery.cancel_scope.cancel()


async def test_a_key_over_max_concurrent_waits_when_configured_to(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("one", max_concurrent=1)
    async with gateway(key_concurrency="queue") as gw:
        results: list[int] = []
        async with trio.open_nursery() as nursery:
            started = trio.Event()

            async def first() -> None:
                results.append(await _stream_until_first_chunk(gw.client, bearer(secret), started))

            async def second() -> None:
                r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
                results.append(r.status_code)

            nursery.start_soon(first)
            await started.wait()
            nursery.start_soon(second)
            while True:  # the second waits behind the first, visibly
                stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
                if stats["data"][0]["usage"]["queued"] == 1:
                    break
                await trio.sleep(0.01)
            assert results == []
        assert results == [200, 200]


async def test_the_local_token_is_owner_only_and_has_every_scope(instant_home: Path, keys: KeyStore) -> None:
    keys.add("alice", families=("chat",))
    async with gateway() as gw:
        token = instant_home / "run" / "local.token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        headers = local_token(instant_home)
        assert (await gw.client.get("/admin/engines", headers=headers)).status_code == 200
        assert (await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
        assert (await gw.client.get("/admin/keys", headers=bearer("blz-local-guess"))).status_code == 401


async def test_a_key_sees_only_its_own_live_requests(instant_home: Path, keys: KeyStore) -> None:
    _, alice = keys.add("alice")
    _, bob = keys.add("bob")
    async with gateway() as gw:
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(alice))
        trace = r.headers["x-blazar-trace-id"]
        mine = (await gw.client.get("/v1/requests", headers=bearer(alice))).json()["data"]
        assert [c["trace_id"] for c in mine] == [trace]
        assert (await gw.client.get("/v1/requests", headers=bearer(bob))).json()["data"] == []
        assert (await gw.client.get(f"/v1/requests/{trace}", headers=bearer(bob))).status_code == 404
        everyone = (await gw.client.get("/v1/requests", headers=local_token(instant_home))).json()["data"]
        assert [c["trace_id"] for c in everyone] == [trace]


# -- tokens per minute and fairness, on the gateway layer with a stand-in route ----------------


def _middleware(tmp_path: Path, tokens: int) -> tuple[GatewayMiddleware, KeyStore]:
    """The real gateway layer and auth step; the chat route is a stand-in that reports
    ``tokens`` (prompt and completion) on the request's card, as the relay does."""
    store = KeyStore(keys_path(tmp_path))
    routes = Routes()

    async def chat(call: Call) -> Reply:
        assert call.card is not None and call.card.key == call.key
        call.card.prompt_tokens, call.card.completion_tokens = tokens - 1, 1
        return Reply(b"{}")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("only the gateway's own route is called")

    routes.add("/v1/chat/completions", chat)
    auth = Auth(KeyStore(keys_path(tmp_path)), local_token="blz-local-test")
    return GatewayMiddleware(app, routes=routes, auth=auth), store


async def test_tokens_per_minute_charge_what_each_request_used(tmp_path: Path) -> None:
    gateway, store = _middleware(tmp_path, tokens=60)
    _, secret = store.add("tok", tpm=100)
    transport = httpx.ASGITransport(app=gateway)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        for _ in range(2):  # 60 used, under 100: the second may start (and brings it to 120)
            r = await client.post("/v1/chat/completions", json={}, headers=bearer(secret))
            assert r.status_code == 200, r.text
        r = await client.post("/v1/chat/completions", json={}, headers=bearer(secret))
        assert r.status_code == 429 and r.json()["error"]["blazar_code"] == "RATE_LIMITED"
        assert "100 tokens per minute" in r.json()["error"]["message"]
        assert 0 < int(r.headers["retry-after"]) <= 60
    (stats,) = gateway.auth.statistics()["data"]  # type: ignore[union-attr]
    assert stats["usage"].tokens_total == 120 and stats["usage"].requests_total == 2


def test_fairness_uses_the_key_name_never_the_secret() -> None:
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("10.0.0.9", 1)}
    secret = "blz-" + "s" * 43

    def client_of(headers: dict[str, str], key: str | None = None) -> str:
        call = Call(
            {**scope, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]},
            trace_id="t",
            max_body=1,
        )
        call.key = key
        return _client_key(call)

    assert client_of(bearer(secret), key="alice") == "key:alice"
    unknown = client_of(bearer(secret))
    assert secret not in unknown and secret[4:] not in unknown and unknown.startswith("tok:")
    assert client_of({"x-api-key": secret}) == unknown  # the same token, either header
    assert client_of({"x-blazar-client": "batch:1"}, key="local") == "client:batch:1"
    assert client_of({}, key="local") == "addr:10.0.0.9"
    assert client_of({}) == "addr:10.0.0.9"


async def test_a_queued_client_that_disconnects_frees_its_place_at_once(
    instant_home: Path, keys: KeyStore
) -> None:
    _, secret = keys.add("one", max_concurrent=1)
    async with gateway(key_concurrency="queue") as gw:

        async def usage() -> dict[str, Any]:
            stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
            return dict(stats["data"][0]["usage"])

        async with trio.open_nursery() as holder:
            started = trio.Event()
            body = {**CHAT, "stream": True, "max_tokens": 2000, "bench_interval_ms": 50}

            held = trio.Event()

            async def hold() -> None:  # a long stream that keeps the key's one place
                async with gw.client.stream(
                    "POST", "/v1/chat/completions", json=body, headers=bearer(secret)
                ) as r:
                    async for _ in r.aiter_bytes():
                        started.set()
                held.set()

            holder.start_soon(hold)
            await started.wait()
            async with trio.open_nursery() as leaver:

                async def queue() -> None:
                    async with httpx.AsyncClient(base_url=str(gw.client.base_url), timeout=30) as other:
                        await other.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))

                leaver.start_soon(queue)
                while True:
                    if (await usage())["queued"] == 1:
                        break
                    await trio.sleep(0.01)
                leaver.cancel_scope.cancel()  # the client hangs up while queued
            while True:  # it leaves the queue while the stream runs on
                if (await usage())["queued"] == 0:
                    break
                await trio.sleep(0.01)
            assert (await usage())["in_flight"] == 1 and not held.is_set()  # the stream runs on
            holder.cancel_scope.cancel()
        # Its place was not leaked: with the stream gone the next request gets in at once.
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
        assert r.status_code == 200, r.text
        assert (await usage())["in_flight"] == 0


@pytest.mark.parametrize(
    ("scopes", "expect"),
    [
        (("metrics",), {"/metrics": 200, "/api/quantiles": 200, "/admin/engines": 403, "chat": 403}),
        (("admin",), {"/metrics": 200, "/api/quantiles": 200, "/admin/engines": 200, "explain": 200}),
        ((), {"/metrics": 403, "/api/quantiles": 403, "/admin/engines": 403, "explain": 403, "chat": 200}),
    ],
)
async def test_metrics_need_a_metrics_or_admin_key_and_diagnostics_admin(
    instant_home: Path, keys: KeyStore, scopes: tuple[str, ...], expect: dict[str, int]
) -> None:
    families = parse_scopes(list(scopes)).families
    _, secret = keys.add("k", families=families)
    async with gateway() as gw:
        for what, status in expect.items():
            if what == "chat":
                r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
            elif what == "explain":
                r = await gw.client.get(f"/api/explain/{MODEL}", headers=bearer(secret))
            else:
                r = await gw.client.get(what, headers=bearer(secret))
            assert r.status_code == status, (what, r.text)
            if status == 403:
                assert "KEY_SCOPE_FORBIDDEN" in r.text
        # The local token (the CLI: `blazar doctor`, `explain`, `why`) reaches them all.
        for path in ("/metrics", "/api/quantiles", f"/api/explain/{MODEL}"):
            assert (await gw.client.get(path, headers=local_token(instant_home))).status_code == 200


async def test_an_open_console_stream_holds_no_concurrency_place(instant_home: Path, keys: KeyStore) -> None:
    """A console tab left open must not use up a key's ``max_concurrent``."""
    _, secret = keys.add("ops", families=("chat", "metrics"), max_concurrent=1)
    async with gateway() as gw, trio.open_nursery() as nursery:
        opened = trio.Event()

        async def watch() -> None:
            async with gw.client.stream("GET", "/api/console/events", headers=bearer(secret)) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    opened.set()

        nursery.start_soon(watch)
        await opened.wait()
        r = await gw.client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
        assert r.status_code == 200, r.text
        stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
        usage = stats["data"][0]["usage"]
        assert usage["in_flight"] == 0 and usage["requests_total"] == 2  # the stream counts once for rpm
        nursery.cancel_scope.cancel()
