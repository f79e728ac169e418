"""A background response cancelled while it is still queued answers ``cancelled`` at once and
never starts. Two slow background responses hold the job runner's two places (the instant
upstream paced at 20 ms a token), so a third waits queued."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.instant import MODEL, instant_config, serve_gateway

SLOW = {"model": MODEL, "input": "Hi", "max_output_tokens": 400, "background": True}


async def test_a_queued_background_response_is_cancelled_at_once(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--interval-ms", "20")) as gw:
        running = [(await gw.client.post("/v1/responses", json=SLOW)).json()["id"] for _ in range(2)]
        queued = (await gw.client.post("/v1/responses", json=SLOW)).json()
        assert queued["status"] == "queued"
        cancelled = await gw.client.post(f"/v1/responses/{queued['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        for rid in running:  # the others are left to finish
            await gw.client.post(f"/v1/responses/{rid}/cancel")
        await trio.sleep(0.3)
        later = (await gw.client.get(f"/v1/responses/{queued['id']}")).json()
    assert later["status"] == "cancelled" and later["output"] == []  # it never ran
