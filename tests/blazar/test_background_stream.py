"""A background response streamed (``background`` with ``stream``) follows OpenAI's order: the
queued Response in ``response.created`` and ``response.queued``, then ``response.in_progress``
once its job starts, then the answer. Served by the real gateway on the instant upstream (a
llama.cpp lane: the queued Response already says the sampling it will run with)."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.instant import MODEL, instant_config, serve_gateway, sse_events

BODY = {"model": MODEL, "input": "Hi", "max_output_tokens": 8, "background": True}


def _opening(raw: bytes) -> list[tuple[str, str, int]]:
    return [(e["type"], e["response"]["status"], e["sequence_number"]) for _, e in sse_events(raw)[:3]]


async def test_a_streamed_background_response_opens_queued(instant_home: Path) -> None:
    async with serve_gateway(instant_config("--reply", "Hello from the job.")) as gw:
        with trio.fail_after(30):
            streamed = await gw.client.post("/v1/responses", json={**BODY, "stream": True})
        assert streamed.status_code == 200, streamed.text
        events = [e for _, e in sse_events(streamed.content)]
        assert _opening(streamed.content) == [
            ("response.created", "queued", 0),
            ("response.queued", "queued", 1),
            ("response.in_progress", "in_progress", 2),
        ]
        assert events[-1]["type"] == "response.completed"
        queued = events[0]["response"]
        assert (queued["temperature"], queued["top_p"]) == (0.8, 0.95)  # llama.cpp's own defaults
        response_id = queued["id"]
        # streamed again, from the start or after the opening
        again = await gw.client.get(f"/v1/responses/{response_id}", params={"stream": "true"})
        assert [e["type"] for _, e in sse_events(again.content)] == [e["type"] for e in events]
        later = await gw.client.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": "1"}
        )
        assert sse_events(later.content)[0][1]["type"] == "response.in_progress"
        # a plain background create answers the same queued Response the stream opens with
        plain = (await gw.client.post("/v1/responses", json=BODY)).json()
        assert plain["status"] == "queued" and (plain["temperature"], plain["top_p"]) == (0.8, 0.95)
