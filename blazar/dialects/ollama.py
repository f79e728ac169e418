"""The Ollama dialect's inference side: ``/api/chat``, ``/api/generate``, ``/api/embed(dings)``.

Requests are validated into wire structs (unknown fields ignored, wrong types
rejected naming the field) and turned into neutral types. Answers are encoded
as NDJSON lines: every encoder here returns bytes ending in ``\\n``, so one
function serves both a streamed line and a single-object body.

Ollama's conventions kept here: ``stream`` defaults to true; durations are in
nanoseconds and zero-valued metrics are left out; ``created_at`` is RFC 3339
with nanoseconds; a tool call is sent whole, with ``arguments`` as an object,
never as fragments; a chat with no messages (or a generate with no prompt)
only loads the model, or unloads it when ``keep_alive`` is 0. Listings, ``show``
and pull progress are the model verbs of ``blazar.dialects.ollama_models``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from blazar.dialects import params
from blazar.dialects._wire import decode_json
from blazar.dialects.jsonstream import complete_prefix
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    DecodeError,
    Delta,
    EmbedRequest,
    Message,
    ResponseFormat,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
    Usage,
)
from blazar.dialects.ollama_time import parse_duration_s
from blazar.errors import Dialect, error_body

__all__ = [
    "StreamEncoder",
    "Timings",
    "ToolCallAccumulator",
    "decode_chat_request",
    "decode_embed_request",
    "decode_generate_request",
    "decode_legacy_embeddings_request",
    "done_reason",
    "encode_chat_chunk",
    "encode_chat_final",
    "encode_chat_response",
    "encode_error",
    "encode_generate_chunk",
    "encode_generate_final",
    "encode_generate_response",
    "encode_load_response",
    "load_action",
]

# ---------------------------------------------------------------------------
# Wire structs (requests)
# ---------------------------------------------------------------------------

_KeepAlive = str | int | float | None
_Format = str | dict[str, Any] | None
_Think = bool | str | None


_Fraction = Annotated[float, Meta(ge=0, le=1)]
_Penalty = Annotated[float, Meta(ge=-2, le=2)]


class _Options(msgspec.Struct, kw_only=True):
    """The ``options`` of Ollama's API: the sampling ones are mapped; the rest (``num_gpu``,
    ``use_mmap``…) are read only to be named as ignored (``blazar.dialects.params``).

    Ranges are what llama.cpp can honour: ``num_predict`` -1 means no limit and -2
    fill the context; a repeat penalty divides the logits, so it must be above 0."""

    num_predict: Annotated[int, Meta(ge=-2)] | None = None
    temperature: Annotated[float, Meta(ge=0)] | None = None
    top_p: _Fraction | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    min_p: _Fraction | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0)] | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    num_ctx: Annotated[int, Meta(ge=1)] | None = None
    typical_p: _Fraction | None = None
    repeat_last_n: Annotated[int, Meta(ge=-1)] | None = None
    mirostat: Annotated[int, Meta(ge=0, le=2)] | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    num_keep: int | None = None
    lora: list[dict[str, Any]] | None = None
    """The model's LoRA adapters' scales (``blazar.dialects.lora``), checked against its engine."""
    penalize_newline: Any = None
    tfs_z: Any = None
    num_batch: Any = None
    num_gpu: Any = None
    main_gpu: Any = None
    num_thread: Any = None
    use_mmap: Any = None
    use_mlock: Any = None
    numa: Any = None
    low_vram: Any = None
    f16_kv: Any = None
    vocab_only: Any = None


_SAMPLING = {
    # Ollama option -> llama.cpp request field, passed through as is
    "typical_p": "typical_p",
    "repeat_last_n": "repeat_last_n",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
    "lora": "lora",
}


class _WireFunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict[str, Any] | str | None = None
    index: int | None = None


class _WireToolCall(msgspec.Struct, kw_only=True):
    function: _WireFunctionCall
    id: str | None = None


class _WireMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | None = None
    images: list[str] | None = None
    tool_calls: list[_WireToolCall] | None = None
    tool_name: str | None = None
    name: str | None = None
    tool_call_id: str | None = None
    thinking: str | None = None


class _WireFunction(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _WireTool(msgspec.Struct, kw_only=True):
    function: _WireFunction
    type: str | None = "function"


class _ChatBody(msgspec.Struct, kw_only=True):
    model: str
    messages: list[_WireMessage] | None = None
    stream: bool | None = None
    format: _Format = None
    tools: list[_WireTool] | None = None
    think: _Think = None
    keep_alive: _KeepAlive = None
    options: _Options | None = None


class _GenerateBody(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool | None = None
    raw: bool | None = None
    format: _Format = None
    images: list[str] | None = None
    think: _Think = None
    keep_alive: _KeepAlive = None
    options: _Options | None = None


class _EmbedBody(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str]
    truncate: bool | None = None
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    late_chunking: bool | None = None
    keep_alive: _KeepAlive = None
    options: dict[str, Any] | None = None


class _LegacyEmbedBody(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | None = None
    keep_alive: _KeepAlive = None
    options: dict[str, Any] | None = None


# ---------------------------------------------------------------------------
# Decoding helpers
# ---------------------------------------------------------------------------


def _check_model(model: str) -> None:
    if not model.strip():
        raise DecodeError("field `model` is empty: name an installed model (see `blazar list`)")


def _think(value: _Think) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if value in ("high", "medium", "low", "max"):
        return True
    raise DecodeError(
        f'invalid field `think`: {value!r} is not true, false, "high", "medium", "low" or "max"'
    )


def _think_level(value: _Think) -> str | None:
    return value if isinstance(value, str) and not isinstance(value, bool) else None


def _format(value: _Format) -> ResponseFormat | None:
    if value is None or value == "":
        return None
    if value == "json":
        return ResponseFormat(kind="json_object")
    if isinstance(value, dict):
        return ResponseFormat(kind="json_schema", schema=value)
    raise DecodeError(f'invalid field `format`: {value!r} is not "json" or a JSON schema object')


def _strip_data_url(image: str) -> str:
    return image.split(",", 1)[1] if image.startswith("data:") and "," in image else image


def _options(opts: _Options | None) -> dict[str, Any]:
    """The neutral sampling fields of ``options`` as ChatRequest keyword arguments."""
    if opts is None:
        return {}
    # num_predict: -1 is unlimited, -2 fills the context; Ollama treats 0 the same way.
    max_tokens = opts.num_predict if opts.num_predict is not None and opts.num_predict > 0 else None
    return {
        "max_tokens": max_tokens,
        "temperature": opts.temperature,
        "top_p": opts.top_p,
        "top_k": opts.top_k,
        "min_p": opts.min_p,
        "seed": opts.seed,
        "stop": [opts.stop] if isinstance(opts.stop, str) else list(opts.stop or []),
        "repeat_penalty": opts.repeat_penalty,
        "presence_penalty": opts.presence_penalty,
        "frequency_penalty": opts.frequency_penalty,
        "num_ctx": opts.num_ctx,
        "sampling": {f: getattr(opts, o) for o, f in _SAMPLING.items() if getattr(opts, o) is not None},
        "output_param": "options.num_predict",
    }


def _ignored(table: params.Table, wire: Any, body: bytes) -> list[str]:
    """What the request sets without effect: the table's ignored parameters, and any key
    that is not part of Ollama's API (at the top level, or in ``options``)."""
    return table.screen(wire) + table.unlisted(params.keys_of(body, table.open))


