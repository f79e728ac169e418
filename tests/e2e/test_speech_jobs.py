"""Transcription jobs (``async=true``) through the real daemon: submitted with the official
``openai`` client's raw request, polled and fetched through the jobs API, the transcript the
same as the synchronous one; a long transcription cancelled while it runs; bad input refused
before any job exists; a job submitted just before a ``kill -9`` run after the restart;
``blazar whisper --async`` and ``blazar jobs result``."""

from __future__ import annotations

import io
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faster_whisper  # noqa: F401  (installed by make install: missing, the tests fail)
import httpx
import openai
import piper  # noqa: F401  (installed by make install: missing, the tests fail)
import pytest

from tests.support import DaemonProc, pull_speech, start_daemon

pytestmark = pytest.mark.slow

SAID = "The quick brown fox jumps over the lazy dog."
STT = "whisper-tiny.en"


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DaemonProc]]:
    """One daemon, replaced by the restart test (the list holds the live one)."""
    home = tmp_path_factory.mktemp("speechjobs") / "home"
    pull_speech(home, (STT, "piper-joe-us"))
    live = [start_daemon(home)]
    try:
        yield live
    finally:
        live[-1].stop()


def _client(d: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def spoken(daemons: list[DaemonProc]) -> bytes:
    with _client(daemons[-1]).audio.speech.with_streaming_response.create(
        model="piper-joe-us", voice="piper-joe-us", input=SAID, response_format="wav"
    ) as r:
        return r.read()


def _repeat(wav: bytes, times: int) -> bytes:
    """The sentence said ``times`` times over: long audio from a short file."""
    with wave.open(io.BytesIO(wav)) as w:
        params, frames = w.getparams(), w.readframes(w.getnframes())
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setparams(params)
        out.writeframes(frames * times)
    return buf.getvalue()


def _submit(d: DaemonProc, audio: bytes, **fields: Any) -> httpx.Response:
    """The transcription as a job, sent with the official client's raw request (multipart)."""
    return (
        _client(d)
        .audio.transcriptions.with_raw_response.create(  # type: ignore[no-any-return]
            model=STT, file=("fox.wav", audio, "audio/wav"), extra_body={"async": "true", **fields}
        )
        .http_response
    )


def _wait(d: DaemonProc, job_id: str, states: set[str], timeout_s: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = httpx.get(f"{d.url}/v1/jobs/{job_id}", timeout=30).json()
        if job["status"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


def test_a_transcription_job_gives_the_synchronous_transcript(
    daemons: list[DaemonProc], spoken: bytes
) -> None:
    d = daemons[-1]
    sync = _client(d).audio.transcriptions.create(model=STT, file=("fox.wav", spoken, "audio/wav"))
    r = _submit(d, spoken)
    assert r.status_code == 202
    job = r.json()
    assert job["object"] == "blazar.job" and job["kind"] == "transcription" and job["model"] == STT
    assert job["status"] in ("queued", "running") and r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["result_url"] == f"/v1/jobs/{job['id']}/result"
    done = _wait(d, job["id"], {"completed", "failed"})
    assert done["status"] == "completed", done
    result = httpx.get(f"{d.url}{job['result_url']}", timeout=30)
    assert result.status_code == 200 and result.headers["content-type"].startswith("application/json")
    assert result.json()["text"] == sync.text
    listed = httpx.get(f"{d.url}/v1/jobs", params={"kind": "transcription"}, timeout=30).json()["data"]
    assert job["id"] in [j["id"] for j in listed]
    assert not (d.home / "jobs" / job["id"] / "upload").exists()  # the upload goes when the job ends

    srt = _submit(d, spoken, response_format="srt").json()
    assert _wait(d, srt["id"], {"completed", "failed"})["status"] == "completed"
    text = httpx.get(f"{d.url}/v1/jobs/{srt['id']}/result", timeout=30)
    assert text.headers["content-type"].startswith("application/x-subrip") and "-->" in text.text


def test_cancelling_a_running_transcription_job(daemons: list[DaemonProc], spoken: bytes) -> None:
    d = daemons[-1]
    job = _submit(d, _repeat(spoken, 40)).json()  # a few minutes of speech
    _wait(d, job["id"], {"running"})
    time.sleep(0.5)  # into the transcription itself
    cancelled = httpx.post(f"{d.url}/v1/jobs/{job['id']}/cancel", timeout=60)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    result = httpx.get(f"{d.url}/v1/jobs/{job['id']}/result", timeout=30)
    assert result.status_code == 409 and result.json()["error"]["blazar_code"] == "JOB_NO_RESULT"
    again = httpx.post(f"{d.url}/v1/jobs/{job['id']}/cancel", timeout=30)
    assert again.status_code == 409 and again.json()["error"]["blazar_code"] == "JOB_FINISHED"
    # the request the job made through the gateway was cut short, and its slot is free
    records = httpx.get(f"{d.url}/admin/requests", params={"client": f"job:{job['id']}"}, timeout=30)
    rows = [r for r in records.json()["data"] if r.get("client") == f"job:{job['id']}"]
    assert rows and rows[0]["status"] == 499, rows
    fresh = _client(d).audio.transcriptions.create(model=STT, file=("fox.wav", spoken, "audio/wav"))
    assert "fox" in fresh.text.lower()


def test_bad_input_is_refused_before_a_job_exists(daemons: list[DaemonProc], spoken: bytes) -> None:
    d = daemons[-1]
    before = httpx.get(f"{d.url}/v1/jobs", params={"kind": "transcription", "limit": 1000}, timeout=30)
    count = len(before.json()["data"])
    url = f"{d.url}/v1/audio/transcriptions"
    cases: list[tuple[dict[str, str], bytes, str | None]] = [
        ({"model": STT, "async": "true", "stream": "true"}, spoken, "stream"),
        ({"model": STT, "async": "true", "response_format": "docx"}, spoken, "response_format"),
        ({"model": STT, "async": "maybe"}, spoken, "async"),
        ({"model": STT, "async": "true"}, b"", "file"),
        ({"model": STT, "async": "true"}, spoken[: len(spoken) // 2], "file"),  # a WAV cut short
        ({"model": "piper-joe-us", "async": "true"}, spoken, None),
        ({"model": "no-such-model", "async": "true"}, spoken, None),
    ]
    for fields, audio, param in cases:
        r = httpx.post(url, data=fields, files={"file": ("a.wav", audio, "audio/wav")}, timeout=60)
        assert 400 <= r.status_code < 500, (fields, r.text)
        error = r.json()["error"]
        assert error["blazar_code"] in ("BAD_REQUEST", "MODEL_KIND_MISMATCH", "MODEL_NOT_FOUND"), error
        if param is not None:
            assert error["param"] == param, error
    after = httpx.get(f"{d.url}/v1/jobs", params={"kind": "transcription", "limit": 1000}, timeout=30)
    assert len(after.json()["data"]) == count
    # audio that is not audio is only found by the engine: the job fails and says why
    job = _submit(d, b"just some text, not audio").json()
    failed = _wait(d, job["id"], {"completed", "failed"})
    assert failed["status"] == "failed" and "BAD_REQUEST" in failed["error"], failed
    r = httpx.get(f"{d.url}/v1/jobs/{job['id']}/result", timeout=30)
    assert r.status_code == 409 and "failed" in r.json()["error"]["message"]


def test_the_cli_submits_a_job_and_prints_its_result(
    daemons: list[DaemonProc], spoken: bytes, tmp_path: Path
) -> None:
    d = daemons[-1]
    wav = tmp_path / "fox.wav"
    wav.write_bytes(spoken)
    job_id = d.cli("whisper", str(wav), "--async").stdout.strip()
    assert job_id.startswith("job_")
    assert _wait(d, job_id, {"completed", "failed"})["status"] == "completed"
    printed = d.cli("jobs", "result", job_id).stdout
    assert "fox" in printed.lower()


def test_a_queued_job_runs_after_a_kill_and_restart(daemons: list[DaemonProc], spoken: bytes) -> None:
    d = daemons[-1]
    expected = _client(d).audio.transcriptions.create(model=STT, file=("fox.wav", spoken, "audio/wav")).text
    job = _submit(d, spoken).json()
    d.proc.kill()  # SIGKILL: no drain; the job is queued or running in the ledger
    d.proc.wait()
    (d.home / "run" / "daemon.json").unlink(missing_ok=True)
    d = start_daemon(d.home)
    daemons.append(d)
    done = _wait(d, job["id"], {"completed", "failed"})
    assert done["status"] == "completed", done
    assert httpx.get(f"{d.url}/v1/jobs/{job['id']}/result", timeout=30).json()["text"] == expected
