"""Serve a CTranslate2 whisper model through ``faster-whisper`` as an OpenAI-style child process.

``python -m actors.engines.whisper_host -m MODEL_DIR --port N --api-key K --alias NAME``
loads the model (CPU, int8 by default) and serves ``GET /health`` (503 while
loading, 200 once loaded), ``GET /v1/models``, and ``POST /v1/audio/transcriptions``
and ``POST /v1/audio/translations`` in OpenAI's multipart shape: ``file``,
``model``, ``language``, ``prompt``, ``temperature``, ``response_format``
(json, text, srt, vtt, verbose_json), ``timestamp_granularities[]`` (word,
segment), ``stream`` (server-sent ``transcript.text.delta`` events as segments
are decoded, then ``transcript.text.done``), and voice-activity detection on
request (``vad_filter``, ``vad_threshold``, ``vad_min_silence_ms``: the Silero
model shipped in the faster-whisper wheel). Audio is decoded with PyAV (any
format it reads) and resampled to 16 kHz mono. An upload that is not audio, is
cut short or holds no samples is answered 400 with what is wrong; the host lives on.

The lifetime rules are the other hosts' (``actors.engines.speech_host``).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from actors.engines import transcript as tx
from actors.engines.multipart import FormError, parse_form
from actors.engines.speech_host import BaseHandler, Gone, HostState, add_common_args, run_host

__all__ = ["SAMPLE_RATE", "Engine", "main", "parse_args"]

SAMPLE_RATE = 16_000
"""What whisper listens at: every upload is resampled to 16 kHz mono."""
_ROUTES: dict[str, tx.Task] = {
    "/v1/audio/transcriptions": "transcribe",
    "/audio/transcriptions": "transcribe",
    "/v1/audio/translations": "translate",
    "/audio/translations": "translate",
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="whisper_host", description=__doc__)
    p.add_argument("-m", "--model", required=True, help="a CTranslate2 whisper model directory")
    add_common_args(p)
    p.add_argument("--compute-type", default="int8", help="CTranslate2 compute type (int8, float32, …)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--workers", type=int, default=1, help="transcriptions run at once")
    return p.parse_args(list(argv))


class Engine:
    """The loaded model. CTranslate2 queues calls beyond ``workers`` itself, so request
    threads call it directly."""

    def __init__(self, ns: argparse.Namespace) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(
            os.path.abspath(ns.model),
            device=ns.device,
            compute_type=ns.compute_type,
            cpu_threads=ns.threads or 0,
            num_workers=ns.workers,
            local_files_only=True,
        )
        self.languages: frozenset[str] = frozenset(self.model.supported_languages)
        self.multilingual: bool = bool(self.model.model.is_multilingual)

    def decode(self, data: bytes, filename: str | None) -> Any:
        """The upload as 16 kHz mono float samples; ``BadRequest`` naming what is wrong."""
        from faster_whisper import decode_audio

        name = f"'{filename}'" if filename else "the upload"
        if not data:
            raise tx.BadRequest(f"{name} is empty (zero bytes): send the audio file's contents", "file")
        if problem := tx.wav_problem(data):
            raise tx.BadRequest(f"{name}: {problem}", "file")
        try:
            samples = decode_audio(io.BytesIO(data), sampling_rate=SAMPLE_RATE)
        except Exception as exc:  # PyAV's errors (InvalidDataError, …) and what decoding raises
            raise tx.BadRequest(
                f"{name} is not audio that can be decoded (wav, mp3, flac, ogg, m4a, webm, …): {exc}", "file"
            ) from None
        if len(samples) == 0:
            raise tx.BadRequest(f"{name} decodes to no audio samples (zero-length audio)", "file")
        return samples

    def check(self, req: tx.TranscriptionRequest) -> None:
        if req.language is not None and req.language not in self.languages:
            served = "only en" if not self.multilingual else "the whisper language codes (en, de, fr, …)"
            raise tx.BadRequest(
                f"language {req.language!r} is not one this model serves: {served}", "language"
            )

    def run(self, req: tx.TranscriptionRequest, samples: Any) -> tuple[float, str, Iterator[tx.Segment]]:
        """Duration, language, and the segments as they are decoded (lazily)."""
        opts: dict[str, Any] = {
            "task": req.task,
            "language": req.language,
            "initial_prompt": req.prompt,
            "word_timestamps": req.word_timestamps,
            "vad_filter": req.vad_filter,
        }
        if req.temperature:  # 0 or none: faster-whisper's ladder, as OpenAI's 0 means
            opts["temperature"] = req.temperature
        if req.beam_size:
            opts["beam_size"] = req.beam_size
        if req.vad_filter:
            vad: dict[str, Any] = {}
            if req.vad_threshold is not None:
                vad["threshold"] = req.vad_threshold
            if req.vad_min_silence_ms is not None:
                vad["min_silence_duration_ms"] = req.vad_min_silence_ms
            opts["vad_parameters"] = vad or None
        segments, info = self.model.transcribe(samples, **opts)
        duration = float(info.duration)
        return duration, str(info.language), _segments(segments, duration)


def _segments(raw: Any, duration: float) -> Iterator[tx.Segment]:
    """The engine's segments as ours, their times kept inside the audio: whisper's timestamp
    tokens step by 20 ms and its last segment may end a little past the samples."""

    def at(t: float) -> float:
        return min(max(float(t), 0.0), duration)

    for n, s in enumerate(raw):
        words = None
        if s.words is not None:
            words = [
                tx.Word(word=w.word, start=at(w.start), end=at(w.end), probability=float(w.probability))
                for w in s.words
            ]
        yield tx.Segment(
            id=n,
            seek=int(s.seek),
            start=at(s.start),
            end=at(s.end),
            text=s.text,
            tokens=list(s.tokens),
            temperature=float(s.temperature or 0.0),
            avg_logprob=float(s.avg_logprob),
            compression_ratio=float(s.compression_ratio),
            no_speech_prob=float(s.no_speech_prob),
            words=words,
        )


class Handler(BaseHandler):
    def do_GET(self) -> None:
        if self.health() or not self.ready():
            return
        path = self.route_path()
        if path in ("/v1/models", "/models"):
            model = {"id": self.state.alias, "object": "model", "owned_by": "faster-whisper"}
            self.send_json(200, {"object": "list", "data": [model]})
        else:
            self.error(404, f"no route GET {path}", kind="not_found_error")

    def do_POST(self) -> None:
        path = self.route_path()
        if not self.authorized():
            return
        body = self.read_body()
        if body is None:
            return
        task = _ROUTES.get(path)
        if task is None:
            self.error(404, f"no route POST {path}", kind="not_found_error")
            return
        if not self.ready():
            return
        self.state.enter()
        try:
            self._transcribe(body, task)
        except tx.BadRequest as exc:
            self.error(400, exc.message, param=exc.param)
        except Gone:
            self.close_connection = True
        except Exception as exc:
            print(f"error: transcription failed: {exc!r}", file=sys.stderr, flush=True)
            self.error(500, f"transcription failed: {exc}", kind="server_error")
        finally:
            self.state.leave()

    def _transcribe(self, body: bytes, task: tx.Task) -> None:
        engine: Engine = self.state.engine
        try:
            form = parse_form(body, self.headers.get("Content-Type", ""))
        except FormError as exc:
            raise tx.BadRequest(str(exc)) from None
        upload = form.get("file", [None])[-1]
        texts = {name: [p.text for p in parts] for name, parts in form.items() if name != "file"}
        req = tx.parse_request(
            texts, upload.data if upload else None, filename=upload.filename if upload else None, task=task
        )
        engine.check(req)
        samples = engine.decode(req.audio, req.filename)
        duration, language, segments = engine.run(req, samples)
        if req.stream:
            self._stream(segments, task=task, duration=duration, language=language)
            return
        done: list[tx.Segment] = []
        for segment in segments:  # decoded lazily: a client that left stops the work here
            self.check_client()
            done.append(segment)
        t = tx.Transcript(task=task, language=language, duration=duration, segments=done)
        content_type, data = tx.render(t, req.response_format, req.granularities)
        self.send_body(200, content_type, data)

    def _stream(
        self, segments: Iterator[tx.Segment], *, task: tx.Task, duration: float, language: str
    ) -> None:
        self.start_chunked("text/event-stream")
        done: list[tx.Segment] = []
        try:
            for segment in segments:
                self.write_chunk(tx.delta_event(segment.text.lstrip() if not done else segment.text))
                done.append(segment)
        except Gone:
            raise
        except Exception as exc:  # the status is sent: the failure goes in the stream, which ends
            print(f"error: transcription failed mid-stream: {exc!r}", file=sys.stderr, flush=True)
            self.write_chunk(tx.error_event(f"transcription failed: {exc}"))
            self.end_chunked()
            return
        t = tx.Transcript(task=task, language=language, duration=duration, segments=done)
        self.write_chunk(tx.done_event(t))
        self.end_chunked()


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(os.path.join(ns.model, "model.bin")):
        print(f"error: not a CTranslate2 whisper model directory (no model.bin): {ns.model}", file=sys.stderr)
        return 2
    os.environ["HF_HUB_OFFLINE"] = "1"
    if ns.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(ns.threads))
    os.dup2(2, 1)  # library prints join our lines in the stderr tail the daemon keeps
    state = HostState(ns)
    return run_host(ns, state, Handler, lambda: Engine(ns), "faster-whisper")


if __name__ == "__main__":
    sys.exit(main())