# ---------------------------------------------------------------------------
# Request decoders
# ---------------------------------------------------------------------------

_ROLES = ("system", "user", "assistant", "tool")


def _arguments_text(i: int, j: int, args: dict[str, Any] | str | None) -> str:
    if args is None:
        return "{}"
    if isinstance(args, dict):
        return msgspec.json.encode(args).decode()
    try:
        parsed = msgspec.json.decode(args)
    except msgspec.DecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise DecodeError(
            f"invalid field `messages[{i}].tool_calls[{j}].function.arguments`: send a JSON object"
        )
    return args


def _messages(wire: list[_WireMessage]) -> list[Message]:
    out: list[Message] = []
    pending: list[ToolCall] = []  # calls of the latest assistant turn not yet answered
    n_calls = 0
    for i, m in enumerate(wire):
        if m.role not in _ROLES:
            raise DecodeError(
                f"invalid field `messages[{i}].role`: {m.role!r} is not one of {', '.join(_ROLES)}"
            )
        calls: list[ToolCall] = []
        for j, call in enumerate(m.tool_calls or []):
            calls.append(
                ToolCall(
                    id=call.id or f"call_{n_calls}",
                    name=call.function.name,
                    arguments=_arguments_text(i, j, call.function.arguments),
                )
            )
            n_calls += 1
        if m.role == "assistant":
            pending = list(calls)
        tool_name = (m.name or m.tool_name) if m.role == "tool" else None
        tool_call_id = m.tool_call_id
        if m.role == "tool":
            match = _answered_call(pending, tool_call_id, tool_name)
            if match is not None:
                pending.remove(match)
                tool_call_id = tool_call_id or match.id
                tool_name = tool_name or match.name
        out.append(
            Message(
                role=m.role,  # type: ignore[arg-type]
                content=m.content or "",
                images=[_strip_data_url(x) for x in m.images or []],
                tool_calls=calls,
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                thinking=m.thinking or None,
            )
        )
    return out


