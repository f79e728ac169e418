"""Relay one request to an engine child, bytes in and bytes out.

The OpenAI dialect is llama.cpp's own, so nothing is parsed on the way back:
the engine's SSE bytes go to the client as they arrive. A lease counts the
request as in flight on the engine from the moment it is sent until the
upstream response is closed, exactly once, whichever way the request ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

import trio

from actors.engine import ConfirmCrash, CrashReport, EngineActor, EngineHandle
from actors.errors import ActorStopped
from actors.rpc import describe_loss, lost_workers
from actors.upstream import UpstreamError, UpstreamResponse
from blazar.dialects.llamacpp import ProgressFilter
from blazar.dialects.model_rename import Renamer, rename_request
from blazar.errors import BlazarError


class Releasable(Protocol):
    def release(self) -> None: ...


__all__ = [
    "Background",
    "OutputWatch",
    "Releasable",
    "RenamingStream",
    "UpstreamStream",
    "close_once_started",
    "close_response",
    "crash_error",
    "renamer_for",
    "send_upstream",
]

log = logging.getLogger("blazar.serve")

Background = Callable[[Callable[[], Awaitable[object]]], None]
"""Starts a task that may outlive the request (``Runtime.start_soon``)."""

Pipe = Callable[[UpstreamResponse, Callable[[bytes], None]], Awaitable[bool]]
"""Relays the rest of a response's body, each chunk given to the callable
(``Exchange.pipe``); False where it cannot."""


_START_WAIT_S = 600.0
"""How long an abandoned request may take to reach its first output (a whole prompt
read on a slow machine) before its connection is closed regardless."""


_JSON_HEADERS = {"Content-Type": "application/json"}


async def close_response(response: UpstreamResponse) -> None:
    """Close an upstream response, also while being cancelled: before the end of the
    body ``UpstreamResponse.aclose`` resets the connection (at once, without waiting),
    and llama.cpp stops at its next write."""
    await response.aclose()


_OUTPUT_MARKS = (
    b'"content":"',
    b'"reasoning_content":"',
    b'"tool_calls":[',
    b'"text":"',
    b'"finish_reason":"',
)
"""What only an event with generated output holds in llama.cpp's (compact) SSE: the role
and progress events that come before the prompt is read have none of these."""


class OutputWatch:
    """Tells from the engine's SSE bytes when it has started generating (a mark split
    between two chunks counts)."""

    __slots__ = ("_tail", "seen")

    def __init__(self) -> None:
        self._tail = b""
        self.seen = False

    def feed(self, chunk: bytes) -> bool:
        if not self.seen:
            data = self._tail + chunk
            self.seen = any(mark in data for mark in _OUTPUT_MARKS)
            self._tail = data[-24:]
        return self.seen


async def close_once_started(
    response: UpstreamResponse, lease: Releasable, watch: OutputWatch | None = None
) -> None:
    """Close the stream of a request whose client is gone once the engine has started
    generating, then release its lease.

    llama.cpp does not notice a connection closed while it reads the prompt: it goes
    on to generate the whole answer for nobody. Closed after its first token, it stops
    at once. Until then the request still occupies the engine, so the lease is held
    until the connection is closed.
    """
    watch = watch or OutputWatch()
    try:
        with trio.move_on_after(_START_WAIT_S):
            while not watch.seen and (chunk := await response.receive_some()):
                watch.feed(chunk)
    except UpstreamError:
        pass
    finally:
        await close_response(response)
        lease.release()


async def crash_error(engine: EngineActor, handle: EngineHandle, exc: Exception) -> BlazarError:
    """Decide whether a broken upstream connection was an engine crash."""
    try:
        report: CrashReport = await engine.ask(ConfirmCrash(generation=handle.generation))
    except ActorStopped:
        report = CrashReport(crashed=False, returncode=None, stderr_summary="", stopped="the daemon stopped")
    if report.stopped is not None:
        return BlazarError(
            "ENGINE_STOPPED",
            f"the engine for '{handle.model}' was stopped while this request ran ({report.stopped})"
            " — send it again; the next request starts the engine",
        )
    if report.crashed:
        # The child's last lines (paths, log text) are the operator's: the daemon's log has them.
        log.warning(
            "engine for '%s' crashed (exit code %s): %s",
            handle.model,
            report.returncode,
            report.stderr_summary,
        )
        workers = engine.spec.rpc
        if lost := lost_workers(report.stderr_summary, workers):
            # A worker's address is the operator's own config, not a line of the engine's.
            return BlazarError(
                "ENGINE_CRASHED",
                f"engine for '{handle.model}' crashed (exit code {report.returncode}): "
                f"{describe_loss(lost, workers)} — the next request starts it again once the "
                "worker answers (`blazar rpc-worker` restarts its rpc-server), or without it where the "
                'model has rpc_fallback = "remaining"; see `blazar logs`',
            )
        return BlazarError(
            "ENGINE_CRASHED",
            f"engine for '{handle.model}' crashed (exit code {report.returncode})"
            " — the next request starts it again; see `blazar logs`",
        )
    return BlazarError("BAD_GATEWAY", f"lost the connection to the engine for '{handle.model}': {exc!r}")


async def send_upstream(handle: EngineHandle, path: str, body: bytes) -> UpstreamResponse:
    """POST a JSON body and return once the response head has arrived; the body is read
    (``aread``, ``aiter_raw``) and the response closed by the caller. A pooled connection
    the engine closed just before reuse is retried once on a new one (nothing was processed);
    other failures raise ``UpstreamError``. An engine that must be sent one fixed model
    name (``EngineHandle.request_model``) gets it."""
    if handle.request_model is not None:
        body = rename_request(body, handle.request_model)
    return await handle.upstream.request("POST", path, body=body, headers=_JSON_HEADERS)


def renamer_for(handle: EngineHandle, client_name: str) -> Renamer | None:
    """What renames the model in the replies of an engine that names it its own way."""
    return None if handle.request_model is None else Renamer(handle.request_model, client_name)


class UpstreamStream:
    """An async iterator over the engine's response bytes, closed exactly once.

    ``on_error`` turns a transport failure midway into the dialect's final error
    event. Closing (by the server after the last chunk, on a client disconnect,
    or by the per-request cleanup when the body was never started) resets the
    upstream connection, which makes llama.cpp stop at its next write, and
    then releases the lease.

    ``progress`` filters out the prompt-progress events the gateway asked for
    (``ask_progress``); with them the engine writes after each batch of the prompt,
    so a stream closed while the prompt is read is closed at once too, and the
    engine stops at its next batch. Without them (a client that named
    ``return_progress`` itself) a stream closed before the engine's first token is
    handed to ``background`` to be closed once that token comes (``close_once_started``).

    ``on_end`` gets the stream's last two chunks, once, when it ends or is closed: the
    engine's usage and timings ride in its final event, read there after the fact so
    that no relayed chunk is ever parsed.

    Once nothing needs to see each chunk, ``pipe_into`` hands the rest of the body to the
    connection's pump (one epoll for every such stream, ``blazar.web.asgi.pump``); the
    iteration then goes on from where the pump stopped: the end, or the engine's error.
    """

    pipeable: ClassVar[bool] = True
    """Whether ``pipe_into`` may be used: not where each chunk must be changed."""

    def __init__(
        self,
        response: UpstreamResponse,
        lease: Releasable,
        on_error: Callable[[Exception], Awaitable[bytes]],
        *,
        background: Background | None = None,
        progress: ProgressFilter | None = None,
        on_end: Callable[[bytes], None] | None = None,
    ) -> None:
        self._response = response
        self._on_end = on_end
        self._prev = self._last = b""
        self._lease = lease
        self._on_error = on_error
        self._background = background if progress is None else None
        self._progress = progress
        self._output = OutputWatch()
        self._finished = False
        self._closed = False

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._finished:
            try:
                chunk = await self._response.receive_some()
            except UpstreamError as exc:
                self._finished = True
                return await self._on_error(exc)
            if not chunk:
                self._finished = True
                self._ended()
                if self._progress is not None and (held := self._progress.flush()):
                    return held
                break
            self._prev, self._last = self._last, chunk
            if self._output.seen:
                return chunk
            self._output.feed(chunk)
            if (progress := self._progress) is None:
                return chunk
            # Progress events come only before the first output: filter until then.
            chunk = progress.feed(chunk)
            if self._output.seen:
                self._progress = None
                chunk += progress.flush()
            if chunk:
                return chunk
        await self.aclose()
        raise StopAsyncIteration

    async def pipe_into(self, pipe: Pipe) -> bool:
        """Hand the rest of the body to ``pipe`` once nothing needs to see each chunk: no
        progress filter runs, and no close waits for the engine's first output (it has come,
        or there is no background to wait in). False while that is not so; True once handed,
        or refused for good."""
        if self._progress is not None or self._finished or self._closed:
            return False
        if not (self._output.seen or self._background is None):
            return False
        await pipe(self._response, self._keep_tail)
        return True

    def _keep_tail(self, chunk: bytes) -> None:
        self._prev, self._last = self._last, chunk

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(self._prev + self._last)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # A client may close as soon as it has read the final event (the OpenAI SDK does
        # at `[DONE]`), before the engine's end of body: what it was sent still counts.
        self._ended()
        if not (self._output.seen or self._finished) and self._background is not None:
            response, lease, watch = self._response, self._lease, self._output
            self._background(lambda: close_once_started(response, lease, watch))
            return
        await close_response(self._response)
        self._lease.release()


class RenamingStream(UpstreamStream):
    """An ``UpstreamStream`` whose chunks have the engine's name for the model replaced
    (``renamer_for``); the plain one stays free of the check on the hot path."""

    pipeable = False

    def __init__(
        self,
        response: UpstreamResponse,
        lease: Releasable,
        on_error: Callable[[Exception], Awaitable[bytes]],
        *,
        rename: Renamer,
        **kw: Any,
    ) -> None:
        super().__init__(response, lease, on_error, **kw)
        self._rename: Renamer | None = rename

    async def __anext__(self) -> bytes:
        while self._rename is not None:
            try:
                chunk = await super().__anext__()
            except StopAsyncIteration:
                rename, self._rename = self._rename, None
                if held := rename.flush():
                    return held
                raise
            if renamed := self._rename.feed(chunk):
                return renamed
        raise StopAsyncIteration
