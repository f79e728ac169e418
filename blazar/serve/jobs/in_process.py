"""The gateway's own ASGI application as a client, for the jobs whose items are requests.

A batch item or a transcription job *is* an HTTP request, by design: sent in-process to the
daemon's ASGI application, it gets exactly what the same request sent over HTTP would
(auth, validation, translation, the error shapes). The service layer never imports that
application: the gateway hands it over as a plain callable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

__all__ = ["ASGIApp", "asgi_client"]

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
"""An ASGI application: ``await app(scope, receive, send)``."""


def asgi_client(app: ASGIApp, headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    """A client whose requests go straight into ``app``, with ``headers`` on each, and no
    timeout (a job's request runs as long as its answer takes)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=None, headers=headers
    )
