"""The speech lanes as data: argv, formats, capabilities, and what the piper host reads."""

from __future__ import annotations

import io
import json
import typing
import wave

import msgspec
import pytest

from actors.config import EngineConfig, ModelOverride
from actors.engines import piper, whisper
from actors.engines import synthesis as sx
from actors.engines._gpu import Program, threaded_env
from actors.engines.routing import LANES, installed, lane_for, route
from actors.engines.spec import LaunchSpec
from actors.engines.transcript import BadRequest
from actors.errors import UnsupportedEngine

SPEC = LaunchSpec(model="tiny.en", path="/m/tiny", ctx_per_slot=0, slots=1, lane="whisper", threads=2)


def _flag(argv: list[str], flag: str) -> str:
    """The value of ``flag`` among the program's own flags (after ``python -m MODULE``)."""
    flags = argv[3:]
    return flags[flags.index(flag) + 1]


def test_the_whisper_host_argv() -> None:
    argv = whisper.build_host_argv(SPEC, port=4242, api_key="k", python="/py")
    assert argv[:3] == ["/py", "-m", "actors.engines.whisper_host"]
    assert (_flag(argv, "-m"), _flag(argv, "--port"), _flag(argv, "--api-key")) == ("/m/tiny", "4242", "k")
    assert (_flag(argv, "--alias"), _flag(argv, "--workers"), _flag(argv, "-t")) == ("tiny.en", "1", "2")
    assert "--device" not in argv
    gpu = whisper.build_host_argv(LaunchSpec(model="w", path="/w", ctx_per_slot=0, slots=2, gpu_layers=99),
                                  port=1, api_key="k")  # fmt: skip
    assert _flag(gpu, "--device") == "cuda" and _flag(gpu, "--workers") == "2"
    assert threaded_env(SPEC)["OMP_NUM_THREADS"] == "2" and threaded_env(SPEC)["HF_HUB_OFFLINE"]


def test_the_whisper_server_argv() -> None:
    program = Program(argv=["/opt/whisper-server"], found="path", dist="")
    spec = LaunchSpec(model="base", path="/m/ggml-base.bin", ctx_per_slot=0, slots=1, extra_args=["-fa"])
    argv = whisper.build_server_argv(spec, port=5050, api_key="unused", program=program, convert=True)
    assert argv[1:4] == ["-m", "actors.engines.watchdog", "/opt/whisper-server"]
    assert (_flag(argv, "--port"), _flag(argv, "-m"), _flag(argv, "--host")) == (
        "5050",
        spec.path,
        "127.0.0.1",
    )
    assert _flag(argv, "--inference-path") == "/v1/audio/transcriptions"
    assert "--convert" in argv and "--no-gpu" in argv and argv[-1] == "-fa" and "unused" not in argv
    plain = whisper.build_server_argv(spec, port=1, api_key="k", program=program, convert=False)
    assert "--convert" not in plain


def test_the_piper_argv() -> None:
    spec = LaunchSpec(model="joe", path="/v/joe.onnx", ctx_per_slot=0, slots=1, lane="piper")
    argv = piper.build_argv(spec, port=7, api_key="k", python="/py")
    assert argv[:3] == ["/py", "-m", "actors.engines.piper_host"]
    assert (_flag(argv, "-m"), _flag(argv, "--alias"), _flag(argv, "--api-key")) == (
        "/v/joe.onnx",
        "joe",
        "k",
    )
    assert "-t" not in argv


