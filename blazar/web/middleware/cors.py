"""Cross-origin access for web pages: which origins are granted, and the headers that say so.

A browser lets a page read a cross-origin answer only when the answer names the page's
origin in ``Access-Control-Allow-Origin``; for anything but a simple request it first asks
with a preflight (``OPTIONS`` with ``Access-Control-Request-Method``). Local origins (a page
on this machine, an editor's webview) are always granted; others only when listed in
``cors_origins`` (``"*"`` lists every origin). Nothing here runs for a request that carries
no ``Origin`` header, which is every SDK, ``curl`` and program.

In the gateway: the grant (``grant_for``) is worked out as the request arrives and added to
the head of whatever answers it, the route's answer or an error, unless the host guard or
the key step refused it (a refused ``Host`` gets no grant). A preflight (``preflight_for``)
is answered by the gateway itself after those two steps (the key step lets every
``OPTIONS`` through: a preflight carries no credentials) and before any route, which
never sees it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from blazar.web import headers as blazar_headers

__all__ = ["LOOPBACK_NAMES", "CorsPolicy", "expose_header", "host_name", "local_origin", "send_preflight"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
_LOCAL_SCHEMES = ("app://", "file://", "tauri://", "vscode-webview://", "vscode-file://")

_METHODS = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
_BASE_HEADERS = (
    "authorization",
    "content-type",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "openai-organization",
    "openai-project",
    *blazar_headers.REQUEST,
)
_EXPOSED = ("x-blazar-trace-id", "traceparent", "request-id", "x-request-id", "retry-after", "x-blazar-mcp")
_MAX_AGE_S = b"600"


def host_name(header: str) -> str:
    """The name in a ``Host`` value (or an origin's authority), without the port."""
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def local_origin(origin: str) -> bool:
    """A page served from this machine, or an app's own scheme; never ``null``."""
    if origin == "null" or origin.startswith(_LOCAL_SCHEMES):
        return origin != "null"
    host = origin.split("://", 1)[-1].rstrip("/")
    return host_name(host).lower() in LOOPBACK_NAMES


class CorsPolicy:
    """The origins granted cross-origin access: local ones, plus ``cors_origins``."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        listed = [o.strip() for o in origins]
        self.any = "*" in listed
        self.listed = frozenset(o.lower().rstrip("/") for o in listed if o != "*")

    def grants(self, origin: str) -> bool:
        if origin.lower() in self.listed:
            return True
        if local_origin(origin):
            return True
        return self.any

    def _grant(self, origin: str) -> list[tuple[bytes, bytes]]:
        # The origin itself, never "*": a page that sends credentials needs its own name back.
        headers = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if origin.lower() in self.listed or local_origin(origin):  # not granted by "*" alone
            headers.append((b"access-control-allow-credentials", b"true"))
        return headers

    def preflight(self, origin: str, headers: Mapping[str, str]) -> list[tuple[bytes, bytes]] | None:
        """The headers of a ``204`` answer to a preflight, or None when the origin is not granted."""
        if not self.grants(origin):
            return None
        allowed = list(_BASE_HEADERS)
        for name in headers.get("access-control-request-headers", "").split(","):
            name = name.strip().lower()
            if name and name not in allowed:
                # The origin is trusted to call at all: the SDKs' own headers (x-stainless-*
                # and the like) are as harmless as ours, and refusing one fails the call.
                allowed.append(name)
        return [
            *self._grant(origin),
            (b"access-control-allow-methods", _METHODS),
            (b"access-control-allow-headers", ", ".join(allowed).encode("latin-1")),
            (b"access-control-max-age", _MAX_AGE_S),
        ]

    def actual(self, origin: str) -> list[tuple[bytes, bytes]] | None:
        """What an actual answer to a granted origin carries beyond the expose list, or None."""
        return self._grant(origin) if self.grants(origin) else None

    def grant_for(self, headers: Mapping[str, str]) -> list[tuple[bytes, bytes]] | None:
        """What the answer to a request with these headers carries beyond the expose list:
        None without an ``Origin`` (every non-browser client) or for one not granted."""
        origin = headers.get("origin")
        return self.actual(origin) if origin else None

    def preflight_for(self, method: str, headers: Mapping[str, str]) -> list[tuple[bytes, bytes]] | None:
        """The headers of the ``204`` answer when this request is a preflight (``OPTIONS`` with
        ``Origin`` and ``Access-Control-Request-Method``) from a granted origin, else None."""
        if method != "OPTIONS" or "access-control-request-method" not in headers:
            return None
        origin = headers.get("origin")
        return self.preflight(origin, headers) if origin else None


def expose_header(response_headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """``Access-Control-Expose-Headers`` naming the trace id and every ``x-blazar-*`` header sent."""
    names = list(_EXPOSED)
    for name, _ in response_headers:
        text = name.decode("latin-1").lower()
        if text.startswith("x-blazar-") and text not in names:
            names.append(text)
    return (b"access-control-expose-headers", ", ".join(names).encode("latin-1"))


async def send_preflight(headers: list[tuple[bytes, bytes]], send: Any) -> None:
    """Answer a preflight on ASGI: ``204``, ``headers`` and no body."""
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
