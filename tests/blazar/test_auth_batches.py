"""Batch items run as the key that made the batch: its route-family and model scopes, its
limits, its name in the ledger. The real gateway with the instant upstream as engine, and
the gateway layer alone (a stand-in route, trio's virtual clock) for the waits."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from blazar.auth.keys import KeyStore, keys_path
from blazar.serve.context import ACT_AS
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.gateway import GatewayMiddleware
from blazar.web.middleware.auth import Auth
from tests.blazar.test_auth_gateway import ANTHROPIC, CHAT, bearer, gateway, local_token
from tests.instant import MODEL, Gateway

ENDED = ("completed", "failed", "cancelled", "expired")


@pytest.fixture
def keys(instant_home: Path) -> KeyStore:
    return KeyStore(keys_path(instant_home))


def _line(custom_id: str, model: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {**CHAT, "model": model},
    }


async def _openai_batch(
    gw: Gateway, secret: str, lines: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a batch of ``lines`` with the key ``secret``: the ended batch, and each line's
    output or error line by custom_id."""
    headers = bearer(secret)
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    upload = await gw.client.post(
        "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}, headers=headers
    )
    assert upload.status_code == 200, upload.text
    body = {
        "input_file_id": upload.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    r = await gw.client.post("/v1/batches", json=body, headers=headers)
    assert r.status_code == 200, r.text
    batch = r.json()
    while batch["status"] not in ENDED:
        await trio.sleep(0.02)
        batch = (await gw.client.get(f"/v1/batches/{batch['id']}", headers=headers)).json()
    results: dict[str, Any] = {}
    for file_id in (batch["output_file_id"], batch["error_file_id"]):
        if file_id is not None:
            content = await gw.client.get(f"/v1/files/{file_id}/content", headers=headers)
            for raw in content.content.splitlines():
                doc = json.loads(raw)
                results[doc["custom_id"]] = doc
    return batch, results


async def _ledger(gw: Gateway, home: Path, path: str, count: int) -> list[dict[str, Any]]:
    """The ledger's records of ``path`` once ``count`` of them are written (writes are batched)."""
    while True:
        r = await gw.client.get("/admin/requests", params={"limit": 500}, headers=local_token(home))
        found = [rec for rec in r.json()["data"] if rec["path"] == path]
        if len(found) >= count:
            return found
        await trio.sleep(0.02)


async def test_batch_items_run_as_the_key_that_made_the_batch(instant_home: Path, keys: KeyStore) -> None:
    _, secret = keys.add("batcher", families=("batch", "chat"), models=(f"{MODEL}*",))
    async with gateway() as gw:
        lines = [_line("mine", MODEL), _line("theirs", "qwen3:0.6b")]  # the second: not even installed
        batch, results = await _openai_batch(gw, secret, lines)
        assert batch["status"] == "completed", batch
        assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}, batch
        assert results["mine"]["response"]["status_code"] == 200
        theirs = results["theirs"]
        assert theirs["error"]["code"] == "MODEL_NOT_IN_SCOPE", theirs
        assert theirs["response"]["status_code"] == 403
        assert "qwen3:0.6b" in theirs["error"]["message"]
        # Charged to the key: the item's tokens are in its usage (no other request used any).
        stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
        (usage,) = [k["usage"] for k in stats["data"] if k["name"] == "batcher"]
        assert usage["tokens_total"] > 0 and usage["refused_scope"] == 0
        # The ledger names the key and the batch, never the loopback address or `local`.
        items = await _ledger(gw, instant_home, "/v1/chat/completions", 2)
        assert {(rec["key"], rec["client"]) for rec in items} == {("batcher", f"batch:{batch['id']}")}
        assert sorted(rec["status"] for rec in items) == [200, 403]


async def test_a_batch_key_without_the_item_s_family_fails_each_item(
    instant_home: Path, keys: KeyStore
) -> None:
    _, secret = keys.add("batch-only", families=("batch",))
    async with gateway() as gw:
        batch, results = await _openai_batch(gw, secret, [_line("a", MODEL), _line("b", MODEL)])
        assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 2, batch
        for custom_id in ("a", "b"):
            assert results[custom_id]["error"]["code"] == "KEY_SCOPE_FORBIDDEN"
            assert results[custom_id]["response"]["status_code"] == 403
        stats = (await gw.client.get("/admin/keys", headers=local_token(instant_home))).json()
        assert stats["data"][0]["usage"]["refused_scope"] == 2


async def test_a_message_batch_item_outside_the_key_s_models_is_errored(
    instant_home: Path, keys: KeyStore
) -> None:
    _, secret = keys.add("claude-ish", families=("batch", "chat"), models=(f"{MODEL}*",))
    headers = {"x-api-key": secret, "anthropic-version": "2023-06-01"}
    body = {
        "requests": [
            {"custom_id": "mine", "params": ANTHROPIC},
            {"custom_id": "theirs", "params": {**ANTHROPIC, "model": "qwen3:0.6b"}},
        ]
    }
    async with gateway() as gw:
        r = await gw.client.post("/v1/messages/batches", json=body, headers=headers)
        assert r.status_code == 200, r.text
        batch = r.json()
        while batch["processing_status"] != "ended":
            await trio.sleep(0.02)
            batch = (await gw.client.get(f"/v1/messages/batches/{batch['id']}", headers=headers)).json()
        assert batch["request_counts"]["succeeded"] == 1 and batch["request_counts"]["errored"] == 1
        raw = (await gw.client.get(f"/v1/messages/batches/{batch['id']}/results", headers=headers)).content
        results = {doc["custom_id"]: doc["result"] for doc in map(json.loads, raw.splitlines())}
        assert results["mine"]["type"] == "succeeded"
        assert results["theirs"]["type"] == "errored"
        error = results["theirs"]["error"]["error"]
        assert error["type"] == "permission_error" and "qwen3:0.6b" in error["message"], error
        items = await _ledger(gw, instant_home, "/v1/messages", 2)
        assert {rec["key"] for rec in items} == {"claude-ish"}


