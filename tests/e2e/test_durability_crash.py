"""Crash safety with a real ``kill -9`` of the daemon: batches resume at their first unrecorded
item, acknowledged responses survive, and the ledger file stays sound."""

from __future__ import annotations

import io
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow


def _client(d: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _kill_and_restart(d: DaemonProc) -> DaemonProc:
    d.proc.kill()  # SIGKILL: no drain, no shutdown hooks
    d.proc.wait()
    (d.home / "run" / "daemon.json").unlink(missing_ok=True)
    return start_daemon(d.home)


def _recorded(home: Path, batch_id: str) -> int:
    conn = sqlite3.connect(f"file:{home / 'blazar.db'}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM batch_items WHERE batch_id = ? AND state NOT IN ('pending', 'running')",
            (batch_id,),
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def _integrity_ok(home: Path) -> None:
    conn = sqlite3.connect(home / "blazar.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


@pytest.fixture
def daemon_home(tmp_path: Path, model_path: Path) -> Iterator[list[DaemonProc]]:
    procs = [start_daemon(make_home(tmp_path / "home", model_path))]
    try:
        yield procs
    finally:
        procs[-1].stop()


def test_a_1000_item_batch_killed_twice_completes_exactly_once_each(daemon_home: list[DaemonProc]) -> None:
    d = daemon_home[0]
    n = 1000
    # Plain one-token completions: what is tested is the batch's bookkeeping across two kills,
    # and the engine's work is the test's time (a CPU engine's cost is its tokens: batching
    # them buys little). A chat item's template (SmolLM2's adds a system turn) made it prefill
    # ten times the tokens; chat batches are tested in test_batches_sdk.py. Each prompt differs
    # from the one before in its last digits, so the slot's prompt cache leaves about one new
    # token to prefill, and one generated token needs no decode step after it: half the time
    # of "Say {i}." with two tokens, for the same 1000 distinct requests.
    lines = [
        {
            "custom_id": f"item-{i:04d}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": f"Say {i:04d}", "max_tokens": 1},
        }
        for i in range(n)
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    client = _client(d)
    upload = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
    )
    for kill_after in (150, 550):
        deadline = time.monotonic() + 600
        while _recorded(d.home, batch.id) < kill_after:
            assert time.monotonic() < deadline, "the batch made no progress"
            time.sleep(0.05)
        d = _kill_and_restart(d)
        daemon_home.append(d)
        _integrity_ok(d.home)
    client = _client(d)
    deadline = time.monotonic() + 900
    while (done := client.batches.retrieve(batch.id)).status != "completed":
        assert done.status in ("validating", "in_progress", "finalizing"), done
        assert time.monotonic() < deadline, "the batch did not complete after the restarts"
        time.sleep(0.2)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (n, n, 0)
    assert done.output_file_id is not None and done.error_file_id is None
    rows = [json.loads(x) for x in client.files.content(done.output_file_id).content.splitlines()]
    assert len(rows) == n
    assert sorted(r["custom_id"] for r in rows) == [f"item-{i:04d}" for i in range(n)]
    assert all(r["response"]["status_code"] == 200 for r in rows)
    job = httpx.get(f"{d.url}/v1/jobs/{batch.id}", timeout=10).json()
    assert job["status"] == "completed" and job["attempts"] == 3
    _integrity_ok(d.home)


def test_every_acknowledged_stored_response_survives_a_kill(daemon_home: list[DaemonProc]) -> None:
    d = daemon_home[0]
    acknowledged: list[str] = []
    stop = threading.Event()

    def burst() -> None:
        with httpx.Client(base_url=d.url, timeout=60) as http:
            while not stop.is_set():
                body: dict[str, Any] = {"model": MODEL, "input": "Hi", "max_output_tokens": 2, "store": True}
                try:
                    r = http.post("/v1/responses", json=body)
                except httpx.HTTPError:
                    return  # the daemon died under us
                if r.status_code == 200:
                    acknowledged.append(r.json()["id"])

    threads = [threading.Thread(target=burst) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acknowledged) < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    d.proc.kill()
    stop.set()
    for t in threads:
        t.join()
    d.proc.wait()
    assert len(acknowledged) >= 30
    (d.home / "run" / "daemon.json").unlink(missing_ok=True)
    d = start_daemon(d.home)
    daemon_home.append(d)
    _integrity_ok(d.home)
    client = _client(d)
    for response_id in acknowledged:
        stored = client.responses.retrieve(response_id)
        assert stored.id == response_id and stored.status in ("completed", "incomplete")
