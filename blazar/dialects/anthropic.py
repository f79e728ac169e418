"""The Anthropic dialect: ``/v1/messages`` and ``/v1/messages/count_tokens``.

Requests are validated into wire structs (unknown fields ignored, wrong types
rejected with the field's path) and translated into a neutral ``ChatRequest``.
Answers are rendered from neutral types: a ``Message`` object for plain calls,
and for streams the event sequence the official SDK's accumulator expects::

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta, message_stop

Usage follows Anthropic's convention: ``input_tokens`` excludes the prompt
tokens read from the cache, so ``input_tokens + cache_read_input_tokens +
cache_creation_input_tokens`` is the whole prompt (the neutral
``Usage.prompt_tokens``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from blazar.dialects import params
from blazar.dialects._wire import OutOfRange, convert, decode_json
from blazar.dialects.jsonstream import complete_prefix
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    DecodeError,
    Delta,
    FinishReason,
    Message,
    ResponseFormat,
    ToolCall,
    ToolChoice,
    ToolSpec,
    Usage,
)
from blazar.errors import Dialect, error_body

__all__ = [
    "MIN_THINKING_BUDGET",
    "SIGNATURE",
    "StreamEncoder",
    "decode_count_tokens_request",
    "decode_messages_request",
    "encode_count_tokens",
    "encode_error",
    "encode_response",
    "message_id_for",
    "neutral_finish",
    "stop_reason",
]

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]

MIN_THINKING_BUDGET = 1024
"""Anthropic's floor for ``thinking.budget_tokens``."""

SIGNATURE = ""
"""The ``signature`` of every thinking block we emit. Anthropic signs thinking so
that it can verify blocks sent back; local models have nothing to sign, and the
SDK only needs the field to be a string. Signatures sent back are ignored."""


# --- wire structs -------------------------------------------------------------


class _WireMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]]


# Anthropic's ranges, checked while decoding.
_MaxTokens = Annotated[int, Meta(ge=1)]
_Unit = Annotated[float, Meta(ge=0, le=1)]
_TopK = Annotated[int, Meta(ge=0)]


class _CountBody(msgspec.Struct, kw_only=True):
    model: str
    messages: list[_WireMessage]
    max_tokens: _MaxTokens | None = None
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: _Unit | None = None
    top_p: _Unit | None = None
    top_k: _TopK | None = None
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    # Read only to be named when they have no effect (blazar.dialects.params).
    metadata: Any = None
    service_tier: Any = None
    container: Any = None
    context_management: Any = None
    mcp_servers: Any = None
    inference_geo: Any = None


class _MessagesBody(_CountBody, kw_only=True):
    max_tokens: _MaxTokens  # required here, optional for count_tokens


class _Text(msgspec.Struct, kw_only=True):
    text: str


class _ImageSource(msgspec.Struct, kw_only=True):
    type: str
    media_type: str | None = None
    data: str | None = None


class _Image(msgspec.Struct, kw_only=True):
    source: _ImageSource


