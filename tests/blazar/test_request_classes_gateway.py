"""Request classes through the real gateway (the instant upstream, 2 slots): the class a
request names, a key's class cap, a full class queue, a class timeout, and the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from actors.config import AdmissionConfig, ClassConfig
from blazar.auth.keys import DEFAULT_FAMILIES, KeyStore, keys_path, parse_scopes
from tests.instant import MODEL, Gateway, instant_config, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
SLOW = {**CHAT, "stream": True, "max_tokens": 20, "bench_interval_ms": 200}
"""A stream that holds its slot for about 4 s."""


async def _hold(gw: Gateway, n: int, nursery: trio.Nursery) -> None:
    """Fill ``n`` slots with slow interactive streams, and wait until they run."""

    async def one() -> None:
        async with gw.client.stream(
            "POST", "/v1/chat/completions", json=SLOW, headers={"x-blazar-class": "interactive"}
        ) as r:
            async for _ in r.aiter_bytes():
                pass

    for _ in range(n):
        nursery.start_soon(one)
    with trio.fail_after(20):
        while gw.runtime.admission.statistics().classes[0].running < n:  # noqa: ASYNC110
            await trio.sleep(0.02)


def _metric(text: str, name: str, klass: str) -> float:
    prefix = f'{name}{{class="{klass}"}} '
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1])


async def test_a_full_class_queue_is_429_with_retry_after_and_a_class_timeout_is_408(
    instant_home: Path,
) -> None:
    classes = AdmissionConfig(batch=ClassConfig(max_queue=1, queue_timeout_s=1.0))
    config = instant_config(slots=2, admission=classes)
    async with serve_gateway(config) as gw, trio.open_nursery() as nursery:
        await gw.client.post("/v1/chat/completions", json=CHAT)  # the engine is up
        await _hold(gw, 2, nursery)
        answers: list[httpx.Response] = []

        async def batch(headers: dict[str, str]) -> None:
            answers.append(await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers))

        nursery.start_soon(batch, {"x-blazar-class": "batch"})
        with trio.fail_after(10):
            while gw.runtime.admission.statistics().classes[2].queued < 1:  # noqa: ASYNC110
                await trio.sleep(0.02)
        # The old header names the same class: low is batch, and its queue is full.
        full = await gw.client.post("/v1/chat/completions", json=CHAT, headers={"x-blazar-priority": "low"})
        assert full.status_code == 429, full.text
        assert full.json()["error"]["blazar_code"] == "QUEUE_FULL"
        assert "batch queue" in full.json()["error"]["message"]
        assert int(full.headers["retry-after"]) >= 1
        # Anthropic's shape for the same refusal.
        msg = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        anth = await gw.client.post("/v1/messages", json=msg, headers={"x-blazar-class": "batch"})
        assert anth.status_code == 429 and anth.json()["error"]["blazar_code"] == "QUEUE_FULL"
        with trio.fail_after(10):
            while not answers:  # noqa: ASYNC110
                await trio.sleep(0.05)
        timed_out = answers[0]
        assert timed_out.status_code == 408, timed_out.text
        assert timed_out.json()["error"]["blazar_code"] == "QUEUE_TIMEOUT"
        assert "batch queue" in timed_out.json()["error"]["message"]
        metrics = (await gw.client.get("/metrics")).text
        assert _metric(metrics, "blazar_class_rejected_total", "batch") == 2
        assert _metric(metrics, "blazar_class_expired_total", "batch") == 1
        assert _metric(metrics, "blazar_class_running", "interactive") == 2
        nursery.cancel_scope.cancel()


async def test_a_key_class_scope_caps_what_it_may_ask_for(instant_home: Path) -> None:
    keys = KeyStore(keys_path(instant_home))
    scopes = parse_scopes(["class:batch"])
    assert set(DEFAULT_FAMILIES) <= set(scopes.families)
    _, capped = keys.add("nightly", families=scopes.families)
    _, free = keys.add("alice")
    config = instant_config("--reply", "hello there", slots=2)
    async with serve_gateway(config) as gw:

        async def ask(secret: str, headers: dict[str, str]) -> Any:
            auth = {"authorization": f"Bearer {secret}", **headers}
            return await gw.client.post("/v1/chat/completions", json=CHAT, headers=auth)

        refused = await ask(capped, {"x-blazar-class": "interactive"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["blazar_code"] == "CLASS_NOT_ALLOWED"
        assert (await ask(capped, {"x-blazar-priority": "high"})).status_code == 403
        before = gw.runtime.admission.statistics().classes[2].granted
        assert (await ask(capped, {})).status_code == 200  # lowered to its cap: batch
        assert (await ask(capped, {"x-blazar-class": "background"})).status_code == 200
        assert gw.runtime.admission.statistics().classes[2].granted == before + 1
        assert (await ask(free, {"x-blazar-class": "interactive"})).status_code == 200
        bad = await ask(free, {"x-blazar-class": "urgent"})
        assert bad.status_code == 400 and bad.json()["error"]["blazar_code"] == "BAD_REQUEST"


async def test_an_interactive_request_takes_the_slot_of_a_batch_one_that_has_sent_nothing(
    instant_home: Path,
) -> None:
    """One slot, a whole batch answer that takes 2 s to decode: an interactive request arriving
    meanwhile preempts it, is answered first, and the batch request is run again from the head of
    its queue and answered once, whole; its card and /metrics say it was preempted."""
    async with serve_gateway(instant_config(slots=1)) as gw:
        await gw.client.post("/v1/chat/completions", json=CHAT)  # the engine is up
        answered: dict[str, httpx.Response] = {}

        async def ask(name: str, body: dict[str, Any]) -> None:
            headers = {"x-blazar-class": name}
            answered[name] = await gw.client.post("/v1/chat/completions", json=body, headers=headers)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "batch", {**CHAT, "max_tokens": 40, "bench_interval_ms": 50})
            with trio.fail_after(10):
                while gw.runtime.admission.statistics().classes[2].running < 1:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            await ask("interactive", CHAT)
            assert list(answered) == ["interactive"]  # it did not wait for the batch answer
        assert list(answered) == ["interactive", "batch"]
        batch = answered["batch"]
        assert batch.status_code == 200 and batch.json()["object"] == "chat.completion"
        card = (await gw.client.get(f"/v1/requests/{batch.headers['x-blazar-trace-id']}")).json()
        assert card["class"] == "batch" and card["preempted"] == 1 and card["state"] == "done"
        metrics = (await gw.client.get("/metrics")).text
        assert _metric(metrics, "blazar_class_preempted_total", "batch") == 1
        assert _metric(metrics, "blazar_class_granted_total", "batch") == 2  # granted twice, ran once


async def test_a_translated_whole_answer_is_preemptible_too(instant_home: Path) -> None:
    """An Anthropic batch request (translated: the engine streams it, the gateway answers it
    whole) gives its slot the same way; being a stream on the engine's side, it stops there."""
    async with serve_gateway(instant_config("--interval-ms", "50", slots=1)) as gw:
        await gw.client.post("/v1/chat/completions", json=CHAT)  # the engine is up
        answered: dict[str, httpx.Response] = {}
        message = {"model": MODEL, "max_tokens": 40, "messages": [{"role": "user", "content": "Hi"}]}

        async def batch() -> None:
            headers = {"x-blazar-class": "batch", "anthropic-version": "2023-06-01"}
            answered["batch"] = await gw.client.post("/v1/messages", json=message, headers=headers)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch)
            with trio.fail_after(10):
                while gw.runtime.admission.statistics().classes[2].running < 1:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            headers = {"x-blazar-class": "interactive"}
            answered["interactive"] = await gw.client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert list(answered) == ["interactive"]
        batch_answer = answered["batch"]
        assert batch_answer.status_code == 200 and batch_answer.json()["type"] == "message", batch_answer.text
        assert batch_answer.json()["usage"]["output_tokens"] == 40  # answered whole, once
        card = (await gw.client.get(f"/v1/requests/{batch_answer.headers['x-blazar-trace-id']}")).json()
        assert card["class"] == "batch" and card["preempted"] == 1
