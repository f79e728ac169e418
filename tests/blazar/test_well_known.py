"""``GET /.well-known/blazar``: the daemon describes itself from its own routes and header
table; open like ``/health``, saying whether keys are needed but never which."""

from __future__ import annotations

import re
from pathlib import Path

from blazar import __version__
from blazar.auth.keys import KeyStore, keys_path
from blazar.web import headers
from tests.instant import instant_config, serve_gateway

ROOT = Path(__file__).parents[2]


async def test_discovery_names_the_routes_engines_headers_and_features(instant_home: Path) -> None:
    async with serve_gateway(instant_config(session_bank=False, strict=True)) as gw:
        r = await gw.client.get("/.well-known/blazar")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert (doc["name"], doc["version"]) == ("blazar", __version__)
        endpoints = set(doc["endpoints"])
        # the gateway's own hot routes, the framework's routes, and itself
        assert {"POST /v1/chat/completions", "POST /v1/messages", "POST /api/chat"} <= endpoints
        assert {"GET /api/tags", "GET /v1/models", "GET /.well-known/blazar"} <= endpoints
        assert not any(e.startswith(("HEAD ", "OPTIONS ")) for e in endpoints)
        assert set(doc["dialects"]) == {"openai", "anthropic", "ollama", "llamacpp"}
        assert "llamacpp" in {e["lane"] for e in doc["engines"]}
        assert doc["headers"]["request"]["x-blazar-priority"]
        assert "x-blazar-act-as" not in doc["headers"]["request"]
        features = doc["features"]
        assert features["keys"] is False and features["strict"] is True
        assert features["session_bank"] is False and features["tls"] is False
        assert features["workers"] == 1


async def test_discovery_is_open_on_a_keyed_daemon_and_says_keys_are_needed(instant_home: Path) -> None:
    KeyStore(keys_path(instant_home)).add("alice")
    async with serve_gateway(instant_config()) as gw:
        assert (await gw.client.get("/v1/models")).status_code == 401
        r = await gw.client.get("/.well-known/blazar")
        assert r.status_code == 200, r.text
        assert r.json()["features"]["keys"] is True
        assert "alice" not in r.text


def test_every_blazar_header_in_the_code_is_in_the_table() -> None:
    """A header read or written anywhere is in blazar/web/headers.py, so CORS lets a page send
    it and discovery names it."""
    known = set(headers.REQUEST) | set(headers.RESPONSE) | set(headers.INTERNAL)
    found: set[str] = set()
    for package in ("blazar", "actors"):
        for path in (ROOT / package).rglob("*.py"):
            found |= {m.lower() for m in re.findall(r"""["'](x-blazar-[a-z-]+)""", path.read_text(), re.I)}
    assert found, "the scan found no header at all"
    assert found <= known, sorted(found - known)