def test_the_lanes_are_registered_and_routed_by_format() -> None:
    assert {"whisper", "whispercpp", "piper"} <= set(LANES)
    lanes = installed(EngineConfig())
    host, tts = lanes["whisper"], lanes["piper"]
    assert host is not None and tts is not None, "make install installs the speech extra"
    assert (host.kind, host.capabilities, host.formats) == ("whisper-host", {"stt"}, {"ctranslate2"})
    assert (tts.kind, tts.capabilities, tts.formats) == ("piper-host", {"tts"}, {"onnx"})
    assert host.start_timeout_s and tts.start_timeout_s and host.cpu_sequences == 1
    assert host.version() and "faster-whisper" in (host.version() or "")
    assert route("ctranslate2", needs=frozenset({"stt"}), pin=None, lanes=lanes).lane == "whisper"
    assert route("onnx", needs=frozenset({"tts"}), pin=None, lanes=lanes).lane == "piper"
    assert route("gguf", needs=frozenset(), pin=None, lanes=lanes).lane == "llamacpp"
    why = {c.lane: c.why for c in route("ggml-whisper", needs=frozenset(), pin=None, lanes=lanes).considered}
    if lanes["whispercpp"] is None:
        assert "whisper-server on PATH" in why["whispercpp"]
    assert lane_for(SPEC, EngineConfig()).kind == "whisper-host"


def test_a_model_can_be_pinned_to_every_lane() -> None:
    pins = typing.get_args(typing.get_type_hints(ModelOverride)["engine"])
    assert set(typing.get_args(pins[0])) == set(LANES)
    assert msgspec.convert({"engine": "piper"}, ModelOverride).engine == "piper"


def test_a_missing_whisper_server_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert whisper.server_lane(EngineConfig()) is None
    with pytest.raises(UnsupportedEngine, match="whisper-server"):
        lane_for(LaunchSpec(model="b", path="/b", ctx_per_slot=0, slots=1, lane="whispercpp"), EngineConfig())


def test_speech_fields() -> None:
    r = sx.parse_speech(b'{"input": "Hi.", "voice": "joe", "speed": 2}')
    assert (r.response_format, r.length_scale, r.voice, r.stream) == ("wav", 0.5, "joe", False)
    r = sx.parse_speech(b'{"input": "Hi.", "response_format": "pcm16", "stream_format": "audio"}')
    assert (r.response_format, r.stream) == ("pcm", True)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"input": ""}', "input"),
        (b'{"input": "   "}', "input"),
        (b'{"voice": "joe"}', "input"),
        (b'{"input": "' + b"a" * 4097 + b'"}', "input"),
        (b'{"input": "x", "response_format": "ogg"}', "response_format"),
        (b'{"input": "x", "stream": true}', "response_format"),  # wav cannot stream
        (b'{"input": "x", "speed": 5}', "speed"),
        (b'{"input": "x", "speed": "fast"}', "speed"),
        (b'{"input": "x", "instructions": "whisper it"}', "instructions"),
        (b'{"input": "x", "voice": 3}', "voice"),
        (b"[1, 2]", None),
        (b"not json", None),
    ],
)
def test_bad_speech_fields_are_named(body: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        sx.parse_speech(body)
    assert info.value.param == param


def test_a_voice_and_its_wav() -> None:
    config = {
        "audio": {"sample_rate": 22050, "quality": "medium"},
        "language": {"code": "en_US"},
        "speaker_id_map": {"b": 1, "a": 0},
    }
    voice = sx.voice_info(config, model_path="/v/en_US-joe-medium.onnx", alias="joe")
    assert (voice.id, voice.name, voice.language, voice.sample_rate) == (
        "joe",
        "en_US-joe-medium",
        "en_US",
        22050,
    )
    assert voice.speakers == ["a", "b"] and json.loads(json.dumps(voice.json()))["object"] == "voice"
    assert sx.voice_info({"espeak": {"voice": "de"}}, model_path="/v/x.onnx").language == "de"
    pcm = b"\x00\x01" * 2205
    with wave.open(io.BytesIO(sx.wav_header(22050, len(pcm)) + pcm)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()) == (22050, 1, 2, 2205)


def test_ffmpeg_argv() -> None:
    argv = sx.ffmpeg_argv("/usr/bin/ffmpeg", "opus", 22050)
    assert argv[0] == "/usr/bin/ffmpeg" and argv[-1] == "pipe:1"
    assert _flag(argv, "-f") == "s16le" and _flag(argv, "-ar") == "22050" and "libopus" in argv
    assert set(sx.ENCODED) == {"mp3", "opus", "aac", "flac"}
    with pytest.raises(ValueError):
        sx.ffmpeg_argv("ffmpeg", "wav", 22050)