def _answered_call(pending: list[ToolCall], call_id: str | None, name: str | None) -> ToolCall | None:
    """The call a tool result answers: by id, else the first pending call of that name, else in order."""
    if call_id is not None:
        return next((c for c in pending if c.id == call_id), None)
    if name is not None:
        return next((c for c in pending if c.name == name), None)
    return pending[0] if pending else None


def _tools(wire: list[_WireTool] | None) -> list[ToolSpec]:
    out = []
    for i, t in enumerate(wire or []):
        if t.type not in (None, "function"):
            raise DecodeError(f"invalid field `tools[{i}].type`: {t.type!r} is not supported; use function")
        fn = t.function
        params = fn.parameters or {"type": "object", "properties": {}}
        out.append(ToolSpec(name=fn.name, description=fn.description or None, parameters=params))
    return out


def decode_chat_request(body: bytes) -> ChatRequest:
    """``POST /api/chat``. No messages means load (or unload, with ``keep_alive`` 0) only."""
    wire = decode_json(body, _ChatBody)
    _check_model(wire.model)
    fmt = _format(wire.format)
    tools = _tools(wire.tools)
    tool_choice = None
    if tools:
        # With both tools and a format the model must call a tool (a reply cannot be
        # held to a schema and left free to call tools at once).
        tool_choice = ToolChoice(mode="required" if fmt is not None else "auto")
    return ChatRequest(
        model=wire.model,
        messages=_messages(wire.messages or []),
        stream=wire.stream is not False,
        tools=tools,
        tool_choice=tool_choice,
        response_format=fmt,
        think=_think(wire.think),
        think_level=_think_level(wire.think),
        include_usage=True,
        keep_alive_s=parse_duration_s(wire.keep_alive),
        ignored=_ignored(params.OLLAMA_CHAT, wire, body),
        **_options(wire.options),
    )


