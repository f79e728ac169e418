"""docs/api.md documents every route the daemon serves (the gateway layer's and the app's), and no other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from actors.runtime_open import open_runtime
from blazar.config import Config, resolve_paths
from blazar.web.app import build_gateway

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
_HEADING = re.compile(r"^### (.+)$", re.MULTILINE)
_ROUTE = re.compile(r"`(GET|HEAD|POST|PUT|PATCH|DELETE) (/[^`]*)`")
_IMPLICIT = {"HEAD", "OPTIONS"}


def documented() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for heading in _HEADING.findall(DOC.read_text()):
        found.update(_ROUTE.findall(heading))
    return found


async def served() -> set[tuple[str, str]]:
    config = Config()
    async with open_runtime(config.runtime(resolve_paths())) as runtime:
        gateway = build_gateway(runtime, config)
        routes = {("POST", path) for path in gateway.routes.post}  # served by the gateway layer
        for rule in gateway.app.url_map.iter_rules():
            if rule.endpoint == "static":
                continue
            path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
            methods = rule.methods or set()
            # HEAD is implied by GET; a route that answers HEAD without GET declares it.
            explicit = {"HEAD"} if rule.rule == "/" or "GET" not in methods else set()
            for method in methods - (_IMPLICIT - explicit):
                routes.add((method, path))
        return routes


async def test_api_doc_matches_the_route_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    with trio.fail_after(30):
        routes = await served()
    docs = documented()
    assert sorted(routes - docs) == [], "routes missing from docs/api.md"
    assert sorted(docs - routes) == [], "docs/api.md names routes that do not exist"
