"""Transcription requests and replies without a model: the form, the fields, the renderers."""

from __future__ import annotations

import json
import re
import struct

import pytest

from actors.engines import transcript as tx
from actors.engines.multipart import FormError, encode_form, parse_form
from actors.engines.synthesis import wav_header

CT = "multipart/form-data; boundary=XyZ"


def _form(*parts: tuple[str, bytes, str | None]) -> bytes:
    out = b""
    for name, data, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += b"--XyZ\r\nContent-Disposition: " + disp.encode() + b"\r\n"
        if filename:
            out += b"Content-Type: audio/wav\r\n"
        out += b"\r\n" + data + b"\r\n"
    return out + b"--XyZ--\r\n"


def test_a_form_keeps_binary_files_and_repeated_fields() -> None:
    audio = bytes(range(256)) * 3 + b"\r\n--XyZ-not-a-boundary\r\n"
    body = _form(
        ("file", audio, "a b.wav"),
        ("timestamp_granularities[]", b"word", None),
        ("timestamp_granularities[]", b"segment", None),
        ("model", b"whisper-1", None),
    )
    form = parse_form(body, CT)
    assert form["file"][0].data == audio and form["file"][0].filename == "a b.wav"
    assert form["file"][0].content_type == "audio/wav"
    assert [p.text for p in form["timestamp_granularities[]"]] == ["word", "segment"]
    assert form["model"][0].text == "whisper-1" and form["model"][0].filename is None


def test_a_form_encoded_again_reads_back_to_the_same_parts() -> None:
    audio = bytes(range(256)) * 3 + b"\r\n--XyZ-not-a-boundary\r\n"
    body = _form(("file", audio, 'q"uote\\d.wav'), ("model", b"whisper-1", None), ("async", b"true", None))
    form = parse_form(body, CT)
    kept = [p for name, parts in form.items() if name != "async" for p in parts]
    again = parse_form(encode_form(kept, "XyZ"), CT)
    assert list(again) == ["file", "model"]
    assert again["file"] == form["file"] and again["model"] == form["model"]
    assert again["file"][0].filename == 'q"uote\\d.wav'


def test_a_flag_takes_the_usual_spellings() -> None:
    assert tx.parse_flag("True", "async") and tx.parse_flag(" on ", "async") and tx.parse_flag("1", "async")
    assert not tx.parse_flag("", "async") and not tx.parse_flag("no", "async")
    with pytest.raises(tx.BadRequest, match="'async' must be true or false"):
        tx.parse_flag("maybe", "async")


@pytest.mark.parametrize(
    ("body", "ctype", "needle"),
    [
        (b"{}", "application/json", "multipart/form-data"),
        (b"x", "multipart/form-data", "boundary"),
        (b"no delimiter here", CT, "never appears"),
        (_form(("file", b"abc", "a.wav"))[:-12], CT, "truncated"),
        (b"--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--", CT, "name"),
    ],
)
def test_a_malformed_form_is_refused_with_its_fault(body: bytes, ctype: str, needle: str) -> None:
    with pytest.raises(FormError, match=needle):
        parse_form(body, ctype)


def _req(fields: dict[str, list[str]], task: tx.Task = "transcribe") -> tx.TranscriptionRequest:
    return tx.parse_request(fields, b"RIFF", filename="a.wav", task=task)


def test_fields_are_read_with_openai_defaults() -> None:
    r = _req({})
    assert (r.response_format, r.granularities, r.stream, r.vad_filter) == ("json", frozenset(), False, False)
    r = _req({"timestamp_granularities[]": ["word"]})
    assert r.response_format == "verbose_json" and r.word_timestamps
    r = _req({"response_format": ["verbose_json"]})
    assert r.granularities == {"segment"} and not r.word_timestamps
    r = _req({"language": [" EN "], "temperature": ["0.4"], "stream": ["true"], "vad_filter": ["1"]})
    assert (r.language, r.temperature, r.stream, r.vad_filter) == ("en", 0.4, True, True)
    assert _req({"language": ["en"]}, task="translate").language is None  # translation is to English


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": ["mp3"]}, "response_format"),
        ({"timestamp_granularities[]": ["char"]}, "timestamp_granularities[]"),
        ({"timestamp_granularities[]": ["word"], "response_format": ["srt"]}, "timestamp_granularities[]"),
        ({"temperature": ["2"]}, "temperature"),
        ({"temperature": ["hot"]}, "temperature"),
        ({"stream": ["maybe"]}, "stream"),
        ({"beam_size": ["2.5"]}, "beam_size"),
        ({"include[]": ["logprobs"]}, "include"),
    ],
)
def test_a_bad_field_is_named(fields: dict[str, list[str]], param: str) -> None:
    with pytest.raises(tx.BadRequest) as info:
        _req(fields)
    assert info.value.param == param


def test_a_form_without_a_file_is_refused() -> None:
    with pytest.raises(tx.BadRequest, match="'file'"):
        tx.parse_request({}, None, filename=None, task="transcribe")


