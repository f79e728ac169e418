"""The semantic cache's store: answers kept in memory with the embedding of the prompt that
asked for them, found again by a prompt whose embedding is close enough.

Entries live in buckets: one per API key, model, lane and *context* (everything of the
request but its last user message: the earlier messages, the sampling, the output limit…),
so a lookup only ever compares prompts whose answers could stand in for each other, and never
across keys. Within a bucket the nearest prompt by cosine similarity wins. The store is
bounded by ``max_entries`` (the oldest is dropped first) and each entry by its TTL.

One store per daemon (``open_semantic_cache``, from the gateway's construction); the service
finds it with ``semantic_cache_of(runtime)``. It holds no task: expired entries go when a
lookup or an insert passes them. The request side (headers, what bypasses the cache, the
embedding call) is ``blazar.serve.semantic_cache``.
"""

from __future__ import annotations

import itertools
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from actors.runtime import Runtime
from blazar.config import SemanticCacheConfig

__all__ = [
    "Bucket",
    "CacheStats",
    "Entry",
    "Found",
    "SemanticCache",
    "normalized",
    "open_semantic_cache",
    "semantic_cache_of",
]

_SAME = 0.9999
"""A new answer whose prompt is this close to a kept one replaces it (two misses raced)."""


class Bucket(msgspec.Struct, frozen=True):
    """What must be equal for two prompts to be compared at all."""

    owner: str
    """The API key's name ('' without a key)."""
    model: str
    lane: str
    context: str
    """A digest of the request without its last user message."""


@dataclass(slots=True)
class Entry:
    bucket: Bucket
    vector: list[float]
    """The prompt's embedding, of length 1."""
    body: bytes
    content_type: str
    headers: dict[str, str]
    """The answer's headers that describe the answer itself (ignored parameters, caps)."""
    stored_t: float
    ttl_s: float
    model: str
    """The canonical name it is counted under (``/api/ps``)."""

    def alive(self, now: float) -> bool:
        return now - self.stored_t < self.ttl_s


@dataclass(frozen=True, slots=True)
class Found:
    """The nearest live entry of a bucket, whether or not it is close enough."""

    entry: Entry
    similarity: float
    age_s: float


@dataclass(slots=True)
class ModelCounts:
    hits: int = 0
    misses: int = 0
    bypasses: dict[str, int] = field(default_factory=dict)
    """By reason (``stream``, ``tools``, …)."""


class CacheStats(msgspec.Struct, frozen=True, kw_only=True):
    """One model's figures, as ``/api/ps`` shows them."""

    hits: int
    misses: int
    bypasses: int
    entries: int


def normalized(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1 (a zero vector stays zero: it matches nothing)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else [0.0 for _ in vector]


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):  # another embedding model since: not comparable
        return -1.0
    return sum(map(operator.mul, a, b))


class SemanticCache:
    """Every kept answer of the daemon, oldest first: the sole owner of entries and counts."""

    def __init__(self, config: SemanticCacheConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._ids = itertools.count()
        self._entries: dict[int, Entry] = {}
        self._buckets: dict[Bucket, dict[int, Entry]] = {}
        self.counts: dict[str, ModelCounts] = {}

    @property
    def usable(self) -> bool:
        """A model is configured to compare prompts with."""
        return bool(self.config.model)

    def nearest(self, bucket: Bucket, vector: Sequence[float], *, max_age_s: float) -> Found | None:
        """The live entry of ``bucket`` nearest ``vector`` (normalized) no older than ``max_age_s``."""
        now = self._clock()
        kept = self._buckets.get(bucket)
        if not kept:
            return None
        best: Found | None = None
        for entry_id, entry in list(kept.items()):
            if not entry.alive(now):
                self._drop(entry_id)
                continue
            age = now - entry.stored_t
            if age >= max_age_s:
                continue
            similarity = _dot(entry.vector, vector)
            if best is None or similarity > best.similarity:
                best = Found(entry, similarity, age)
        return best

    def put(
        self,
        bucket: Bucket,
        vector: list[float],
        body: bytes,
        *,
        content_type: str,
        headers: dict[str, str],
        ttl_s: float,
        model: str | None = None,
    ) -> None:
        """Keep an answer (``vector`` normalized); the oldest entries go past ``max_entries``."""
        now = self._clock()
        for entry_id, entry in list(self._buckets.get(bucket, {}).items()):
            if not entry.alive(now) or _dot(entry.vector, vector) >= _SAME:
                self._drop(entry_id)  # the bucket goes with its last entry
        entry = Entry(bucket, vector, body, content_type, headers, now, ttl_s, model or bucket.model)
        entry_id = next(self._ids)
        self._entries[entry_id] = self._buckets.setdefault(bucket, {})[entry_id] = entry
        while len(self._entries) > self.config.max_entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        kept = self._buckets[entry.bucket]
        del kept[entry_id]
        if not kept:
            del self._buckets[entry.bucket]

    def sweep(self) -> None:
        now = self._clock()
        for entry_id in [i for i, e in self._entries.items() if not e.alive(now)]:
            self._drop(entry_id)

    def note(self, model: str, outcome: str, reason: str | None = None) -> None:
        """Count one request: ``hit``, ``miss`` or ``bypass`` (with its reason)."""
        counts = self.counts.setdefault(model, ModelCounts())
        if outcome == "hit":
            counts.hits += 1
        elif outcome == "miss":
            counts.misses += 1
        else:
            key = reason or "other"
            counts.bypasses[key] = counts.bypasses.get(key, 0) + 1

    def stats(self, model: str) -> CacheStats:
        """``model``'s counts and live entries."""
        self.sweep()
        counts = self.counts.get(model, ModelCounts())
        entries = sum(1 for e in self._entries.values() if e.model == model)
        return CacheStats(
            hits=counts.hits, misses=counts.misses, bypasses=sum(counts.bypasses.values()), entries=entries
        )

    def __len__(self) -> int:
        return len(self._entries)


_STORES: weakref.WeakKeyDictionary[Runtime, SemanticCache] = weakref.WeakKeyDictionary()


def open_semantic_cache(
    runtime: Runtime, config: SemanticCacheConfig, clock: Callable[[], float]
) -> SemanticCache:
    """The daemon's one semantic cache (``clock``: seconds, e.g. ``trio.current_time``)."""
    cache = SemanticCache(config, clock)
    _STORES[runtime] = cache
    return cache


def semantic_cache_of(runtime: Runtime) -> SemanticCache | None:
    """The cache ``open_semantic_cache`` made for ``runtime``; None where none was (an embedder)."""
    return _STORES.get(runtime)
