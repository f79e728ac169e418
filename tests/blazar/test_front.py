"""The daemon's gateway answers its own routes before the framework behind it is loaded
(``blazar.web.front``): served on hypercorn as the daemon serves it, with the instant
upstream as its engine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio
from quart_trio import QuartTrio

from actors.runtime_open import open_runtime
from blazar.config import resolve_paths
from blazar.web.app import create_app
from blazar.web.asgi.listen import hypercorn_config, serve
from blazar.web.front import Framework, open_gateway
from tests.instant import instant_config
from tests.support import MODEL


@asynccontextmanager
async def served(
    *, settles: bool = True, builds: bool = True
) -> AsyncIterator[tuple[httpx.AsyncClient, Framework]]:
    """The daemon's gateway on a free port. ``settles``: its framework loads once the start
    has settled, as in the daemon (else only when a request needs it); ``builds``: it can."""
    config = instant_config()
    async with open_runtime(config.runtime(resolve_paths())) as runtime, trio.open_nursery() as nursery:
        gateway = open_gateway(runtime, config)
        if not settles or not builds:

            def build() -> QuartTrio:
                if not builds:
                    raise RuntimeError("the framework could not be built")
                return create_app(runtime, config)

            gateway.app = Framework(build, settled=trio.sleep_forever)
        assert isinstance(gateway.app, Framework)
        hconfig = hypercorn_config(config)
        hconfig.bind = ["127.0.0.1:0"]
        stop = trio.Event()
        binds = await nursery.start(
            lambda task_status: serve(
                gateway, config, hconfig, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as client:
            yield client, gateway.app
        stop.set()


async def test_own_routes_answer_before_the_framework_loads(instant_home: Path) -> None:
    async with served(settles=False) as (client, app):
        health = await client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        chat = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"]
        assert app.app is None  # nothing needed the framework yet
        models = await client.get("/v1/models")  # a framework route: it loads, then answers
        assert models.status_code == 200
        assert MODEL in {m["id"] for m in models.json()["data"]}
        assert app.app is not None


async def test_the_framework_loads_once_the_start_settles(instant_home: Path) -> None:
    async with served() as (client, app):
        with trio.fail_after(30):
            await app.wait_loaded()  # with no request asking for it
        assert app.app is not None
        assert (await client.get("/api/errors")).status_code == 200


async def test_a_framework_that_fails_to_load_is_an_error_in_the_dialect(instant_home: Path) -> None:
    async with served(builds=False) as (client, _):
        reply = await client.get("/v1/models")
        assert reply.status_code == 500
        error = reply.json()["error"]
        assert error["blazar_code"] == "INTERNAL"
        assert "could not be built" in error["message"]
        assert (await client.get("/health")).status_code == 200  # the gateway's own routes still answer


def test_the_gateway_listens_without_the_framework_or_http2() -> None:
    """What the daemon imports to listen: no Quart (flask, werkzeug), no HTTP/2 protocol
    (hpack), no WebSocket stream (wsproto), no Jinja."""
    probe = (
        "import sys, json\n"
        "import blazar.entry, blazar.daemon.serve, httpx, blazar.web.front, blazar.web.asgi.listen\n"
        "heavy = ('quart', 'quart_trio', 'flask', 'werkzeug', 'hpack', 'wsproto', 'jinja2',\n"
        "         'blazar.web.app')\n"
        "print(json.dumps(sorted(m for m, mod in sys.modules.items() if mod is not None and any("
        "m == h or m.startswith(h + '.') for h in heavy))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
