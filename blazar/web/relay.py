"""Relay one request to an engine child, bytes in and bytes out.

The OpenAI dialect is llama.cpp's own, so nothing is parsed on the way back:
the engine's SSE bytes go to the client as they arrive. A lease counts the
request as in flight on the engine from the moment it is sent until the
upstream response is closed, exactly once, whichever way the request ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from actors.engine import ConfirmCrash, CrashReport, EngineActor, EngineHandle
from actors.errors import ActorStopped
from actors.upstream import UpstreamError, UpstreamResponse
from blazar.errors import BlazarError


class Releasable(Protocol):
    def release(self) -> None: ...


__all__ = ["Releasable", "UpstreamStream", "close_response", "crash_error", "send_upstream"]


_JSON_HEADERS = {"Content-Type": "application/json"}


async def close_response(response: UpstreamResponse) -> None:
    """Close an upstream response, also while being cancelled: closing the connection
    before the end of the body is what makes llama.cpp stop generating.
    ``UpstreamResponse.aclose`` does it in a shielded, bounded scope."""
    await response.aclose()


async def crash_error(engine: EngineActor, handle: EngineHandle, exc: Exception) -> BlazarError:
    """Decide whether a broken upstream connection was an engine crash."""
    try:
        report: CrashReport = await engine.ask(ConfirmCrash(generation=handle.generation))
    except ActorStopped:
        return BlazarError("ENGINE_CRASHED", f"engine for '{handle.model}' stopped during the request")
    if report.crashed:
        detail = f": {report.stderr_summary}" if report.stderr_summary else ""
        return BlazarError(
            "ENGINE_CRASHED",
            f"engine for '{handle.model}' crashed (exit code {report.returncode}){detail}"
            " — the next request starts it again; see `blazar logs`",
        )
    return BlazarError("BAD_GATEWAY", f"lost the connection to the engine for '{handle.model}': {exc!r}")


async def send_upstream(handle: EngineHandle, path: str, body: bytes) -> UpstreamResponse:
    """POST a JSON body and return once the response head has arrived; the body is read
    (``aread``, ``aiter_raw``) and the response closed by the caller. A pooled connection
    the engine closed just before reuse is retried once on a new one (nothing was processed);
    other failures raise ``UpstreamError``."""
    return await handle.upstream.request("POST", path, body=body, headers=_JSON_HEADERS)


class UpstreamStream:
    """An async iterator over the engine's response bytes, closed exactly once.

    ``on_error`` turns a transport failure midway into the dialect's final error
    event. Closing (by the server after the last chunk, on a client disconnect,
    or by the per-request cleanup when the body was never started) closes the
    upstream connection, which makes llama.cpp stop generating at once, and
    then releases the lease.
    """

    def __init__(
        self,
        response: UpstreamResponse,
        lease: Releasable,
        on_error: Callable[[Exception], Awaitable[bytes]],
    ) -> None:
        self._response = response
        self._lease = lease
        self._on_error = on_error
        self._finished = False
        self._closed = False

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            await self.aclose()
            raise StopAsyncIteration
        try:
            chunk = await self._response.receive_some()
        except UpstreamError as exc:
            self._finished = True
            return await self._on_error(exc)
        if not chunk:
            self._finished = True
            await self.aclose()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await close_response(self._response)
        self._lease.release()
