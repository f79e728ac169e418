"""The realtime dialect without I/O: client events read or refused with OpenAI's error
codes, session updates applied or refused whole, server events' shapes, and the sentence
cutter that lets synthesis start before the answer is written."""

from __future__ import annotations

import base64
import json

import pytest

from blazar.dialects import realtime as rt
from blazar.dialects.vad import TurnDetection


def _session() -> rt.Session:
    return rt.Session(id="sess_1", model="smollm2-135m")


def test_a_served_event_is_read_with_its_id() -> None:
    kind, event_id, event = rt.decode_event('{"type": "response.create", "event_id": "ev1"}')
    assert (kind, event_id, event["type"]) == ("response.create", "ev1", "response.create")


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("{oops", "invalid_json", None),
        ("[1, 2]", "invalid_json", None),
        ('{"event_id": "x"}', "missing_required_parameter", "type"),
        ('{"type": 5}', "missing_required_parameter", "type"),
        ('{"type": "no.such.thing"}', "invalid_value", "type"),
        ('{"type": "conversation.item.truncate"}', "unsupported", "type"),
    ],
)
def test_bad_events_are_refused_with_a_code(raw: str, code: str, param: str | None) -> None:
    with pytest.raises(rt.EventError) as err:
        rt.decode_event(raw)
    assert err.value.code == code and err.value.param == param and err.value.message


def test_the_refused_event_keeps_its_id() -> None:
    with pytest.raises(rt.EventError) as err:
        rt.decode_event('{"type": "nope", "event_id": "ev9"}')
    assert err.value.event_id == "ev9"


def test_audio_is_base64_of_whole_samples() -> None:
    pcm = bytes(range(10))
    assert rt.decode_audio(base64.b64encode(pcm).decode()) == pcm
    for bad in ("***", 5, None, base64.b64encode(b"abc").decode()):
        with pytest.raises(rt.EventError) as err:
            rt.decode_audio(bad)
        assert err.value.param == "audio"


