"""The gateway's framework edges, served for real by hypercorn in-process (no engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from blazar.config import Config
from blazar.errors import CATALOG
from tests.instant import serve_gateway


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    async with serve_gateway(Config(max_body_mb=0.01)) as gw:  # about 10 KiB: cheap to cross
        yield gw.client


async def test_health_and_trace_id(gateway: httpx.AsyncClient) -> None:
    r = await gateway.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.headers["x-blazar-trace-id"].startswith("blz-")


async def test_error_catalog_is_served(gateway: httpx.AsyncClient) -> None:
    r = await gateway.get("/api/errors")
    codes = {e["code"]: e["status"] for e in r.json()["data"]}
    assert codes == {c.code: c.status for c in CATALOG.values()}
    assert codes["MODEL_NOT_FOUND"] == 404 and codes["ENGINE_CRASHED"] == 502


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/no/such/route", 404, "NOT_FOUND"),
        ("DELETE", "/v1/models", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/v1/completions", 405, "METHOD_NOT_ALLOWED"),
    ],
)
async def test_framework_errors_are_json(
    gateway: httpx.AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    r = await gateway.request(method, path)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["blazar_code"] == code


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        (b"{not json", "INVALID_JSON", "not valid JSON"),
        (b"", "INVALID_JSON", "empty"),
        (b'{"messages": []}', "BAD_REQUEST", "`model`"),
        (b'{"model": 1, "messages": []}', "BAD_REQUEST", "`model`"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "BAD_REQUEST",
            "`stream`",
        ),
    ],
)
async def test_bad_bodies_are_400(gateway: httpx.AsyncClient, body: bytes, code: str, fragment: str) -> None:
    r = await gateway.post("/v1/chat/completions", content=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["blazar_code"] == code and fragment in err["message"]


async def test_unknown_model_is_404_naming_pull(gateway: httpx.AsyncClient) -> None:
    body = {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}
    r = await gateway.post("/v1/chat/completions", json=body)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["blazar_code"] == "MODEL_NOT_FOUND" and "blazar pull ghost" in err["message"]
    r = await gateway.get("/v1/models/ghost")
    assert r.status_code == 404


async def test_out_of_range_sampling_is_refused_before_the_engine(gateway: httpx.AsyncClient) -> None:
    # The model does not exist: a 400 here proves the check runs before any engine is sought.
    chat = {"model": "ghost", "messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}
    r = await gateway.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Invalid 'top_p': decimal above maximum value. "
        "Expected a value <= 1, but got 1.5 instead.",
        "type": "invalid_request_error",
        "param": "top_p",
        "code": "bad_request",
        "blazar_code": "BAD_REQUEST",
    }
    r = await gateway.post("/v1/messages", json={**chat, "max_tokens": 8, "top_p": 0.5, "top_k": -1})
    assert r.status_code == 400
    doc = r.json()
    assert doc["error"]["type"] == "invalid_request_error" and doc["blazar_code"] == "BAD_REQUEST"
    assert doc["error"]["message"] == "top_k: must be at least 0, got -1"
    ollama_chat = {"model": "ghost", "messages": chat["messages"], "options": {"top_p": 1.5}}
    r = await gateway.post("/api/chat", json=ollama_chat)
    assert r.status_code == 400
    assert r.json() == {
        "error": "invalid field `options.top_p`: must be between 0 and 1, got 1.5",
        "blazar_code": "BAD_REQUEST",
    }


async def test_error_shape_follows_the_dialect(gateway: httpx.AsyncClient) -> None:
    body = {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]}
    r = await gateway.post("/v1/chat/completions", json=body, headers={"anthropic-version": "2023-06-01"})
    doc = r.json()
    assert doc["type"] == "error" and doc["error"]["type"] == "not_found_error"
    assert doc["blazar_code"] == "MODEL_NOT_FOUND"
    r = await gateway.get("/api/nothing-here")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    assert r.json()["blazar_code"] == "NOT_FOUND"


async def test_host_header_guard(gateway: httpx.AsyncClient) -> None:
    r = await gateway.get("/v1/models", headers={"Host": "evil.example:11435"})
    assert r.status_code == 403
    assert r.json()["error"]["blazar_code"] == "HOST_FORBIDDEN"
    for ok in ("localhost:11435", "127.0.0.1", "[::1]:11435"):
        assert (await gateway.get("/v1/models", headers={"Host": ok})).status_code == 200


async def test_body_limit_with_content_length(gateway: httpx.AsyncClient) -> None:
    r = await gateway.post("/v1/chat/completions", content=b"x" * 20_000)
    assert r.status_code == 413
    assert r.json()["error"]["blazar_code"] == "PAYLOAD_TOO_LARGE"


async def test_body_limit_on_a_chunked_body(gateway: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 1000

    r = await gateway.post("/v1/chat/completions", content=chunks())
    assert "content-length" not in r.request.headers
    assert r.status_code == 413
    assert r.json()["error"]["blazar_code"] == "PAYLOAD_TOO_LARGE"


async def test_models_list_is_openai_shaped(gateway: httpx.AsyncClient) -> None:
    r = await gateway.get("/v1/models")
    assert msgspec.json.decode(r.content) == {"object": "list", "data": []}


async def test_requests_are_recorded_in_the_ledger(gateway: httpx.AsyncClient) -> None:
    r = await gateway.post(
        "/v1/chat/completions", json={"model": "ghost", "messages": [{"role": "user", "content": "x"}]}
    )
    trace = r.headers["x-blazar-trace-id"]
    for _ in range(100):
        rows = (await gateway.get("/admin/requests", params={"trace_id": trace})).json()["data"]
        if rows:
            break
        await trio.sleep(0.02)
    assert rows[0]["status"] == 404 and rows[0]["blazar_code"] == "MODEL_NOT_FOUND"
    assert rows[0]["model"] == "ghost" and rows[0]["path"] == "/v1/chat/completions"


async def test_cross_origin_web_pages_are_refused(gateway: httpx.AsyncClient) -> None:
    r = await gateway.post("/admin/shutdown", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "HOST_FORBIDDEN"
    for ok in ("http://localhost:3000", "http://127.0.0.1:11435", "vscode-webview://abc"):
        assert (await gateway.get("/health", headers={"Origin": ok})).status_code == 200


async def test_images_are_refused_without_a_vision_projector(
    gateway: httpx.AsyncClient, tmp_path: Path, model_path: Path
) -> None:
    from registry.store import Store

    Store(tmp_path / "models").import_file(model_path, "text-only")  # no projector: no engine starts
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = {
        "model": "text-only",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}],
    }
    r = await gateway.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "VISION_PROJECTOR_MISSING"


async def test_an_unread_body_never_poisons_the_connection(gateway: httpx.AsyncClient) -> None:
    # A 404 answered before the body was read must not leave the rest of that body
    # on the keep-alive connection, where it would be taken for the next request.
    for _ in range(2):
        r = await gateway.post("/no/such/route", content=b"x" * 2_000_000)
        assert r.status_code == 404 and r.headers["connection"] == "close"
        with trio.fail_after(10):
            assert (await gateway.get("/health")).status_code == 200
