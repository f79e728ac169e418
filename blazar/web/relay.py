"""Relay one request to an engine child, bytes in and bytes out.

The OpenAI dialect is llama.cpp's own, so nothing is parsed on the way back:
the engine's SSE bytes go to the client as they arrive. A lease counts the
request as in flight on the engine from the moment it is sent until the
upstream response is closed, exactly once, whichever way the request ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import httpx
import trio

from actors.engine import ConfirmCrash, CrashReport, EngineActor, EngineHandle
from actors.errors import ActorStopped
from blazar.errors import BlazarError


class Releasable(Protocol):
    def release(self) -> None: ...


__all__ = ["Releasable", "UpstreamStream", "close_response", "crash_error", "send_upstream"]


async def close_response(response: httpx.Response) -> None:
    """Close an upstream response even while being cancelled (bounded): closing the
    connection is what makes llama.cpp stop generating."""
    with trio.CancelScope(shield=True), trio.move_on_after(2.0):
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


async def send_upstream(handle: EngineHandle, path: str, body: bytes, *, stream: bool) -> httpx.Response:
    """Send the request; a pooled connection the engine closed just before reuse is retried once."""
    request = handle.client.build_request(
        "POST", path, content=body, headers={"Content-Type": "application/json"}
    )
    try:
        return await handle.client.send(request, stream=stream)
    except httpx.RemoteProtocolError as exc:
        # "Server disconnected without sending a response": nothing was processed.
        if "without sending a response" not in str(exc):
            raise
    return await handle.client.send(request, stream=stream)


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
        response: httpx.Response,
        lease: Releasable,
        on_error: Callable[[Exception], Awaitable[bytes]],
    ) -> None:
        self._response = response
        self._chunks = response.aiter_raw()
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
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            self._finished = True
            await self.aclose()
            raise
        except httpx.HTTPError as exc:
            self._finished = True
            return await self._on_error(exc)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await close_response(self._response)
        self._lease.release()
