"""The OpenAI dialect: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Requests are validated into wire structs (unknown fields ignored, wrong types
rejected with the field's path) and then relayed as the caller's own bytes;
llama.cpp speaks this dialect natively.
"""

from __future__ import annotations

import base64
import struct
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from blazar.dialects import params
from blazar.dialects._wire import OutOfRange, decode_json
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    CompletionRequest,
    DecodeError,
    Delta,
    EmbedRequest,
    EmbedResponse,
    FinishReason,
    Message,
    ResponseFormat,
    ToolCall,
    ToolChoice,
    ToolSpec,
    Usage,
)
from blazar.dialects.thinking import level as effort_level
from blazar.errors import Dialect, error_body

__all__ = [
    "ChatStreamEncoder",
    "decode_chat_request",
    "decode_completion_request",
    "decode_embeddings_request",
    "embedding_inputs",
    "encode_chat_response",
    "encode_embeddings",
    "encode_error",
    "encode_model",
    "encode_model_list",
    "encode_stream_error",
    "merge_error_code",
    "wording",
]


_ROLES = {"system", "developer", "user", "assistant", "tool"}


class _StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _WireMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


# OpenAI's ranges, checked while decoding (the relayed path decodes too, so the
# engine never sees a value OpenAI would refuse).
_Temperature = Annotated[float, Meta(ge=0, le=2)]
_TopP = Annotated[float, Meta(ge=0, le=1)]
_Penalty = Annotated[float, Meta(ge=-2, le=2)]
_N = Annotated[int, Meta(ge=1, le=8)]
_MaxTokens = Annotated[int, Meta(ge=1)]
_TopLogprobs = Annotated[int, Meta(ge=0, le=20)]


class _ChatBody(msgspec.Struct, kw_only=True):
    model: str
    messages: list[_WireMessage]
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    max_tokens: _MaxTokens | None = None
    max_completion_tokens: _MaxTokens | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    n: _N | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logprobs: bool | None = None
    top_logprobs: _TopLogprobs | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    user: str | None = None
    # Read only to be named when they have no effect (blazar.dialects.params).
    modalities: Any = None
    audio: Any = None
    web_search_options: Any = None
    safety_identifier: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    prediction: Any = None
    verbosity: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    functions: Any = None
    function_call: Any = None


