"""The text-to-speech lane: a piper voice in our host, on the ``piper-tts`` wheel.

``python -m actors.engines.piper_host -m VOICE.onnx`` (its ``VOICE.onnx.json``
beside it: format ``onnx``) serves OpenAI's ``/v1/audio/speech`` and
``/v1/audio/voices``; it checks the API key and answers ``/health`` 503 while
loading. ``pip install 'blazar[speech]'`` installs it; the lossy formats need
``ffmpeg`` on ``PATH`` (``scripts/setup-ffmpeg.sh``).

Of the ``LaunchSpec`` it reads the voice path and name, ``threads`` (onnxruntime's
intra-op threads, through ``OMP_NUM_THREADS``) and ``extra_args``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

from actors.config import EngineConfig
from actors.engines._gpu import threaded_env, wheel_version
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec

__all__ = ["CAPABILITIES", "FORMATS", "build_argv", "host_available", "lane"]

CAPABILITIES = frozenset({"tts"})
FORMATS = frozenset({"onnx"})
"""A piper voice: ``NAME.onnx`` with its ``NAME.onnx.json`` beside it (the store's format
name for a voice: ``onnx``; the model's kind, ``tts``, tells it from other ONNX models)."""
START_TIMEOUT_S = 60.0


def host_available() -> bool:
    return importlib.util.find_spec("piper") is not None


def build_argv(spec: LaunchSpec, *, port: int, api_key: str, python: str = sys.executable) -> list[str]:
    flags = [
        "-m", spec.path,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--api-key", api_key,
        "--alias", spec.alias or spec.model,
    ]  # fmt: skip
    if spec.threads:
        flags += ["-t", str(spec.threads)]
    return [python, "-m", "actors.engines.piper_host", *flags, *spec.extra_args]


def _version() -> str | None:
    return wheel_version("piper-tts", "onnxruntime")


def lane(config: EngineConfig, release: object = None) -> Lane | None:
    """The piper host, or None when the wheel is not installed."""
    if release is not None or not host_available():
        return None
    return Lane(
        name="piper",
        kind="piper-host",
        binary=None,
        argv=lambda spec, port, api_key: build_argv(spec, port=port, api_key=api_key),
        version=_version,
        capabilities=CAPABILITIES,
        formats=FORMATS,
        env=threaded_env,
        llguidance=False,
        cpu_sequences=1,
        start_timeout_s=START_TIMEOUT_S,
    )
