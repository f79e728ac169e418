"""``GET /ui``: the web console, a page shipped inside the package (``blazar/web/console/static/``).

The page itself needs no key (it holds no data); everything it shows comes from the scoped
data routes (``/api/console/snapshot``, ``/api/console/events`` and the action routes),
which it calls with the key the user types in. The host and origin guard in front of the
app applies here as everywhere. A content security policy keeps the page to this daemon:
no script, style, font or connection to any other host.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from quart import Response, request
from quart_trio import QuartTrio

from blazar.web.asgi.replies import error_response

__all__ = ["register"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@cache
def _asset(name: str) -> tuple[bytes, str] | None:
    """The file's bytes and its ETag, or None when the package has no such file."""
    if "/" in name or name.startswith(".") or not any(name.endswith(s) for s in _TYPES):
        return None
    path = resources.files("blazar.web.console").joinpath("static", name)
    if not path.is_file():
        return None
    data = path.read_bytes()
    return data, '"' + hashlib.sha256(data).hexdigest()[:20] + '"'


def _serve(name: str) -> Response:
    found = _asset(name)
    if found is None:
        return error_response("NOT_FOUND", f"the console has no file {name!r} — open /ui")
    data, etag = found
    headers = {
        # Revalidate every time (a cheap 304): an upgraded daemon serves its new page at once.
        "Cache-Control": "no-cache",
        "ETag": etag,
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": _POLICY,
        "Referrer-Policy": "no-referrer",
    }
    if request.headers.get("If-None-Match") == etag:
        return Response(b"", 304, headers=headers)
    content_type = _TYPES["." + name.rsplit(".", 1)[-1]]
    return Response(data, 200, headers=headers, content_type=content_type)


async def index() -> Response:
    return _serve("index.html")


async def asset(name: str) -> Response:
    return _serve(name)


def register(app: QuartTrio) -> None:
    app.get("/ui")(index)
    app.get("/ui/")(index)
    app.get("/ui/<name>")(asset)
