"""The Ollama dialect's model verbs: ``/api/tags``, ``ps``, ``show``, ``pull``, ``version``.

Inference (``/api/chat``, ``/api/generate``, embeddings) lives in
``blazar.dialects.ollama``; this side only lists and describes models and
reports pull progress, so the two share no wire structs, only the time
formats of ``blazar.dialects.ollama_time`` and the NDJSON line framing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

from blazar.dialects.ollama_time import FOREVER_RFC3339, rfc3339

__all__ = [
    "ModelDetails",
    "PsEntry",
    "TagEntry",
    "encode_ps",
    "encode_pull_progress",
    "encode_show",
    "encode_tags",
    "encode_version",
    "format_parameter_size",
    "model_capabilities",
    "pull_status",
    "with_tag",
]


def format_parameter_size(n_params: int) -> str:
    """Ollama's ``parameter_size``: ``"134.52M"``, ``"7.2B"``, ``"8B"``, ``"500K"``."""
    if n_params >= 1_000_000_000:
        b = n_params / 1e9
        return f"{b:.0f}B" if b == math.floor(b) else f"{b:.1f}B"
    if n_params >= 1_000_000:
        m = n_params / 1e6
        return f"{m:.0f}M" if m == math.floor(m) else f"{m:.2f}M"
    if n_params >= 1000:
        return f"{n_params / 1000:.0f}K"
    return str(n_params)


def with_tag(name: str) -> str:
    """``name:latest`` when the name carries no tag (Ollama always shows one)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _hex_digest(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _line(doc: Any) -> bytes:
    return msgspec.json.encode(doc) + b"\n"


def encode_version(version: str) -> bytes:
    return _line({"version": version})


# ---------------------------------------------------------------------------
# Listings: tags, ps, show
# ---------------------------------------------------------------------------


class ModelDetails(msgspec.Struct, frozen=True, kw_only=True):
    parent_model: str = ""
    format: str = "gguf"
    family: str = ""
    families: list[str] = []
    parameter_size: str = ""
    quantization_level: str = ""


class TagEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """As installed; ``:latest`` is appended in the listing when it has no tag."""
    size: int
    digest: str
    """Hex sha256, with or without ``sha256:``."""
    modified_at: float
    """Unix time."""
    details: ModelDetails = ModelDetails()
    engine: str | None = None
    capabilities: list[str] = []
    extras: dict[str, Any] = {}


class PsEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    size: int
    digest: str
    details: ModelDetails = ModelDetails()
    expires_at: float | None = None
    """Unix time the model unloads; None = kept loaded forever."""
    size_vram: int = 0
    context_length: int = 0
    engine: str = ""
    slots: int = 0
    in_flight: int = 0
    extras: dict[str, Any] = {}
    """More Blazar fields (``blazar_spec``, ``blazar_sleeping``…), appended as given."""


def encode_tags(models: Sequence[TagEntry]) -> bytes:
    rows = []
    for m in models:
        name = with_tag(m.name)
        row: dict[str, Any] = {
            "name": name,
            "model": name,
            "modified_at": rfc3339(m.modified_at),
            "size": m.size,
            "digest": _hex_digest(m.digest),
            "details": msgspec.to_builtins(m.details),
        }
        if m.capabilities:
            row["capabilities"] = list(m.capabilities)
        if m.engine is not None:
            row["engine"] = m.engine
        row.update(m.extras)
        rows.append(row)
    return _line({"models": rows})


def encode_ps(entries: Sequence[PsEntry]) -> bytes:
    rows = []
    for e in entries:
        name = with_tag(e.name)
        row: dict[str, Any] = {
            "name": name,
            "model": name,
            "size": e.size,
            "digest": _hex_digest(e.digest),
            "details": msgspec.to_builtins(e.details),
            "expires_at": FOREVER_RFC3339 if e.expires_at is None else rfc3339(e.expires_at),
            "size_vram": e.size_vram,
            "context_length": e.context_length,
            "engine": e.engine,
            "slots": e.slots,
            "in_flight": e.in_flight,
        }
        row.update(e.extras)
        rows.append(row)
    return _line({"models": rows})


def model_capabilities(
    *,
    embedding: bool = False,
    rerank: bool = False,
    tools: bool = False,
    insert: bool = False,
    vision: bool = False,
    thinking: bool = False,
) -> list[str]:
    """Ollama's capability list: ``embedding`` models only embed and rerankers only rank (each
    its one capability, as Ollama lists an embedding model's); others complete."""
    if embedding or rerank:
        return ["embedding"] if embedding else ["rerank"]
    caps = ["completion"]
    caps += [
        name
        for name, on in (("tools", tools), ("insert", insert), ("vision", vision), ("thinking", thinking))
        if on
    ]
    return caps


def encode_show(
    *,
    modelfile: str,
    parameters: str,
    template: str,
    details: ModelDetails,
    model_info: dict[str, Any],
    capabilities: Sequence[str],
    modified_at: float,
    system: str = "",
    license: str = "",
    projector_info: dict[str, Any] | None = None,
    extras: dict[str, Any] | None = None,
) -> bytes:
    """``POST /api/show``. ``model_info`` holds GGUF keys (``general.architecture``,
    ``llama.context_length``…); it is always sent (the Python client requires it)."""
    doc: dict[str, Any] = {}
    if license:
        doc["license"] = license
    doc["modelfile"] = modelfile
    if parameters:
        doc["parameters"] = parameters
    if template:
        doc["template"] = template
    if system:
        doc["system"] = system
    doc["details"] = msgspec.to_builtins(details)
    doc["model_info"] = model_info
    if projector_info:
        doc["projector_info"] = projector_info
    doc["capabilities"] = list(capabilities)
    doc["modified_at"] = rfc3339(modified_at)
    doc.update(extras or {})
    return _line(doc)


# ---------------------------------------------------------------------------
# Pull progress
# ---------------------------------------------------------------------------

_PULL_STATUSES = {
    "resolving": "pulling manifest",
    "verifying": "verifying sha256 digest",
    "importing": "writing manifest",
    "writing": "writing manifest",
    "done": "success",
    "success": "success",
}


def pull_status(status: str, digest: str | None) -> str:
    """Ollama's status text for a generic pull status (``registry.pull.PullProgress.status``).

    ``downloading`` becomes ``pulling <first 12 hex of the digest>`` (``pulling model``
    without a digest); statuses Ollama has no word for pass through unchanged.
    """
    if status in ("downloading", "pulling"):
        return f"pulling {_hex_digest(digest)[:12]}" if digest else "pulling model"
    return _PULL_STATUSES.get(status, status)


def encode_pull_progress(
    status: str,
    *,
    digest: str | None = None,
    total: int | None = None,
    completed: int | None = None,
) -> bytes:
    """One NDJSON line of ``/api/pull``. ``status`` is already Ollama's (see ``pull_status``)."""
    doc: dict[str, Any] = {"status": status}
    if digest:
        doc["digest"] = "sha256:" + _hex_digest(digest)
    if total is not None:
        doc["total"] = total
    if completed is not None:
        doc["completed"] = completed
    return _line(doc)