def decode_generate_request(body: bytes) -> ChatRequest:
    """``POST /api/generate``. An empty prompt means load (or unload) only.

    Not raw: ``messages`` = [system?, user(prompt, images)]. Raw: ``raw_prompt`` is
    the prompt and ``messages`` holds it as one user message (which carries the
    images); the engine must send ``raw_prompt`` untemplated.
    """
    wire = decode_json(body, _GenerateBody)
    _check_model(wire.model)
    ignored = _ignored(params.OLLAMA_GENERATE, wire, body)
    prompt = wire.prompt or ""
    images = [_strip_data_url(x) for x in wire.images or []]
    raw_prompt: str | None = None
    messages: list[Message] = []
    suffix = wire.suffix or None
    if suffix is not None:
        # Fill in the middle runs on the engine's /infill: the prompt is the prefix, laid
        # out with the model's FIM tokens, never with its chat template.
        if images:
            raise DecodeError("invalid field `images`: fill in the middle (`suffix`) takes text only")
        unused = {"system": wire.system, "format": wire.format, "think": wire.think}
        ignored += [name for name, value in unused.items() if value not in (None, "", False)]
        raw_prompt = prompt
        messages = [Message(role="user", content=prompt)] if prompt else []
    elif wire.raw:
        if wire.system:
            raise DecodeError(
                "invalid field `system`: raw mode sends the prompt as-is; drop `system` or `raw`"
            )
        if prompt:
            raw_prompt = prompt
            messages = [Message(role="user", content=prompt, images=images)]
    elif prompt:
        if wire.system:
            messages.append(Message(role="system", content=wire.system))
        messages.append(Message(role="user", content=prompt, images=images))
    return ChatRequest(
        model=wire.model,
        messages=messages,
        stream=wire.stream is not False,
        response_format=None if suffix is not None else _format(wire.format),
        think=None if suffix is not None else _think(wire.think),
        think_level=None if suffix is not None else _think_level(wire.think),
        include_usage=True,
        keep_alive_s=parse_duration_s(wire.keep_alive),
        raw_prompt=raw_prompt,
        suffix=suffix,
        ignored=ignored,
        **_options(wire.options),
    )


def load_action(req: ChatRequest) -> Literal["load", "unload"] | None:
    """``"load"`` / ``"unload"`` when a decoded chat or generate request only manages residency."""
    if req.messages or req.raw_prompt or req.suffix:
        return None
    return "unload" if req.keep_alive_s == 0 else "load"


def decode_embed_request(body: bytes) -> EmbedRequest:
    """``POST /api/embed``. ``options`` are ignored (and named so)."""
    wire = decode_json(body, _EmbedBody)
    _check_model(wire.model)
    inputs = [wire.input] if isinstance(wire.input, str) else list(wire.input)
    if not inputs:
        raise DecodeError("field `input` is empty: send a string or a non-empty list of strings")
    return EmbedRequest(
        model=wire.model,
        inputs=inputs,
        dimensions=wire.dimensions,
        truncate=wire.truncate is not False,
        keep_alive_s=parse_duration_s(wire.keep_alive),
        ignored=_ignored(params.OLLAMA_EMBED, wire, body),
        late_chunking=bool(wire.late_chunking),
    )


def decode_legacy_embeddings_request(body: bytes) -> EmbedRequest:
    """``POST /api/embeddings``. An empty prompt gives ``inputs == []``: load only
    (Ollama answers ``{"embedding": []}``)."""
    wire = decode_json(body, _LegacyEmbedBody)
    _check_model(wire.model)
    return EmbedRequest(
        model=wire.model,
        inputs=[wire.prompt] if wire.prompt else [],
        keep_alive_s=parse_duration_s(wire.keep_alive),
        ignored=_ignored(params.OLLAMA_EMBEDDINGS, wire, body),
    )


def _line(doc: Any) -> bytes:
    return msgspec.json.encode(doc) + b"\n"


# ---------------------------------------------------------------------------
# Chat / generate encoders
# ---------------------------------------------------------------------------


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Durations measured by the gateway, in nanoseconds."""

    total_ns: int = 0
    load_ns: int = 0
    prompt_eval_ns: int = 0
    eval_ns: int = 0


_DONE_REASONS = {"stop": "stop", "stop_sequence": "stop", "tool_calls": "stop", "length": "length"}


def done_reason(finish_reason: str | None) -> str:
    """Ollama's ``done_reason`` for a neutral finish reason (``load``/``unload`` pass through)."""
    if finish_reason is None:
        return "stop"
    return _DONE_REASONS.get(finish_reason, finish_reason)


def _metrics(usage: Usage | None, timings: Timings) -> dict[str, int]:
    """Ollama's metrics, zero values left out as Go's ``omitempty`` does."""
    usage = usage or Usage()
    pairs = (
        ("total_duration", timings.total_ns),
        ("load_duration", timings.load_ns),
        ("prompt_eval_count", usage.prompt_tokens),
        ("prompt_eval_duration", timings.prompt_eval_ns),
        ("eval_count", usage.completion_tokens),
        ("eval_duration", timings.eval_ns),
    )
    return {k: int(v) for k, v in pairs if v}