def test_a_session_update_applies_every_field() -> None:
    s = rt.update_session(
        _session(),
        {
            "instructions": "Be brief.",
            "voice": "piper-joe-us",
            "modalities": ["text"],
            "input_audio_transcription": {"model": "whisper-tiny.en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 300, "threshold": 0.6},
            "temperature": 0.3,
            "max_response_output_tokens": 64,
            "input_audio_format": "pcm16",
        },
    )
    assert s.instructions == "Be brief." and s.voice == "piper-joe-us" and s.modalities == ("text",)
    assert s.transcription_model == "whisper-tiny.en" and s.temperature == 0.3 and s.max_output_tokens == 64
    assert s.turn_detection == TurnDetection(silence_duration_ms=300, threshold=0.6)
    assert rt.update_session(s, {"turn_detection": None}).turn_detection is None
    assert rt.update_session(s, {"max_response_output_tokens": "inf"}).max_output_tokens is None
    shown = rt.session_json(s)
    assert shown["object"] == "realtime.session" and shown["output_audio_format"] == "pcm16"
    assert shown["turn_detection"]["silence_duration_ms"] == 300 and shown["max_response_output_tokens"] == 64


@pytest.mark.parametrize(
    ("update", "param"),
    [
        ({"input_audio_format": "g711_ulaw"}, "session.input_audio_format"),
        ({"output_audio_format": "g711_alaw"}, "session.output_audio_format"),
        ({"turn_detection": {"type": "semantic_vad"}}, "session.turn_detection.type"),
        ({"turn_detection": {"type": "server_vad", "silence_duration_ms": "long"}}, "session.turn_detection"),
        ({"turn_detection": {"type": "server_vad", "bogus": 1}}, "session.turn_detection.bogus"),
        ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
        ({"temperature": 3}, "session.temperature"),
        ({"modalities": ["video"]}, "session.modalities"),
        ({"max_response_output_tokens": 0}, "session.max_response_output_tokens"),
        ({"voice": ""}, "session.voice"),
    ],
)
def test_what_cannot_be_honoured_is_refused(update: dict[str, object], param: str) -> None:
    with pytest.raises(rt.EventError) as err:
        rt.update_session(_session(), update)
    assert err.value.param == param


def test_response_options_last_for_one_response() -> None:
    base = _session()
    one = rt.response_options(
        base, {"modalities": ["text"], "instructions": "Shout.", "max_output_tokens": 9}
    )
    assert one.modalities == ("text",) and one.instructions == "Shout." and one.max_output_tokens == 9
    assert rt.response_options(base, None) is base
    with pytest.raises(rt.EventError):
        rt.response_options(base, {"conversation": "none"})


def test_server_events_have_ids_and_errors_openais_shape() -> None:
    events = rt.Events()
    first, second = json.loads(events.event("session.created")), json.loads(events.event("session.created"))
    assert first["event_id"] != second["event_id"] and first["event_id"].startswith("event_")
    err = json.loads(events.error(rt.EventError("invalid_value", "no", "type"), "ev1"))
    assert err["type"] == "error"
    assert err["error"] == {
        "type": "invalid_request_error",
        "code": "invalid_value",
        "message": "no",
        "param": "type",
        "event_id": "ev1",
        "blazar_code": "BAD_REQUEST",
    }


def test_sentences_are_cut_as_the_text_streams() -> None:
    cut = rt.Sentences()
    out: list[str] = []
    for piece in ["Paris is the capi", "tal of France. It is", " a big city! Many ", "people live there"]:
        out += cut.feed(piece)
    assert out == ["Paris is the capital of France.", "It is a big city!"]
    assert cut.flush() == ["Many people live there"] and cut.flush() == []


def test_short_sentences_join_the_next_and_numbers_do_not_cut() -> None:
    cut = rt.Sentences()
    assert cut.feed("Hi. ") == []  # too short to be worth a synthesis of its own
    assert cut.feed("It costs 3.50 dollars today. ") == ["Hi. It costs 3.50 dollars today."]
    assert cut.feed("A line without an end mark\nand more") == ["A line without an end mark"]
    assert cut.flush() == ["and more"]


def test_every_session_field_is_known_or_refused_as_openai_does() -> None:
    with pytest.raises(rt.EventError) as err:
        rt.update_session(_session(), {"instructions": "x", "colour": "blue"})
    assert (err.value.code, err.value.param) == ("unknown_parameter", "session.colour")
    assert err.value.message == "Unknown parameter: 'session.colour'."
    for field, value in [
        ("tool_choice", "required"),
        ("input_audio_noise_reduction", {"type": "near_field"}),
        ("tracing", "auto"),
    ]:
        with pytest.raises(rt.EventError) as err:
            rt.update_session(_session(), {field: value})
        assert err.value.code == "unsupported" and err.value.param == f"session.{field}"
    # the values this server does are accepted as they are
    same = rt.update_session(
        _session(), {"tool_choice": "auto", "tools": [], "input_audio_noise_reduction": None}
    )
    assert same == _session()


def test_speed_and_whisper_language_and_prompt_are_honoured() -> None:
    s = rt.update_session(
        _session(),
        {"speed": 1.25, "input_audio_transcription": {"model": "w", "language": "en", "prompt": "Blazar"}},
    )
    assert (s.speed, s.transcription_model, s.transcription_language, s.transcription_prompt) == (
        1.25,
        "w",
        "en",
        "Blazar",
    )
    assert rt.session_json(s)["input_audio_transcription"] == {
        "model": "w",
        "language": "en",
        "prompt": "Blazar",
    }
    for bad in ({"speed": 3}, {"input_audio_transcription": {"model": "w", "beam": 2}}):
        with pytest.raises(rt.EventError):
            rt.update_session(s, bad)
    cleared = rt.update_session(s, {"input_audio_transcription": None})
    assert cleared.transcription_model is None and cleared.transcription_language is None


def test_a_response_refuses_what_it_cannot_do_and_keeps_its_metadata() -> None:
    base = _session()
    one = rt.response_options(base, {"metadata": {"topic": "weather"}})
    assert one.metadata == {"topic": "weather"} and base.metadata is None
    for bad, param in [
        ({"input": [{"type": "message"}]}, "response.input"),
        ({"tool_choice": "required"}, "response.tool_choice"),
        ({"output_audio_format": "g711_ulaw"}, "response.output_audio_format"),
        ({"metadata": "x"}, "response.metadata"),
        ({"stream": True}, "response.stream"),
    ]:
        with pytest.raises(rt.EventError) as err:
            rt.response_options(base, bad)
        assert err.value.param == param
