"""Transcription requests and replies in OpenAI's shapes, with no I/O.

The whisper host reads a request with ``parse_request`` (the fields of OpenAI's
multipart form), runs the engine, and answers with ``render`` (``json``, ``text``,
``srt``, ``vtt``, ``verbose_json``) or, streamed, with ``delta_event`` and
``done_event`` (server-sent ``transcript.text.delta`` / ``transcript.text.done``).
The gateway may use the same functions; nothing here touches a socket or a model.
``wav_problem`` finds what is wrong with a RIFF upload that a decoder would
otherwise read in part without complaint (a truncated file).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

__all__ = [
    "FORMATS",
    "GRANULARITIES",
    "BadRequest",
    "Segment",
    "Transcript",
    "TranscriptionRequest",
    "Word",
    "delta_event",
    "done_event",
    "error_event",
    "language_name",
    "parse_flag",
    "parse_request",
    "render",
    "srt",
    "timestamp",
    "usage",
    "verbose_json",
    "vtt",
    "wav_problem",
]

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
Task = Literal["transcribe", "translate"]


class BadRequest(ValueError):
    """A request the host answers with 400; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class Word(msgspec.Struct, frozen=True, kw_only=True):
    word: str
    start: float
    end: float
    probability: float | None = None


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    start: float
    end: float
    text: str
    seek: int = 0
    tokens: list[int] = []
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: list[Word] | None = None


class Transcript(msgspec.Struct, frozen=True, kw_only=True):
    task: Task
    language: str
    """The language code the engine detected or was given (``en``)."""
    duration: float
    """Seconds of audio."""
    segments: list[Segment]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()

    @property
    def words(self) -> list[Word]:
        return [w for s in self.segments for w in s.words or ()]


class TranscriptionRequest(msgspec.Struct, frozen=True, kw_only=True):
    task: Task
    audio: bytes
    filename: str | None = None
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    """None or 0: the engine's fallback ladder (0.0 then higher as decoding fails)."""
    response_format: str = "json"
    granularities: frozenset[str] = frozenset()
    stream: bool = False
    vad_filter: bool = False
    vad_threshold: float | None = None
    vad_min_silence_ms: int | None = None
    beam_size: int | None = None

    @property
    def word_timestamps(self) -> bool:
        return "word" in self.granularities


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def parse_flag(value: str, param: str) -> bool:
    """A form's boolean field (true/false, 1/0, yes/no, on/off; empty is false)."""
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise BadRequest(f"'{param}' must be true or false, not {value!r}", param)


def _number(value: str, param: str, low: float, high: float) -> float:
    try:
        n = float(value)
    except ValueError:
        raise BadRequest(f"'{param}' must be a number, not {value!r}", param) from None
    if not (low <= n <= high):
        raise BadRequest(f"'{param}' must be between {low:g} and {high:g}, not {value}", param)
    return n


def _whole(value: str, param: str, low: int, high: int) -> int:
    n = _number(value, param, low, high)
    if n != int(n):
        raise BadRequest(f"'{param}' must be a whole number, not {value!r}", param)
    return int(n)


_KNOWN = frozenset(
    {
        "file", "model", "language", "prompt", "temperature", "response_format", "stream",
        "timestamp_granularities[]", "timestamp_granularities", "vad_filter", "vad_threshold",
        "vad_min_silence_ms", "beam_size", "chunking_strategy",
    }
)  # fmt: skip
_REFUSED = {
    "include": "'include' (logprobs) is not served by whisper",
    "known_speaker_names": "speaker names (diarization) are not served by whisper",
}