def _arguments_object(text: str) -> dict[str, Any]:
    """A call's JSON-text arguments as the object Ollama sends; arguments cut off by the
    token cap keep what was complete, and text that is not an object is kept under
    ``_raw`` rather than dropped."""
    if not text.strip():
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        try:
            value = msgspec.json.decode(complete_prefix(text) or "null")
        except msgspec.DecodeError:
            value = None
    return value if isinstance(value, dict) else {"_raw": text}


def _tool_calls(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "function": {"index": i, "name": c.name, "arguments": _arguments_object(c.arguments)}}
        for i, c in enumerate(calls)
    ]


def _message(content: str, thinking: str, tool_calls: Sequence[ToolCall], think: bool) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking and think:
        msg["thinking"] = thinking
    if tool_calls:
        msg["tool_calls"] = _tool_calls(tool_calls)
    return msg


def encode_chat_chunk(
    model: str,
    delta: Delta,
    *,
    created_at: str,
    tool_calls: Sequence[ToolCall] = (),
    think: bool = True,
) -> bytes:
    """One ``done:false`` line. ``delta.tool_calls`` fragments are NOT encoded: feed them
    to a ``ToolCallAccumulator`` and pass the whole calls as ``tool_calls``."""
    msg = _message(delta.text, delta.thinking, tool_calls, think)
    return _line({"model": model, "created_at": created_at, "message": msg, "done": False})


def encode_chat_final(
    model: str,
    *,
    created_at: str,
    finish_reason: str | None,
    usage: Usage | None,
    timings: Timings,
    content: str = "",
    thinking: str = "",
    tool_calls: Sequence[ToolCall] = (),
    think: bool = True,
) -> bytes:
    """The ``done:true`` line with ``done_reason`` and the metrics; the message is
    usually empty (``content``/``thinking``/``tool_calls`` carry any tail)."""
    doc: dict[str, Any] = {
        "model": model,
        "created_at": created_at,
        "message": _message(content, thinking, tool_calls, think),
        "done": True,
        "done_reason": done_reason(finish_reason),
    }
    doc.update(_metrics(usage, timings))
    return _line(doc)


def encode_chat_response(
    resp: ChatResponse,
    *,
    created_at: str,
    timings: Timings,
    think: bool = True,
    model: str | None = None,
) -> bytes:
    """The whole answer of a ``stream:false`` chat. ``think=False`` drops ``thinking``;
    ``model`` overrides ``resp.model`` (send the name the caller used)."""
    return encode_chat_final(
        model or resp.model,
        created_at=created_at,
        finish_reason=resp.finish_reason,
        usage=resp.usage,
        timings=timings,
        content=resp.text,
        thinking=resp.thinking,
        tool_calls=resp.tool_calls,
        think=think,
    )


def encode_generate_chunk(model: str, delta: Delta, *, created_at: str, think: bool = True) -> bytes:
    doc: dict[str, Any] = {"model": model, "created_at": created_at, "response": delta.text}
    if delta.thinking and think:
        doc["thinking"] = delta.thinking
    doc["done"] = False
    return _line(doc)


def encode_generate_final(
    model: str,
    *,
    created_at: str,
    finish_reason: str | None,
    usage: Usage | None,
    timings: Timings,
    response: str = "",
    thinking: str = "",
    think: bool = True,
) -> bytes:
    """The ``done:true`` line of ``/api/generate`` (``context`` is never sent)."""
    doc: dict[str, Any] = {"model": model, "created_at": created_at, "response": response}
    if thinking and think:
        doc["thinking"] = thinking
    doc["done"] = True
    doc["done_reason"] = done_reason(finish_reason)
    doc.update(_metrics(usage, timings))
    return _line(doc)


def encode_generate_response(
    resp: ChatResponse,
    *,
    created_at: str,
    timings: Timings,
    think: bool = True,
    model: str | None = None,
) -> bytes:
    return encode_generate_final(
        model or resp.model,
        created_at=created_at,
        finish_reason=resp.finish_reason,
        usage=resp.usage,
        timings=timings,
        response=resp.text,
        thinking=resp.thinking,
        think=think,
    )


