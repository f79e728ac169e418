"""Model kinds: what a model does, which routes serve it, and the refusal for a wrong one.

A model's kind is in its manifest (``ModelRecord.kind``): ``chat`` and ``embedding``
(and ``rerank``) are GGUF models the text lanes (llama.cpp, mistral.rs, …) run; ``stt``
(whisper) and ``tts`` (piper) are multi-file models only their speech lanes run; ``image``
is a diffusion checkpoint only stable-diffusion.cpp runs. A
request that reaches a model of a kind its route cannot use is refused with
``MODEL_KIND_MISMATCH`` (400), naming the kind and the route that serves it.
"""

from __future__ import annotations

from .errors import ModelKindMismatch
from .store import KINDS, ModelRecord

__all__ = [
    "IMAGE_KINDS",
    "KINDS",
    "SPEECH_KINDS",
    "TEXT_KINDS",
    "describe",
    "kind_of_capabilities",
    "mismatch",
    "require",
]

TEXT_KINDS = frozenset({"chat", "embedding", "rerank"})
"""Kinds a text lane runs (llama.cpp's server serves chat, embeddings and reranking)."""
SPEECH_KINDS = frozenset({"stt", "tts"})
IMAGE_KINDS = frozenset({"image"})
"""Image generation (a diffusion checkpoint, on stable-diffusion.cpp)."""

_WORDS = {
    "chat": "a chat (text generation) model",
    "embedding": "an embedding model",
    "rerank": "a reranker",
    "stt": "a speech-to-text model",
    "tts": "a text-to-speech voice",
    "image": "an image generation model",
    "text": "a text model (chat, embedding or rerank)",
}
ROUTES = {
    "chat": "POST /v1/chat/completions (or /v1/messages, /api/chat)",
    "embedding": "POST /v1/embeddings (or /api/embed)",
    "rerank": "POST /v1/rerank",
    "stt": "POST /v1/audio/transcriptions",
    "tts": "POST /v1/audio/speech",
    "image": "POST /v1/images/generations",
}
"""The route that serves each kind, as refusals name it."""


def describe(kind: str) -> str:
    """``a speech-to-text model`` …, for messages."""
    return _WORDS.get(kind, f"a model of kind {kind!r}")


def kind_of_capabilities(capabilities: list[str]) -> str:
    """The kind a catalog entry's capabilities imply for a GGUF model."""
    if "embedding" in capabilities:
        return "embedding"
    if "rerank" in capabilities:
        return "rerank"
    return "chat"


def mismatch(name: str, kind: str, wanted: str) -> ModelKindMismatch:
    """The refusal for model ``name`` of ``kind`` sent where ``wanted`` (a kind, or ``text``
    for any of ``TEXT_KINDS``) is served."""
    route = ROUTES.get(kind)
    where = f" — send it to {route}" if route else ""
    return ModelKindMismatch(
        name,
        kind,
        f"model '{name}' is {describe(kind)} (kind {kind}) and this route needs {describe(wanted)}{where}",
    )


def require(record: ModelRecord, allowed: frozenset[str], wanted: str) -> None:
    """Raise ``ModelKindMismatch`` unless ``record``'s kind is one of ``allowed``."""
    if record.kind not in allowed:
        raise mismatch(record.name, record.kind, wanted)
