"""Browsers and CORS, served for real by the gateway on hypercorn in-process (no engine):
preflights, grants on actual answers (the gateway's own routes, the app's, errors), and no
grant ever for a foreign origin. Also the transport keys of config.toml."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from blazar.config import Config, ConfigError, load_config, resolve_paths
from blazar.web.middleware.cors import CorsPolicy
from tests.instant import serve_gateway

APP = "https://app.example"
EVIL = "https://evil.example"
CHAT = {"model": "ghost", "messages": [{"role": "user", "content": "x"}]}
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}


@asynccontextmanager
async def gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    async with serve_gateway(Config(**settings)) as gw:
        yield gw.client


def _granted(r: httpx.Response, origin: str) -> bool:
    return r.headers.get("access-control-allow-origin") == origin


async def test_a_preflight_from_a_listed_origin_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch, cors_origins=[APP]) as client:
        headers = {
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
        }
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/models"):
            r = await client.options(path, headers=headers)
            assert r.status_code == 204 and r.content == b""
            assert r.headers["access-control-allow-origin"] == APP  # the origin, never "*"
            assert r.headers["access-control-allow-credentials"] == "true"
            assert "Origin" in r.headers["vary"]
            assert "POST" in r.headers["access-control-allow-methods"]
            allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
            want = {"authorization", "x-api-key", "anthropic-version", "content-type", "x-stainless-os"}
            assert want | {"x-blazar-priority", "x-blazar-deadline-ms"} <= allowed
            assert int(r.headers["access-control-max-age"]) > 0


async def test_actual_answers_to_a_listed_origin_carry_the_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch, cors_origins=[APP]) as client:
        answers = [
            await client.get("/v1/models", headers={"Origin": APP}),  # the app's route
            await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP}),  # own route, 404
            await client.post("/api/chat", content=b"{nope", headers={"Origin": APP}),  # own route, 400
            await client.get("/no/such/route", headers={"Origin": APP}),  # the framework's 404
        ]
        assert [r.status_code for r in answers] == [200, 404, 400, 404]
        for r in answers:
            assert _granted(r, APP) and "Origin" in r.headers["vary"]
            exposed = {h.strip() for h in r.headers["access-control-expose-headers"].split(",")}
            assert "x-blazar-trace-id" in exposed
            assert r.headers["x-blazar-trace-id"].startswith("blz-")


async def test_a_foreign_origin_never_gets_a_grant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with gateway(tmp_path, monkeypatch, cors_origins=[APP]) as client:
        r = await client.options("/v1/chat/completions", headers={"Origin": EVIL, **PREFLIGHT})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": EVIL})
        assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "HOST_FORBIDDEN"
        assert "access-control-allow-origin" not in r.headers
        assert "cors_origins" in r.json()["error"]["message"]
        # A listed origin still needs a local Host on a loopback bind (DNS rebinding).
        r = await client.get("/v1/models", headers={"Origin": APP, "Host": "app.example"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


async def test_on_an_open_bind_a_foreign_origin_is_served_without_a_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # host 0.0.0.0: the host guard is off (the test client still calls 127.0.0.1); open
    # without keys only because the operator says so
    async with gateway(
        tmp_path, monkeypatch, host="0.0.0.0", insecure_open=True, cors_origins=[APP]
    ) as client:
        r = await client.get("/v1/models", headers={"Origin": EVIL})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        r = await client.options("/v1/models", headers={"Origin": EVIL, **PREFLIGHT})
        assert "access-control-allow-origin" not in r.headers
        assert _granted(await client.get("/v1/models", headers={"Origin": APP}), APP)


async def test_without_a_list_only_local_origins_are_granted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch) as client:
        for local in ("http://localhost:3000", "http://127.0.0.1:8080", "vscode-webview://abc"):
            r = await client.options("/v1/chat/completions", headers={"Origin": local, **PREFLIGHT})
            assert r.status_code == 204 and _granted(r, local)
            assert _granted(await client.get("/v1/models", headers={"Origin": local}), local)
        r = await client.get("/v1/models", headers={"Origin": APP})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = await client.get("/v1/models", headers={"Origin": "null"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


async def test_no_origin_means_no_cors_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with gateway(tmp_path, monkeypatch, cors_origins=["*"]) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 404
        assert not [h for h in r.headers if h.startswith("access-control-")]
        # A plain OPTIONS (no preflight headers) is the route's own answer, not a grant.
        r = await client.options("/v1/chat/completions")
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_a_star_grants_any_origin_by_name_without_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(tmp_path, monkeypatch, cors_origins=["*"]) as client:
        r = await client.options("/v1/messages", headers={"Origin": EVIL, **PREFLIGHT})
        assert r.status_code == 204 and _granted(r, EVIL)
        assert "access-control-allow-credentials" not in r.headers


def test_the_policy_matches_origins_exactly() -> None:
    policy = CorsPolicy([APP])
    assert policy.grants(APP) and policy.grants("HTTPS://APP.EXAMPLE")
    for other in ("https://app.example.evil", "http://app.example", "https://app.example:8443", "null"):
        assert not policy.grants(other), other
    assert policy.actual(EVIL) is None and policy.preflight(EVIL, {}) is None


# -- config keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('tls_cert = "{d}/cert.pem"\n', "go together"),
        ('tls_cert = "{d}/missing.pem"\ntls_key = "{d}/key.pem"\n', "tls_cert = "),
        ('tls_cert = "{d}/cert.pem"\ntls_key = "{d}/nothing.pem"\n', "not a readable file"),
        ('cors_origins = ["app.example"]\n', "scheme://host"),
        ('cors_origins = ["https://app.example/"]\n', "no path"),
        ("max_connections = 0\n", "at least 1"),
        ("header_timeout_s = 0\n", "above 0"),
        ("max_connection = 5\n", "max_connection"),
    ],
)
def test_transport_keys_are_checked_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, fragment: str
) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "key.pem").write_text("x")
    (tmp_path / "config.toml").write_text(text.format(d=tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_config(resolve_paths())
    assert fragment in str(caught.value)


def test_transport_keys_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "key.pem").write_text("x")
    (tmp_path / "config.toml").write_text(
        f'tls_cert = "{tmp_path}/cert.pem"\ntls_key = "{tmp_path}/key.pem"\n'
        'cors_origins = ["https://app.example", "*"]\nheader_timeout_s = 5\nmax_connections = 10\n'
        "max_connections_per_client = 2\nmax_header_kb = 8\nkeep_alive_timeout_s = 30\n"
    )
    config = load_config(resolve_paths())
    assert config.cors_origins == ["https://app.example", "*"] and config.tls_key == f"{tmp_path}/key.pem"
    assert (config.header_timeout_s, config.max_connections, config.max_connections_per_client) == (5, 10, 2)
    assert (config.max_header_kb, config.keep_alive_timeout_s) == (8, 30)
