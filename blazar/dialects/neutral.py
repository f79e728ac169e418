"""Dialect-neutral request, response and stream types.

Every dialect decodes its wire request into a ``ChatRequest`` (or the other
requests here) and encodes ``ChatResponse`` / ``Delta`` back into its own
bytes. The engine side (``blazar/dialects/llamacpp.py``) turns a ``ChatRequest``
into the OpenAI-shaped body llama.cpp expects and parses what it answers into
``Delta`` and ``ChatResponse``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ChatRequest",
    "ChatResponse",
    "CompletionRequest",
    "DecodeError",
    "Delta",
    "EmbedRequest",
    "EmbedResponse",
    "FinishReason",
    "Message",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "ResponseFormat",
    "Role",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolSpec",
    "Usage",
]

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence"]


class DecodeError(ValueError):
    """A request body that cannot be decoded; ``message`` names the field, and so does
    ``param`` (its path, e.g. ``top_p``) where one field is to blame."""

    def __init__(self, message: str, *, code: str = "BAD_REQUEST", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    arguments: str
    """The arguments as JSON text (OpenAI's convention; other dialects parse it)."""


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = {}
    """A JSON schema for the arguments object."""


class ToolChoice(msgspec.Struct, frozen=True, kw_only=True):
    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None
    """The function's name when ``mode`` is ``"function"``."""


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["text", "json_object", "json_schema"] = "text"
    schema: dict[str, Any] | None = None


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    role: Role
    content: str = ""
    images: list[str] = []
    """Base64-encoded images (only for models with a vision projector)."""
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    tool_name: str | None = None
    thinking: str | None = None


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    messages: list[Message]
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] = []
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list[ToolSpec] = []
    tool_choice: ToolChoice | None = None
    response_format: ResponseFormat | None = None
    think: bool | None = None
    """Think (True) or not (False) before answering; None: the model's own default
    (``blazar.dialects.thinking`` says what the engine is told)."""
    think_level: str | None = None
    """The effort asked for with ``think``: ``minimal``, ``low``, ``medium``, ``high``,
    ``xhigh`` or ``max``; None: the model's own."""
    think_budget: int | None = None
    """The most tokens the reasoning may take before the engine ends it; None: no limit."""
    think_param: str = "think"
    """The name of the thinking switch in the caller's dialect, for reports."""
    include_usage: bool = True
    num_ctx: int | None = None
    """Per-slot context the caller asks for (restarts the engine at that size)."""
    keep_alive_s: float | None = None
    """Seconds to stay loaded after this request; 0 unloads, negative keeps forever."""
    raw_prompt: str | None = None
    """A prompt sent as-is, without the chat template (Ollama ``generate`` with ``raw``)."""
    suffix: str | None = None
    """Fill in the middle: the text that follows the answer, whose prefix is ``raw_prompt``
    (Ollama ``generate`` with ``suffix``); the engine's ``/infill`` runs it."""
    sampling: dict[str, Any] = {}
    """Further llama.cpp sampler fields, under llama.cpp's names (``mirostat``, ``n_keep``…)."""
    ignored: list[str] = []
    """The request's parameters accepted without effect (``blazar.dialects.params``)."""
    output_param: str = "max_tokens"
    """The name of the output limit in the caller's dialect, for reports."""


class CompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    prompt: str | list[Any]
    stream: bool = False
    max_tokens: int | None = None
    include_usage: bool = False
    ignored: list[str] = []
    output_param: str = "max_tokens"


class EmbedRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    inputs: list[str] | list[list[int]]
    """Texts, or token arrays (OpenAI's ``input`` of token ids), all sent in one engine call."""
    dimensions: int | None = None
    truncate: bool = True
    keep_alive_s: float | None = None
    ignored: list[str] = []
    late_chunking: bool = False
    """``inputs`` are the chunks of one text, embedded together and pooled per chunk."""


class RerankRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None
    """The most results to return (the best ones); None: all."""
    return_documents: bool = True
    keep_alive_s: float | None = None
    ignored: list[str] = []


class RerankResult(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    """The document's place in the request's ``documents``."""
    score: float


class RerankResponse(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    results: list[RerankResult]
    """Best first; ties keep the documents' order."""
    prompt_tokens: int = 0


class EmbedResponse(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    embeddings: list[list[float]]
    prompt_tokens: int = 0


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine reused from its cache (counted in ``prompt_tokens``)."""
    reasoning_tokens: int = 0
    """Output tokens spent thinking (counted in ``completion_tokens``)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    """A fragment of the arguments' JSON text; fragments of one index concatenate."""


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a streamed answer. A final delta carries ``finish_reason``,
    and the engine's last event carries ``usage``."""

    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCallDelta] = []
    finish_reason: FinishReason | None = None
    usage: Usage | None = None


class ChatResponse(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    model: str
    created: int
    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = []
    finish_reason: FinishReason = "stop"
    usage: Usage = Usage()