# -- the auth step's waits and refusals for batch items, on the gateway layer -----------------


def _middleware(tmp_path: Path) -> tuple[GatewayMiddleware, KeyStore]:
    """The real gateway layer and auth step; the chat route is a stand-in reporting 10 tokens."""
    routes = Routes()

    async def chat(call: Call) -> Reply:
        assert call.card is not None
        call.card.prompt_tokens, call.card.completion_tokens = 9, 1
        return Reply(json.dumps({"key": call.key}).encode())

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("only the gateway's own route is called")

    routes.add("/v1/chat/completions", chat)
    auth = Auth(KeyStore(keys_path(tmp_path)), local_token="blz-local-test")
    return GatewayMiddleware(app, routes=routes, auth=auth), KeyStore(keys_path(tmp_path))


def _client(gateway: GatewayMiddleware) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=gateway)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


ITEM = {**bearer("blz-local-test"), ACT_AS: "slow", "x-blazar-client": "batch:b1"}


async def test_a_batch_item_over_its_key_s_rpm_waits_instead_of_failing(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    gateway, store = _middleware(tmp_path)
    _, secret = store.add("slow", rpm=2)
    async with _client(gateway) as client:
        t0 = trio.current_time()
        for _ in range(3):  # the third waits (virtual time) for the window, then runs
            r = await client.post("/v1/chat/completions", json={}, headers=ITEM)
            assert r.status_code == 200 and r.json() == {"key": "slow"}, r.text
        assert trio.current_time() - t0 >= 60.0
        # An interactive request over the same window is refused at once, as before.
        await client.post("/v1/chat/completions", json={}, headers=ITEM)
        r = await client.post("/v1/chat/completions", json={}, headers=bearer(secret))
        assert r.status_code == 429 and r.json()["error"]["blazar_code"] == "RATE_LIMITED"
    (stats,) = gateway.auth.statistics()["data"]  # type: ignore[union-attr]
    assert stats["usage"].requests_total == 4 and stats["usage"].tokens_total == 40
    assert stats["usage"].refused_rate == 1


async def test_a_batch_item_waiting_on_a_removed_or_expired_key_fails_with_its_error(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    gateway, store = _middleware(tmp_path)
    store.add("slow", rpm=1)
    store.add("other")
    async with _client(gateway) as client:
        assert (await client.post("/v1/chat/completions", json={}, headers=ITEM)).status_code == 200
        answers: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def waiting() -> None:
                answers.append(await client.post("/v1/chat/completions", json={}, headers=ITEM))

            nursery.start_soon(waiting)
            auth = gateway.auth
            assert auth is not None
            while True:
                if auth.usage["slow"].queued:
                    break
                await trio.sleep(0.01)
            store.remove("slow")
        (r,) = answers
        assert r.status_code == 401 and r.json()["error"]["blazar_code"] == "UNAUTHORIZED", r.text
        assert "'slow'" in r.text and "no longer exists" in r.text
        # The next item of the batch is refused at once, the same way.
        r = await client.post("/v1/chat/completions", json={}, headers=ITEM)
        assert r.status_code == 401 and "no longer exists" in r.text
        store.add("late", expires_at=time.time() - 1)
        r = await client.post("/v1/chat/completions", json={}, headers={**ITEM, ACT_AS: "late"})
        assert r.status_code == 401 and r.json()["error"]["blazar_code"] == "KEY_EXPIRED", r.text


async def test_acting_as_a_key_needs_the_local_token_and_only_narrows(tmp_path: Path) -> None:
    gateway, store = _middleware(tmp_path)
    _, small = store.add("small", families=("chat",))
    store.add("boss", families=("admin", "chat"))
    async with _client(gateway) as client:
        # A key cannot act as another: the header is ignored, its own grant applies.
        r = await client.get("/admin/engines", headers={**bearer(small), ACT_AS: "boss"})
        assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "KEY_SCOPE_FORBIDDEN"
        r = await client.post("/v1/chat/completions", json={}, headers={**bearer(small), ACT_AS: "boss"})
        assert r.json() == {"key": "small"}
        # No credentials and the header: still 401.
        r = await client.post("/v1/chat/completions", json={}, headers={ACT_AS: "boss"})
        assert r.status_code == 401
        # The local token acting as `small` has `small`'s scopes, not its own.
        r = await client.get("/admin/engines", headers={**bearer("blz-local-test"), ACT_AS: "small"})
        assert r.status_code == 403 and "'small'" in r.text


async def test_with_no_key_left_a_batch_s_key_still_refuses_its_items(tmp_path: Path) -> None:
    gateway, store = _middleware(tmp_path)
    store.add("gone")
    store.remove("gone", force=True)
    async with _client(gateway) as client:
        assert (await client.post("/v1/chat/completions", json={})).status_code == 200  # open daemon
        r = await client.post("/v1/chat/completions", json={}, headers={**ITEM, ACT_AS: "gone"})
        assert r.status_code == 401 and "no longer exists" in r.text
        # Someone else's header on an open daemon changes nothing.
        r = await client.post("/v1/chat/completions", json={}, headers={ACT_AS: "gone"})
        assert r.status_code == 200
