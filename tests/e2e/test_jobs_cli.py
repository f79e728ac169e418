"""``blazar jobs`` against the real daemon: list, show, follow and cancel background responses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow


def _background(daemon: DaemonProc, text: str, max_output_tokens: int) -> str:
    body = {"model": MODEL, "input": text, "max_output_tokens": max_output_tokens, "background": True}
    resp = httpx.post(f"{daemon.url}/v1/responses", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    assert doc["status"] == "queued"
    return str(doc["id"])


def _events(daemon: DaemonProc, job_id: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{daemon.url}/v1/jobs/{job_id}/events", timeout=30)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["data"])


def test_follow_show_list_and_refused_cancel(daemon: DaemonProc) -> None:
    job_id = _background(daemon, "Name three colours.", 30)

    # followed from the start, while the job is still queued or running
    followed = daemon.cli("jobs", "follow", job_id, check=False, timeout_s=180)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.strip().startswith(f"job {job_id} completed")
    deltas = sum(e["kind"] == "response.output_text.delta" for e in _events(daemon, job_id))
    assert deltas > 0
    assert f"({deltas} text deltas)" in followed.stdout

    shown = json.loads(daemon.cli("jobs", "show", job_id, "--json").stdout)
    assert (shown["id"], shown["object"], shown["kind"]) == (job_id, "blazar.job", "response")
    assert (shown["model"], shown["status"], shown["attempts"]) == (MODEL, "completed", 1)
    plain = daemon.cli("jobs", "show", job_id).stdout
    assert job_id in plain and "completed" in plain

    listed = json.loads(daemon.cli("jobs", "--json").stdout)
    assert listed["object"] == "list"
    assert job_id in [j["id"] for j in listed["data"]]
    ours = next(j for j in listed["data"] if j["id"] == job_id)
    assert ours["status"] == "completed"
    running = json.loads(daemon.cli("jobs", "--state", "running", "--json").stdout)
    assert job_id not in [j["id"] for j in running["data"]]
    table = daemon.cli("jobs", "--kind", "response").stdout
    header, *rows = table.splitlines()
    assert header.split() == ["ID", "KIND", "MODEL", "STATUS", "ATTEMPTS", "AGE", "PROGRESS"]
    row = next(r for r in rows if r.split()[0] == job_id)
    assert row.split()[:5] == [job_id, "response", MODEL, "completed", "1"]

    refused = daemon.cli("jobs", "cancel", job_id, check=False)
    assert refused.returncode != 0
    assert job_id in refused.stderr and "already ended" in refused.stderr
    assert refused.stdout == ""
    assert json.loads(daemon.cli("jobs", "show", job_id, "--json").stdout)["status"] == "completed"


def test_unknown_job_is_one_line(daemon: DaemonProc) -> None:
    for args in (("show", "job_nope"), ("follow", "job_nope"), ("cancel", "job_nope")):
        out = daemon.cli("jobs", *args, check=False)
        assert out.returncode != 0, args
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "job_nope" in lines[0] and "blazar jobs" in lines[0], out.stderr
        assert "Traceback" not in out.stderr


def test_bad_state_is_refused_before_any_request(daemon: DaemonProc) -> None:
    out = daemon.cli("jobs", "--state", "sleeping", check=False)
    assert out.returncode != 0
    assert "sleeping" in out.stderr and "queued" in out.stderr


def test_cancel_ends_a_live_follow_non_zero(daemon: DaemonProc) -> None:
    job_id = _background(daemon, "Write a very long story about the sea.", 3000)
    follower = subprocess.Popen(
        [sys.executable, "-m", "blazar", "jobs", "follow", job_id],
        env=daemon.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if httpx.get(f"{daemon.url}/v1/jobs/{job_id}", timeout=10).json()["status"] == "running":
                break
            time.sleep(0.05)
        time.sleep(0.5)  # let the follower attach to the live stream
        assert follower.poll() is None, "follow ended before the job did"
        cancelled = daemon.cli("jobs", "cancel", job_id, check=False)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.strip() == f"job {job_id} cancelled"
        stdout, stderr = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode != 0
    assert stdout == ""
    assert stderr.strip().startswith(f"error: job {job_id} was cancelled")
    shown = json.loads(daemon.cli("jobs", "show", job_id, "--json").stdout)
    assert shown["status"] == "cancelled"


def test_no_daemon_says_how_to_start_one(tmp_path: Path, daemon: DaemonProc) -> None:
    env = {**daemon.env, "BLAZAR_HOME": str(tmp_path / "empty")}
    out = subprocess.run(
        [sys.executable, "-m", "blazar", "jobs"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "no daemon is running" in out.stderr and "blazar serve" in out.stderr
