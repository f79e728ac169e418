"""Serve a piper voice through ``piper-tts`` (onnxruntime) as an OpenAI-style child process.

``python -m actors.engines.piper_host -m VOICE.onnx --port N --api-key K --alias NAME``
loads the voice (its ``VOICE.onnx.json`` beside it) and serves ``GET /health``
(503 while loading, 200 once loaded), ``GET /v1/models``, ``GET /v1/audio/voices``
(the voice with its language and sample rate) and ``POST /v1/audio/speech``
(OpenAI's JSON body: ``input``, ``voice``, ``response_format`` wav / pcm, and
mp3 / opus / aac / flac through an ``ffmpeg`` child when one is installed;
``speed`` 0.25 to 4; ``stream``). PCM and the ffmpeg formats stream as synthesis runs,
one sentence at a time (chunked transfer); WAV is sent whole with its length.
PCM is mono signed 16-bit little-endian at 24 kHz, OpenAI's ``pcm`` (resampled from the
voice's own rate as each sentence comes, ``actors.engines.resample``); the
``X-Sample-Rate`` header states the rate of every format (WAV and the ffmpeg formats keep
the voice's).

The lifetime rules are the other hosts' (``actors.engines.speech_host``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from actors.engines import synthesis as sx
from actors.engines.resample import Resampler
from actors.engines.speech_host import BaseHandler, Gone, HostState, add_common_args, run_host
from actors.engines.transcript import BadRequest

__all__ = ["Engine", "main", "parse_args"]

_READ = 16 * 1024
PCM_HZ = 24_000
"""OpenAI's ``pcm``: 24 kHz, 16-bit, mono."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="piper_host", description=__doc__)
    p.add_argument("-m", "--model", required=True, help="the voice's .onnx file (its .onnx.json beside it)")
    p.add_argument("-c", "--config", default=None, help="the voice's .onnx.json (default: beside the model)")
    add_common_args(p)
    p.add_argument("--max-input-chars", type=int, default=sx.MAX_INPUT_CHARS, help="the longest 'input'")
    p.add_argument("--ffmpeg", default=None, help="the ffmpeg to encode with (default: on PATH)")
    return p.parse_args(list(argv))


def config_path(ns: argparse.Namespace) -> str:
    return ns.config or ns.model + ".json"


class Engine:
    """The loaded voice. Synthesis of one sentence at a time holds a lock: the phonemizer
    (espeak-ng) keeps global state; the model itself is only ever run one call at a time."""

    def __init__(self, ns: argparse.Namespace, voice: sx.Voice) -> None:
        self.voice = voice
        self.piper = _load_voice(ns)
        self._lock = threading.Lock()
        self.speaker_ids: dict[str, int] = dict(self.piper.config.speaker_id_map or {})

    def pcm(self, req: sx.SpeechRequest, speaker: int | None) -> Iterator[bytes]:
        """The speech as 16-bit PCM, one sentence per item."""
        from piper import SynthesisConfig

        config = SynthesisConfig(
            speaker_id=speaker,
            length_scale=req.length_scale,
            noise_scale=req.noise_scale,
            noise_w_scale=req.noise_w,
        )
        chunks = iter(self.piper.synthesize(req.input, syn_config=config))
        while True:
            with self._lock:
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk.audio_int16_bytes


