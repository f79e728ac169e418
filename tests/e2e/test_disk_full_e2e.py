"""A full disk is an answer: the real daemon with its files store on a small tmpfs, filled up.

An upload answers 507 ``DISK_FULL`` in OpenAI's shape and leaves no temp file; a batch
whose output file cannot be written says so in its ``errors`` and completes, with every
answer, once the space is back; a restart removes the temp files a crash left.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc, fill_filesystem, small_filesystem, start_daemon, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def files_on_small_disk(home: Path) -> Iterator[Path]:
    with small_filesystem(home / "files", "2m") as folder:
        yield folder


def _lines(n: int) -> bytes:
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Say {i}."}],
            },
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _upload(url: str, data: bytes) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", data, "application/jsonl")},
        timeout=60,
    )


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


def test_a_full_disk_is_answered_and_a_batch_resumes_when_space_returns(
    home: Path, files_on_small_disk: Path
) -> None:
    folder = files_on_small_disk
    daemon: DaemonProc = start_daemon(home)
    try:
        upload = _upload(daemon.url, _lines(2))
        assert upload.status_code == 200, upload.text
        filler = fill_filesystem(folder)

        # An upload on the full disk: 507 in OpenAI's shape, saying what to do, no local path.
        refused = _upload(daemon.url, _lines(40))
        assert refused.status_code == 507, refused.text
        error = refused.json()["error"]
        assert error["blazar_code"] == "DISK_FULL" and error["code"] == "disk_full"
        assert "the upload" in error["message"] and "files/" in error["message"]
        assert "free space" in error["message"] and str(home) not in error["message"]
        assert _temps(folder) == []

        # A batch whose output file cannot be written waits, and says why while it waits.
        created = httpx.post(
            f"{daemon.url}/v1/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            timeout=60,
        )
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]

        def get_batch() -> dict[str, Any]:
            got: dict[str, Any] = httpx.get(f"{daemon.url}/v1/batches/{batch_id}", timeout=30).json()
            return got

        def stalled() -> dict[str, Any] | None:
            batch = get_batch()
            assert batch["status"] not in ("completed", "failed", "expired", "cancelled"), batch
            errors = (batch.get("errors") or {}).get("data") or []
            return batch if any(e["code"] == "disk_full" for e in errors) else None

        waiting = wait_until(stalled, 120, "the batch to say that the disk is full")
        assert waiting is not None
        assert waiting["status"] in ("in_progress", "finalizing")
        assert _temps(folder) == []

        # Space back: the batch goes on by itself, with both answers.
        filler.unlink()

        def ended() -> dict[str, Any] | None:
            batch = get_batch()
            return batch if batch["status"] in ("completed", "failed", "expired") else None

        done = wait_until(ended, 120, "the batch to complete once the space is back")
        assert done is not None
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        assert not (done.get("errors") or {}).get("data")
        out = httpx.get(f"{daemon.url}/v1/files/{done['output_file_id']}/content", timeout=30)
        rows = [json.loads(line) for line in out.content.splitlines() if line.strip()]
        assert sorted(r["custom_id"] for r in rows) == ["req-0", "req-1"]
    finally:
        daemon.stop()

    # What a crash in the middle of a write leaves is gone after a restart.
    (folder / ".sha256-left.0123abcd.tmp").write_bytes(b"partial")
    (home / "jobs" / "job_left").mkdir(parents=True, exist_ok=True)
    (home / "jobs" / "job_left" / ".result.89abcdef.tmp").write_bytes(b"partial")
    again = start_daemon(home)
    try:
        assert _temps(folder) == [] and _temps(home / "jobs") == []
        assert httpx.get(f"{again.url}/v1/files", timeout=30).status_code == 200
    finally:
        again.stop()
