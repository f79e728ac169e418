"""Speech through the SDK on the real speech lanes: piper speaks, whisper transcribes what it
said (whole and as a job), and the realtime session (the ``realtime`` extra) opens on the
real WebSocket route."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import faster_whisper  # noqa: F401  (installed by make install: missing, the tests fail)
import piper  # noqa: F401  (installed by make install: missing, the tests fail)
import pytest
from tests.support import MODEL, DaemonProc, ensure_model, make_home, pull_speech, start_daemon

from blazar_sdk import AsyncClient, BlazarError, Client

pytestmark = pytest.mark.slow


SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    home = make_home(tmp_path_factory.mktemp("sdk-speech") / "home", ensure_model())
    pull_speech(home)
    d: DaemonProc = start_daemon(home)
    try:
        yield Client(base_url=d.url)
    finally:
        d.stop()


@pytest.fixture(scope="module")
def spoken(client: Client) -> bytes:
    audio = client.speech("piper-joe-us", SENTENCE, response_format="wav")
    assert audio.content_type.startswith("audio/") and audio.audio[:4] == b"RIFF" and audio.sample_rate
    return audio.audio


def test_speech_stream_gives_pcm_as_it_is_made(client: Client) -> None:
    with client.speech_stream("piper-joe-us", SENTENCE) as chunks:
        pcm = b"".join(chunks)
    assert chunks.sample_rate == 24000 and len(pcm) > 24000 and len(pcm) % 2 == 0


def test_transcribe_what_piper_said(client: Client, spoken: bytes) -> None:
    got = client.transcribe("whisper-tiny.en", ("fox.wav", spoken, "audio/wav"))
    words = got.text.lower()
    assert "fox" in words and "dog" in words, got.text
    text = client.transcribe("whisper-tiny.en", ("fox.wav", spoken), response_format="text")
    assert "fox" in text.text.lower() and isinstance(text.raw, str)


def test_transcription_job(client: Client, spoken: bytes) -> None:
    job = client.transcribe_job("whisper-tiny.en", ("fox.wav", spoken, "audio/wav"))
    assert job.kind == "transcription" and job.status in ("queued", "running")
    done = client.jobs.wait(job.id, timeout_s=240)
    assert done.status == "completed", done.error
    result = client.jobs.result(job.id)
    assert result.content_type.startswith("application/json") and "fox" in result.json()["text"].lower()


def test_a_speech_model_on_chat_is_a_typed_refusal(client: Client) -> None:
    with pytest.raises(BlazarError) as caught:
        client.chat("piper-joe-us", [{"role": "user", "content": "hi"}])
    assert (caught.value.status, caught.value.blazar_code) == (400, "MODEL_KIND_MISMATCH")


def test_realtime_session_opens_and_answers_events(client: Client) -> None:
    pytest.importorskip("websockets", reason="the realtime client needs the `realtime` extra")
    with client.realtime(MODEL) as session:
        assert session.recv(timeout=60)["type"] == "session.created"
        assert session.recv(timeout=60)["type"] == "conversation.created"
        session.send("no.such.event")
        err = session.recv(timeout=60)
        assert err["type"] == "error" and "no.such.event" in err["error"]["message"]
        session.send("input_audio_buffer.clear")
        assert session.recv(timeout=60)["type"] == "input_audio_buffer.cleared"

    with pytest.raises(BlazarError) as refused:
        client.realtime("no-such-model")
    assert (refused.value.status, refused.value.blazar_code) == (404, "MODEL_NOT_FOUND")


def test_async_realtime_session(client: Client) -> None:
    pytest.importorskip("websockets", reason="the realtime client needs the `realtime` extra")

    async def main() -> None:
        session = await AsyncClient(base_url=client.base_url).realtime(MODEL)
        async with session:
            assert (await session.recv())["type"] == "session.created"

    asyncio.run(asyncio.wait_for(main(), 60))