def _omp_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _load_voice(ns: argparse.Namespace) -> Any:
    """The voice, on ``ns.threads`` onnxruntime threads when given, else on ``OMP_NUM_THREADS``
    when that is set (the variable the CTranslate2 lane sizes its pool by); piper's own loader
    takes no session options, so the session is built the way it builds it."""
    from piper import PiperVoice

    threads = ns.threads or _omp_threads()
    if not threads:
        return PiperVoice.load(ns.model, config_path=config_path(ns))
    import onnxruntime
    from piper.config import PiperConfig
    from piper.voice import ESPEAK_DATA_DIR

    with open(config_path(ns), encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(ns.model, sess_options=options, providers=["CPUExecutionProvider"])
    return PiperVoice(config=config, session=session, espeak_data_dir=ESPEAK_DATA_DIR)


class PiperState(HostState):
    def __init__(self, ns: argparse.Namespace) -> None:
        super().__init__(ns)
        self.max_input: int = ns.max_input_chars
        self.ffmpeg: str | None = ns.ffmpeg or shutil.which("ffmpeg")


class Handler(BaseHandler):
    def do_GET(self) -> None:
        if self.health() or not self.ready():
            return
        path = self.route_path()
        engine: Engine = self.state.engine
        if path in ("/v1/models", "/models"):
            model = {"id": self.state.alias, "object": "model", "owned_by": "piper"}
            self.send_json(200, {"object": "list", "data": [model]})
        elif path in ("/v1/audio/voices", "/audio/voices"):
            self.send_json(200, {"object": "list", "data": [engine.voice.json()]})
        else:
            self.error(404, f"no route GET {path}", kind="not_found_error")

    def do_POST(self) -> None:
        path = self.route_path()
        if not self.authorized():
            return
        body = self.read_body()
        if body is None:
            return
        if path not in ("/v1/audio/speech", "/audio/speech"):
            self.error(404, f"no route POST {path}", kind="not_found_error")
            return
        if not self.ready():
            return
        self.state.enter()
        try:
            self._speech(body)
        except BadRequest as exc:
            self.error(400, exc.message, param=exc.param)
        except Gone:
            self.close_connection = True
        except Exception as exc:
            print(f"error: synthesis failed: {exc!r}", file=sys.stderr, flush=True)
            self.error(500, f"synthesis failed: {exc}", kind="server_error")
        finally:
            self.state.leave()

    def _speaker(self, engine: Engine, req: sx.SpeechRequest) -> int | None:
        voice = engine.voice
        names = {voice.id, voice.name}
        speaker = req.speaker
        if req.voice is not None and req.voice not in names:
            if req.voice in engine.speaker_ids and speaker is None:
                speaker = req.voice
            else:
                served = ", ".join(sorted(names | set(engine.speaker_ids)))
                raise BadRequest(f"unknown voice {req.voice!r}: this host serves {served}", "voice")
        if speaker is None:
            return None
        if speaker not in engine.speaker_ids:
            raise BadRequest(f"unknown speaker {speaker!r} of voice {voice.id}", "speaker")
        return engine.speaker_ids[speaker]

    def _speech(self, body: bytes) -> None:
        engine: Engine = self.state.engine
        req = sx.parse_speech(body, max_input=self.piper.max_input)
        speaker = self._speaker(engine, req)
        rate = engine.voice.sample_rate
        headers = {"X-Sample-Rate": str(rate), "X-Channels": "1", "X-Sample-Format": "s16le"}
        fmt = req.response_format
        ffmpeg = None
        if fmt in sx.ENCODED:
            ffmpeg = self.piper.ffmpeg
            if ffmpeg is None:
                raise BadRequest(
                    f"response_format {fmt} needs ffmpeg, which is not installed here: install it "
                    "(apt-get install ffmpeg) or ask for wav or pcm",
                    "response_format",
                )
        audio = engine.pcm(req, speaker)
        if fmt == "wav":
            parts = []
            for part in audio:  # one sentence each: a client that left stops the work here
                self.check_client()
                parts.append(part)
            pcm = b"".join(parts)
            self.send_body(200, sx.CONTENT_TYPES["wav"], sx.wav_header(rate, len(pcm)) + pcm, headers)
            return
        if ffmpeg is None:
            audio = _resampled(audio, rate, PCM_HZ)
            headers["X-Sample-Rate"] = str(PCM_HZ)
            first = next(audio, b"")  # a failure before the first sentence still gets its status
            self.start_chunked(sx.CONTENT_TYPES["pcm"], headers)
            self.write_chunk(first)
            for pcm in audio:
                self.write_chunk(pcm)
            self.end_chunked()
            return
        self._encoded(sx.ffmpeg_argv(ffmpeg, fmt, rate), audio, sx.CONTENT_TYPES[fmt])

    def _encoded(self, argv: list[str], audio: Iterator[bytes], content_type: str) -> None:
        """Synthesis feeds ffmpeg's stdin from a thread while its stdout streams to the client."""
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def feed() -> None:
            try:
                for pcm in audio:
                    stdin.write(pcm)
            except (OSError, ValueError):
                pass
            finally:
                try:
                    stdin.close()
                except OSError:
                    pass

        writer = threading.Thread(target=feed, name="ffmpeg-feed", daemon=True)
        writer.start()
        try:
            data = os.read(stdout.fileno(), _READ)
            if not data:  # nothing encoded: the status can still say so
                proc.wait(30)
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                self.error(
                    502, f"ffmpeg encoded nothing (exit {proc.returncode}): {err[-300:]}", kind="server_error"
                )
                return
            self.start_chunked(content_type)
            while data:
                self.write_chunk(data)
                data = os.read(stdout.fileno(), _READ)
            self.end_chunked()
            proc.wait(10)
        finally:
            if proc.poll() is None:  # the client left, or ffmpeg hangs
                proc.kill()
                proc.wait()
            writer.join(5)

    @property
    def piper(self) -> PiperState:
        state = self.state
        assert isinstance(state, PiperState)
        return state


def _resampled(audio: Iterator[bytes], src_hz: int, dst_hz: int) -> Iterator[bytes]:
    """Each sentence at ``dst_hz`` as it comes; the resampler's state runs across them."""
    resampler = Resampler(src_hz, dst_hz)
    for pcm in audio:
        if out := resampler.feed(pcm):
            yield out
    if tail := resampler.flush():
        yield tail


def load(ns: argparse.Namespace) -> tuple[sx.Voice, dict[str, Any]]:
    with open(config_path(ns), encoding="utf-8") as f:
        config = json.load(f)
    return sx.voice_info(config, model_path=ns.model, alias=ns.alias), config


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(ns.model):
        print(f"error: voice file not found: {ns.model}", file=sys.stderr)
        return 2
    if not os.path.isfile(config_path(ns)):
        print(f"error: the voice's config is missing: {config_path(ns)}", file=sys.stderr)
        return 2
    voice, _ = load(ns)
    if ns.alias is None:
        ns.alias = voice.id
    os.dup2(2, 1)
    state = PiperState(ns)
    return run_host(ns, state, Handler, lambda: Engine(ns, voice), "piper")


if __name__ == "__main__":
    sys.exit(main())
