"""Dialect-neutral request and response types."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = ["ChatRequest", "CompletionRequest", "DecodeError", "Message", "Usage"]


class DecodeError(ValueError):
    """A request body that cannot be decoded; ``message`` names the field."""

    def __init__(self, message: str, *, code: str = "BAD_REQUEST") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    messages: list[Message]
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    include_usage: bool = False


class CompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    prompt: str | list[Any]
    stream: bool = False
    max_tokens: int | None = None
    include_usage: bool = False