def parse_request(
    fields: Mapping[str, Sequence[str]], audio: bytes | None, *, filename: str | None, task: Task
) -> TranscriptionRequest:
    """A request from the form's text fields and its ``file`` part (None: none was sent)."""
    for name, why in _REFUSED.items():
        if name in fields or f"{name}[]" in fields:
            raise BadRequest(why, name)

    def one(name: str) -> str | None:
        values = fields.get(name)
        return values[-1] if values else None

    if audio is None:
        raise BadRequest("the form has no 'file' part: upload the audio as 'file'", "file")
    grains = [*fields.get("timestamp_granularities[]", ()), *fields.get("timestamp_granularities", ())]
    granularities = frozenset(g.strip() for g in grains if g.strip())
    if bad := sorted(granularities - set(GRANULARITIES)):
        raise BadRequest(
            f"unknown timestamp granularity {bad[0]!r}: one of {', '.join(GRANULARITIES)}",
            "timestamp_granularities[]",
        )
    fmt = one("response_format")
    if fmt is None:
        fmt = "verbose_json" if granularities else "json"
    if fmt not in FORMATS:
        raise BadRequest(f"unknown response_format {fmt!r}: one of {', '.join(FORMATS)}", "response_format")
    if granularities and fmt != "verbose_json":
        raise BadRequest(
            "timestamp_granularities[] needs response_format verbose_json", "timestamp_granularities[]"
        )
    temperature = one("temperature")
    language = one("language")
    vad_threshold, vad_silence, beam = one("vad_threshold"), one("vad_min_silence_ms"), one("beam_size")
    return TranscriptionRequest(
        task=task,
        audio=audio,
        filename=filename,
        model=one("model"),
        language=((language or "").strip().lower() or None) if task == "transcribe" else None,
        prompt=one("prompt") or None,
        temperature=_number(temperature, "temperature", 0.0, 1.0) if temperature not in (None, "") else None,
        response_format=fmt,
        granularities=granularities or (frozenset({"segment"}) if fmt == "verbose_json" else frozenset()),
        stream=parse_flag(one("stream") or "", "stream"),
        vad_filter=parse_flag(one("vad_filter") or "", "vad_filter"),
        vad_threshold=_number(vad_threshold, "vad_threshold", 0.0, 1.0) if vad_threshold else None,
        vad_min_silence_ms=_whole(vad_silence, "vad_min_silence_ms", 0, 60_000) if vad_silence else None,
        beam_size=_whole(beam, "beam_size", 1, 16) if beam else None,
    )


def unknown_fields(fields: Iterable[str]) -> list[str]:
    """Form fields this module does not read (the host ignores them, as OpenAI's does not)."""
    return sorted(set(fields) - _KNOWN)


# -- audio checks ------------------------------------------------------------


def wav_problem(data: bytes) -> str | None:
    """What is wrong with a RIFF/WAVE upload, or None (also for anything not RIFF).

    A decoder reads the samples a cut-short file has and says nothing, so the
    declared sizes are checked against the bytes there are."""
    if not data.startswith(b"RIFF"):
        return None
    if len(data) < 12 or data[8:12] != b"WAVE":
        return "the file starts like a WAV (RIFF) but its header is cut short or not WAVE"
    declared = struct.unpack_from("<I", data, 4)[0] + 8
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if chunk == b"data":
            have = len(data) - pos - 8
            if size not in (0, 0xFFFFFFFF) and size > have:
                return (
                    f"the WAV file is truncated: its header declares {size} bytes of samples, "
                    f"the upload holds {have}"
                )
            return None
        pos += 8 + size + (size & 1)
    if declared > len(data):
        return (
            f"the WAV file is truncated: its header declares {declared} bytes, the upload holds {len(data)}"
        )
    return "the WAV file has no 'data' chunk (no samples)"


# -- replies -----------------------------------------------------------------


def timestamp(seconds: float, *, decimal: str = ",") -> str:
    """``HH:MM:SS,mmm`` (SubRip; WebVTT takes ``.``)."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def srt(segments: Sequence[Segment]) -> str:
    cues = [
        f"{n}\n{timestamp(s.start)} --> {timestamp(s.end)}\n{s.text.strip()}\n"
        for n, s in enumerate(segments, 1)
    ]
    return "\n".join(cues)


def vtt(segments: Sequence[Segment]) -> str:
    cues = [
        f"{timestamp(s.start, decimal='.')} --> {timestamp(s.end, decimal='.')}\n{s.text.strip()}\n"
        for s in segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


def usage(t: Transcript) -> dict[str, Any]:
    """OpenAI's duration-billed usage: whole seconds of audio, rounded up."""
    return {"type": "duration", "seconds": math.ceil(t.duration)}


