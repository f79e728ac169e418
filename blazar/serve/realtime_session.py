"""A Realtime API session over one socket, as a voice loop (OpenAI's Realtime API events).

Audio in (pcm16, 24 kHz) is cut into turns by the server VAD (``blazar.dialects.vad``)
or by the client's commits; each committed turn is transcribed (whisper), and a
response runs the chat model on the conversation, streaming its text as
``response.audio_transcript.delta`` and synthesising it sentence by sentence (piper) as
``response.audio.delta``, so the first audio leaves before the answer is written.
Every engine call claims its engine through admission (``blazar.serve.voice``).

Speech while a response runs (barge-in) cancels it: its chat stream and synthesis are
cancelled, their claims released, and it ends with ``response.done`` status
``cancelled``. A closed socket cancels everything the session started (the caller
cancels ``run``). A bad event gets an ``error`` event and the socket stays open. The
WebSocket route is ``blazar.web.routes.openai.realtime``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from actors.runtime import Runtime
from blazar.dialects import realtime as rt
from blazar.dialects.neutral import ChatRequest, Message
from blazar.dialects.vad import SpeechStarted, Vad, VadEvent
from blazar.errors import CATALOG, BlazarError
from blazar.serve import voice
from blazar.serve.context import Ask

__all__ = ["RealtimeSession", "as_event_error"]

log = logging.getLogger("blazar.serve")

_BYTES_PER_MS = rt.PCM_HZ * 2 // 1000
_MIN_COMMIT_MS = 100
_MAX_BUFFER_MS = 10 * 60 * 1000
_OUT_BUFFER = 64


@dataclass(eq=False)
class Item:
    """One conversation item: a user turn (audio or text) or an answer."""

    id: str
    role: str
    content_type: str
    """``input_audio``, ``input_text``, ``audio`` or ``text``."""
    text: str | None = None
    """The transcript or text; None while an audio turn is being transcribed."""
    ready: trio.Event = field(default_factory=trio.Event)

    def json(self, status: str = "completed") -> dict[str, Any]:
        key = "transcript" if self.content_type in ("input_audio", "audio") else "text"
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": status,
            "role": self.role,
            "content": [{"type": self.content_type, key: self.text}],
        }


@dataclass(eq=False)
class Running:
    id: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    reason: str = "client_cancelled"


class RealtimeSession:
    """One socket's session: its settings, input buffer, VAD, conversation and the response
    running (at most one); every task it starts runs in its nursery, so the socket's end
    ends them."""

    def __init__(self, runtime: Runtime, session: rt.Session, ask: Ask) -> None:
        self.runtime = runtime
        self.ask = ask
        """The context of the WebSocket request that opened the session (its key, its card)."""
        self.session = session
        self.events = rt.Events()
        self.items: list[Item] = []
        self.buffer = bytearray()
        self.buffer_start_ms = 0
        """Where the input buffer begins in the session's audio (ms since the first append)."""
        self.vad: Vad | None = None
        self.next_item_id = rt.new_id("item")
        self._speech_start_ms = 0
        self.running: Running | None = None
        self._send, self._outbox = trio.open_memory_channel[str](_OUT_BUFFER)
        self._socket_send: Callable[[str], Awaitable[None]] | None = None
        self._nursery: trio.Nursery | None = None
        self._arm_vad(0)

    # -- plumbing ---------------------------------------------------------

    async def emit(self, kind: str, **fields: Any) -> None:
        await self._send.send(self.events.event(kind, **fields))

    async def fail(self, err: rt.EventError, event_id: str | None = None) -> None:
        await self._send.send(self.events.error(err, event_id))

    async def _sender(self) -> None:
        assert self._socket_send is not None
        async for text in self._outbox:
            await self._socket_send(text)

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None
        return self._nursery

    def _arm_vad(self, position_ms: int) -> None:
        td = self.session.turn_detection
        self.vad = Vad(td, rate_hz=rt.PCM_HZ, position_ms=position_ms) if td is not None else None

    @property
    def total_ms(self) -> int:
        return self.buffer_start_ms + len(self.buffer) // _BYTES_PER_MS

    # -- the loop ---------------------------------------------------------

    async def run(
        self, receive: Callable[[], Awaitable[str | bytes]], send: Callable[[str], Awaitable[None]]
    ) -> None:
        """Serve the socket whose messages ``receive`` gives and ``send`` takes, until it closes
        (the caller cancels, or ``receive`` raises)."""
        self._socket_send = send
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._sender)
            await self.emit("session.created", session=rt.session_json(self.session))
            conversation = {"id": rt.new_id("conv"), "object": "realtime.conversation"}
            await self.emit("conversation.created", conversation=conversation)
            while True:
                message = await receive()
                await self.handle(message)

    async def handle(self, message: str | bytes) -> None:
        event_id = None
        try:
            if isinstance(message, bytes):
                raise rt.EventError("invalid_value", "send events as JSON text frames, not binary ones")
            kind, event_id, event = rt.decode_event(message)
            await self._dispatch(kind, event, event_id)
        except rt.EventError as err:
            await self.fail(err, event_id or err.event_id)
        except BlazarError as exc:
            await self.fail(as_event_error(exc), event_id)
        except Exception as exc:  # a bug of ours: said, logged, and the socket stays usable
            await self.fail(as_event_error(_internal(exc, "an event")), event_id)

    async def _dispatch(self, kind: str, event: dict[str, Any], event_id: str | None) -> None:
        match kind:
            case "session.update":
                await self._update(event.get("session"))
            case "input_audio_buffer.append":
                await self._append(rt.decode_audio(event.get("audio")))
            case "input_audio_buffer.commit":
                await self._commit_by_hand()
            case "input_audio_buffer.clear":
                self._clear()
                await self.emit("input_audio_buffer.cleared")
            case "conversation.item.create":
                await self._create_item(event.get("item"), event.get("previous_item_id"))
            case "response.create":
                await self._start_response(rt.response_options(self.session, event.get("response")))
            case "response.cancel":
                await self._cancel_by_hand(event.get("response_id"))
            case _:  # decode_event lets only the served types through
                raise rt.EventError("invalid_value", f"unknown event type {kind!r}", param="type")

    # -- session and input ------------------------------------------------

    async def _update(self, raw: Any) -> None:
        session = rt.update_session(self.session, raw)
        if session.voice != self.session.voice and session.voice is not None:
            await voice.first_installed(self.runtime, "tts", session.voice)
        if session.transcription_model not in (self.session.transcription_model, None):
            await voice.first_installed(self.runtime, "stt", session.transcription_model)
        if session.model != self.session.model and session.model is not None:
            await self.runtime.engine_for(session.model)
        before = self.session.turn_detection
        self.session = session
        if session.turn_detection != before:
            self._arm_vad(self.total_ms)
        await self.emit("session.updated", session=rt.session_json(session))

    async def _append(self, pcm: bytes) -> None:
        if len(self.buffer) + len(pcm) > _MAX_BUFFER_MS * _BYTES_PER_MS:
            raise rt.EventError(
                "input_audio_buffer_full",
                "the input audio buffer holds 10 minutes: commit or clear it (or turn server VAD on)",
            )
        self.buffer += pcm
        if self.vad is not None:
            for event in self.vad.feed(pcm):
                await self._on_vad(event)

    async def _on_vad(self, event: VadEvent) -> None:
        td = self.session.turn_detection
        assert td is not None
        if isinstance(event, SpeechStarted):
            if self.running is not None and td.interrupt_response:
                self._cancel(self.running, "turn_detected")
            await self.emit(
                "input_audio_buffer.speech_started",
                audio_start_ms=event.audio_start_ms,
                item_id=self.next_item_id,
            )
            self._speech_start_ms = event.audio_start_ms
            return
        await self.emit(
            "input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms, item_id=self.next_item_id
        )
        start = max(0, self._speech_start_ms - self.buffer_start_ms) * _BYTES_PER_MS
        end = max(0, event.audio_end_ms - self.buffer_start_ms) * _BYTES_PER_MS
        item = await self._commit(bytes(self.buffer[start:end]))
        self.buffer_start_ms = event.audio_end_ms
        del self.buffer[:end]
        if td.create_response and item is not None:
            if self.running is not None:  # interrupt_response off: the turn waits, and is said to
                raise rt.EventError(
                    "conversation_already_has_active_response",
                    f"turn {item.id} is committed but not answered: response {self.running.id} is "
                    "still running (interrupt_response is off) — send response.create after its "
                    "response.done",
                )
            await self._start_response(self.session)

    async def _commit_by_hand(self) -> None:
        ms = len(self.buffer) // _BYTES_PER_MS
        if ms < _MIN_COMMIT_MS:
            raise rt.EventError(
                "input_audio_buffer_commit_empty",
                f"buffer too small: expected at least {_MIN_COMMIT_MS}ms of audio, but the buffer "
                f"holds {ms}ms",
            )
        await self._commit(bytes(self.buffer))
        self._clear()

    def _clear(self) -> None:
        self.buffer_start_ms = self.total_ms
        self.buffer.clear()
        if self.vad is not None:
            self.vad.reset()

    async def _commit(self, pcm: bytes) -> Item | None:
        item = Item(id=self.next_item_id, role="user", content_type="input_audio")
        self.next_item_id = rt.new_id("item")
        previous = self.items[-1].id if self.items else None
        self.items.append(item)
        await self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        await self.emit("conversation.item.created", previous_item_id=previous, item=item.json())
        self.nursery.start_soon(self._transcribe, item, pcm)
        return item

    async def _transcribe(self, item: Item, pcm: bytes) -> None:
        try:
            model = await voice.first_installed(self.runtime, "stt", self.session.transcription_model)
            item.text = await voice.transcribe(
                self.runtime,
                model,
                pcm,
                rt.PCM_HZ,
                self.ask,
                language=self.session.transcription_language,
                prompt=self.session.transcription_prompt,
            )
        except Exception as exc:
            item.text = ""
            err = as_event_error(_blazar_error(exc, "a transcription"))
            error = {"type": "transcription_error", "code": err.code, "message": err.message, "param": None}
            await self.emit(
                "conversation.item.input_audio_transcription.failed",
                item_id=item.id,
                content_index=0,
                error=error,
            )
        else:
            await self.emit(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=0,
                transcript=item.text,
            )
        finally:
            if item.text is None:
                item.text = ""
            item.ready.set()

    async def _create_item(self, raw: Any, previous_item_id: Any) -> None:
        if not isinstance(raw, dict) or raw.get("type", "message") != "message":
            raise rt.EventError(
                "unsupported", "only `message` items can be created here (no function calls)", "item.type"
            )
        role = raw.get("role")
        if role not in ("user", "assistant", "system"):
            raise rt.EventError("invalid_value", "item.role must be user, assistant or system", "item.role")
        texts = []
        for part in raw.get("content") or []:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "text"):
                raise rt.EventError(
                    "unsupported", "item content must be input_text or text parts", param="item.content"
                )
            texts.append(str(part.get("text") or ""))
        ids = {i.id for i in self.items}
        if previous_item_id is not None and previous_item_id not in ids:
            raise rt.EventError(
                "item_not_found", f"previous_item_id {previous_item_id!r} is not in the conversation"
            )
        kind = "input_text" if role != "assistant" else "text"
        given = raw.get("id")
        item_id = given if isinstance(given, str) and given else rt.new_id("item")
        item = Item(id=item_id, role=role, content_type=kind, text="".join(texts))
        item.ready.set()
        previous = self.items[-1].id if self.items else None
        self.items.append(item)
        await self.emit("conversation.item.created", previous_item_id=previous, item=item.json())

    # -- responses --------------------------------------------------------

    async def _start_response(self, settings: rt.Session) -> None:
        if self.running is not None:
            raise rt.EventError(
                "conversation_already_has_active_response",
                f"response {self.running.id} is still running: cancel it (response.cancel) or wait "
                "for its response.done",
            )
        if settings.model is None:
            raise rt.EventError(
                "missing_required_parameter",
                "no chat model: connect with ?model=NAME or set session.model",
                param="session.model",
            )
        running = self.running = Running(id=rt.new_id("resp"))
        created = _response_json(running.id, "in_progress", metadata=settings.metadata)
        await self.emit("response.created", response=created)
        self.nursery.start_soon(self._respond, running, settings)

    async def _cancel_by_hand(self, response_id: Any) -> None:
        running = self.running
        if running is None or (response_id is not None and response_id != running.id):
            raise rt.EventError("response_cancel_not_active", "there is no active response to cancel")
        self._cancel(running, "client_cancelled")

    def _cancel(self, running: Running, reason: str) -> None:
        running.reason = reason
        running.scope.cancel()

    async def _respond(self, running: Running, settings: rt.Session) -> None:
        answer = Item(id=rt.new_id("item"), role="assistant", content_type="audio", text="")
        if "audio" not in settings.modalities:
            answer.content_type = "text"
        turn = _Turn(self, running, answer, settings)
        status: rt.Status = "completed"
        details: dict[str, Any] | None = None
        out = voice.ChatText()
        try:
            with running.scope:
                await turn.run(settings, out)
            if running.scope.cancelled_caught:
                status, details = "cancelled", {"type": "cancelled", "reason": running.reason}
            elif out.finish_reason == "length":  # cut by max_response_output_tokens
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except Exception as exc:
            err = as_event_error(_blazar_error(exc, "a response"))
            status = "failed"
            error = {"type": "server_error", "code": err.code, "message": err.message}
            details = {"type": "failed", "error": error}
            await self.fail(err)
        finally:
            self.running = None
        answer.ready.set()
        await turn.finish(status, details, out.usage)


