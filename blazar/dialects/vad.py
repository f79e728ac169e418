"""Server-side voice-activity detection for the realtime dialect, with no I/O.

OpenAI's ``server_vad`` turn detection takes a ``threshold`` (0 to 1), a
``prefix_padding_ms`` and a ``silence_duration_ms``. Here a frame of 20 ms is voiced when
its level (RMS, in dB below full scale) reaches ``threshold_dbfs(threshold)``: 0.5 is
-40 dBFS, each 0.1 moves it by 6 dB (0 hears almost anything, 1 only shouting). Speech
starts after ``START_MS`` of voiced frames in a row (a click is not a turn) and reports
where it began less the prefix padding; it stops once ``silence_duration_ms`` of unvoiced
frames have followed, reporting the time the silence reached that length. ``Vad.feed``
takes any cut of the PCM (16-bit little-endian mono) and answers the events its whole
frames decide; times are milliseconds since the first sample fed, as OpenAI's
``audio_start_ms`` / ``audio_end_ms`` are.
"""

from __future__ import annotations

import math
import sys
from array import array
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = [
    "FRAME_MS",
    "START_MS",
    "SpeechStarted",
    "SpeechStopped",
    "TurnDetection",
    "Vad",
    "VadEvent",
    "frame_level_dbfs",
    "threshold_dbfs",
]

FRAME_MS = 20
START_MS = 60
"""Voiced audio in a row that makes a start of speech."""


class TurnDetection(msgspec.Struct, frozen=True, kw_only=True):
    """The session's ``turn_detection`` (OpenAI's field names and defaults)."""

    type: str = "server_vad"
    threshold: Annotated[float, Meta(ge=0, le=1)] = 0.5
    prefix_padding_ms: Annotated[int, Meta(ge=0)] = 300
    silence_duration_ms: Annotated[int, Meta(ge=0)] = 500
    create_response: bool = True
    interrupt_response: bool = True


class SpeechStarted(msgspec.Struct, frozen=True, kw_only=True):
    audio_start_ms: int


class SpeechStopped(msgspec.Struct, frozen=True, kw_only=True):
    audio_end_ms: int


VadEvent = SpeechStarted | SpeechStopped


def threshold_dbfs(threshold: float) -> float:
    """The level a voiced frame reaches, for OpenAI's 0-to-1 ``threshold``."""
    return -70.0 + 60.0 * min(max(threshold, 0.0), 1.0)


def frame_level_dbfs(frame: bytes) -> float:
    """The RMS level of 16-bit little-endian PCM in dBFS (-inf for digital silence)."""
    samples = array("h")
    samples.frombytes(frame[: len(frame) - len(frame) % 2])
    if not samples:
        return -math.inf
    if sys.byteorder == "big":
        samples.byteswap()
    energy = sum(s * s for s in samples)
    if energy == 0:
        return -math.inf
    return 10.0 * math.log10(energy / len(samples) / (32768.0 * 32768.0))


class Vad:
    """The detector over one session's input, fed as it arrives."""

    def __init__(self, settings: TurnDetection, *, rate_hz: int = 24_000, position_ms: int = 0) -> None:
        self.settings = settings
        self.frame_bytes = rate_hz * FRAME_MS // 1000 * 2
        self.floor_dbfs = threshold_dbfs(settings.threshold)
        self.position_ms = position_ms
        """The time of the next whole frame."""
        self.speaking = False
        self._pending = b""
        self._voiced_run = 0
        self._silent_run = 0

    def feed(self, pcm: bytes) -> list[VadEvent]:
        data = self._pending + pcm
        whole = len(data) - len(data) % self.frame_bytes
        self._pending = data[whole:]
        events: list[VadEvent] = []
        for at in range(0, whole, self.frame_bytes):
            event = self._frame(frame_level_dbfs(data[at : at + self.frame_bytes]) >= self.floor_dbfs)
            if event is not None:
                events.append(event)
        return events

    def _frame(self, voiced: bool) -> VadEvent | None:
        self.position_ms += FRAME_MS
        now = self.position_ms
        if not self.speaking:
            self._voiced_run = self._voiced_run + FRAME_MS if voiced else 0
            if self._voiced_run >= START_MS:
                self.speaking, self._silent_run = True, 0
                began = now - self._voiced_run
                return SpeechStarted(audio_start_ms=max(0, began - self.settings.prefix_padding_ms))
            return None
        self._silent_run = 0 if voiced else self._silent_run + FRAME_MS
        if self._silent_run >= self.settings.silence_duration_ms:
            self.speaking, self._voiced_run = False, 0
            return SpeechStopped(audio_end_ms=now)
        return None

    def reset(self) -> None:
        """Forget a turn in progress (the buffer was cleared or committed by hand)."""
        self.speaking = False
        self._voiced_run = self._silent_run = 0
