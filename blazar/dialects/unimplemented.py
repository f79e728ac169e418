"""Routes of the dialects' public APIs that Blazar does not serve: pure data.

Such a route answers ``501 NOT_IMPLEMENTED`` with the reason and what to use
instead, never a ``404`` that reads like a typo nor a ``200`` that does nothing.
A prefix covers the route and everything under it (``/v1/assistants`` covers
``/v1/assistants/{id}``); the routes Blazar does serve are never looked up here.
docs/api.md lists the same prefixes; a test keeps the two in step.
"""

from __future__ import annotations

import msgspec

__all__ = ["UNIMPLEMENTED", "Unimplemented", "lookup"]


class Unimplemented(msgspec.Struct, frozen=True):
    prefix: str
    dialect: str
    reason: str
    """Why, and what to use instead."""


_PLANNED = "not served yet: a later release adds it"
_LOCAL = "nothing leaves this machine"

UNIMPLEMENTED: tuple[Unimplemented, ...] = (
    # OpenAI
    Unimplemented(
        "/v1/audio",
        "openai",
        "only /v1/audio/transcriptions, /translations, /speech and /voices are served",
    ),
    Unimplemented(
        "/v1/images",
        "openai",
        "only /v1/images/generations, /edits, /variations, /upscale and /files/{file_id} are served",
    ),
    Unimplemented(
        "/v1/assistants",
        "openai",
        "the Assistants API is not served (OpenAI retires it): use `/v1/responses` with `conversation`",
    ),
    Unimplemented(
        "/v1/threads",
        "openai",
        "threads belong to the Assistants API: use `/v1/conversations` and `/v1/responses`",
    ),
    Unimplemented(
        "/v1/vector_stores",
        "openai",
        "no hosted file search: embed with `/v1/embeddings` and search your own store",
    ),
    Unimplemented(
        "/v1/fine_tuning",
        "openai",
        "no training here: fine-tune elsewhere, then `blazar import` the GGUF file",
    ),
    Unimplemented(
        "/v1/moderations", "openai", "no moderation model is served: ask a chat model to classify the text"
    ),
    Unimplemented(
        "/v1/uploads", "openai", "multipart uploads are not served: upload a whole file with `POST /v1/files`"
    ),
    Unimplemented("/v1/evals", "openai", "evals are not served: run them against `/v1/chat/completions`"),
    Unimplemented("/v1/containers", "openai", "no code-execution containers here"),
    Unimplemented(
        "/v1/videos",
        "openai",
        "only POST /v1/videos, GET /v1/videos, /v1/videos/{video_id} and its /content are served",
    ),
    Unimplemented("/v1/chatkit", "openai", "ChatKit sessions are not served: use `/v1/responses`"),
    Unimplemented(
        "/v1/organization", "openai", "there is no organization: keys and usage are `blazar` commands"
    ),
    Unimplemented("/v1/edits", "openai", "removed by OpenAI: use `/v1/chat/completions`"),
    Unimplemented("/v1/engines", "openai", "removed by OpenAI: use `/v1/models`"),
    # Anthropic
    Unimplemented(
        "/v1/complete", "anthropic", "the legacy Text Completions API is not served: use `/v1/messages`"
    ),
    Unimplemented("/v1/skills", "anthropic", "Agent Skills are not served"),
    Unimplemented(
        "/v1/organizations", "anthropic", "there is no organization: keys and usage are `blazar` commands"
    ),
    # Ollama
    Unimplemented("/api/me", "ollama", f"there are no ollama.com accounts here: {_LOCAL}"),
    Unimplemented("/api/signin", "ollama", f"there are no ollama.com accounts here: {_LOCAL}"),
    Unimplemented("/api/signout", "ollama", f"there are no ollama.com accounts here: {_LOCAL}"),
    Unimplemented("/api/web_search", "ollama", f"web search is not available: {_LOCAL}"),
    Unimplemented("/api/web_fetch", "ollama", f"web fetch is not available: {_LOCAL}"),
)


def lookup(path: str) -> Unimplemented | None:
    """The entry covering ``path`` (a route no handler serves), or None."""
    for entry in UNIMPLEMENTED:
        p = entry.prefix
        if path == p or (path.startswith(p) and path[len(p)] == "/"):
            return entry
    return None
