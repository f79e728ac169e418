"""What a served request answers: a whole body or a stream, a status, headers.

The service layer hands a ``Reply`` back to the HTTP layer, which sends it as it is (a
stream chunk by chunk, closed however the client's connection ends); a stream is sent
with the headers that keep proxies from caching or buffering it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from blazar.errors import Dialect

__all__ = ["JSON", "LOADING_NS", "SSE_CACHE", "Reply", "dialect_for", "stream_reply"]

JSON = "application/json"
LOADING_NS = 100_000_000
"""A request that waited longer than this for its engine is marked as loading
(``X-Blazar-Status: loading``, Ollama ``load_duration``)."""
SSE_CACHE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""A stream is neither cached nor held back by a buffering proxy (nginx reads the second)."""


@dataclass(slots=True)
class Reply:
    """What a gateway-served route answers: a whole body, or a stream of chunks that the
    gateway sends as they come (and closes, if it has ``aclose``, however the stream ends)."""

    body: bytes | AsyncIterator[bytes]
    status: int = 200
    content_type: str = JSON
    headers: Mapping[str, str] | None = None


def stream_reply(
    stream: AsyncIterator[bytes], *, content_type: str, headers: Mapping[str, str] | None = None
) -> Reply:
    """A streamed answer: never cached nor buffered by a proxy."""
    return Reply(stream, content_type=content_type, headers={**SSE_CACHE, **(headers or {})})


_NATIVE_API = (
    "/api/errors",
    "/api/why",
    "/api/explain",
    "/api/quantiles",
    "/api/failover",
    "/api/model-doctor",
    "/api/bench",  # and /api/benchmarks
    "/api/scorecard/",
    "/api/tune",
    "/api/profiles/",
    "/api/console/",
    "/api/capacity",
    "/api/peers",
    "/api/route/",
    "/api/plan/",
    "/api/coreside",
    "/api/mcp",
    "/api/evict",
)
"""Blazar's own routes under Ollama's ``/api/`` prefix: they answer in the native shape."""


def dialect_for(path: str, headers: Mapping[str, str]) -> Dialect:
    """Which error shape a request gets (DESIGN §7); ``headers`` has lower-case names."""
    if path.startswith("/v1/messages") or "anthropic-version" in headers:
        return Dialect.ANTHROPIC
    if path.startswith("/api/") and not path.startswith(_NATIVE_API):
        return Dialect.OLLAMA
    return Dialect.OPENAI
