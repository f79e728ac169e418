"""Anthropic Message Batches through the official ``anthropic`` SDK, on the real daemon and engine."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0, timeout=120)


def request(custom_id: str, prompt: str, **params: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "params": {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": prompt}],
            **params,
        },
    }


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.2)
    raise AssertionError(f"{batch_id} still {batch.processing_status}")


def test_create_retrieve_list_results_delete(client: anthropic.Anthropic) -> None:
    batch = client.messages.batches.create(
        requests=[
            request("first", "Say one."),
            request("second", "Say two."),
            request("broken", "Say three.", temperature=7),  # refused when it runs
        ]  # type: ignore[list-item]
    )
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status == "in_progress" and batch.results_url is None
    done = wait_ended(client, batch.id)
    counts = done.request_counts
    assert (counts.succeeded, counts.errored, counts.processing, counts.canceled) == (2, 1, 0, 0)
    assert done.ended_at is not None and done.results_url is not None
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"first", "second", "broken"}
    first = results["first"]
    assert first.type == "succeeded" and first.message.content[0].type == "text"  # type: ignore[union-attr]
    broken = results["broken"]
    assert broken.type == "errored" and broken.error.error.type == "invalid_request_error"  # type: ignore[union-attr]
    assert batch.id in [b.id for b in client.messages.batches.list()]
    deleted = client.messages.batches.delete(batch.id)
    assert deleted.id == batch.id and deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_cancel(client: anthropic.Anthropic) -> None:
    batch = client.messages.batches.create(
        requests=[request(f"r{i}", "Write a long story.", max_tokens=300) for i in range(30)]  # type: ignore[misc]
    )
    cancelled = client.messages.batches.cancel(batch.id)
    assert cancelled.processing_status == "ended" and cancelled.cancel_initiated_at is not None
    counts = cancelled.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.errored + counts.canceled == 30
    kinds = {r.result.type for r in client.messages.batches.results(batch.id)}
    assert "canceled" in kinds
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.batches.cancel(batch.id)
    assert err.value.status_code == 409


def test_bad_batches_are_refused_in_anthropic_shape(daemon: DaemonProc) -> None:
    url = f"{daemon.url}/v1/messages/batches"
    for body, param in (
        ({"requests": []}, "requests"),
        ({"requests": [request("a", "x"), request("a", "y")]}, "requests[1].custom_id"),
        ({"requests": [{"custom_id": "a", "params": {"max_tokens": 1}}]}, "requests[0].params.model"),
    ):
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400, r.text
        doc = r.json()
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert param in doc["error"]["message"]
    r = httpx.post(
        url, json={"requests": [request("a", "x") | {"params": {"model": "nope", "max_tokens": 1}}]}
    )
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(f"{url}/msgbatch_nope/results", timeout=30)
    assert r.status_code == 404