def encode_load_response(
    model: str,
    *,
    created_at: str,
    done_reason: Literal["load", "unload"],
    dialect: Literal["chat", "generate"],
) -> bytes:
    """The answer to an empty chat/generate (load, or unload when ``keep_alive`` is 0)."""
    doc: dict[str, Any] = {"model": model, "created_at": created_at}
    if dialect == "chat":
        doc["message"] = {"role": "assistant", "content": ""}
    else:
        doc["response"] = ""
    doc["done"] = True
    doc["done_reason"] = done_reason
    return _line(doc)


class ToolCallAccumulator:
    """Merges streamed ``ToolCallDelta`` fragments by index into whole ``ToolCall``s.

    The first fragment of an index with an ``id``/``name`` sets them; ``arguments``
    fragments concatenate. Calls without an id get ``call_<index>``.
    """

    def __init__(self) -> None:
        self._ids: dict[int, str | None] = {}
        self._names: dict[int, str] = {}
        self._args: dict[int, list[str]] = {}

    def add(self, fragments: Iterable[ToolCallDelta]) -> None:
        for f in fragments:
            if f.index not in self._args:
                self._args[f.index] = []
                self._ids[f.index] = None
                self._names[f.index] = ""
            if f.id and not self._ids[f.index]:
                self._ids[f.index] = f.id
            if f.name and not self._names[f.index]:
                self._names[f.index] = f.name
            if f.arguments:
                self._args[f.index].append(f.arguments)

    @property
    def pending(self) -> bool:
        return bool(self._args)

    def finish(self) -> list[ToolCall]:
        """The whole calls in index order; the accumulator is empty afterwards."""
        calls = [
            ToolCall(
                id=self._ids[i] or f"call_{i}",
                name=self._names[i],
                arguments="".join(self._args[i]) or "{}",
            )
            for i in sorted(self._args)
        ]
        self._ids.clear()
        self._names.clear()
        self._args.clear()
        return calls


class StreamEncoder:
    """Turns a stream of neutral ``Delta``s into Ollama NDJSON lines (chat or generate).

    ``feed`` returns the bytes to send now (``b""`` when a delta carries nothing
    Ollama shows, e.g. a tool-call fragment or a bare usage event); ``finish``
    returns the whole tool calls (chat) as one ``done:false`` line, then the
    ``done:true`` line with the metrics. Usage and finish reason are taken from
    the deltas.
    """

    def __init__(self, model: str, *, dialect: Literal["chat", "generate"], think: bool = True) -> None:
        self.model = model
        self.dialect = dialect
        self.think = think
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self._calls = ToolCallAccumulator()

    def feed(self, delta: Delta, *, created_at: str) -> bytes:
        if delta.usage is not None:
            self.usage = delta.usage
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        self._calls.add(delta.tool_calls)
        thinking = delta.thinking if self.think else ""
        if not delta.text and not thinking:
            return b""
        if self.dialect == "chat":
            return encode_chat_chunk(self.model, delta, created_at=created_at, think=self.think)
        return encode_generate_chunk(self.model, delta, created_at=created_at, think=self.think)

    def finish(self, *, created_at: str, timings: Timings) -> bytes:
        calls = self._calls.finish()
        if self.dialect == "generate":
            return encode_generate_final(
                self.model,
                created_at=created_at,
                finish_reason=self.finish_reason,
                usage=self.usage,
                timings=timings,
                think=self.think,
            )
        head = b""
        if calls:
            head = encode_chat_chunk(self.model, Delta(), created_at=created_at, tool_calls=calls)
        return head + encode_chat_final(
            self.model,
            created_at=created_at,
            finish_reason=self.finish_reason,
            usage=self.usage,
            timings=timings,
            think=self.think,
        )


# ---------------------------------------------------------------------------
# Errors (the embeddings' answers: blazar.dialects.ollama_embed)
# ---------------------------------------------------------------------------


def encode_error(code: str, message: str) -> bytes:
    """``{"error": message, "blazar_code": code}``: an error body, or the last line of a failed stream."""
    return _line(error_body(Dialect.OLLAMA, code, message))
