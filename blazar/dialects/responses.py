"""The OpenAI Responses dialect: ``/v1/responses`` requests, Response objects, input items.

A request's ``input`` (a string or a list of items) and the items of the responses
it continues become neutral messages; the model's answer becomes output items
(``reasoning``, ``message``, ``function_call``). ``OutputBuilder`` in
``responses_stream`` builds those items from neutral deltas, for the whole answer
and for the event stream alike, so both carry the same output.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from blazar.dialects import params
from blazar.dialects._wire import decode_json
from blazar.dialects.neutral import (
    ChatRequest,
    DecodeError,
    Message,
    ResponseFormat,
    Role,
    ToolCall,
    ToolChoice,
    ToolSpec,
    Usage,
)
from blazar.dialects.openai import wording
from blazar.dialects.thinking import level as effort_level

__all__ = [
    "INCLUDABLE",
    "ResponsesRequest",
    "chat_request",
    "decode_request",
    "encode_deleted",
    "encode_input_tokens",
    "encode_response",
    "item_page",
    "new_id",
    "sampled",
    "split_name",
    "usage_doc",
]

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]

INCLUDABLE = frozenset(
    {
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
        "message.input_image.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
    }
)
"""What OpenAI accepts in ``include``. None of it can be produced here (no encrypted
reasoning, no logprobs in this dialect yet, no built-in tools); the spec lets a
server leave out what it cannot give, and the gateway names each one in
``X-Blazar-Ignored`` (strict mode refuses it)."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


_Temperature = Annotated[float, Meta(ge=0, le=2)]
_TopP = Annotated[float, Meta(ge=0, le=1)]
_MaxOutput = Annotated[int, Meta(ge=1)]
_MetadataKey = Annotated[str, Meta(max_length=64)]
_MetadataValue = Annotated[str, Meta(max_length=512)]