class _CompletionBody(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | list[Any]
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    max_tokens: _MaxTokens | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    n: _N | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: Any = None
    user: Any = None


def wording(r: OutOfRange) -> str:
    """OpenAI's own message for a number out of range (clients match on it)."""
    kind = "integer" if r.integer else "decimal"
    side = "above maximum" if r.above else "below minimum"
    return f"Invalid '{r.path}': {kind} {side} value. Expected a value {r.limit}, but got {r.value} instead."


def _check_model(model: str) -> None:
    if not model.strip():
        raise DecodeError("field `model` is empty: name an installed model (see `blazar list`)")


def decode_chat_request(body: bytes) -> ChatRequest:
    wire: _ChatBody = decode_json(body, _ChatBody, wording)
    ignored = params.OPENAI_CHAT.screen(wire)
    if wire.store is True and "metadata" in ignored:
        ignored.remove("metadata")  # kept with the stored completion
    max_tokens = wire.max_completion_tokens if wire.max_completion_tokens is not None else wire.max_tokens
    _check_model(wire.model)
    think, think_level = (
        effort_level(wire.reasoning_effort, "reasoning_effort")
        if wire.reasoning_effort is not None
        else (None, None)
    )
    if not wire.messages:
        raise DecodeError("field `messages` is empty: send at least one message")
    for i, msg in enumerate(wire.messages):
        if msg.role not in _ROLES:
            raise DecodeError(
                f"invalid field `messages[{i}].role`: {msg.role!r} is not one of {', '.join(sorted(_ROLES))}"
            )
    return ChatRequest(
        model=wire.model,
        messages=[_message(i, m) for i, m in enumerate(wire.messages)],
        stream=bool(wire.stream),
        max_tokens=max_tokens,
        temperature=wire.temperature,
        top_p=wire.top_p,
        seed=wire.seed,
        stop=[wire.stop] if isinstance(wire.stop, str) else list(wire.stop or []),
        presence_penalty=wire.presence_penalty,
        frequency_penalty=wire.frequency_penalty,
        tools=[_tool(i, t) for i, t in enumerate(wire.tools or [])],
        tool_choice=_tool_choice(wire.tool_choice),
        response_format=_response_format(wire.response_format),
        think=think,
        think_level=think_level,
        think_param="reasoning_effort",
        include_usage=bool(wire.stream_options and wire.stream_options.include_usage),
        ignored=ignored,
        output_param="max_completion_tokens" if wire.max_completion_tokens is not None else "max_tokens",
    )


def _text_and_images(i: int, content: str | list[dict[str, Any]] | None) -> tuple[str, list[str]]:
    if content is None or isinstance(content, str):
        return content or "", []
    texts: list[str] = []
    images: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            images.append(url.split(",", 1)[1] if url.startswith("data:") and "," in url else url)
        else:
            raise DecodeError(f"invalid field `messages[{i}].content[{j}].type`: {kind!r} is not supported")
    return "".join(texts), images


def _message(i: int, m: _WireMessage) -> Message:
    text, images = _text_and_images(i, m.content)
    role = "system" if m.role == "developer" else m.role
    calls = []
    for j, call in enumerate(m.tool_calls or []):
        fn = call.get("function") or {}
        if not isinstance(fn.get("name"), str):
            raise DecodeError(f"missing required field `messages[{i}].tool_calls[{j}].function.name`")
        args = fn.get("arguments", "{}")
        calls.append(
            ToolCall(
                id=str(call.get("id") or f"call_{i}_{j}"),
                name=fn["name"],
                arguments=args if isinstance(args, str) else msgspec.json.encode(args).decode(),
            )
        )
    return Message(
        role=role,  # type: ignore[arg-type]
        content=text,
        images=images,
        tool_calls=calls,
        tool_call_id=m.tool_call_id,
        tool_name=m.name if m.role == "tool" else None,
    )


def _tool(i: int, t: dict[str, Any]) -> ToolSpec:
    fn = t.get("function")
    if (
        t.get("type", "function") != "function"
        or not isinstance(fn, dict)
        or not isinstance(fn.get("name"), str)
    ):
        raise DecodeError(
            f"invalid field `tools[{i}]`: expected {{type: function, function: {{name, parameters}}}}"
        )
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return ToolSpec(name=fn["name"], description=fn.get("description"), parameters=params)


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise DecodeError(f"invalid field `tool_choice`: {choice!r} is not auto, none or required")
        return ToolChoice(mode=choice)  # type: ignore[arg-type]
    name = (choice.get("function") or {}).get("name")
    if not isinstance(name, str):
        raise DecodeError("invalid field `tool_choice.function.name`: name the function to call")
    return ToolChoice(mode="function", name=name)


def _response_format(fmt: dict[str, Any] | None) -> ResponseFormat | None:
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise DecodeError("missing required field `response_format.json_schema.schema`")
        return ResponseFormat(kind="json_schema", schema=schema)
    if kind in ("text", "json_object"):
        return ResponseFormat(kind=kind)
    raise DecodeError(
        f"invalid field `response_format.type`: {kind!r} is not text, json_object or json_schema"
    )


def decode_completion_request(body: bytes) -> CompletionRequest:
    wire: _CompletionBody = decode_json(body, _CompletionBody, wording)
    _check_model(wire.model)
    return CompletionRequest(
        model=wire.model,
        prompt=wire.prompt,
        stream=bool(wire.stream),
        max_tokens=wire.max_tokens,
        include_usage=bool(wire.stream_options and wire.stream_options.include_usage),
        ignored=params.OPENAI_COMPLETIONS.screen(wire),
    )


def encode_model(name: str, *, created: int, owned_by: str = "blazar", **extra: Any) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": owned_by, **extra}


def encode_model_list(models: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": models}


def encode_error(code: str, message: str, *, param: str | None = None) -> bytes:
    """The JSON body of an error answer in OpenAI's shape."""
    return msgspec.json.encode(error_body(Dialect.OPENAI, code, message, param=param))


def encode_stream_error(code: str, message: str) -> bytes:
    """The SSE event that ends a failed stream (and no ``[DONE]`` follows)."""
    return b"data: " + msgspec.json.encode(error_body(Dialect.OPENAI, code, message)) + b"\n\n"


def merge_error_code(body: bytes, code: str) -> bytes:
    """Add ``blazar_code`` to an engine's OpenAI-shaped error body, keeping the rest."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        doc["error"].setdefault("blazar_code", code)
        return msgspec.json.encode(doc)
    text = body.decode("utf-8", "replace").strip() or "the engine returned an error"
    return msgspec.json.encode(error_body(Dialect.OPENAI, code, text))


class _EmbeddingsBody(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[Any]
    encoding_format: str | None = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    late_chunking: bool | None = None
    user: str | None = None


_INPUT_SHAPES = "a string, a list of strings, a token array or a list of token arrays"


def embedding_inputs(value: str | list[Any]) -> list[str] | list[list[int]]:
    """OpenAI's ``input``: a string, strings, one token array (ints) or token arrays."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise DecodeError(f"field `input` is empty: send {_INPUT_SHAPES}", param="input")
    if all(isinstance(x, str) for x in value):
        return list(value)
    if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return [list(value)]
    arrays: list[list[int]] = []
    for i, x in enumerate(value):
        if (
            not isinstance(x, list)
            or not x
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in x)
        ):
            raise DecodeError(
                f"invalid field `input[{i}]`: send {_INPUT_SHAPES} (not a mix; no empty token array)",
                param="input",
            )
        arrays.append(x)
    return arrays


def decode_embeddings_request(body: bytes) -> tuple[EmbedRequest, str]:
    """POST /v1/embeddings → the neutral request and the encoding format (float or base64)."""
    wire: _EmbeddingsBody = decode_json(body, _EmbeddingsBody, wording)
    _check_model(wire.model)
    inputs = embedding_inputs(wire.input)
    fmt = wire.encoding_format or "float"
    if fmt not in ("float", "base64"):
        raise DecodeError(f"invalid field `encoding_format`: {fmt!r} is not float or base64")
    ignored = params.OPENAI_EMBEDDINGS.screen(wire)
    req = EmbedRequest(
        model=wire.model,
        inputs=inputs,
        dimensions=wire.dimensions,
        ignored=ignored,
        late_chunking=bool(wire.late_chunking),
    )
    return req, fmt


def encode_embeddings(resp: EmbedResponse, *, encoding_format: str) -> bytes:
    data = []
    for i, vector in enumerate(resp.embeddings):
        if encoding_format == "base64":
            value: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        else:
            value = vector
        data.append({"object": "embedding", "index": i, "embedding": value})
    usage = {"prompt_tokens": resp.prompt_tokens, "total_tokens": resp.prompt_tokens}
    return msgspec.json.encode({"object": "list", "data": data, "model": resp.model, "usage": usage})


def _usage_doc(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _finish(reason: FinishReason | None) -> str | None:
    return "stop" if reason == "stop_sequence" else reason


def encode_chat_response(resp: ChatResponse, *, model: str) -> bytes:
    """A translated (not relayed) answer as a ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": resp.text or None}
    if resp.thinking:
        message["reasoning_content"] = resp.thinking
    if resp.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in resp.tool_calls
        ]
    return msgspec.json.encode(
        {
            "id": resp.id,
            "object": "chat.completion",
            "created": resp.created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": _finish(resp.finish_reason)}],
            "usage": _usage_doc(resp.usage),
        }
    )


class ChatStreamEncoder:
    """Neutral deltas as ``chat.completion.chunk`` SSE events, ending with ``[DONE]``."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._named: set[int] = set()

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        doc = {**self._head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + msgspec.json.encode(doc) + b"\n\n"

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": None})

    def feed(self, delta: Delta) -> bytes:
        out: dict[str, Any] = {}
        if delta.text:
            out["content"] = delta.text
        if delta.thinking:
            out["reasoning_content"] = delta.thinking
        if delta.tool_calls:
            calls = []
            for c in delta.tool_calls:
                call: dict[str, Any] = {"index": c.index, "function": {"arguments": c.arguments}}
                if c.index not in self._named:
                    self._named.add(c.index)
                    call.update(id=c.id or f"call_{c.index}", type="function")
                    call["function"]["name"] = c.name or ""
                calls.append(call)
            out["tool_calls"] = calls
        return self._chunk(out) if out else b""

    def finish(self, final: Delta) -> bytes:
        body = self.feed(final) + self._chunk({}, _finish(final.finish_reason) or "stop")
        if self._include_usage:
            doc = {**self._head, "choices": [], "usage": _usage_doc(final.usage or Usage())}
            body += b"data: " + msgspec.json.encode(doc) + b"\n\n"
        return body + b"data: [DONE]\n\n"
