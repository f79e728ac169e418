"""The realtime voice loop (``GET /v1/realtime``) as a WebSocket session.

The standard library has no WebSocket client, so this part needs the ``realtime`` extra
(``pip install 'blazar-sdk[realtime]'``, which brings ``websockets``). Events are OpenAI's
Realtime events as dicts: ``session.update``, ``input_audio_buffer.append`` (pcm16, 24 kHz
mono), ``response.create``, …; the daemon answers ``session.created``,
``response.audio.delta``, ``error``, …
"""

from __future__ import annotations

import base64
import json
from contextlib import AsyncExitStack, ExitStack
from typing import Any, AsyncIterator, Dict, Iterator, Mapping, Optional
from urllib.parse import quote

from ._errors import SDK_CONNECTION, SDK_MISSING_EXTRA, BlazarError, error_from_body

__all__ = ["AsyncRealtimeSession", "RealtimeSession", "connect", "connect_async"]


def _url(base_url: str, model: str) -> str:
    scheme, rest = base_url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/v1/realtime?model={quote(model, safe='')}"


def _missing(exc: ImportError) -> BlazarError:
    return BlazarError(
        "the realtime client needs the `websockets` package: pip install 'blazar-sdk[realtime]'",
        blazar_code=SDK_MISSING_EXTRA,
    )


def _refused(exc: Exception) -> BlazarError:
    """The daemon's JSON refusal of the upgrade (401, 403, 404, …), when it sent one."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and status >= 400:
        body = getattr(response, "body", b"") or b""
        headers = {k.lower(): v for k, v in getattr(response, "headers", {}).items()}
        return error_from_body(status, body, headers)
    return BlazarError(f"the realtime connection failed: {exc}", blazar_code=SDK_CONNECTION)


def _event(kind: str, fields: Mapping[str, Any]) -> str:
    return json.dumps({"type": kind, **fields})


class RealtimeSession:
    """A blocking realtime session: ``send`` events, ``recv`` (or iterate) the daemon's."""

    def __init__(self, ws: Any, stack: ExitStack) -> None:
        self._ws = ws
        self._stack = stack

    def send(self, kind: str, **fields: Any) -> None:
        self._ws.send(_event(kind, fields))

    def append_audio(self, pcm16: bytes) -> None:
        """``input_audio_buffer.append`` with raw pcm16 (24 kHz mono)."""
        self.send("input_audio_buffer.append", audio=base64.b64encode(pcm16).decode("ascii"))

    def recv(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        event: Dict[str, Any] = json.loads(self._ws.recv(timeout))
        return event

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for message in self._ws:
            yield json.loads(message)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> RealtimeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRealtimeSession:
    """The asyncio twin of ``RealtimeSession``."""

    def __init__(self, ws: Any, stack: AsyncExitStack) -> None:
        self._ws = ws
        self._stack = stack

    async def send(self, kind: str, **fields: Any) -> None:
        await self._ws.send(_event(kind, fields))

    async def append_audio(self, pcm16: bytes) -> None:
        await self.send("input_audio_buffer.append", audio=base64.b64encode(pcm16).decode("ascii"))

    async def recv(self) -> Dict[str, Any]:
        event: Dict[str, Any] = json.loads(await self._ws.recv())
        return event

    async def __aiter__(self) -> AsyncIterator[Dict[str, Any]]:
        async for message in self._ws:
            yield json.loads(message)

    async def close(self) -> None:
        await self._stack.aclose()

    async def __aenter__(self) -> AsyncRealtimeSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(base_url: str, model: str, headers: Mapping[str, str], **kwargs: Any) -> RealtimeSession:
    try:
        from websockets.sync.client import connect as ws_connect
    except ImportError as exc:
        raise _missing(exc) from exc
    stack = ExitStack()
    try:
        # Entered as a context manager, which websockets asks for; the session's close() exits it.
        ws = stack.enter_context(
            ws_connect(_url(base_url, model), additional_headers=dict(headers), **kwargs)
        )
    except Exception as exc:  # websockets' handshake errors, OSError
        raise _refused(exc) from exc
    return RealtimeSession(ws, stack)


async def connect_async(
    base_url: str, model: str, headers: Mapping[str, str], **kwargs: Any
) -> AsyncRealtimeSession:
    try:
        from websockets.asyncio.client import connect as ws_connect
    except ImportError as exc:
        raise _missing(exc) from exc
    stack = AsyncExitStack()
    try:
        connecting = ws_connect(_url(base_url, model), additional_headers=dict(headers), **kwargs)
        ws = await stack.enter_async_context(connecting)
    except Exception as exc:
        raise _refused(exc) from exc
    return AsyncRealtimeSession(ws, stack)
