"""The doctor, bench and scorecard routes refuse bad input before any job exists."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from blazar.config import Config
from tests.instant import serve_gateway


@pytest.fixture
async def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    async with serve_gateway(Config()) as gw:
        yield gw.client


async def test_unknown_models_and_bad_bodies_are_refused(gateway: httpx.AsyncClient) -> None:
    for method, path, body in (
        ("POST", "/api/model-doctor", {"model": "ghost"}),
        ("GET", "/api/model-doctor/ghost", None),
        ("POST", "/api/bench", {"model": "ghost"}),
        ("GET", "/api/scorecard/ghost", None),
        ("GET", "/api/benchmarks?model=ghost", None),
    ):
        r = await gateway.request(method, path, json=body)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["blazar_code"] == "MODEL_NOT_FOUND"
    r = await gateway.post("/api/model-doctor", json={})
    assert r.status_code == 400 and "`model`" in r.json()["error"]["message"]
    for bad, param in (
        ({"concurrency": [0]}, "concurrency"),
        ({"concurrency": []}, "concurrency"),
        ({"ctx": 0}, "ctx"),
        ({"requests": 0}, "requests"),
        ({"max_tokens": 1}, "max_tokens"),
    ):
        r = await gateway.post("/api/bench", json={"model": "ghost", **bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == param
    listed = await gateway.get("/api/benchmarks")
    assert listed.status_code == 200 and listed.json() == {"object": "list", "data": []}