def test_wav_checks_find_truncation_and_pass_whole_files() -> None:
    pcm = b"\x01\x00" * 1000
    wav = wav_header(16000, len(pcm)) + pcm
    assert tx.wav_problem(wav) is None
    assert tx.wav_problem(b"ID3 an mp3") is None  # not RIFF: the decoder judges it
    assert "truncated" in (tx.wav_problem(wav[:500]) or "")
    assert "2000 bytes" in (tx.wav_problem(wav[:500]) or "")
    assert "cut short" in (tx.wav_problem(b"RIFF\x00") or "")
    no_data = b"RIFF" + struct.pack("<I", 4 + 24) + b"WAVE" + wav[12:36]
    assert "no 'data'" in (tx.wav_problem(no_data) or "")
    streaming = wav_header(16000, 0xFFFFFFFF - 36)[:40] + struct.pack("<I", 0xFFFFFFFF) + pcm
    assert tx.wav_problem(streaming) is None  # a streamed WAV says "unknown length"


def _transcript() -> tx.Transcript:
    words = [tx.Word(word=" Hello", start=0.0, end=0.4), tx.Word(word=" world.", start=0.4, end=0.9)]
    return tx.Transcript(
        task="transcribe",
        language="en",
        duration=3661.25,
        segments=[
            tx.Segment(id=0, start=0.0, end=0.9, text=" Hello world.", words=words),
            tx.Segment(id=1, start=3600.5, end=3661.0049, text=" Later on.", words=[]),
        ],
    )


def test_timestamps() -> None:
    assert tx.timestamp(0) == "00:00:00,000"
    assert tx.timestamp(3661.0049) == "01:01:01,005"
    assert tx.timestamp(59.9996, decimal=".") == "00:01:00.000"
    assert tx.timestamp(-1) == "00:00:00,000"


_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)")


def parse_cues(text: str) -> list[tuple[float, float, str]]:
    """Cues of an SRT or WebVTT document (used by the host tests as well)."""
    cues = []
    for block in text.strip().split("\n\n"):
        lines = block.strip().splitlines()
        at = next(i for i, line in enumerate(lines) if "-->" in line) if "-->" in block else None
        if at is None:
            continue
        m = _CUE.fullmatch(lines[at].strip())
        assert m, lines[at]
        g = [int(x) for x in m.groups()]
        start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
        end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
        cues.append((start, end, "\n".join(lines[at + 1 :])))
    return cues


def test_srt_and_vtt() -> None:
    t = _transcript()
    ctype, srt = tx.render(t, "srt")
    assert ctype.startswith("application/x-subrip")
    text = srt.decode()
    assert text.startswith(
        "1\n00:00:00,000 --> 00:00:00,900\nHello world.\n\n2\n01:00:00,500 --> 01:01:01,005\n"
    )
    assert parse_cues(text) == [(0.0, 0.9, "Hello world."), (3600.5, 3661.005, "Later on.")]
    ctype, vtt = tx.render(t, "vtt")
    assert ctype.startswith("text/vtt") and vtt.decode().startswith(
        "WEBVTT\n\n00:00:00.000 --> 00:00:00.900\n"
    )
    assert [c[2] for c in parse_cues(vtt.decode())] == ["Hello world.", "Later on."]


def test_json_text_and_verbose_json() -> None:
    t = _transcript()
    assert json.loads(tx.render(t, "json")[1]) == {
        "text": "Hello world. Later on.",
        "usage": {"type": "duration", "seconds": 3662},
    }
    assert tx.render(t, "text") == ("text/plain; charset=utf-8", b"Hello world. Later on.\n")
    both = json.loads(tx.render(t, "verbose_json", frozenset({"word", "segment"}))[1])
    assert (both["task"], both["language"], both["duration"]) == ("transcribe", "english", 3661.25)
    assert both["words"] == [
        {"word": "Hello", "start": 0.0, "end": 0.4},
        {"word": "world.", "start": 0.4, "end": 0.9},
    ]
    assert [s["text"] for s in both["segments"]] == [" Hello world.", " Later on."]
    words_only = json.loads(tx.render(t, "verbose_json", frozenset({"word"}))[1])
    assert "segments" not in words_only and len(words_only["words"]) == 2
    assert "words" not in json.loads(tx.render(t, "verbose_json", frozenset({"segment"}))[1])
    assert tx.language_name("haw") == "hawaiian" and tx.language_name("xx") == "xx"
    with pytest.raises(tx.BadRequest):
        tx.render(t, "mp3")


def test_stream_events() -> None:
    delta = tx.delta_event("Hello")
    assert delta.startswith(b"data: ") and delta.endswith(b"\n\n")
    assert json.loads(delta[6:]) == {"type": "transcript.text.delta", "delta": "Hello"}
    done = json.loads(tx.done_event(_transcript())[6:])
    assert done["type"] == "transcript.text.done" and done["text"] == "Hello world. Later on."
    error = json.loads(tx.error_event("it broke")[6:])
    assert error["type"] == "error" and error["error"]["message"] == "it broke"
