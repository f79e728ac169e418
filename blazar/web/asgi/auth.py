"""Who may call what: the scope each route needs, how a key is presented, and the checks
routes make of the current request's key (``require_model``, ``model_visible``).

The gateway's auth step itself (``Auth``: the keys, the local token, each key's limits)
is ``blazar.web.middleware.auth``; what is here is shared by it and by the routes.
A route's family is found by exact match or a few prefix tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from blazar.auth.keys import ADMIN, FAMILIES, LOCAL_NAME, METRICS, Key
from blazar.serve.context import ACT_AS
from blazar.web.asgi.call import current_or_none

__all__ = [
    "ACT_AS",
    "ANY",
    "LOCAL_KEY",
    "OPEN",
    "WATCHES",
    "family_of",
    "model_visible",
    "presented_secret",
    "require_model",
    "secret_tag",
]

OPEN = "open"
"""Routes no key is needed for."""
ANY = "any"
"""Routes any valid key may call (listings, the error catalog, its own live requests)."""

_EXACT = {
    "/health": OPEN,
    "/healthz": OPEN,
    "/.well-known/blazar": OPEN,
    "/v1/chat/completions": "chat",
    "/v1/completions": "chat",
    "/v1/messages": "chat",
    "/v1/messages/count_tokens": "chat",
    "/api/chat": "chat",
    "/api/generate": "chat",
    # llama.cpp's utilities, through the gateway (blazar/web/routes/llamacpp.py)
    "/tokenize": "chat",
    "/detokenize": "chat",
    "/apply-template": "chat",
    "/infill": "chat",
    "/v1/embeddings": "embeddings",
    "/api/embed": "embeddings",
    "/api/embeddings": "embeddings",
    "/v1/rerank": "embeddings",  # vectors: reranking is in the embeddings family
    "/v1/reranking": "embeddings",
    "/rerank": "embeddings",
    "/reranking": "embeddings",
    "/api/rerank": "embeddings",
    "/v1/chat/completions/control": "chat",  # steered chat (a vector by `path` needs admin)
    "/v1/systemone": "chat",  # a decision is a chat model's answer, held to a closed set
    "/v1/realtime": "audio",  # a voice loop: speech in and out (its chat model is checked by name)
    "/api/pull": ADMIN,
    "/api/delete": ADMIN,
    "/api/create": ADMIN,
    "/api/copy": ADMIN,
    "/api/push": ADMIN,
    "/api/evict": ADMIN,
    # Aggregates a scraper reads: a `metrics` key (or an admin key). Per-request stories
    # (/api/why) and a model's effective settings (/api/explain) need admin.
    "/metrics": METRICS,
    "/api/quantiles": METRICS,
}
_PREFIXES = (
    # Longer prefixes first: /v1/messages/batches is batch work, /v1/messages chat.
    ("/v1/messages/batches", "batch"),
    ("/v1/batches", "batch"),
    ("/v1/files", "batch"),
    ("/v1/jobs", "batch"),
    ("/v1/responses", "chat"),
    ("/v1/chat/completions", "chat"),  # the stored completions under it
    ("/v1/conversations", "chat"),
    ("/v1/stream", "chat"),  # resumable streams: each key sees its own only
    ("/v1/streams", "chat"),
    ("/v1/audio/", "audio"),
    ("/audio/", "audio"),
    ("/v1/images/", "images"),
    ("/v1/videos", "images"),  # made by image (diffusion) models
    ("/admin/", ADMIN),
    ("/v1/adapters", ADMIN),  # a model's LoRA scales: how it runs for every client
    ("/api/blobs/", ADMIN),
    ("/api/explain", ADMIN),
    ("/api/why", ADMIN),
    ("/api/mcp/", ADMIN),  # starts a server, calls its tools; GET /api/mcp only lists
    ("/api/failover/", ADMIN),  # pin and unpin; GET /api/failover only lists
    ("/api/model-doctor", ADMIN),  # runs probes (GET reads a certificate: admin too, it shows prompts)
    ("/api/bench", ADMIN),  # runs a benchmark
    ("/api/tune", ADMIN),  # restarts a model's engine with trial settings
    ("/api/profiles/", ADMIN),  # DELETE changes how a model runs; GET: admin too, beside it
    ("/api/benchmarks", METRICS),
    ("/api/scorecard/", METRICS),
    ("/api/console/", METRICS),  # the console's read model: the operator's view, like /metrics
    # The console page holds no data; the routes it reads are scoped.
    ("/ui", OPEN),
)
WATCHES = frozenset({"/api/console/events"})
"""Long-lived read streams (an open console tab): charged one request against the key's rpm,
never a concurrency place, so a tab left open does not use up ``max_concurrent``."""


def family_of(path: str) -> str:
    """The scope a route needs: a family of ``keys.FAMILIES``, ``OPEN`` or ``ANY``."""
    family = _EXACT.get(path)
    if family is not None:
        return family
    for prefix, family in _PREFIXES:
        if path.startswith(prefix) and (
            prefix.endswith("/") or len(path) == len(prefix) or path[len(prefix)] == "/"
        ):
            return family
    return ANY


LOCAL_KEY = Key(name=LOCAL_NAME, digest="", hint="", families=FAMILIES, models=("*",), created_at=0.0)


def presented_secret(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth is not None and auth[:7].lower() == "bearer " and len(auth) > 7:
        return auth[7:].strip()
    return headers.get("x-api-key") or None


def secret_tag(secret: str) -> str:
    """A stable, non-reversible name for a secret that is no key (admission fairness)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def require_model(name: str) -> None:
    """Refuse (403 ``MODEL_NOT_IN_SCOPE``) a model the current request's key may not use."""
    call = current_or_none()
    if call is not None:
        call.check_model(name)


def model_visible(name: str) -> bool:
    """Whether a listing shows ``name`` to the current request's key."""
    call = current_or_none()
    grant = call.grant if call is not None else None
    return grant is None or grant.allows_model(name)
