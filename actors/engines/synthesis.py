"""Speech requests, voices and audio containers for the piper host, with no I/O.

``parse_speech`` reads OpenAI's ``POST /v1/audio/speech`` body; ``voice_info`` the
facts of a piper voice from its ``.onnx.json``; ``wav_header`` frames PCM as WAV;
``ffmpeg_argv`` is the encoder command for the lossy formats (and FLAC), which the
host runs only when ``ffmpeg`` is installed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any

import msgspec

from actors.engines.transcript import BadRequest

__all__ = [
    "CONTENT_TYPES",
    "ENCODED",
    "FORMATS",
    "MAX_INPUT_CHARS",
    "SpeechRequest",
    "Voice",
    "ffmpeg_argv",
    "parse_speech",
    "voice_info",
    "wav_header",
]

FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "flac")
ENCODED = frozenset({"mp3", "opus", "aac", "flac"})
"""The formats ffmpeg encodes; wav and pcm are written by the host itself."""
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}
MAX_INPUT_CHARS = 4096
"""OpenAI's limit on ``input``, and the host's default."""


class Voice(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    """The name requests give as ``voice`` (the alias the host serves)."""
    name: str
    """The voice file's own name (``en_US-joe-medium``)."""
    language: str | None
    """``en_US``: the voice's language code."""
    quality: str | None
    sample_rate: int
    speakers: list[str] = []
    """Named speakers of a multi-speaker voice (``voice`` may name one)."""

    def json(self) -> dict[str, Any]:
        return {
            "object": "voice",
            "id": self.id,
            "name": self.name,
            "language": self.language,
            "quality": self.quality,
            "sample_rate": self.sample_rate,
            "speakers": self.speakers,
            "installed": True,
        }


def voice_info(config: Mapping[str, Any], *, model_path: str, alias: str | None = None) -> Voice:
    """A voice's facts from its ``.onnx.json`` (``config``) and the model file's path."""
    name = os.path.basename(model_path)
    if name.endswith(".onnx"):
        name = name[: -len(".onnx")]
    audio = config.get("audio") or {}
    language = config.get("language") or {}
    code = language.get("code") if isinstance(language, Mapping) else None
    if code is None and isinstance(config.get("espeak"), Mapping):
        code = config["espeak"].get("voice")
    return Voice(
        id=alias or name,
        name=name,
        language=code,
        quality=audio.get("quality"),
        sample_rate=int(audio.get("sample_rate") or 22050),
        speakers=sorted(config.get("speaker_id_map") or {}),
    )


class SpeechRequest(msgspec.Struct, frozen=True, kw_only=True):
    input: str
    model: str | None = None
    voice: str | None = None
    response_format: str = "wav"
    speed: float = 1.0
    stream: bool = False
    speaker: str | None = None
    noise_scale: float | None = None
    noise_w: float | None = None

    @property
    def length_scale(self) -> float:
        """Piper's duration factor: twice as fast is half as long."""
        return 1.0 / self.speed


class _Body(msgspec.Struct, kw_only=True):
    input: Any = None
    model: Any = None
    voice: Any = None
    response_format: Any = None
    speed: Any = None
    stream: Any = None
    stream_format: Any = None
    speaker: Any = None
    noise_scale: Any = None
    noise_w: Any = None
    instructions: Any = None


def _num(value: Any, param: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{param}' must be a number", param)
    if not low <= value <= high:
        raise BadRequest(f"'{param}' must be between {low:g} and {high:g}, not {value}", param)
    return float(value)


def parse_speech(body: bytes, *, max_input: int = MAX_INPUT_CHARS) -> SpeechRequest:
    try:
        raw = msgspec.json.decode(body, type=_Body)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not a JSON object of speech fields: {exc}") from None
    if not isinstance(raw.input, str) or not raw.input.strip():
        raise BadRequest("'input' must be the text to speak, and not empty", "input")
    if len(raw.input) > max_input:
        raise BadRequest(
            f"'input' is {len(raw.input)} characters, over this host's limit of {max_input}: "
            "split the text into several requests",
            "input",
        )
    if raw.instructions:
        raise BadRequest("'instructions' (voice direction) is not served by piper voices", "instructions")
    fmt = raw.response_format if raw.response_format is not None else "wav"
    if fmt == "pcm16":
        fmt = "pcm"
    if fmt not in FORMATS:
        raise BadRequest(f"unknown response_format {fmt!r}: one of {', '.join(FORMATS)}", "response_format")
    if raw.stream_format not in (None, "audio"):
        raise BadRequest(
            "only stream_format 'audio' is served (raw audio bytes as they are made)", "stream_format"
        )
    stream = bool(raw.stream) or raw.stream_format == "audio"
    if stream and fmt == "wav":
        raise BadRequest(
            "a WAV file states its length before its samples, so it cannot stream: ask for "
            "response_format pcm (or mp3, opus, aac, flac) to stream",
            "response_format",
        )
    for name in ("voice", "model", "speaker"):
        value = getattr(raw, name)
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"'{name}' must be a string", name)
    return SpeechRequest(
        input=raw.input,
        model=raw.model,
        voice=raw.voice or None,
        response_format=fmt,
        speed=_num(raw.speed, "speed", 0.25, 4.0) if raw.speed is not None else 1.0,
        stream=stream,
        speaker=raw.speaker or None,
        noise_scale=_num(raw.noise_scale, "noise_scale", 0.0, 2.0) if raw.noise_scale is not None else None,
        noise_w=_num(raw.noise_w, "noise_w", 0.0, 2.0) if raw.noise_w is not None else None,
    )


def wav_header(sample_rate: int, data_bytes: int, *, channels: int = 1, width: int = 2) -> bytes:
    """The 44-byte RIFF/WAVE header of ``data_bytes`` bytes of little-endian PCM."""
    block = channels * width
    fmt = struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, width * 8)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVE"
        + b"fmt "
        + fmt
        + b"data"
        + struct.pack("<I", data_bytes)
    )


_ENCODERS = {
    "mp3": ["-c:a", "libmp3lame", "-b:a", "128k", "-f", "mp3"],
    "opus": ["-c:a", "libopus", "-b:a", "48k", "-ar", "48000", "-f", "ogg"],
    "aac": ["-c:a", "aac", "-b:a", "96k", "-f", "adts"],
    "flac": ["-c:a", "flac", "-f", "flac"],
}


def ffmpeg_argv(ffmpeg: str, fmt: str, sample_rate: int) -> list[str]:
    """ffmpeg reading mono s16le PCM at ``sample_rate`` on stdin, writing ``fmt`` on stdout."""
    if fmt not in _ENCODERS:
        raise ValueError(f"ffmpeg does not encode {fmt!r} here: one of {', '.join(sorted(_ENCODERS))}")
    return [
        ffmpeg, "-hide_banner", "-loglevel", "error", "-nostdin",
        "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0",
        *_ENCODERS[fmt], "pipe:1",
    ]  # fmt: skip
