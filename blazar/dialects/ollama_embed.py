"""Ollama's embeddings answers: ``/api/embed`` and the older ``/api/embeddings``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blazar.dialects.neutral import EmbedResponse

__all__ = ["encode_embed_response", "encode_legacy_embedding"]


def _line(doc: Any) -> bytes:
    return msgspec.json.encode(doc) + b"\n"


def encode_embed_response(
    resp: EmbedResponse, *, total_ns: int, load_ns: int, model: str | None = None
) -> bytes:
    doc: dict[str, Any] = {"model": model or resp.model, "embeddings": resp.embeddings}
    for key, value in (
        ("total_duration", total_ns),
        ("load_duration", load_ns),
        ("prompt_eval_count", resp.prompt_tokens),
    ):
        if value:
            doc[key] = int(value)
    return _line(doc)


def encode_legacy_embedding(vector: Sequence[float]) -> bytes:
    return _line({"embedding": list(vector)})
