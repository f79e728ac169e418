"""The admin routes that make an engine ready go through the runtime's protocol: a load
(``POST /admin/models/NAME/load``, ``Runtime.load``) claims an admission slot as a request
does, and ``GET /admin/engines/NAME/slots`` (``Runtime.lease``) holds a lease while it reads
the engine but takes no admission slot, so it answers while every slot is busy. The real
gateway, with the instant upstream as its engine."""

from __future__ import annotations

from pathlib import Path

import trio

from actors.engine import EngineState
from actors.runtime import Runtime
from tests.instant import MODEL, instant_config, serve_gateway


def _queue(rt: Runtime, model: str) -> tuple[int, int]:
    for q in rt.admission.statistics().queues:
        if q.model == model:
            return q.running, q.queued
    return 0, 0


async def test_slots_are_read_under_a_lease_while_every_slot_is_busy(instant_home: Path) -> None:
    with trio.fail_after(60):
        async with serve_gateway(instant_config(slots=2)) as gw:
            rt = gw.runtime
            r = await gw.client.get(f"/admin/engines/{MODEL}/slots")  # cold: started as for a request
            assert r.status_code == 200 and len(r.json()) == 2, r.text
            engine = rt.engine_if_loaded(MODEL)
            assert engine is not None and engine.state is EngineState.READY and engine.in_flight == 0
            async with rt.claim(MODEL), rt.claim(MODEL):
                assert _queue(rt, MODEL) == (2, 0)
                r = await gw.client.get(f"/admin/engines/{MODEL}/slots")
                assert r.status_code == 200 and len(r.json()) == 2
                async with rt.lease(MODEL) as (leased, handle):
                    assert leased is engine and engine.in_flight == 3  # two requests and the look
                    assert handle is engine.ready_handle()
                assert engine.in_flight == 2 and _queue(rt, MODEL) == (2, 0)  # no slot was taken


async def test_a_load_waits_for_an_admission_slot_as_a_request_does(instant_home: Path) -> None:
    with trio.fail_after(60):
        async with serve_gateway(instant_config(slots=1)) as gw:
            rt = gw.runtime
            cards: list[dict[str, object]] = []

            async def load() -> None:
                r = await gw.client.post(f"/admin/models/{MODEL}/load", json={"keep_alive_s": -1})
                assert r.status_code == 200, r.text
                cards.append(r.json())

            async with trio.open_nursery() as nursery:
                claim = await rt.claim(MODEL)
                nursery.start_soon(load)
                # the load queues behind the request (admission's numbers are what changes)
                while _queue(rt, MODEL) != (1, 1):  # noqa: ASYNC110
                    await trio.sleep(0.01)
                assert cards == []
                claim.release()
            (card,) = cards
            assert (card["model"], card["slots"], card["evicted"]) == (MODEL, 1, [])
            assert _queue(rt, MODEL) == (0, 0)  # released once the card was read
            assert rt.lifecycle.expires_at(MODEL) is None  # its keep-alive, as a request's
