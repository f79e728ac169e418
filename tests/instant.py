"""The real gateway in-process, with the benchmarks' instant upstream as its engine.

The engine actor spawns ``bench/instant-upstream`` exactly as it spawns ``llama-server``
(through the watchdog, with llama-server's flags), so a request runs the whole path —
dialect, admission, engine start, lease, relay or translation, release — in well under
a second and without llama.cpp.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.config import EngineConfig
from actors.runtime import Runtime
from actors.runtime_open import open_runtime
from blazar.config import Config, resolve_paths
from blazar.web.app import build_gateway
from blazar.web.asgi.listen import hypercorn_config, serve
from tests.support import MODEL, ROOT, make_home

__all__ = [
    "MODEL",
    "SHIM",
    "Gateway",
    "instant_config",
    "prepare_models",
    "serve_gateway",
    "sse_events",
]

SHIM = ROOT / "bench" / "instant-upstream"


def prepare_models(root: Path, model_path: Path) -> Path:
    """A models directory holding the test model."""
    return make_home(root, model_path) / "models"


def instant_config(*upstream_args: str, slots: int = 4, **tunables: Any) -> Config:
    """A config whose engines are the instant upstream, run with ``upstream_args``."""
    engine = EngineConfig(llama_server=str(SHIM), extra_args=list(upstream_args), start_timeout_s=20.0)
    return Config(slots=slots, default_ctx=512, keep_alive_s=-1, engine=engine, **tunables)


@dataclass
class Gateway:
    client: httpx.AsyncClient
    runtime: Runtime


@asynccontextmanager
async def serve_gateway(config: Config) -> AsyncIterator[Gateway]:
    """The ASGI app the daemon serves, on hypercorn on a free loopback port."""
    async with open_runtime(config.runtime(resolve_paths())) as runtime, trio.open_nursery() as nursery:
        hconfig = hypercorn_config(config)
        hconfig.bind = ["127.0.0.1:0"]
        stop = trio.Event()
        binds = await nursery.start(
            lambda task_status: serve(
                build_gateway(runtime, config),
                config,
                hconfig,
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=10) as client:
            yield Gateway(client=client, runtime=runtime)
        stop.set()
        nursery.cancel_scope.cancel()


def sse_events(raw: bytes) -> list[tuple[str | None, Any]]:
    """``(event name, decoded data)`` of each server-sent event; ``[DONE]`` stays a string."""
    out: list[tuple[str | None, Any]] = []
    for block in raw.decode().split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out
