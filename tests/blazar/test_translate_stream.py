"""A translated stream re-encodes what the engine sends: here an Anthropic stream's head."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from blazar.dialects.neutral import ChatRequest, Message
from blazar.serve import engine_call
from blazar.serve.engine_call import Timings, TranslatedStream
from blazar.web.routes.anthropic.messages import _Encoder


def _sse(*docs: dict[str, Any]) -> list[bytes]:
    return [b"data: " + msgspec.json.encode(d) + b"\n\n" for d in docs] + [b"data: [DONE]\n\n"]


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self.closed = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


class _Call:
    """What a translated stream uses of its ``EngineCall``."""

    def __init__(self, req: ChatRequest) -> None:
        self.req = req
        self.native_tools = False
        self.timings = Timings(started_ns=time.perf_counter_ns())
        self.engine = self.handle = self.runtime = None
        self.card = None
        self.released = 0

    def release(self) -> None:
        self.released += 1


def _events(sse: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in sse.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            out.append((name.removeprefix("event: "), msgspec.json.decode(data.removeprefix("data: "))))
    return out


async def test_message_start_reports_the_prompt_tokens_the_engine_counted() -> None:
    req = ChatRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)
    role = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
    progress = {"total": 34, "cache": 33, "processed": 33, "time_ms": 0}
    chunks = _sse(
        {"choices": [role], "prompt_progress": progress},
        {"choices": [role], "prompt_progress": {**progress, "processed": 34}},
        {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 34,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 33},
            },
        },
    )
    call, response = _Call(req), _Response(chunks)
    stream = TranslatedStream(call, response, _Encoder(req, "msg_t"))  # type: ignore[arg-type]
    pieces = [piece async for piece in stream]
    events = _events(b"".join(pieces))
    assert [name for name, _ in events[:2]] == ["message_start", "ping"]
    # message_start went out with the engine's first event, before any text.
    assert b"message_start" in pieces[0] and b"Hello" not in pieces[0]
    start = events[0][1]["message"]["usage"]
    end = next(data["usage"] for name, data in events if name == "message_delta")
    assert start == {
        "input_tokens": 1,
        "output_tokens": 0,
        "cache_read_input_tokens": 33,
        "cache_creation_input_tokens": 0,
    }
    assert {k: v for k, v in end.items() if k != "output_tokens"} == {
        k: v for k, v in start.items() if k != "output_tokens"
    }
    assert response.closed and call.released == 1


async def test_an_engine_without_progress_still_gets_a_head() -> None:
    req = ChatRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)
    chunks = _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    stream = TranslatedStream(_Call(req), _Response(chunks), _Encoder(req, "msg_u"))  # type: ignore[arg-type]
    events = _events(b"".join([piece async for piece in stream]))
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    assert events[0][1]["message"]["usage"]["input_tokens"] == 0


def _long_prompt() -> list[bytes]:
    """A prompt evaluated in four batches (one progress event each), then one word."""
    role = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
    progress = [
        {"total": 8000, "cache": 0, "processed": n, "time_ms": n // 40} for n in (0, 2048, 4096, 6144)
    ]
    return _sse(
        *({"choices": [role], "prompt_progress": p} for p in progress),
        {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    )


async def _names(req: ChatRequest, chunks: list[bytes]) -> list[str]:
    stream = TranslatedStream(_Call(req), _Response(chunks), _Encoder(req, "msg_k"))  # type: ignore[arg-type]
    return [name for name, _ in _events(b"".join([piece async for piece in stream]))]


async def test_a_long_silent_prompt_keeps_the_stream_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every batch of the prompt takes longer than the keep-alive interval here, so each
    # progress event after the head becomes a ping the client skips.
    monkeypatch.setattr(engine_call, "KEEPALIVE_S", 0.0)
    req = ChatRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)
    names = await _names(req, _long_prompt())
    assert names[:5] == ["message_start", "ping", "ping", "ping", "ping"]
    assert names[5:7] == ["content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


async def test_a_quick_prompt_sends_no_extra_pings() -> None:
    req = ChatRequest(model="m", messages=[Message(role="user", content="hi")], stream=True)
    names = await _names(req, _long_prompt())
    assert names.count("ping") == 1