class _Reasoning(msgspec.Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class _Text(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class _Body(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: _Text | None = None
    reasoning: _Reasoning | None = None
    max_output_tokens: _MaxOutput | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    seed: int | None = None
    """Not in OpenAI's reference; llama.cpp honours it, and tests rely on it."""
    metadata: dict[_MetadataKey, _MetadataValue] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    stream: bool | None = None
    include: list[str] | None = None
    truncation: str | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    max_tool_calls: Annotated[int, Meta(ge=0)] | None = None
    user: str | None = None
    # Read only to be named when they have no effect (blazar.dialects.params).
    safety_identifier: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    stream_options: Any = None
    prompt: Any = None


class ResponsesRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded ``POST /v1/responses``: the neutral parts, and what the Response echoes."""

    model: str
    items: list[dict[str, Any]]
    """This turn's input items in their stored form (each with an ``id``)."""
    instructions: str | None = None
    tools: list[ToolSpec] = []
    namespaces: frozenset[str] = frozenset()
    """Names of the ``namespace`` tools; their functions are offered as ``NAMESPACE.NAME``."""
    tool_choice: ToolChoice | None = None
    response_format: ResponseFormat | None = None
    think: bool | None = None
    think_level: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    store: bool = True
    previous_response_id: str | None = None
    conversation: str | None = None
    background: bool = False
    stream: bool = False
    ignored: list[str] = []
    """Parameters accepted but not honoured, named for ``X-Blazar-Ignored``."""
    echo: dict[str, Any] = {}
    """The request fields a Response object repeats (tools, tool_choice, text, …)."""


def decode_request(body: bytes) -> ResponsesRequest:
    wire: _Body = decode_json(body, _Body, wording)
    if not wire.model.strip():
        raise DecodeError(
            "field `model` is empty: name an installed model (see `blazar list`)", param="model"
        )
    if wire.metadata is not None and len(wire.metadata) > 16:
        raise DecodeError("invalid field `metadata`: at most 16 keys", param="metadata")
    store = wire.store is not False
    background = bool(wire.background)
    if background and not store:
        raise DecodeError("background responses must be stored: drop `store: false`", param="background")
    if wire.previous_response_id is not None and wire.conversation is not None:
        raise DecodeError(
            "`previous_response_id` and `conversation` cannot be used together: pick one",
            param="conversation",
        )
    conversation = wire.conversation
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
        if not isinstance(conversation, str):
            raise DecodeError("invalid field `conversation.id`: name a conversation", param="conversation")
    tools = [spec for i, t in enumerate(wire.tools or []) for spec in _tools(i, t)]
    namespaces = frozenset(t["name"] for t in wire.tools or [] if t.get("type") == "namespace")
    ignored = _ignored(wire)
    text_format = _format((wire.text.format if wire.text else None) or {"type": "text"})
    items = _items(wire.input)
    if not items and wire.previous_response_id is None and conversation is None:
        raise DecodeError("field `input` is empty: send a string or at least one item", param="input")
    think, think_level = _think(wire.reasoning)
    echo: dict[str, Any] = {
        "instructions": wire.instructions,
        "tools": [_echo_tool(t) if t.get("type") == "function" else t for t in wire.tools or []],
        "tool_choice": wire.tool_choice if wire.tool_choice is not None else "auto",
        "parallel_tool_calls": wire.parallel_tool_calls is not False,
        "text": {"format": _echo_format((wire.text.format if wire.text else None) or {"type": "text"})},
        "reasoning": {"effort": wire.reasoning.effort, "summary": wire.reasoning.summary}
        if wire.reasoning
        else {"effort": None, "summary": None},
        "max_output_tokens": wire.max_output_tokens,
        "temperature": wire.temperature,
        "top_p": wire.top_p,
        "metadata": wire.metadata or {},
        "store": store,
        "background": background,
        "previous_response_id": wire.previous_response_id,
        "truncation": wire.truncation or "disabled",
        "user": wire.user,
        # Required by OpenAI's reference and Open Responses: what ran, or the field's neutral value.
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": wire.top_logprobs or 0,
        "max_tool_calls": wire.max_tool_calls,
        "service_tier": "default",
        "safety_identifier": wire.safety_identifier if isinstance(wire.safety_identifier, str) else None,
        "prompt_cache_key": wire.prompt_cache_key if isinstance(wire.prompt_cache_key, str) else None,
    }
    return ResponsesRequest(
        model=wire.model,
        items=items,
        instructions=wire.instructions,
        tools=tools,
        namespaces=namespaces,
        tool_choice=_tool_choice(wire.tool_choice, tools),
        response_format=text_format,
        think=think,
        think_level=think_level,
        max_output_tokens=wire.max_output_tokens,
        temperature=wire.temperature,
        top_p=wire.top_p,
        seed=wire.seed,
        store=store,
        previous_response_id=wire.previous_response_id,
        conversation=conversation,
        background=background,
        stream=bool(wire.stream),
        ignored=ignored,
        echo=echo,
    )


def _ignored(wire: _Body) -> list[str]:
    out: list[str] = []
    for i, name in enumerate(wire.include or []):
        if name not in INCLUDABLE:
            raise DecodeError(
                f"invalid field `include[{i}]`: {name!r} is not one of {', '.join(sorted(INCLUDABLE))}",
                param=f"include[{i}]",
            )
        out.append(f"include:{name}")
    # ``truncation: auto`` is not done: an overflow is refused, not cut from the front.
    return out + [name for name in params.RESPONSES.screen(wire) if name != "include"]


def _think(reasoning: _Reasoning | None) -> tuple[bool | None, str | None]:
    if reasoning is None or reasoning.effort is None:
        return None, None
    return effort_level(reasoning.effort, "reasoning.effort")


def _tools(i: int, t: dict[str, Any]) -> list[ToolSpec]:
    """A function tool, or the functions of a ``namespace`` tool (named ``NAMESPACE.NAME``:
    a dot cannot be in a function's own name, so the name splits back without doubt)."""
    if t.get("type") != "namespace":
        return [_tool(f"tools[{i}]", t)]
    namespace = t.get("name")
    if not isinstance(namespace, str) or not namespace:
        raise DecodeError(f"missing required field `tools[{i}].name`", param=f"tools[{i}].name")
    inner = t.get("tools")
    if not isinstance(inner, list):
        raise DecodeError(f"invalid field `tools[{i}].tools`: expected a list of function tools")
    specs = [_tool(f"tools[{i}].tools[{j}]", tool) for j, tool in enumerate(inner)]
    return [msgspec.structs.replace(spec, name=f"{namespace}.{spec.name}") for spec in specs]


def split_name(name: str, namespaces: frozenset[str]) -> tuple[str | None, str]:
    """A called tool's namespace (None for a plain function) and its own name."""
    head, dot, tail = name.partition(".")
    return (head, tail) if dot and head in namespaces else (None, name)


def _tool(where: str, t: dict[str, Any]) -> ToolSpec:
    kind = t.get("type")
    if kind != "function":
        raise DecodeError(
            f"invalid field `{where}.type`: tool type {kind!r} is not supported here — only "
            "`function` and `namespace` tools are (register MCP servers for server-side tools)",
            param=f"{where}.type",
        )
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise DecodeError(f"missing required field `{where}.name`", param=f"{where}.name")
    params = t.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise DecodeError(f"invalid field `{where}.parameters`: expected a JSON schema object")
    return ToolSpec(name=name, description=t.get("description"), parameters=params)


def _echo_tool(t: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": t.get("name"),
        "description": t.get("description"),
        "parameters": t.get("parameters"),
        "strict": t.get("strict", True),
    }


def _echo_format(fmt: dict[str, Any]) -> dict[str, Any]:
    """``text.format`` as a Response repeats it: a JSON schema format with every field the
    reference gives it (``description`` null when not sent, ``strict`` false by default)."""
    if fmt.get("type") != "json_schema":
        return fmt
    return {
        "type": "json_schema",
        "name": fmt.get("name"),
        "description": fmt.get("description"),
        "schema": fmt.get("schema"),
        "strict": fmt.get("strict") is True,
    }


def _tool_choice(choice: str | dict[str, Any] | None, tools: list[ToolSpec]) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise DecodeError(
                f"invalid field `tool_choice`: {choice!r} is not auto, none or required", param="tool_choice"
            )
        return ToolChoice(mode=choice)  # type: ignore[arg-type]
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise DecodeError(
            f"invalid field `tool_choice`: {choice.get('type')!r} is not supported — use auto, none, "
            "required or {type: function, name}",
            param="tool_choice",
        )
    if choice["name"] not in {t.name for t in tools}:
        raise DecodeError(
            f"invalid field `tool_choice.name`: no tool named {choice['name']!r} in `tools`",
            param="tool_choice.name",
        )
    return ToolChoice(mode="function", name=choice["name"])


def _format(fmt: dict[str, Any]) -> ResponseFormat | None:
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(kind="json_object")
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise DecodeError("missing required field `text.format.schema`", param="text.format.schema")
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            raise DecodeError("missing required field `text.format.name`", param="text.format.name")
        return ResponseFormat(kind="json_schema", schema=schema)
    raise DecodeError(
        f"invalid field `text.format.type`: {kind!r} is not text, json_object or json_schema",
        param="text.format.type",
    )


# -- input items --------------------------------------------------------------

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def _items(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """This turn's input in the stored form: every item typed, with an id, its content a list."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    return [_item(i, item) for i, item in enumerate(value)]


def _item(i: int, item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message" if "role" in item else None)
    where = f"input[{i}]"
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise DecodeError(
                f"invalid field `{where}.role`: {role!r} is not one of {', '.join(_ROLES)}",
                param=f"{where}.role",
            )
        content = item.get("content")
        if isinstance(content, str):
            part_type = "output_text" if role == "assistant" else "input_text"
            parts: list[dict[str, Any]] = [{"type": part_type, "text": content}]
        elif isinstance(content, list):
            parts = [_part(f"{where}.content[{j}]", p) for j, p in enumerate(content)]
        else:
            raise DecodeError(f"invalid field `{where}.content`: expected a string or a list of parts")
        return {
            "id": item.get("id") or new_id("msg"),
            "type": "message",
            "role": role,
            "content": parts,
            "status": "completed",
        }
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise DecodeError(f"missing required field `{where}.{key}`", param=f"{where}.{key}")
        call = {
            "id": item.get("id") or new_id("fc"),
            "type": "function_call",
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": item["arguments"],
            "status": "completed",
        }
        if isinstance(item.get("namespace"), str):
            call["namespace"] = item["namespace"]
        return call
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise DecodeError(f"missing required field `{where}.call_id`", param=f"{where}.call_id")
        output = item.get("output")
        if isinstance(output, list):
            output = "".join(_part(f"{where}.output[{j}]", p).get("text", "") for j, p in enumerate(output))
        if not isinstance(output, str):
            raise DecodeError(f"invalid field `{where}.output`: expected a string", param=f"{where}.output")
        return {
            "id": item.get("id") or new_id("fco"),
            "type": "function_call_output",
            "call_id": item["call_id"],
            "output": output,
            "status": "completed",
        }
    if kind == "mcp_call":  # a tool call the gateway ran in an earlier turn
        for key in ("server_label", "name"):
            if not isinstance(item.get(key), str):
                raise DecodeError(f"missing required field `{where}.{key}`", param=f"{where}.{key}")
        return {
            "id": item.get("id") or new_id("mcp"),
            "type": "mcp_call",
            "server_label": item["server_label"],
            "name": item["name"],
            "arguments": item.get("arguments") if isinstance(item.get("arguments"), str) else "{}",
            "output": item.get("output") if isinstance(item.get("output"), str) else None,
            "error": item.get("error"),
            "status": item.get("status") or "completed",
        }
    if kind == "reasoning":
        return {
            "id": item.get("id") or new_id("rs"),
            "type": "reasoning",
            "summary": item.get("summary") or [],
            "content": item.get("content") or [],
        }
    raise DecodeError(
        f"invalid field `{where}.type`: item type {kind!r} is not supported — send message, "
        "function_call, function_call_output, mcp_call or reasoning items",
        param=f"{where}.type",
    )


def _part(where: str, part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise DecodeError(f"missing required field `{where}.text`", param=f"{where}.text")
        return {"type": "output_text" if kind == "output_text" else "input_text", "text": text}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url.startswith("data:"):
            raise DecodeError(
                f"invalid field `{where}.image_url`: send the image inline as a data: URL "
                "(file ids and remote URLs are not fetched)",
                param=f"{where}.image_url",
            )
        return {"type": "input_image", "image_url": url, "detail": part.get("detail", "auto")}
    raise DecodeError(
        f"invalid field `{where}.type`: content part {kind!r} is not supported — send input_text, "
        "output_text or input_image",
        param=f"{where}.type",
    )


def _text_of(parts: list[dict[str, Any]]) -> tuple[str, list[str]]:
    texts = [p["text"] for p in parts if "text" in p]
    images = [p["image_url"].split(",", 1)[-1] for p in parts if p.get("type") == "input_image"]
    return "".join(texts), images


def messages_of(items: list[dict[str, Any]], *, instructions: str | None) -> list[Message]:
    """Stored items (earlier turns, then this one) as neutral chat messages."""
    out: list[Message] = []
    if instructions:
        out.append(Message(role="system", content=instructions))
    names: dict[str, str] = {}
    thinking: list[str] = []

    def take_thinking() -> str | None:
        text = "".join(thinking) or None
        thinking.clear()
        return text

    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            parts = list(item.get("content") or []) + list(item.get("summary") or [])
            thinking.extend(str(p.get("text", "")) for p in parts)
        elif kind == "message":
            text, images = _text_of(item["content"])
            role: Role = "system" if item["role"] == "developer" else item["role"]
            think = take_thinking() if role == "assistant" else None
            out.append(Message(role=role, content=text, images=images, thinking=think))
        elif kind == "function_call":
            name = f"{item['namespace']}.{item['name']}" if item.get("namespace") else item["name"]
            names[item["call_id"]] = name
            call = ToolCall(id=item["call_id"], name=name, arguments=item["arguments"])
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = msgspec.structs.replace(last, tool_calls=[*last.tool_calls, call])
            else:
                out.append(Message(role="assistant", tool_calls=[call], thinking=take_thinking()))
        elif kind == "mcp_call":
            call = ToolCall(
                id=item["id"],
                name=f"mcp__{item['server_label']}__{item['name']}",
                arguments=item["arguments"],
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = msgspec.structs.replace(last, tool_calls=[*last.tool_calls, call])
            else:
                out.append(Message(role="assistant", tool_calls=[call], thinking=take_thinking()))
            error = item.get("error")
            result = item.get("output") or ""
            if error is not None:
                said = error.get("message") or error.get("content") if isinstance(error, dict) else error
                result = f"error: {said if isinstance(said, str) else msgspec.json.encode(said).decode()}"
            out.append(Message(role="tool", content=result, tool_call_id=call.id, tool_name=call.name))
        elif kind == "function_call_output":
            out.append(
                Message(
                    role="tool",
                    content=item["output"],
                    tool_call_id=item["call_id"],
                    tool_name=names.get(item["call_id"]),
                )
            )
    return out


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatRequest:
    """The neutral chat request for ``req``, after the ``history`` it continues."""
    messages = messages_of([*history, *req.items], instructions=req.instructions)
    if not messages or all(m.role == "system" for m in messages):
        raise DecodeError("nothing to answer: `input` has no message", param="input")
    return ChatRequest(
        model=req.model,
        messages=messages,
        stream=req.stream,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        tools=req.tools,
        tool_choice=req.tool_choice,
        response_format=req.response_format,
        think=req.think,
        think_level=req.think_level,
        think_param="reasoning.effort",
        ignored=req.ignored,
        output_param="max_output_tokens",
    )


# -- Response objects -----------------------------------------------------------


def usage_doc(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def encode_response(
    req: ResponsesRequest,
    *,
    response_id: str,
    created_at: float,
    status: Status,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    incomplete: str | None = None,
    completed_at: float | None = None,
    conversation: str | None = None,
) -> dict[str, Any]:
    """A Response object; ``req.echo`` supplies the request fields it repeats."""
    doc: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "model": req.model,
        "output": output or [],
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "usage": usage,
        "completed_at": int(completed_at) if completed_at is not None else None,
        **req.echo,
    }
    conv = conversation or req.conversation
    doc["conversation"] = {"id": conv} if conv else None
    return doc


def sampled(req: ResponsesRequest, temperature: float | None, top_p: float | None) -> ResponsesRequest:
    """``req`` whose Response echoes the sampling the engine ran with (the model's own defaults,
    or the engine's) where the request left ``temperature`` or ``top_p`` out."""
    echo = dict(req.echo)
    if echo.get("temperature") is None and temperature is not None:
        echo["temperature"] = temperature
    if echo.get("top_p") is None and top_p is not None:
        echo["top_p"] = top_p
    return msgspec.structs.replace(req, echo=echo)


def encode_deleted(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "deleted": True}


def encode_input_tokens(n: int) -> dict[str, Any]:
    return {"object": "response.input_tokens", "input_tokens": n}


def item_page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: Literal["asc", "desc"]
) -> dict[str, Any]:
    """One page of a list of items (input items, conversation items), cursor after an id."""
    rows = items if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [r.get("id") for r in rows]
        if after not in ids:
            raise DecodeError(f"invalid field `after`: no item {after!r} in this list", param="after")
        rows = rows[ids.index(after) + 1 :]
    page = rows[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(rows) > limit,
    }
