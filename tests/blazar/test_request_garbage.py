"""A request leaves nothing for the garbage collector: what it made is freed by reference
counting as it ends. A reference cycle left by each request (a cleanup that refers back to
the call, the direct writer that holds the server's stream) keeps every object of the
request alive until a full collection, and those collections then stop every stream for
tens of milliseconds. Measured through the real gateway on hypercorn with the instant
upstream, for a relayed stream and a whole answer."""

from __future__ import annotations

import gc
from pathlib import Path

import trio

from actors.upstream import UpstreamResponse
from blazar.serve.relay import UpstreamStream
from blazar.web.asgi.call import Call
from blazar.web.asgi.direct import BodyWriter
from tests.instant import MODEL, instant_config, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
WATCHED = (Call, UpstreamStream, UpstreamResponse, BodyWriter)


async def test_a_relayed_request_leaves_no_cycle(instant_home: Path) -> None:
    async with serve_gateway(instant_config(slots=2)) as gw:
        await gw.client.post("/v1/chat/completions", json=CHAT)  # the engine is up
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
        try:
            for _ in range(3):
                async with gw.client.stream(
                    "POST", "/v1/chat/completions", json={**CHAT, "stream": True}
                ) as r:
                    assert r.status_code == 200
                    assert (await r.aread()).rstrip().endswith(b"data: [DONE]")
                whole = await gw.client.post("/v1/chat/completions", json=CHAT)
                assert whole.status_code == 200
            await trio.sleep(0.2)  # the requests' cleanups and records are done
            gc.collect()
            left = sorted({type(o).__name__ for o in gc.garbage if isinstance(o, WATCHED)})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert left == []