class _ToolUse(msgspec.Struct, kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


class _ToolResult(msgspec.Struct, kw_only=True):
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class _Thinking(msgspec.Struct, kw_only=True):
    thinking: str
    signature: str | None = None


class _Tool(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: str | None = None


class _ToolChoice(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _ThinkingConfig(msgspec.Struct, kw_only=True):
    type: str
    budget_tokens: int | None = None


class _OutputFormat(msgspec.Struct, kw_only=True):
    type: str
    schema: dict[str, Any] | None = None


class _OutputConfig(msgspec.Struct, kw_only=True):
    format: _OutputFormat | None = None
    effort: str | None = None


# --- requests -----------------------------------------------------------------


def _wording(r: OutOfRange) -> str:
    # Anthropic names the field first, then what is wrong with it.
    return f"{r.path}: must be {r.range}, got {r.value}"


def decode_messages_request(body: bytes) -> ChatRequest:
    """``POST /v1/messages`` → neutral request (``max_tokens`` is required)."""
    wire: _MessagesBody = decode_json(body, _MessagesBody, _wording)
    table = params.ANTHROPIC_MESSAGES
    ignored = table.screen(wire) + table.unlisted(params.keys_of(body, table.open))
    return msgspec.structs.replace(_request(wire), ignored=ignored)


def decode_count_tokens_request(body: bytes) -> ChatRequest:
    """``POST /v1/messages/count_tokens`` → neutral request (no ``max_tokens`` needed)."""
    wire: _CountBody = decode_json(body, _CountBody, _wording)
    return _request(wire)


def _request(wire: _CountBody) -> ChatRequest:
    if not wire.model.strip():
        raise DecodeError("field `model` is empty: name an installed model (see `blazar list`)")
    if not wire.messages:
        raise DecodeError("field `messages` is empty: send at least one message")
    tools = [_tool(i, t) for i, t in enumerate(wire.tools or [])]
    messages = _system(wire.system) + _messages(wire.messages)
    return ChatRequest(
        model=wire.model,
        messages=messages,
        stream=bool(wire.stream),
        max_tokens=wire.max_tokens,
        temperature=wire.temperature,
        top_p=wire.top_p,
        top_k=wire.top_k,
        stop=list(wire.stop_sequences or []),
        tools=tools,
        tool_choice=_tool_choice(wire.tool_choice, tools),
        response_format=_response_format(wire.output_config),
        include_usage=True,
        think_param="thinking",
        **_thinking(wire.thinking, wire.output_config, wire.max_tokens),
    )


ATTRIBUTION_PREFIX = "x-anthropic-billing-header:"
"""How Claude Code's first system block starts: a version and hash that change every prompt."""


def _system_text(system: str | list[dict[str, Any]], path: str) -> str:
    if isinstance(system, str):
        return system
    parts = []
    for j, block in enumerate(system):
        kind = block.get("type")
        if kind != "text":
            raise DecodeError(
                f"invalid field `{path}[{j}].type`: {kind!r} is not supported: send text blocks"
            )
        text = convert(block, _Text, f"{path}[{j}]").text
        if text.startswith(ATTRIBUTION_PREFIX):
            # Billing attribution for Anthropic's servers, not words for the model: at the head
            # of the prompt it changed every prompt's prefix, so no prompt reused the cache.
            continue
        parts.append(text)
    return "\n".join(parts)


def _system(system: str | list[dict[str, Any]] | None) -> list[Message]:
    text = _system_text(system, "system") if system is not None else ""
    return [Message(role="system", content=text)] if text else []


_ALLOWED = {
    "user": {"text", "image", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}


def _messages(wire: list[_WireMessage]) -> list[Message]:
    out: list[Message] = []
    tool_names: dict[str, str] = {}
    for i, msg in enumerate(wire):
        if msg.role == "system":
            # A system turn inside the conversation (agents send them between turns):
            # kept in place; the engine side folds it into the user's text where the
            # model's template takes no such turn.
            if text := _system_text(msg.content, f"messages[{i}].content"):
                out.append(Message(role="system", content=text))
            continue
        if msg.role not in _ALLOWED:
            # Anthropic's wording, which clients match on, then where and what to send.
            hint = ": send tool results as tool_result blocks in a user turn" if msg.role == "tool" else ""
            raise DecodeError(
                f'messages: Unexpected role "{msg.role}". Allowed roles are "user", "assistant" '
                f'or "system" (messages[{i}].role){hint}',
                param=f"messages[{i}].role",
            )
        if isinstance(msg.content, str):
            out.append(Message(role=msg.role, content=msg.content))  # type: ignore[arg-type]
            continue
        texts: list[str] = []
        images: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        results: list[Message] = []
        for j, block in enumerate(msg.content):
            path = f"messages[{i}].content[{j}]"
            kind = block.get("type")
            if not isinstance(kind, str):
                raise DecodeError(f"missing required field `{path}.type`")
            if kind not in _ALLOWED[msg.role]:
                if any(kind in allowed for allowed in _ALLOWED.values()):
                    raise DecodeError(
                        f"invalid field `{path}.type`: {kind!r} blocks are not allowed in {msg.role} turns"
                    )
                raise DecodeError(f"invalid field `{path}.type`: {kind!r} blocks are not supported")
            match kind:
                case "text":
                    texts.append(convert(block, _Text, path).text)
                case "image":
                    images.append(_image(block, path))
                case "thinking":
                    thinking.append(convert(block, _Thinking, path).thinking)
                case "redacted_thinking":
                    pass  # encrypted by Anthropic: nothing a local model can read
                case "tool_use":
                    use = convert(block, _ToolUse, path)
                    tool_names[use.id] = use.name
                    calls.append(
                        ToolCall(id=use.id, name=use.name, arguments=msgspec.json.encode(use.input).decode())
                    )
                case "tool_result":
                    result = convert(block, _ToolResult, path)
                    text, result_images = _result_content(result.content, f"{path}.content")
                    if result.is_error:
                        text = f"Error: {text}"
                    results.append(
                        Message(
                            role="tool",
                            content=text,
                            images=result_images,
                            tool_call_id=result.tool_use_id,
                            tool_name=tool_names.get(result.tool_use_id),
                        )
                    )
        out.extend(results)
        if not results or texts or images:
            out.append(
                Message(
                    role=msg.role,  # type: ignore[arg-type]
                    content="\n".join(texts),
                    images=images,
                    tool_calls=calls,
                    thinking="".join(thinking) if thinking else None,
                )
            )
    return out


def _image(block: dict[str, Any], path: str) -> str:
    source = convert(block, _Image, path).source
    if source.type != "base64":
        raise DecodeError(
            f"invalid field `{path}.source.type`: {source.type!r} is not supported: send the image as base64"
        )
    if not source.data:
        raise DecodeError(f"missing required field `{path}.source.data`")
    return source.data


def _result_content(content: str | list[dict[str, Any]] | None, path: str) -> tuple[str, list[str]]:
    if content is None or isinstance(content, str):
        return content or "", []
    texts: list[str] = []
    images: list[str] = []
    for k, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            texts.append(convert(block, _Text, f"{path}[{k}]").text)
        elif kind == "image":
            images.append(_image(block, f"{path}[{k}]"))
        else:
            raise DecodeError(
                f"invalid field `{path}[{k}].type`: {kind!r} is not supported: send text or image"
            )
    return "\n".join(texts), images


def _tool(i: int, raw: dict[str, Any]) -> ToolSpec:
    kind = raw.get("type")
    if kind not in (None, "custom"):
        raise DecodeError(
            f"invalid field `tools[{i}].type`: server tool {kind!r} is not supported: "
            "declare custom tools with name, description and input_schema"
        )
    tool = convert(raw, _Tool, f"tools[{i}]")
    if not tool.name:
        raise DecodeError(f"invalid field `tools[{i}].name`: the name is empty")
    return ToolSpec(name=tool.name, description=tool.description, parameters=tool.input_schema)


def _tool_choice(raw: dict[str, Any] | None, tools: list[ToolSpec]) -> ToolChoice | None:
    if raw is None:
        return None
    choice = convert(raw, _ToolChoice, "tool_choice")
    match choice.type:
        case "auto":
            return ToolChoice(mode="auto")
        case "any":
            return ToolChoice(mode="required")
        case "none":
            return ToolChoice(mode="none")
        case "tool":
            if not choice.name:
                raise DecodeError("missing required field `tool_choice.name`: name the tool to call")
            if choice.name not in {t.name for t in tools}:
                raise DecodeError(
                    f"invalid field `tool_choice.name`: no tool named {choice.name!r} in `tools`"
                )
            return ToolChoice(mode="function", name=choice.name)
    raise DecodeError(f"invalid field `tool_choice.type`: {choice.type!r} is not auto, any, tool or none")


def _thinking(
    raw: dict[str, Any] | None, output: dict[str, Any] | None, max_tokens: int | None
) -> dict[str, Any]:
    """The request's ``think`` fields: ``thinking`` switches it, its ``budget_tokens`` caps
    it, and ``output_config.effort`` sets the level of thinking that is on."""
    effort = convert(output, _OutputConfig, "output_config").effort if output is not None else None
    think = _think(raw, max_tokens)
    out: dict[str, Any] = {"think": think}
    if think and isinstance(raw, dict):
        out["think_budget"] = raw.get("budget_tokens") if raw.get("type") == "enabled" else None
    if effort is not None:
        if effort not in ("low", "medium", "high", "xhigh", "max"):
            raise DecodeError(
                f"invalid field `output_config.effort`: {effort!r} is not low, medium, high, xhigh or max"
            )
        if think:
            out["think_level"] = effort
    return out


def _think(raw: dict[str, Any] | None, max_tokens: int | None) -> bool | None:
    if raw is None:
        return None
    config = convert(raw, _ThinkingConfig, "thinking")
    match config.type:
        case "disabled":
            return False
        case "adaptive":
            return True
        case "enabled":
            budget = config.budget_tokens
            if budget is None:
                raise DecodeError("missing required field `thinking.budget_tokens`")
            if budget < MIN_THINKING_BUDGET:
                raise DecodeError(
                    f"invalid field `thinking.budget_tokens`: must be at least "
                    f"{MIN_THINKING_BUDGET}, got {budget}"
                )
            if max_tokens is not None and budget >= max_tokens:
                raise DecodeError(
                    f"invalid field `thinking.budget_tokens`: {budget} must be less than "
                    f"`max_tokens` ({max_tokens}): raise max_tokens or lower the budget"
                )
            return True
    raise DecodeError(f"invalid field `thinking.type`: {config.type!r} is not enabled, disabled or adaptive")


def _response_format(raw: dict[str, Any] | None) -> ResponseFormat | None:
    if raw is None:
        return None
    fmt = convert(raw, _OutputConfig, "output_config").format
    if fmt is None:
        return None
    if fmt.type != "json_schema":
        raise DecodeError(f"invalid field `output_config.format.type`: {fmt.type!r} is not json_schema")
    if fmt.schema is None:
        raise DecodeError("missing required field `output_config.format.schema`")
    return ResponseFormat(kind="json_schema", schema=fmt.schema)


# --- responses ----------------------------------------------------------------

_TO_STOP: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
}
_TO_NEUTRAL: dict[str, FinishReason] = {
    "end_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "stop_sequence": "stop_sequence",
    "model_context_window_exceeded": "length",
}


def stop_reason(finish: FinishReason | None, *, used_tools: bool = False) -> StopReason:
    """Neutral finish reason → Anthropic ``stop_reason``.

    A turn that called tools ends with ``tool_use`` even when the engine said
    ``stop``: agents loop on exactly that value.
    """
    reason = _TO_STOP.get(finish or "stop", "end_turn")
    return "tool_use" if used_tools and reason == "end_turn" else reason


def neutral_finish(reason: str | None) -> FinishReason:
    """Anthropic ``stop_reason`` → neutral finish reason (unknown ones → ``stop``)."""
    return _TO_NEUTRAL.get(reason or "end_turn", "stop")


def message_id_for(raw: str) -> str:
    """An Anthropic-looking ``msg_…`` id derived from an engine's or our own id."""
    if raw.startswith("msg_"):
        return raw
    for prefix in ("chatcmpl-", "cmpl-", "req_", "req-"):
        if raw.startswith(prefix):
            raw = raw[len(prefix) :]
            break
    return f"msg_{raw}"


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0),
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object; arguments cut off by the token cap
    keep what was complete."""
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        try:
            value = msgspec.json.decode(complete_prefix(arguments) or "{}")
        except msgspec.DecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def encode_response(resp: ChatResponse, *, request: ChatRequest, stop_sequence: str | None = None) -> bytes:
    """The non-stream ``Message`` object.

    ``stop_sequence`` is the custom stop sequence that ended the answer, when
    the engine reported which one.
    """
    content: list[dict[str, Any]] = []
    if resp.thinking and request.think:
        content.append({"type": "thinking", "thinking": resp.thinking, "signature": SIGNATURE})
    if resp.text or not resp.tool_calls:
        content.append({"type": "text", "text": resp.text})
    for call in resp.tool_calls:
        content.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call.arguments)}
        )
    reason = stop_reason(resp.finish_reason, used_tools=bool(resp.tool_calls))
    return msgspec.json.encode(
        {
            "id": message_id_for(resp.id),
            "type": "message",
            "role": "assistant",
            "model": resp.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
            "usage": _usage(resp.usage),
        }
    )


def encode_count_tokens(input_tokens: int) -> bytes:
    return msgspec.json.encode({"input_tokens": input_tokens})


def encode_error(code: str, message: str) -> bytes:
    """The JSON body of an error answer in Anthropic's shape."""
    return msgspec.json.encode(error_body(Dialect.ANTHROPIC, code, message))


# --- streams ------------------------------------------------------------------


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"


def _complete_json(text: str) -> bool:
    try:
        msgspec.json.decode(text)
    except msgspec.DecodeError:
        return False
    return True


class _ToolState:
    __slots__ = ("args", "block", "closed", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.args = ""
        self.block: int | None = None
        """The content block index, once the block is open."""
        self.closed = False


class StreamEncoder:
    """Renders one streamed answer as Anthropic SSE events.

    Call ``start()`` once, ``feed()`` for each neutral ``Delta``, then either
    ``finish()`` or ``error()``. Content blocks are numbered from 0 in the order
    they open; only one is open at a time, and a change of kind (thinking,
    text, a tool call) closes the open one.

    Tool calls stream one block at a time. When the engine interleaves the
    argument fragments of several calls, the later calls are held back until
    the open call's arguments form complete JSON (or the stream ends) and are
    then sent as one ``input_json_delta`` followed by their live fragments.
    """

    def __init__(self, *, message_id: str, model: str, request: ChatRequest) -> None:
        self._id = message_id_for(message_id)
        self._model = model
        self._think = bool(request.think)
        self._started = False
        self._finished = False
        self._next_block = 0
        self._open: tuple[str, int] | None = None
        """(kind, block index) of the open block; kind is thinking, text or tool."""
        self._tools: dict[int, _ToolState] = {}
        self._order: list[int] = []
        self._usage: Usage | None = None

    # public API

    def start(self, prompt: Usage | None = None) -> bytes:
        """``message_start`` and a ping. ``prompt`` (its ``prompt_tokens`` and
        ``cached_tokens``) is the prompt's size when the engine has said it: clients
        read the input tokens from this event, before the answer ends."""
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(prompt or Usage()),
        }
        return _event("message_start", {"type": "message_start", "message": message}) + self.ping()

    def ping(self) -> bytes:
        """A keep-alive event, which clients skip; nothing before the stream's head."""
        return _event("ping", {"type": "ping"}) if self._started else b""

    def feed(self, delta: Delta) -> bytes:
        """Events for one delta (its ``finish_reason`` is for ``finish()``;
        its ``usage`` is remembered for ``finish()``)."""
        if self._finished:
            raise RuntimeError("feed() after finish() or error()")
        out = [self.start()]
        if delta.usage is not None:
            self._usage = delta.usage
        if delta.thinking and self._think:
            out.append(self._into("thinking"))
            out.append(self._delta({"type": "thinking_delta", "thinking": delta.thinking}))
        if delta.text:
            out.append(self._into("text"))
            out.append(self._delta({"type": "text_delta", "text": delta.text}))
        for tc in delta.tool_calls:
            out.append(self._tool_fragment(tc.index, tc.id, tc.name, tc.arguments))
        return b"".join(out)

    def finish(
        self, finish_reason: FinishReason | None, usage: Usage | None = None, stop_sequence: str | None = None
    ) -> bytes:
        if self._finished:
            raise RuntimeError("finish() after finish() or error()")
        out = [self.start(), self._close(), self._flush_tools()]
        if self._next_block == 0:
            # An empty answer still has one (empty) text block, as the non-stream form does.
            out.append(self._into("text"))
            out.append(self._close())
        self._finished = True
        usage = usage or self._usage
        reason = stop_reason(finish_reason, used_tools=bool(self._tools))
        delta_usage: dict[str, int] = _usage(usage) if usage is not None else {"output_tokens": 0}
        out.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": reason,
                        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
                    },
                    "usage": delta_usage,
                },
            )
        )
        out.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error(self, code: str, message: str) -> bytes:
        """The ``error`` event that ends a failed stream (nothing follows it)."""
        self._finished = True
        return _event("error", error_body(Dialect.ANTHROPIC, code, message))

    # blocks

    def _delta(self, delta: dict[str, Any]) -> bytes:
        assert self._open is not None
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": self._open[1], "delta": delta}
        )

    def _into(self, kind: Literal["thinking", "text"]) -> bytes:
        """Make a ``kind`` block the open one, closing whatever else is open."""
        if self._open is not None and self._open[0] == kind:
            return b""
        out = self._close() + self._flush_tools()
        block: dict[str, Any] = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        return out + self._start_block(kind, block)

    def _start_block(self, kind: str, block: dict[str, Any]) -> bytes:
        index = self._next_block
        self._next_block += 1
        self._open = (kind, index)
        return _event(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
        )

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        kind, index = self._open
        out = b""
        if kind == "thinking":
            out = self._delta({"type": "signature_delta", "signature": SIGNATURE})
        elif kind == "tool":
            for state in self._tools.values():
                if state.block == index:
                    state.closed = True
        self._open = None
        return out + _event("content_block_stop", {"type": "content_block_stop", "index": index})

    # tool calls

    def _tool_fragment(self, index: int, call_id: str | None, name: str | None, args: str) -> bytes:
        state = self._tools.get(index)
        if state is None:
            state = self._tools[index] = _ToolState()
            self._order.append(index)
        if call_id and not state.id:
            state.id = call_id
        if name and not state.name:
            state.name = name
        if state.closed:
            return b""  # its block is closed: only trailing bytes after complete JSON can land here
        if state.block is not None:
            state.args += args
            out = self._delta({"type": "input_json_delta", "partial_json": args}) if args else b""
            return out + self._advance_tools()
        state.args += args
        return self._advance_tools()

    def _open_tool(self, index: int, state: _ToolState) -> bytes:
        out = self._start_block(
            "tool",
            {
                "type": "tool_use",
                "id": state.id or f"toolu_{self._id.removeprefix('msg_')}_{index}",
                "name": state.name or "",
                "input": {},
            },
        )
        state.block = self._next_block - 1
        if state.args:
            out += self._delta({"type": "input_json_delta", "partial_json": state.args})
        return out

    def _pending(self) -> list[tuple[int, _ToolState]]:
        return [(i, self._tools[i]) for i in self._order if self._tools[i].block is None]

    def _advance_tools(self) -> bytes:
        """Open the next held-back tool call when the open block allows it."""
        out = b""
        while True:
            pending = [(i, s) for i, s in self._pending() if s.name]
            if not pending:
                return out
            if self._open is not None and self._open[0] == "tool":
                open_state = next(s for s in self._tools.values() if s.block == self._open[1])
                if not _complete_json(open_state.args):
                    return out
            out += self._close()
            index, state = pending[0]
            out += self._open_tool(index, state)

    def _flush_tools(self) -> bytes:
        """Close the open tool call and send every held-back one, in order."""
        if self._open is not None and self._open[0] != "tool":
            return b""
        out = self._close()
        for index, state in self._pending():
            out += self._open_tool(index, state) + self._close()
        return out
