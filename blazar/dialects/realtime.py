"""OpenAI's Realtime API events (the beta WebSocket protocol), with no I/O.

``decode_event`` reads a client event (JSON text) into its type and fields, refusing
bad JSON, a missing or unknown ``type`` and the events this server does not serve with
an ``EventError`` (which becomes an ``error`` event: the socket stays open).
``update_session`` applies a ``session.update`` to the session's settings, refusing what
cannot be honoured; ``Events`` renders server events with fresh ``event_id`` s;
``Sentences`` cuts streamed text into sentences for synthesis.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Any, Literal

import msgspec

from blazar.dialects.vad import TurnDetection

__all__ = [
    "CLIENT_EVENTS",
    "PCM_HZ",
    "EventError",
    "Events",
    "Sentences",
    "Session",
    "decode_audio",
    "decode_event",
    "new_id",
    "session_json",
    "update_session",
]

PCM_HZ = 24_000
"""OpenAI's ``pcm16``: 24 kHz, 16-bit little-endian, mono, both ways."""

CLIENT_EVENTS = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "response.create",
        "response.cancel",
    }
)
_UNSUPPORTED = "unsupported"
_SESSION_FIELDS = frozenset(
    {
        "model",
        "modalities",
        "instructions",
        "voice",
        "input_audio_format",
        "output_audio_format",
        "input_audio_transcription",
        "turn_detection",
        "tools",
        "tool_choice",
        "temperature",
        "max_response_output_tokens",
        "speed",
        "input_audio_noise_reduction",
        "tracing",
    }
)
_ONLY: dict[str, tuple[Any, ...]] = {
    # the values of these fields that this server does (no tools; no noise reduction; no tracing)
    "tool_choice": ("auto", "none", None),
    "input_audio_noise_reduction": (None,),
    "tracing": (None,),
}
_RESPONSE_FIELDS = frozenset(
    {
        "modalities",
        "instructions",
        "voice",
        "output_audio_format",
        "tools",
        "tool_choice",
        "temperature",
        "max_response_output_tokens",
        "max_output_tokens",
        "conversation",
        "metadata",
        "input",
    }
)
_NOT_SERVED = frozenset(
    {
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "output_audio_buffer.clear",
        "transcription_session.update",
    }
)


