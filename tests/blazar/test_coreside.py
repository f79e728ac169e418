"""Would these models fit together? The pure verdict, and ``GET /api/coreside`` on the real
gateway (the instant upstream as engine): a loaded model counts as it runs, the budget is the
one a load is checked against now, and bad input is a 4xx."""

from __future__ import annotations

from pathlib import Path

import trio

from actors.coreside import CoresidentModel, verdict
from tests.instant import MODEL, instant_config, serve_gateway


def _row(name: str, size: int | None) -> CoresidentModel:
    return CoresidentModel(model=name, ctx_per_slot=512, slots=1, bytes=size, loaded=False)


def test_the_verdict_adds_the_estimates_against_the_budget() -> None:
    both = verdict([_row("a", 300), _row("b", 500)], 1000, "memory_budget_mb")
    assert (both.total, both.fits, both.headroom) == (800, True, 200)
    over = verdict([_row("a", 300), _row("b", 800)], 1000, "memory_budget_mb")
    assert (over.fits, over.headroom) == (False, -100)
    unknown = verdict([_row("a", None)], 10, "memory_budget_mb")  # no estimate: loaded unchecked
    assert (unknown.total, unknown.fits) == (0, True)
    unchecked = verdict([_row("a", 300)], None, "no memory check")
    assert unchecked.fits and unchecked.headroom is None


async def test_the_route_counts_a_loaded_model_as_it_runs(instant_home: Path) -> None:
    async with serve_gateway(instant_config(memory_budget_mb=4096)) as gw:
        with trio.fail_after(60):
            before = (await gw.client.get("/api/coreside", params={"model": [MODEL, MODEL]})).json()
            assert [m["loaded"] for m in before["models"]] == [False, False]
            assert before["budget"] == 4096 << 20 and before["budget_from"] == "memory_budget_mb"
            size = before["models"][0]["bytes"]
            assert size > 0 and before["total"] == 2 * size and before["fits"] is True
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            assert (await gw.client.post("/v1/chat/completions", json=chat)).status_code == 200
            after = (await gw.client.get("/api/coreside", params={"model": MODEL})).json()
            assert after["models"][0]["loaded"] is True and after["total"] == size

            missing = await gw.client.get("/api/coreside")
            # an /api/ route: the Ollama dialect's error shape
            assert missing.status_code == 400 and missing.json()["error"]["blazar_code"] == "BAD_REQUEST"
            unknown = await gw.client.get("/api/coreside", params={"model": "no-such-model"})
            assert unknown.status_code == 404, unknown.text
            assert unknown.json()["error"]["blazar_code"] == "MODEL_NOT_FOUND"
