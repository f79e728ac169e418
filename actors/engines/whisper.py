"""The speech-to-text lanes: faster-whisper in our host, and whisper.cpp's ``whisper-server``.

``whisper`` runs ``python -m actors.engines.whisper_host`` on a CTranslate2 whisper
model directory (format ``ctranslate2``: ``model.bin``, ``config.json``,
``tokenizer.json``, ``vocabulary.txt``), on the ``faster-whisper`` wheel
(``pip install 'blazar[speech]'``). It checks the API key, answers ``/health`` 503
while loading, and serves OpenAI's ``/v1/audio/transcriptions`` and
``/v1/audio/translations`` itself.

``whispercpp`` runs ``whisper-server`` when one is on ``PATH`` (a ggml ``.bin``
model, format ``ggml-whisper``), under our watchdog. Its transcription route is
mapped onto OpenAI's path (``--inference-path``); it checks no API key, has no
translation route (the gateway sends ``translate=true`` on the transcription
path) and converts non-WAV audio only with ``--convert``, which needs ffmpeg.

Of the ``LaunchSpec`` both read the model path and name, ``threads``, ``gpu_layers``
(set: on the GPU) and ``extra_args``; the host reads ``slots`` too (transcriptions at
once, ``--workers``), while whisper-server runs one request at a time whatever it is
given (its ``-p`` splits one file among processors). Context and templates do not apply.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import sys

from actors.config import EngineConfig
from actors.engines._gpu import Program, program_version, threaded_env, watched, wheel_version
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec

__all__ = [
    "CAPABILITIES",
    "HOST_FORMATS",
    "SERVER_FORMATS",
    "build_host_argv",
    "build_server_argv",
    "find_whisper_server",
    "host_available",
    "host_lane",
    "server_lane",
]

CAPABILITIES = frozenset({"stt"})
"""Speech to text: transcription (word and segment timestamps, voice-activity detection)
and translation to English."""
HOST_FORMATS = frozenset({"ctranslate2"})
"""A CTranslate2 whisper model directory (what faster-whisper loads): the store's format
name for such a folder (``registry`` records it as ``ctranslate2``)."""
SERVER_FORMATS = frozenset({"ggml-whisper"})
"""A whisper.cpp ggml model file (``ggml-tiny.en.bin``)."""
START_TIMEOUT_S = 120.0
"""A large model on a slow disk takes a while; tiny.en loads in about two seconds."""


def host_available() -> bool:
    return importlib.util.find_spec("faster_whisper") is not None


def find_whisper_server(configured: str | None = None) -> Program | None:
    if configured:
        return Program(argv=[configured], found="configured", dist="")
    found = shutil.which("whisper-server")
    return Program(argv=[found], found="path", dist="") if found else None


def build_host_argv(spec: LaunchSpec, *, port: int, api_key: str, python: str = sys.executable) -> list[str]:
    flags = [
        "-m", spec.path,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--api-key", api_key,
        "--alias", spec.alias or spec.model,
        "--workers", str(max(1, spec.slots)),
    ]  # fmt: skip
    if spec.threads:
        flags += ["-t", str(spec.threads)]
    if spec.gpu_layers:
        flags += ["--device", "cuda", "--compute-type", "int8_float16"]
    return [python, "-m", "actors.engines.whisper_host", *flags, *spec.extra_args]


def build_server_argv(
    spec: LaunchSpec, *, port: int, api_key: str, program: Program, convert: bool | None = None
) -> list[str]:
    """``api_key`` is not passed: whisper-server has no such option. ``convert`` (default:
    when ffmpeg is on PATH) lets it read any format ffmpeg decodes, not only WAV."""
    if convert is None:
        convert = shutil.which("ffmpeg") is not None
    flags = [
        "--host", "127.0.0.1",
        "--port", str(port),
        "-m", spec.path,
        "--inference-path", "/v1/audio/transcriptions",
    ]  # fmt: skip
    if spec.threads:
        flags += ["-t", str(spec.threads)]
    if convert:
        flags.append("--convert")
    if not spec.gpu_layers:
        flags.append("--no-gpu")
    return watched(program, [*flags, *spec.extra_args])


def _host_version() -> str | None:
    return wheel_version("faster-whisper", "ctranslate2")


def host_lane(config: EngineConfig, release: object = None) -> Lane | None:
    """The faster-whisper host, or None when the wheel is not installed."""
    if release is not None or not host_available():
        return None
    return Lane(
        name="whisper",
        kind="whisper-host",
        binary=None,
        argv=lambda spec, port, api_key: build_host_argv(spec, port=port, api_key=api_key),
        version=_host_version,
        capabilities=CAPABILITIES,
        formats=HOST_FORMATS,
        env=threaded_env,
        llguidance=False,
        cpu_sequences=1,
        start_timeout_s=START_TIMEOUT_S,
    )


def server_lane(config: EngineConfig, release: object = None) -> Lane | None:
    """whisper.cpp's ``whisper-server`` on PATH, or None."""
    program = find_whisper_server()
    if release is not None or program is None:
        return None
    return Lane(
        name="whisper.cpp",
        kind="whisper-server",
        binary=program.argv[0],
        argv=lambda spec, port, api_key: build_server_argv(spec, port=port, api_key=api_key, program=program),
        version=lambda: program_version(program, label="whisper.cpp"),
        capabilities=CAPABILITIES,
        formats=SERVER_FORMATS,
        env=threaded_env,
        llguidance=False,
        cpu_sequences=1,
        start_timeout_s=START_TIMEOUT_S,
    )