class EventError(Exception):
    """A client event this server refuses; the socket stays usable."""

    def __init__(
        self, code: str, message: str, param: str | None = None, *, blazar_code: str = "BAD_REQUEST"
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.blazar_code = code, message, param, blazar_code
        self.event_id: str | None = None
        """The client event refused, when it had an ``event_id``."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """The settings of one connection (OpenAI's names)."""

    id: str
    model: str | None
    modalities: tuple[str, ...] = ("text", "audio")
    instructions: str = ""
    voice: str | None = None
    """The text-to-speech model (an installed voice); None: the first installed."""
    transcription_model: str | None = None
    """``input_audio_transcription.model``: the speech-to-text model; None: the first installed."""
    transcription_language: str | None = None
    transcription_prompt: str | None = None
    turn_detection: TurnDetection | None = TurnDetection()
    temperature: float = 0.8
    max_output_tokens: int | None = None
    speed: float = 1.0
    """The voice's speed (piper's length scale is its inverse)."""
    metadata: dict[str, Any] | None = None
    """A response's own ``metadata``, echoed in its events (never set on the session)."""


def session_json(s: Session) -> dict[str, Any]:
    return {
        "id": s.id,
        "object": "realtime.session",
        "model": s.model,
        "modalities": list(s.modalities),
        "instructions": s.instructions,
        "voice": s.voice,
        "input_audio_format": "pcm16",
        "output_audio_format": "pcm16",
        "input_audio_transcription": {
            "model": s.transcription_model,
            "language": s.transcription_language,
            "prompt": s.transcription_prompt,
        },
        "turn_detection": msgspec.to_builtins(s.turn_detection) if s.turn_detection else None,
        "tools": [],
        "tool_choice": "auto",
        "temperature": s.temperature,
        "max_response_output_tokens": "inf" if s.max_output_tokens is None else s.max_output_tokens,
        "speed": s.speed,
        "input_audio_noise_reduction": None,
        "tracing": None,
    }


def _refuse(param: str, message: str, code: str = "invalid_value") -> EventError:
    return EventError(code, message, param=f"session.{param}")


def _number(raw: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise _refuse(name, f"session.{name} must be a number from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def _turn_detection(raw: Any, current: TurnDetection | None) -> TurnDetection | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _refuse("turn_detection", "session.turn_detection must be an object or null")
    kind = raw.get("type", "server_vad")
    if kind != "server_vad":
        raise _refuse(
            "turn_detection.type",
            f"turn_detection type {kind!r} is not served here: use 'server_vad' (energy-based) or "
            "null and commit the input buffer yourself",
        )
    base = msgspec.to_builtins(current or TurnDetection())
    known = set(base)
    unknown = sorted(set(raw) - known - {"eagerness", "idle_timeout_ms"})
    if unknown:
        raise _refuse(f"turn_detection.{unknown[0]}", f"unknown turn_detection field {unknown[0]!r}")
    if raw.get("idle_timeout_ms") is not None:
        raise _refuse("turn_detection.idle_timeout_ms", "turn_detection.idle_timeout_ms is not served here")
    try:
        return msgspec.convert({**base, **{k: v for k, v in raw.items() if k in known}}, TurnDetection)
    except msgspec.ValidationError as exc:
        raise _refuse("turn_detection", f"bad turn_detection: {exc}") from None


def update_session(s: Session, raw: Any) -> Session:
    """``s`` with a ``session.update``'s ``session`` object applied; refused whole when any
    field is bad, or asks for what this server cannot do."""
    if not isinstance(raw, dict):
        raise EventError("invalid_value", "session.update needs a `session` object", param="session")
    _known(raw, _SESSION_FIELDS, "session")
    for name, allowed in _ONLY.items():
        if name in raw and raw[name] not in allowed:
            served = " or ".join(json.dumps(v) for v in allowed)
            raise _refuse(
                name, f"session.{name} {raw[name]!r} is not served here: send {served}", _UNSUPPORTED
            )
    changes: dict[str, Any] = {}
    if "model" in raw and raw["model"] is not None:
        if not isinstance(raw["model"], str) or not raw["model"]:
            raise _refuse("model", "session.model must name a chat model")
        changes["model"] = raw["model"]
    if "modalities" in raw:
        mods = raw["modalities"]
        if not isinstance(mods, list) or not mods or not set(mods) <= {"text", "audio"}:
            raise _refuse("modalities", "session.modalities must be ['text', 'audio'] or ['text']")
        changes["modalities"] = tuple(dict.fromkeys(mods))
    if "instructions" in raw:
        if not isinstance(raw["instructions"], str):
            raise _refuse("instructions", "session.instructions must be a string")
        changes["instructions"] = raw["instructions"]
    if "voice" in raw:
        if not isinstance(raw["voice"], str) or not raw["voice"]:
            raise _refuse("voice", "session.voice must name an installed voice (GET /v1/audio/voices)")
        changes["voice"] = raw["voice"]
    for fmt in ("input_audio_format", "output_audio_format"):
        if raw.get(fmt, "pcm16") != "pcm16":
            raise _refuse(fmt, f"{fmt} {raw[fmt]!r} is not served here: only 'pcm16' (24 kHz mono)")
    if "input_audio_transcription" in raw:
        changes.update(_transcription(raw["input_audio_transcription"]))
    if "turn_detection" in raw:
        changes["turn_detection"] = _turn_detection(raw["turn_detection"], s.turn_detection)
    if raw.get("tools"):
        raise _refuse(
            "tools", "function calling is not served on /v1/realtime yet: send no tools", _UNSUPPORTED
        )
    if (temperature := _number(raw, "temperature", 0.0, 2.0)) is not None:
        changes["temperature"] = temperature
    if "max_response_output_tokens" in raw:
        changes["max_output_tokens"] = _max_tokens(raw["max_response_output_tokens"], "session")
    if (speed := _number(raw, "speed", 0.25, 1.5)) is not None:
        changes["speed"] = speed
    return msgspec.structs.replace(s, **changes)


def _known(raw: dict[str, Any], fields: frozenset[str], where: str) -> None:
    """OpenAI refuses a field it does not know; so does this server (none is ignored)."""
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise EventError(
            "unknown_parameter", f"Unknown parameter: '{where}.{unknown[0]}'.", f"{where}.{unknown[0]}"
        )


def _transcription(asked: Any) -> dict[str, Any]:
    if asked is None:
        return {"transcription_model": None, "transcription_language": None, "transcription_prompt": None}
    if not isinstance(asked, dict):
        raise _refuse("input_audio_transcription", "input_audio_transcription must be an object or null")
    _known(asked, frozenset({"model", "language", "prompt"}), "session.input_audio_transcription")
    out: dict[str, Any] = {}
    for name in ("model", "language", "prompt"):
        value = asked.get(name)
        if value is not None and not isinstance(value, str):
            raise _refuse(
                f"input_audio_transcription.{name}", f"input_audio_transcription.{name} must be a string"
            )
        out[f"transcription_{name}"] = value or None
    return out


def _max_tokens(value: Any, where: str) -> int | None:
    if value == "inf" or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise EventError(
            "invalid_value",
            f"max_response_output_tokens must be 1 to 4096 or 'inf', got {value!r}",
            param=f"{where}.max_response_output_tokens",
        )
    return value


def response_options(s: Session, raw: Any) -> Session:
    """A ``response.create``'s ``response`` object: settings for this response only."""
    if raw is None:
        return s
    if not isinstance(raw, dict):
        raise EventError("invalid_value", "response must be an object", param="response")
    _known(raw, _RESPONSE_FIELDS, "response")
    if raw.get("input"):
        raise EventError(_UNSUPPORTED, "a response's own `input` items are not served here", "response.input")
    if raw.get("output_audio_format", "pcm16") != "pcm16":
        raise EventError("invalid_value", "only 'pcm16' audio is served here", "response.output_audio_format")
    if raw.get("tool_choice") not in _ONLY["tool_choice"]:
        raise EventError(
            _UNSUPPORTED, "tool_choice needs tools, which are not served here", "response.tool_choice"
        )
    metadata = raw.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise EventError("invalid_value", "response.metadata must be an object", "response.metadata")
    if raw.get("tools"):
        raise EventError(_UNSUPPORTED, "function calling is not served on /v1/realtime yet", "response.tools")
    if raw.get("conversation") not in (None, "auto"):
        raise EventError(
            _UNSUPPORTED,
            "out-of-band responses (conversation: none) are not served here",
            "response.conversation",
        )
    changes: dict[str, Any] = {"metadata": metadata}
    for name in ("instructions", "voice"):
        if isinstance(raw.get(name), str):
            changes[name] = raw[name]
    if "modalities" in raw:
        changes["modalities"] = update_session(s, {"modalities": raw["modalities"]}).modalities
    if (temperature := _number(raw, "temperature", 0.0, 2.0)) is not None:
        changes["temperature"] = temperature
    if "max_response_output_tokens" in raw or "max_output_tokens" in raw:
        value = raw.get("max_response_output_tokens", raw.get("max_output_tokens"))
        changes["max_output_tokens"] = _max_tokens(value, "response")
    return msgspec.structs.replace(s, **changes)


def decode_event(text: str | bytes) -> tuple[str, str | None, dict[str, Any]]:
    """A client event: its type, its ``event_id`` and the whole object."""
    try:
        event = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise EventError("invalid_json", f"the event is not valid JSON: {exc}") from None
    if not isinstance(event, dict):
        raise EventError("invalid_json", "an event must be a JSON object with a `type`")
    kind = event.get("type")
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    err = None
    if not isinstance(kind, str):
        err = EventError("missing_required_parameter", "the event has no `type`", param="type")
    elif kind in _NOT_SERVED:
        err = EventError(_UNSUPPORTED, f"event type {kind!r} is not served here", param="type")
    elif kind not in CLIENT_EVENTS:
        served = ", ".join(sorted(CLIENT_EVENTS))
        err = EventError(
            "invalid_value", f"unknown event type {kind!r}: the served ones are {served}", "type"
        )
    if err is not None:
        err.event_id = event_id
        raise err
    assert isinstance(kind, str)
    return kind, event_id, event


def decode_audio(raw: Any) -> bytes:
    """``input_audio_buffer.append``'s ``audio``: base64 of 16-bit PCM at 24 kHz."""
    if not isinstance(raw, str):
        raise EventError("invalid_value", "`audio` must be a base64 string of pcm16 audio", param="audio")
    try:
        pcm = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise EventError("invalid_value", "`audio` is not valid base64", param="audio") from None
    if len(pcm) % 2:
        message = "`audio` has an odd number of bytes: pcm16 samples are 2 bytes"
        raise EventError("invalid_value", message, "audio")
    return pcm


Status = Literal["completed", "cancelled", "failed", "incomplete"]


class Events:
    """Server events, JSON text, each with its own ``event_id``."""

    def event(self, kind: str, **fields: Any) -> str:
        return msgspec.json.encode({"event_id": new_id("event"), "type": kind, **fields}).decode()

    def error(self, err: EventError, event_id: str | None = None) -> str:
        body = {
            "type": "invalid_request_error",
            "code": err.code,
            "message": err.message,
            "param": err.param,
            "event_id": event_id,
            "blazar_code": err.blazar_code,
        }
        return self.event("error", error=body)


_ENDS = ".!?;:\n"


class Sentences:
    """Cuts streamed text where a sentence ends (an end mark then a space, or a line break),
    so synthesis starts before the whole answer is written."""

    def __init__(self, *, min_chars: int = 12) -> None:
        self._text = ""
        self._min = min_chars

    def feed(self, text: str) -> list[str]:
        self._text += text
        out: list[str] = []
        start = 0
        for i, ch in enumerate(self._text):
            end = ch == "\n" or (ch in _ENDS and i + 1 < len(self._text) and self._text[i + 1].isspace())
            if end and i + 1 - start >= self._min:
                out.append(self._text[start : i + 1].strip())
                start = i + 1
        self._text = self._text[start:]
        return [s for s in out if s]

    def flush(self) -> list[str]:
        rest, self._text = self._text.strip(), ""
        return [rest] if rest else []
