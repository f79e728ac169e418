"""``blazar whisper FILE`` and ``blazar tts TEXT``: the audio routes from the command line.

Both go through the daemon (started in the background when none runs), so the speech
model's engine is the daemon's, admitted and kept alive like any other. Without
``--model`` the first installed model of the right kind is used.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import err, load_setup, open_store
from blazar.daemon.client import CliError, Daemon, ensure_daemon

Transcript = Literal["text", "json", "srt", "vtt", "verbose_json"]
Audio = Literal["wav", "pcm", "mp3", "opus", "aac", "flac"]


def _model_of(kind: str, model: str | None) -> str:
    """``model``, or the first installed model of ``kind``."""
    paths, _ = load_setup()
    store = open_store(paths)
    if model is not None:
        if store.find(model) is None:
            raise CliError(f"model '{model}' is not installed — see `blazar list`")
        return model
    found = next((r.name for r in store.list() if r.kind == kind), None)
    if found is None:
        catalog = "whisper-tiny.en" if kind == "stt" else "piper-joe-us"
        raise CliError(f"no {kind} model is installed — `blazar pull {catalog}`")
    return found


def _daemon() -> Daemon:
    paths, config = load_setup()
    daemon, started = ensure_daemon(paths, config)
    if started:
        err.print(
            f"[dim]started a background daemon (pid {daemon.pid}) at {daemon.url}; `blazar stop` ends it[/]"
        )
    return daemon


@app.command
def whisper(
    file: Path,
    *,
    model: str | None = None,
    format: Annotated[Transcript, Parameter(help="What to print.")] = "text",
    language: str | None = None,
    translate: Annotated[bool, Parameter(help="Into English (/v1/audio/translations).")] = False,
    async_: Annotated[
        bool,
        Parameter(
            name="--async",
            help="Run it as a job: print its id at once (`blazar jobs result ID` prints the transcript).",
        ),
    ] = False,
) -> None:
    """Transcribe FILE (any audio ffmpeg can read) with a speech-to-text model and print it."""
    if not file.is_file():
        raise CliError(f"no file {file}")
    name = _model_of("stt", model)
    fields = {"model": name, "response_format": format}
    if language is not None:
        fields["language"] = language
    if async_:
        fields["async"] = "true"
    route = "/v1/audio/translations" if translate else "/v1/audio/transcriptions"
    daemon = _daemon()
    with file.open("rb") as audio:
        resp = daemon.http.post(route, data=fields, files={"file": (file.name, audio)}, timeout=None)
    if resp.status_code >= 400:
        raise CliError(
            _message(resp.json())
            if resp.headers.get("content-type", "").startswith("application/json")
            else resp.text
        )
    if async_:
        job = resp.json()
        job_id = job["id"]
        sys.stdout.write(job_id + "\n")
        err.print(f"[dim]{job['status']}: `blazar jobs follow {job_id}`; `blazar jobs result {job_id}`[/]")
        return
    sys.stdout.write(resp.text if resp.text.endswith("\n") else resp.text + "\n")


@app.command
def tts(
    text: str,
    *,
    output: Annotated[Path, Parameter(name=["-o", "--output"], help="Where the audio goes.")] = Path(
        "speech.wav"
    ),
    model: str | None = None,
    voice: str | None = None,
    format: Annotated[
        Audio | None, Parameter(help="Audio format (default: from the file's suffix, else wav).")
    ] = None,
    speed: float | None = None,
) -> None:
    """Speak TEXT with a text-to-speech voice into a file (written as the audio arrives)."""
    name = _model_of("tts", model)
    fmt = format or (output.suffix.lstrip(".").lower() or "wav")
    body: dict[str, object] = {"model": name, "input": text, "voice": voice or name, "response_format": fmt}
    if speed is not None:
        body["speed"] = speed
    daemon = _daemon()
    with daemon.http.stream("POST", "/v1/audio/speech", json=body, timeout=None) as resp:
        if resp.status_code >= 400:
            resp.read()
            raise CliError(_message(resp.json()))
        size = 0
        with output.open("wb") as f:
            for chunk in resp.iter_bytes():
                f.write(chunk)
                size += len(chunk)
    err.print(f"[dim]wrote {output} ({size:,} bytes, {fmt})[/]")


def _message(doc: object) -> str:
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    return str(doc)
