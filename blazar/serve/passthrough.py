"""Relay a request's bytes to its model's engine and answer with what the engine answers.

For the routes whose wire shape is the engine's own (the audio routes, llama.cpp's utility
routes): the gateway claims the engine through admission like any request, sends the
body as it is, and relays the answer as it comes, whole or streamed. An engine's refusal
keeps its status and body, with ``blazar_code`` added; ``refusal`` may word one itself.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.engine import EngineActor
from actors.runtime import Runtime
from actors.upstream import UpstreamError
from blazar.dialects import openai
from blazar.errors import BlazarError
from blazar.serve.claim import claim_engine
from blazar.serve.context import Ask, Relayed
from blazar.serve.relay import UpstreamStream, crash_error
from blazar.serve.reply import JSON, Reply, stream_reply

__all__ = ["relay_call"]

Refusal = Callable[[int, bytes], BlazarError | None]
"""An engine's non-200 answer (status, body) worded as the gateway's error; None: relayed."""


async def relay_call(
    runtime: Runtime,
    call: Relayed,
    ask: Ask,
    engine: EngineActor,
    path: str,
    *,
    body: bytes | None = None,
    content_type: str = JSON,
    stream_error: Callable[[BlazarError], bytes] = lambda err: b"",
    refusal: Refusal | None = None,
) -> Reply:
    """POST ``body`` (default: the request's own) to ``engine`` at ``path``; ``stream_error``
    is what ends a stream the engine fails midway (default: nothing, the stream ends short)."""
    lease = await claim_engine(runtime, engine, ask)
    handle = lease.handle
    try:
        upstream = await handle.upstream.request(
            "POST", path, body=call.body if body is None else body, headers={"content-type": content_type}
        )
    except UpstreamError as exc:
        lease.release()
        raise await crash_error(engine, handle, exc) from exc
    except BaseException:
        lease.release()
        raise
    head = {k.decode("latin-1"): v.decode("latin-1") for k, v in upstream.headers}
    kind = head.get("content-type", JSON)
    if upstream.status_code != 200:
        try:
            content = await upstream.aread()
        finally:
            await upstream.aclose()
            lease.release()
        if refusal is not None and (err := refusal(upstream.status_code, content)) is not None:
            raise err
        code = "BAD_REQUEST" if upstream.status_code < 500 else "BAD_GATEWAY"
        call.code = code
        return Reply(openai.merge_error_code(content, code), upstream.status_code, content_type=kind)

    async def on_error(exc: Exception) -> bytes:
        err = await crash_error(engine, handle, exc)
        if call.card is not None:
            call.card.note_failure(err.code, err.message)
        return stream_error(err)

    relayed = UpstreamStream(upstream, lease, on_error, background=runtime.start_soon)
    call.on_cleanup(relayed.aclose)
    headers = {k: v for k, v in head.items() if k.startswith("x-")}  # e.g. the sample rate of pcm
    return stream_reply(relayed, content_type=kind, headers=headers)