def verbose_json(t: Transcript, granularities: frozenset[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "task": t.task,
        "language": language_name(t.language),
        "duration": round(t.duration, 3),
        "text": t.text,
    }
    if "segment" in granularities or not granularities:
        out["segments"] = [
            {
                "id": s.id,
                "seek": s.seek,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": s.tokens,
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for s in t.segments
        ]
    if "word" in granularities:
        out["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)} for w in t.words
        ]
    out["usage"] = usage(t)
    return out


def render(t: Transcript, fmt: str, granularities: frozenset[str] = frozenset()) -> tuple[str, bytes]:
    """The reply body in ``fmt`` and its Content-Type."""
    if fmt == "json":
        return "application/json", msgspec.json.encode({"text": t.text, "usage": usage(t)})
    if fmt == "verbose_json":
        return "application/json", msgspec.json.encode(verbose_json(t, granularities))
    if fmt == "text":
        return "text/plain; charset=utf-8", (t.text + "\n").encode()
    if fmt == "srt":
        return "application/x-subrip; charset=utf-8", srt(t.segments).encode()
    if fmt == "vtt":
        return "text/vtt; charset=utf-8", vtt(t.segments).encode()
    raise BadRequest(f"unknown response_format {fmt!r}: one of {', '.join(FORMATS)}", "response_format")


def delta_event(text: str) -> bytes:
    """One server-sent ``transcript.text.delta`` event."""
    return b"data: " + msgspec.json.encode({"type": "transcript.text.delta", "delta": text}) + b"\n\n"


def done_event(t: Transcript) -> bytes:
    """The closing ``transcript.text.done`` event, with the whole text and its usage."""
    body = {"type": "transcript.text.done", "text": t.text, "usage": usage(t)}
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


def error_event(message: str) -> bytes:
    """A server-sent ``error`` event: what a stream that has begun says when it fails."""
    body = {"type": "error", "error": {"message": message, "type": "server_error", "code": 500}}
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


def language_name(code: str) -> str:
    """Whisper's English name for a language code (``en`` → ``english``); the code when unknown."""
    return _LANGUAGES.get(code, code)


_LANGUAGES = dict(
    pair.replace("_", " ").split(":")
    for pair in (
        "en:english zh:chinese de:german es:spanish ru:russian ko:korean fr:french ja:japanese "
        "pt:portuguese tr:turkish pl:polish ca:catalan nl:dutch ar:arabic sv:swedish it:italian "
        "id:indonesian hi:hindi fi:finnish vi:vietnamese he:hebrew uk:ukrainian el:greek ms:malay "
        "cs:czech ro:romanian da:danish hu:hungarian ta:tamil no:norwegian th:thai ur:urdu "
        "hr:croatian bg:bulgarian lt:lithuanian la:latin mi:maori ml:malayalam cy:welsh sk:slovak "
        "te:telugu fa:persian lv:latvian bn:bengali sr:serbian az:azerbaijani sl:slovenian "
        "kn:kannada et:estonian mk:macedonian br:breton eu:basque is:icelandic hy:armenian "
        "ne:nepali mn:mongolian bs:bosnian kk:kazakh sq:albanian sw:swahili gl:galician "
        "mr:marathi pa:punjabi si:sinhala km:khmer sn:shona yo:yoruba so:somali af:afrikaans "
        "oc:occitan ka:georgian be:belarusian tg:tajik sd:sindhi gu:gujarati am:amharic "
        "yi:yiddish lo:lao uz:uzbek fo:faroese ht:haitian_creole ps:pashto tk:turkmen nn:nynorsk "
        "mt:maltese sa:sanskrit lb:luxembourgish my:myanmar bo:tibetan tl:tagalog mg:malagasy "
        "as:assamese tt:tatar haw:hawaiian ln:lingala ha:hausa ba:bashkir jw:javanese su:sundanese "
        "yue:cantonese"
    ).split()
)
