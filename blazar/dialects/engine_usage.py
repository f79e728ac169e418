"""What llama.cpp says a request cost: tokens in and out, prefill and decode time.

The engine reports it itself, in its reply: ``usage`` (OpenAI's token counts)
and ``timings`` (``prompt_n``/``prompt_ms`` for the prompt it evaluated,
``predicted_n``/``predicted_ms`` for the tokens it generated, ``cache_n`` for the
prompt tokens it reused; ``draft_n``/``draft_n_accepted`` when it speculated). A
whole body carries both at its top level; a stream carries them in its final event,
just before ``data: [DONE]``.

The relayed hot path never parses what it relays: it keeps the last bytes of
the stream and hands them here once, at the end (``of_stream_tail``). Decoding
uses a typed decoder that declares only these two fields, so the rest of a body
is skipped, not built.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blazar.dialects.neutral import Usage

__all__ = ["EngineUsage", "of_body", "of_parts", "of_stream_tail", "stream_error"]


class EngineUsage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int | None = None
    """Prompt tokens in all (those reused from the cache included)."""
    completion_tokens: int | None = None
    prefill_ms: float | None = None
    """The engine's time evaluating the prompt (what it did not reuse)."""
    decode_ms: float | None = None
    """The engine's time generating the output tokens."""
    drafted: int | None = None
    """Tokens speculative decoding drafted (``timings.draft_n``); None: it did not run."""
    accepted: int | None = None
    """Of those, the tokens the model kept (``timings.draft_n_accepted``)."""


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Timings(msgspec.Struct):
    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    cache_n: int | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None


class _Doc(msgspec.Struct):
    usage: _Usage | None = None
    timings: _Timings | None = None


_DECODER = msgspec.json.Decoder(_Doc)


def _combine(usage: _Usage | None, timings: _Timings | None) -> EngineUsage | None:
    if usage is None and timings is None:
        return None
    prompt = usage.prompt_tokens if usage is not None else None
    completion = usage.completion_tokens if usage is not None else None
    if timings is not None:
        if prompt is None and timings.prompt_n is not None:
            prompt = timings.prompt_n + (timings.cache_n or 0)
        if completion is None:
            completion = timings.predicted_n
        return EngineUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            prefill_ms=timings.prompt_ms,
            decode_ms=timings.predicted_ms,
            drafted=timings.draft_n,
            accepted=timings.draft_n_accepted,
        )
    return EngineUsage(prompt_tokens=prompt, completion_tokens=completion)


def of_body(body: bytes) -> EngineUsage | None:
    """From a whole (non-stream) JSON reply; None when it says nothing or is not JSON."""
    try:
        doc = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return _combine(doc.usage, doc.timings)


def of_stream_tail(tail: bytes) -> EngineUsage | None:
    """From the last bytes of an SSE stream: the last event that holds ``timings`` (or,
    from an engine without them, ``usage``). None when the tail holds neither whole."""
    at = tail.rfind(b'"timings":')
    if at < 0:
        at = tail.rfind(b'"usage":{')
        if at < 0:
            return None
    start = tail.rfind(b"data:", 0, at)
    if start < 0:
        return None
    end = tail.find(b"\n", at)
    line = tail[start + 5 : end if end >= 0 else len(tail)]
    return of_body(line)


def of_parts(usage: Usage | None, timings: Any) -> EngineUsage | None:
    """From what a parsed stream already holds: its final usage, and the ``timings``
    object of its last event (a dict, or None)."""
    t = None
    if isinstance(timings, dict):
        try:
            t = msgspec.convert(timings, _Timings)
        except msgspec.ValidationError:
            t = None
    u = _Usage(usage.prompt_tokens, usage.completion_tokens) if usage is not None else None
    return _combine(u, t)


class _Error(msgspec.Struct):
    message: str = ""


class _ErrorDoc(msgspec.Struct):
    error: _Error | str | None = None


_ERROR_DECODER = msgspec.json.Decoder(_ErrorDoc)


def stream_error(tail: bytes) -> str | None:
    """The message of the error event an engine ended its SSE stream with (llama.cpp
    writes ``data: {"error": {...}}`` when a request fails after its head); None when
    the tail holds none."""
    at = tail.rfind(b'data: {"error":')
    if at < 0:
        return None
    end = tail.find(b"\n", at)
    try:
        doc = _ERROR_DECODER.decode(tail[at + 6 : end if end >= 0 else len(tail)])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "an error event"
    err = doc.error
    if isinstance(err, _Error):
        return err.message or "an error event"
    return err or "an error event"