class _Turn:
    """One response's output: the answer item, its text deltas and its audio deltas."""

    def __init__(self, session: RealtimeSession, running: Running, item: Item, settings: rt.Session) -> None:
        self.s, self.running, self.item, self.settings = session, running, item, settings
        self.audio = "audio" in settings.modalities
        self.started = False
        self.ids = {"response_id": running.id, "item_id": item.id, "output_index": 0, "content_index": 0}

    def _part(self) -> dict[str, Any]:
        key = "transcript" if self.audio else "text"
        return {"type": "audio" if self.audio else "text", key: self.item.text or ""}

    async def run(self, settings: rt.Session, out: voice.ChatText) -> None:
        s = self.s
        for item in list(s.items):
            await item.ready.wait()
        messages = [Message(role="system", content=settings.instructions)] if settings.instructions else []
        messages += [
            Message(role=i.role, content=i.text)  # type: ignore[arg-type]
            for i in s.items
            if i.text
        ]
        if not any(m.role == "user" for m in messages):
            raise BlazarError("BAD_REQUEST", "nothing to answer: the conversation has no user words yet")
        assert settings.model is not None
        req = ChatRequest(
            model=settings.model,
            messages=messages,
            stream=True,
            max_tokens=settings.max_output_tokens,
            temperature=settings.temperature,
        )
        previous = s.items[-1].id if s.items else None
        s.items.append(self.item)
        self.started = True
        pending = self.item.json("in_progress")
        await s.emit("response.output_item.added", response_id=self.running.id, output_index=0, item=pending)
        await s.emit("conversation.item.created", previous_item_id=previous, item=pending)
        await s.emit("response.content_part.added", **self.ids, part=self._part())
        tts_model = await voice.first_installed(s.runtime, "tts", settings.voice) if self.audio else None
        send, receive = trio.open_memory_channel[str](math.inf)
        async with trio.open_nursery() as nursery:
            if tts_model is not None:
                nursery.start_soon(self._speak, tts_model, receive)
            sentences = rt.Sentences()
            async with send, contextlib.aclosing(voice.stream_chat(s.runtime, req, out, s.ask)) as text:
                async for delta in text:
                    if not delta:
                        continue
                    self.item.text = (self.item.text or "") + delta
                    kind = "response.audio_transcript.delta" if self.audio else "response.text.delta"
                    await s.emit(kind, **self.ids, delta=delta)
                    for sentence in sentences.feed(delta):
                        send.send_nowait(sentence)
                for sentence in sentences.flush():
                    send.send_nowait(sentence)

    async def _speak(self, model: str, sentences: trio.MemoryReceiveChannel[str]) -> None:
        async with sentences:
            async for sentence in sentences:
                spoken = voice.speak(self.s.runtime, model, sentence, self.s.ask, speed=self.settings.speed)
                async with contextlib.aclosing(spoken) as chunks:
                    async for pcm in chunks:
                        delta = base64.b64encode(pcm).decode()
                        await self.s.emit("response.audio.delta", **self.ids, delta=delta)

    async def finish(self, status: rt.Status, details: dict[str, Any] | None, usage: Any) -> None:
        s, item = self.s, self.item
        item_status = "completed" if status == "completed" else "incomplete"
        output = []
        if self.started:
            if self.audio:
                await s.emit("response.audio.done", **self.ids)
                await s.emit("response.audio_transcript.done", **self.ids, transcript=item.text or "")
            else:
                await s.emit("response.text.done", **self.ids, text=item.text or "")
            await s.emit("response.content_part.done", **self.ids, part=self._part())
            done = item.json(item_status)
            await s.emit("response.output_item.done", response_id=self.running.id, output_index=0, item=done)
            output.append(done)
        body = _response_json(self.running.id, status, details, output, self.settings.metadata)
        if usage is not None:
            body["usage"] = {
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "input_token_details": {
                    "cached_tokens": usage.cached_tokens,
                    "text_tokens": usage.prompt_tokens,
                    "audio_tokens": 0,
                },
                "output_token_details": {"text_tokens": usage.completion_tokens, "audio_tokens": 0},
            }
        await s.emit("response.done", response=body)


def _response_json(
    response_id: str,
    status: str,
    details: dict[str, Any] | None = None,
    output: list[Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": output or [],
        "metadata": metadata,
        "usage": None,
    }


def _blazar_error(exc: Exception, what: str) -> BlazarError:
    """The error to report: ours, also from inside a task group (the chat and the synthesis
    run side by side), else an internal one."""
    if isinstance(exc, ExceptionGroup):
        ours, _ = exc.split(BlazarError)
        found: BaseException | None = ours
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        if isinstance(found, BlazarError):
            return found
    if isinstance(exc, BlazarError):
        return exc
    return _internal(exc, what)


def _internal(exc: Exception, what: str) -> BlazarError:
    log.error("realtime: %s failed", what, exc_info=exc)
    return BlazarError("INTERNAL", f"internal error in {what} ({type(exc).__name__}): see the daemon's log")


def as_event_error(exc: BlazarError) -> rt.EventError:
    status = CATALOG[exc.code].status if exc.code in CATALOG else 500
    code = "invalid_value" if status < 500 else "server_error"
    if exc.code == "MODEL_NOT_FOUND":
        code = "model_not_found"
    return rt.EventError(code, exc.message, param=exc.param, blazar_code=exc.code)
