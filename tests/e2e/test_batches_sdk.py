"""OpenAI Files and Batches through the official ``openai`` SDK, on the real daemon and engine."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.responses_schema import check_response
from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def chat_line(custom_id: str, prompt: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    if url == "/v1/responses":
        body = {"model": MODEL, "input": prompt, "max_output_tokens": 8}
    elif url == "/v1/embeddings":
        body = {"model": MODEL, "input": prompt}
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def wait_batch(client: openai.OpenAI, batch_id: str, timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def parse_jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


@pytest.mark.parametrize("url", ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"])
def test_a_batch_runs_to_its_output_file(client: openai.OpenAI, url: str) -> None:
    lines = [chat_line(f"req-{i}", f"Say the number {i}.", url) for i in range(5)]
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == len(jsonl(lines))
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint=url,
        completion_window="24h",
        metadata={"run": "e2e"},  # type: ignore[arg-type]
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "e2e"}
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 5, 0)
    assert done.output_file_id and done.error_file_id is None
    rows = parse_jsonl(client.files.content(done.output_file_id).content)
    assert sorted(r["custom_id"] for r in rows) == [f"req-{i}" for i in range(5)]
    for row in rows:
        assert row["id"].startswith("batch_req_") and row["error"] is None
        assert row["response"]["status_code"] == 200
        if url == "/v1/responses":  # a Response like any other, held to the published schemas
            check_response(row["response"]["body"], row["custom_id"])
    body = rows[0]["response"]["body"]
    assert body["object"] == {"/v1/chat/completions": "chat.completion", "/v1/responses": "response"}.get(
        url, "list"
    )
    assert batch.id in [b.id for b in client.batches.list()]


def test_a_failing_request_goes_to_the_error_file(client: openai.OpenAI) -> None:
    bad = chat_line("bad", "hi")
    bad["body"]["temperature"] = 5  # refused by the gateway when it runs
    lines = [chat_line("good", "Say hi."), bad]
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None and done.request_counts.failed == 1
    assert done.error_file_id and done.output_file_id
    (error,) = parse_jsonl(client.files.content(done.error_file_id).content)
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["error"]["code"] == "BAD_REQUEST"


def test_cancel_keeps_what_ran(client: openai.OpenAI) -> None:
    lines = [chat_line(f"r{i}", "Write a long story about the sea.") for i in range(40)]
    for line in lines:
        line["body"]["max_tokens"] = 200
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while client.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.05)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled"
    assert cancelled.request_counts is not None
    counts = cancelled.request_counts
    assert counts.total == 40 and counts.completed < 40
    if cancelled.error_file_id:
        errors = parse_jsonl(client.files.content(cancelled.error_file_id).content)
        assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
        assert len(errors) == 40 - counts.completed - counts.failed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'
            b"not json\n",
            "line 2",
        ),
        (
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n',
            "line 2",
        ),
    ],
)
def test_a_bad_line_is_refused_on_upload(client: openai.OpenAI, content: bytes, needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    assert needle in err.value.message
    assert err.value.body["blazar_code"] == "BATCH_FILE_INVALID"  # type: ignore[index]


def test_unknown_model_endpoint_and_ids(client: openai.OpenAI) -> None:
    line = chat_line("a", "hi")
    line["body"]["model"] = "no-such-model"
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([line]))), purpose="batch")
    with pytest.raises(openai.NotFoundError) as err:
        client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert err.value.body["blazar_code"] == "MODEL_NOT_FOUND"  # type: ignore[index]
    good = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line("a", "hi")]))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=good.id, endpoint="/v1/embeddings", completion_window="24h")
    assert err.value.body["blazar_code"] == "BATCH_ENDPOINT_MISMATCH"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-nope")
    notes = client.files.create(file=("notes.txt", io.BytesIO(b"not a batch")), purpose="user_data")
    assert client.files.content(notes.id).content == b"not a batch"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(
            input_file_id=notes.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert err.value.body["param"] == "input_file_id"  # type: ignore[index]
    assert client.files.delete(good.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.content(good.id)


def test_an_oversized_upload_is_refused(daemon: DaemonProc) -> None:
    big = b"x" * (51 * 1024 * 1024)
    r = httpx.post(
        f"{daemon.url}/v1/files", files={"file": ("big.jsonl", big)}, data={"purpose": "batch"}, timeout=60
    )
    assert r.status_code == 413 and r.json()["error"]["blazar_code"] == "PAYLOAD_TOO_LARGE"


def test_interactive_requests_are_not_queued_behind_a_batch(
    client: openai.OpenAI, daemon: DaemonProc
) -> None:
    lines = [chat_line(f"bg-{i}", f"Count to {i}.") for i in range(200)]
    for line in lines:
        line["body"]["max_tokens"] = 16
    upload = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    try:
        deadline = time.monotonic() + 120
        while (
            b := client.batches.retrieve(batch.id)
        ).request_counts is None or b.request_counts.completed < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        latencies, busiest = [], 0
        for _ in range(5):
            queue = next(
                q
                for q in httpx.get(f"{daemon.url}/admin/engines").json()["admission"]["queues"]
                if q["model"] == MODEL
            )
            # the batch leaves a slot free, so the interactive request below never waits
            assert queue["running"] <= queue["capacity"] - 1, queue
            busiest = max(busiest, queue["running"])
            t0 = time.monotonic()
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
            )
            latencies.append(time.monotonic() - t0)
            assert r.choices[0].message.content is not None
        assert busiest >= 1  # the batch was running beside them
        assert client.batches.retrieve(batch.id).status == "in_progress"
        print(f"interactive latency beside a 200-item batch: {[round(x * 1000) for x in latencies]} ms")
    finally:
        client.batches.cancel(batch.id)
