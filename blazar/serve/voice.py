"""The engine calls of a voice turn: speech to text, a chat answer as text deltas, text to
speech as PCM chunks; each claims its engine through admission like the HTTP routes.

Used by the realtime WebSocket (``blazar.web.routes.openai.realtime``). The whisper and piper engines
speak OpenAI's audio routes themselves, so a transcription is a multipart POST of a WAV
and speech a streamed ``pcm`` answer (24 kHz, ``actors/engines/piper_host.py``). The chat
runs through ``EngineCall`` like the translated dialects, on any text lane.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator

import msgspec
import trio

from actors.engines.synthesis import wav_header
from actors.runtime import Runtime
from actors.upstream import UpstreamError
from blazar.dialects.neutral import ChatRequest, Delta, Usage
from blazar.errors import BlazarError
from blazar.serve.claim import claim_engine
from blazar.serve.context import Ask
from blazar.serve.engine_call import EngineCall, Timings
from blazar.serve.relay import close_response, crash_error

__all__ = ["ChatText", "first_installed", "speak", "stream_chat", "transcribe"]

STT = frozenset({"stt"})
TTS = frozenset({"tts"})
_PULL = {"stt": "blazar pull whisper-tiny.en", "tts": "blazar pull piper-joe-us"}
_WHAT = {"stt": "speech-to-text model", "tts": "voice (text-to-speech model)"}


async def first_installed(runtime: Runtime, kind: str, asked: str | None) -> str:
    """The model of ``kind`` a session uses: the one it named (installed), else the first
    installed by name."""
    records = await trio.to_thread.run_sync(runtime.store.list)
    names = sorted(r.name for r in records if r.kind == kind)
    if asked is not None:
        if asked in names:
            return asked
        listed = ", ".join(names) or "none"
        raise BlazarError(
            "MODEL_NOT_FOUND",
            f"{asked!r} is not an installed {_WHAT[kind]}; installed: {listed} — name one of them "
            f"or `{_PULL[kind]}`",
        )
    if not names:
        raise BlazarError("MODEL_NOT_FOUND", f"no {_WHAT[kind]} is installed: run `{_PULL[kind]}`")
    return names[0]


def _form(fields: dict[str, str], audio: bytes) -> tuple[bytes, str]:
    boundary = "blazar" + secrets.token_hex(12)
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="turn.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
    )
    body = b"".join(parts) + audio + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


class _Transcript(msgspec.Struct):
    text: str = ""


async def transcribe(
    runtime: Runtime,
    model: str,
    pcm: bytes,
    rate_hz: int,
    ask: Ask,
    *,
    language: str | None = None,
    prompt: str | None = None,
) -> str:
    """The text of a turn's audio (16-bit mono PCM at ``rate_hz``); ``language`` and
    ``prompt`` are whisper's."""
    engine = await runtime.engine_for(model, kinds=STT)
    wav = wav_header(rate_hz, len(pcm)) + pcm
    # Greedy decoding: a voice turn waits on it, and beam search costs several times as much.
    fields = {"model": model, "response_format": "json", "beam_size": "1"}
    if language:
        fields["language"] = language
    if prompt:
        fields["prompt"] = prompt
    body, content_type = _form(fields, wav)
    claim = await claim_engine(runtime, engine, ask)
    try:
        try:
            upstream = await claim.handle.upstream.request(
                "POST", "/v1/audio/transcriptions", body=body, headers={"content-type": content_type}
            )
            try:
                content = await upstream.aread()
            finally:
                await close_response(upstream)
        except UpstreamError as exc:
            raise await crash_error(engine, claim.handle, exc) from exc
    finally:
        claim.release()
    if upstream.status_code != 200:
        raise BlazarError("BAD_GATEWAY", f"the engine for '{model}' failed to transcribe: {content[:300]!r}")
    return msgspec.json.decode(content, type=_Transcript).text.strip()


async def speak(
    runtime: Runtime, model: str, text: str, ask: Ask, *, speed: float = 1.0
) -> AsyncGenerator[bytes, None]:
    """The sentence as PCM chunks (24 kHz, 16-bit, mono) as the engine makes them; each
    chunk holds whole samples."""
    engine = await runtime.engine_for(model, kinds=TTS)
    body = msgspec.json.encode(
        {"model": model, "input": text, "response_format": "pcm", "stream": True, "speed": speed}
    )
    claim = await claim_engine(runtime, engine, ask)
    try:
        try:
            upstream = await claim.handle.upstream.request(
                "POST", "/v1/audio/speech", body=body, headers={"content-type": "application/json"}
            )
        except UpstreamError as exc:
            raise await crash_error(engine, claim.handle, exc) from exc
        try:
            if upstream.status_code != 200:
                content = await upstream.aread()
                raise BlazarError("BAD_GATEWAY", f"the voice '{model}' failed to speak: {content[:300]!r}")
            carry = b""
            async for chunk in upstream.aiter_raw():
                data = carry + chunk
                cut = len(data) - len(data) % 2
                carry = data[cut:]
                if cut:
                    yield data[:cut]
        except UpstreamError as exc:
            raise await crash_error(engine, claim.handle, exc) from exc
        finally:
            await close_response(upstream)
    finally:
        claim.release()


class ChatText:
    """A stream encoder that hands the text on (``EngineCall.stream`` yields what it
    returns) and keeps the final usage and any error."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.failure: BlazarError | None = None

    def start(self, prompt: Usage | None) -> bytes:
        return b""

    def feed(self, delta: Delta) -> bytes:
        return delta.text.encode()

    def finish(self, final: Delta, timings: Timings) -> bytes:
        self.usage, self.finish_reason = final.usage, final.finish_reason
        return final.text.encode()

    def error(self, code: str, message: str) -> bytes:
        self.failure = BlazarError(code, message)
        return b""

    def keepalive(self) -> bytes:
        return b""


async def stream_chat(
    runtime: Runtime, req: ChatRequest, out: ChatText, ask: Ask
) -> AsyncGenerator[str, None]:
    """The answer's text as it is written; the claim is released however the stream ends."""
    call = EngineCall(runtime, req, ask)
    await call.prepare()
    try:
        stream = await call.stream(out)
    except BaseException:
        call.release()
        raise
    try:
        async for chunk in stream:
            yield chunk.decode("utf-8", "replace")
    finally:
        await stream.aclose()
    if out.failure is not None:
        raise out.failure
