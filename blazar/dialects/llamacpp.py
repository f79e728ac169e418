"""The llama.cpp side of translation: neutral requests in, llama.cpp's OpenAI API out.

Dialects other than OpenAI decode into a ``ChatRequest``; ``engine_request``
turns it into the path and body llama.cpp expects, and ``EngineStream`` /
``parse_response`` turn what llama.cpp answers back into neutral ``Delta`` and
``ChatResponse`` values. Reasoning that leaks into the text as
``<think>…</think>`` is split out here, and tool calling for models whose chat
template knows no tools is emulated (see ``blazar.dialects.tools``).
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec

from blazar.dialects import thinking, tools
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    Delta,
    FinishReason,
    Message,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from blazar.errors import BlazarError, prompt_too_long

__all__ = [
    "OPTION_FIELDS",
    "SAMPLING_DEFAULTS",
    "EngineError",
    "EngineStream",
    "ProgressFilter",
    "ThinkSplitter",
    "apply_defaults",
    "apply_defaults_to_body",
    "ask_progress",
    "cap_output",
    "cap_output_in_body",
    "classify_error",
    "context_advice",
    "engine_request",
    "fold_system_turns",
    "infill_refusal",
    "openai_message",
    "parse_response",
    "reminder",
]

SAMPLING_DEFAULTS = (0.8, 0.95)
"""The temperature and top_p llama.cpp's server samples with when a request names neither
(``common_params_sampling``), for the APIs whose answers must say what was used."""

TOOL_CALL_MAX_TOKENS = 512
"""Output cap for a forced tool call when the caller set none."""

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}
_OPEN, _CLOSE = "<think>", "</think>"


class EngineError(Exception):
    """The engine reported an error inside a stream or a response body."""


def openai_message(m: Message) -> dict[str, Any]:
    """A neutral message in the OpenAI chat shape llama.cpp reads."""
    if m.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        parts += [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}} for img in m.images
        ]
        out: dict[str, Any] = {"role": m.role, "content": parts}
    else:
        out = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id or ""
        if m.tool_name:
            out["name"] = m.tool_name
    if m.thinking and m.role == "assistant":
        out["reasoning_content"] = m.thinking
    return out


def reminder(text: str) -> str:
    """A system turn written as text inside a user turn (the form agents fall back to)."""
    return f"<system-reminder>\n{text}\n</system-reminder>"


def fold_system_turns(messages: list[Message]) -> list[Message]:
    """The conversation for a template that takes one system turn, at the start.

    Leading system messages merge into that one. A later one becomes reminder
    text at the end of the user turn just before it, else at the start of the
    user turn just after it, else a user turn of its own.
    """
    lead = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    head = "\n\n".join(m.content for m in messages[:lead] if m.content)
    out = [Message(role="system", content=head)] if head else []
    waiting: list[str] = []
    for m in messages[lead:]:
        if m.role == "system":
            if not m.content:
                continue
            if not waiting and out and out[-1].role == "user":
                prev = out[-1]
                out[-1] = msgspec.structs.replace(
                    prev, content="\n\n".join(t for t in (prev.content, reminder(m.content)) if t)
                )
            else:
                waiting.append(reminder(m.content))
            continue
        if waiting:
            if m.role == "user":
                m = msgspec.structs.replace(m, content="\n\n".join(t for t in (*waiting, m.content) if t))
            else:
                out.append(Message(role="user", content="\n\n".join(waiting)))
            waiting = []
        out.append(m)
    if waiting:
        out.append(Message(role="user", content="\n\n".join(waiting)))
    return out


def _tool_schema(req: ChatRequest) -> dict[str, Any] | None:
    """The schema that constrains an emulated tool answer (None: the output is free)."""
    own_format = req.response_format is not None and req.response_format.kind != "text"
    return tools.constraint_schema(req.tools, req.tool_choice, response_format=own_format)


def engine_request(
    req: ChatRequest,
    *,
    native_tools: bool,
    system_turns: bool = True,
    llguidance: bool = False,
    thinking_support: str = "none",
    think_effort: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The llama.cpp route and JSON body for a neutral request.

    ``system_turns`` says whether the model's template keeps system turns after the
    first user turn. ``llguidance``: the engine's build reads llguidance grammars (the
    xllamacpp wheel's does), which emulated tool calls use to keep their JSON compact.
    ``thinking_support`` and ``think_effort`` are what the template does about reasoning
    (``LaunchSpec.thinking``, ``.think_effort``): see ``blazar.dialects.thinking``.
    """
    body: dict[str, Any] = {"stream": req.stream}
    if req.stream:
        # The progress event comes before the prompt is evaluated and carries its token
        # count, which a stream's first event reports (Anthropic's message_start).
        body["stream_options"] = {"include_usage": True}
        body["return_progress"] = True
    for key in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    for key in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    if req.stop:
        body["stop"] = req.stop
    body.update(req.sampling)
    if req.suffix is not None:
        # llama.cpp's native fill-in-the-middle: the model's FIM tokens around both parts.
        body.pop("stream_options", None)  # OpenAI-route options only
        body.pop("return_progress", None)
        if "max_tokens" in body:
            body["n_predict"] = body.pop("max_tokens")
        body["input_prefix"] = req.raw_prompt or ""
        body["input_suffix"] = req.suffix
        return "/infill", body
    if req.raw_prompt is not None:
        body["prompt"] = req.raw_prompt
        return "/v1/completions", body

    messages = list(req.messages)
    if tools.emulated(req, native_tools=native_tools):
        schema = _tool_schema(req)
        own_format = req.response_format is not None and req.response_format.kind != "text"
        prose = (
            tools.prose_grammar(req.tools, req.tool_choice, response_format=own_format)
            if llguidance
            else None
        )
        # With a grammar that lets the answer be prose, the model is asked to answer normally.
        wrapped = schema is not None and prose is None
        messages = tools.render_for_prompt(messages, req.tools, req.tool_choice, wrapped=wrapped)
        if prose is not None:
            body["grammar"] = prose
        elif schema is not None and llguidance:
            # Our own grammar, because the one llama.cpp derives from a JSON schema lets
            # the model pretty-print: newlines and indents cost tokens before the first
            # argument. llguidance's JSON is compact when whitespace is not flexible.
            compact = {**schema, "x-guidance": {"whitespace_flexible": False}}
            body["grammar"] = "%llguidance {}\nstart: %json " + msgspec.json.encode(compact).decode()
        elif schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "tool_call", "schema": schema},
            }
        if tools.forced(req.tool_choice):
            # A grammar keeps a small model inside the JSON but not from rambling in
            # a string forever; a call never needs this many tokens.
            body.setdefault("max_tokens", TOOL_CALL_MAX_TOKENS)
    elif req.tools and native_tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters},
            }
            for t in req.tools
        ]
        if req.tool_choice is not None:
            choice = req.tool_choice
            body["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}}
                if choice.mode == "function"
                else choice.mode
            )
    if "response_format" not in body and "grammar" not in body and req.response_format is not None:
        fmt = req.response_format
        if fmt.kind == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif fmt.kind == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": fmt.schema},
            }
    if not system_turns:
        messages = fold_system_turns(messages)
    body["messages"] = [openai_message(m) for m in messages]
    body.update(thinking.engine_fields(req, support=thinking_support, reads_effort=think_effort))
    return "/v1/chat/completions", body


OPTION_FIELDS = {
    # a Modelfile's PARAMETER name -> the request field (the OpenAI wire name too)
    "num_predict": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def apply_defaults(req: ChatRequest, *, system: str | None, defaults: dict[str, Any]) -> ChatRequest:
    """Fill what the request leaves unset from the model's settings (a Modelfile's
    SYSTEM and PARAMETER lines); the request always wins."""
    changes: dict[str, Any] = {}
    for option, field in OPTION_FIELDS.items():
        if option in defaults and getattr(req, field) is None:
            value = defaults[option]
            if not (field == "max_tokens" and isinstance(value, int) and value < 0):
                changes[field] = value
    if "stop" in defaults and not req.stop:
        stop = defaults["stop"]
        changes["stop"] = [stop] if isinstance(stop, str) else list(stop)
    if "num_ctx" in defaults and req.num_ctx is None:
        changes["num_ctx"] = int(defaults["num_ctx"])
    if system and req.raw_prompt is None and req.messages and req.messages[0].role != "system":
        changes["messages"] = [Message(role="system", content=system), *req.messages]
    return msgspec.structs.replace(req, **changes) if changes else req


def apply_defaults_to_body(body: bytes, *, system: str | None, defaults: dict[str, Any]) -> bytes:
    """``apply_defaults`` for a relayed OpenAI body (chat or completions): the same rules
    on the JSON the engine will get, so relayed requests honour a model's settings too.
    The body comes back unchanged (the same bytes) when there is nothing to fill."""
    doc = msgspec.json.decode(body)
    if not isinstance(doc, dict):
        return body
    changed = False
    for option, field in OPTION_FIELDS.items():
        if option not in defaults or doc.get(field) is not None:
            continue
        value = defaults[option]
        if field == "max_tokens" and (
            doc.get("max_completion_tokens") is not None or (isinstance(value, int) and value < 0)
        ):
            continue
        doc[field] = value
        changed = True
    if "stop" in defaults and not doc.get("stop"):
        stop = defaults["stop"]
        doc["stop"] = [stop] if isinstance(stop, str) else list(stop)
        changed = True
    messages = doc.get("messages")
    if system and isinstance(messages, list) and messages:
        first = messages[0]
        if not (isinstance(first, dict) and first.get("role") in ("system", "developer")):
            doc["messages"] = [{"role": "system", "content": system}, *messages]
            changed = True
    return msgspec.json.encode(doc) if changed else body


def _usage(doc: dict[str, Any] | None) -> Usage | None:
    if not doc:
        return None
    details = doc.get("prompt_tokens_details") or {}
    out_details = doc.get("completion_tokens_details") or {}
    return Usage(
        prompt_tokens=int(doc.get("prompt_tokens") or 0),
        completion_tokens=int(doc.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        reasoning_tokens=int(out_details.get("reasoning_tokens") or 0),
    )


class ThinkSplitter:
    """Route ``<think>…</think>`` in streamed text to thinking, tags split across chunks included."""

    def __init__(self) -> None:
        self._inside = False
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        data = self._held + text
        self._held = ""
        visible: list[str] = []
        thought: list[str] = []
        while data:
            tag = _CLOSE if self._inside else _OPEN
            at = data.find(tag)
            if at < 0:
                # Keep a possible partial tag at the end for the next chunk.
                keep = next((n for n in range(len(tag) - 1, 0, -1) if data.endswith(tag[:n])), 0)
                chunk, self._held = (data[:-keep], data[-keep:]) if keep else (data, "")
                (thought if self._inside else visible).append(chunk)
                break
            (thought if self._inside else visible).append(data[:at])
            data = data[at + len(tag) :]
            self._inside = not self._inside
        return "".join(visible), "".join(thought)

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return ("", held) if self._inside else (held, "")


class EngineStream:
    """Incremental parser of llama.cpp's OpenAI SSE stream into neutral deltas.

    Bytes may split anywhere (inside a UTF-8 sequence too); ``feed`` buffers up
    to the next event boundary. With emulated tools the text is the JSON the
    output was constrained to: ``tools.OutputParser`` turns it into text or
    tool-call deltas as it streams.

    ``prompt`` is the prompt's size (tokens in all, of them cached) from the
    engine's first progress event, known before any token is generated; None
    until then, or from an engine that sends none. ``seen_event`` says whether a
    whole event has arrived yet; ``events`` counts them, so a caller can tell that
    the engine is at work when an event brings nothing to send (prompt progress,
    held-back text).
    """

    def __init__(self, req: ChatRequest, *, native_tools: bool) -> None:
        self._buf = b""
        self._think = ThinkSplitter()
        self._tools: tools.OutputParser | None = None
        if tools.emulated(req, native_tools=native_tools):
            wrapped = _tool_schema(req) is not None
            self._tools = tools.OutputParser(req.tools, req.tool_choice, wrapped=wrapped)
        self._finish: FinishReason | None = None
        self.started = False
        """The engine has sent some of the answer (which may not have become a delta yet)."""
        self.done = False
        self.prompt: Usage | None = None
        self.seen_event = False
        self.events = 0
        self.timings: Any = None
        """The engine's ``timings`` object from its final event (prompt and decode times)."""
        self.thinking_events = 0
        """Engine events that carried thinking. llama.cpp streams one event per token it
        generates and counts no reasoning tokens of its own, so this counts them (the
        tokens of the ``<think>`` tags themselves, which carry no text, excepted)."""

    def feed(self, data: bytes) -> list[Delta]:
        self._buf += data
        out: list[Delta] = []
        while True:
            end = self._buf.find(b"\n\n")
            if end < 0:
                break
            event, self._buf = self._buf[:end], self._buf[end + 2 :]
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    out.extend(self._event(line[6:]))
        return out

    def _event(self, payload: bytes) -> list[Delta]:
        self.seen_event = True
        self.events += 1
        if payload.strip() == b"[DONE]":
            self.done = True
            return self._end(None)
        doc = msgspec.json.decode(payload)
        if "error" in doc:
            err = doc["error"]
            raise EngineError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
        if (timings := doc.get("timings")) is not None:
            self.timings = timings
        if "choices" not in doc and "content" in doc:
            return self._native(doc)
        progress = doc.get("prompt_progress")
        if self.prompt is None and isinstance(progress, dict):
            self.prompt = Usage(
                prompt_tokens=int(progress.get("total") or 0), cached_tokens=int(progress.get("cache") or 0)
            )
        deltas: list[Delta] = []
        for choice in doc.get("choices") or []:
            d = choice.get("delta") or {}
            text, thinking = self._think.feed(d.get("content") or "")
            thinking = (d.get("reasoning_content") or "") + thinking
            if thinking:
                self.thinking_events += 1
            calls = [
                ToolCallDelta(
                    index=int(c.get("index", i)),
                    id=c.get("id"),
                    name=(c.get("function") or {}).get("name"),
                    arguments=(c.get("function") or {}).get("arguments") or "",
                )
                for i, c in enumerate(d.get("tool_calls") or [])
            ]
            if text or thinking or calls:
                self.started = True
            if self._tools is not None and text:
                if thinking:
                    deltas.append(Delta(thinking=thinking))
                    thinking = ""
                deltas.extend(self._tools.feed(text))
                text = ""
            if choice.get("finish_reason"):
                self._finish = _FINISH.get(choice["finish_reason"], "stop")
            if text or thinking or calls:
                deltas.append(Delta(text=text, thinking=thinking, tool_calls=calls))
        usage = _usage(doc.get("usage"))
        if usage is not None:
            deltas.extend(self._end(usage))
        return deltas

    def _native(self, doc: dict[str, Any]) -> list[Delta]:
        """An event of llama.cpp's native completion stream (``/infill``): ``content``, and
        ``stop`` with the stop type and token counts on the last one."""
        text = doc.get("content") or ""
        deltas: list[Delta] = []
        if text:
            self.started = True
            deltas.append(Delta(text=text))
        if doc.get("stop"):
            self._finish = "length" if doc.get("stop_type") == "limit" else "stop"
            usage = Usage(
                prompt_tokens=int(doc.get("tokens_evaluated") or 0),
                completion_tokens=int(doc.get("tokens_predicted") or 0),
                cached_tokens=int(doc.get("tokens_cached") or 0),
            )
            deltas.extend(self._end(usage))
        return deltas

    def _end(self, usage: Usage | None) -> list[Delta]:
        if self._finish is None and usage is None:
            return []
        tail_text, tail_thinking = self._think.flush()
        finish = self._finish or "stop"
        self._finish = None
        calls: list[ToolCallDelta] = []
        if self._tools is not None:
            # The emulated answer's last pieces ride on the final delta.
            parser, self._tools = self._tools, None
            tail = parser.feed(tail_text) if tail_text else []
            more, finish = parser.finish(finish)
            tail += more
            tail_text = "".join(d.text for d in tail)
            calls = [c for d in tail for c in d.tool_calls]
        usage = usage or Usage()
        if self.thinking_events and not usage.reasoning_tokens:
            counted = self.thinking_events
            if usage.completion_tokens:
                counted = min(counted, usage.completion_tokens)
            usage = msgspec.structs.replace(usage, reasoning_tokens=counted)
        return [
            Delta(
                text=tail_text,
                thinking=tail_thinking,
                tool_calls=calls,
                finish_reason=finish,
                usage=usage,
            )
        ]


def parse_response(doc: dict[str, Any], req: ChatRequest, *, native_tools: bool) -> ChatResponse:
    """A non-stream llama.cpp response (chat or completion) as a neutral response."""
    if "error" in doc:
        err = doc["error"]
        raise EngineError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    choice = (doc.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = message.get("content") if message else choice.get("text")
    splitter = ThinkSplitter()
    text, thinking = splitter.feed(content or "")
    tail_text, tail_thinking = splitter.flush()
    text += tail_text
    thinking = (message.get("reasoning_content") or "") + thinking + tail_thinking
    finish: FinishReason = _FINISH.get(choice.get("finish_reason") or "stop", "stop")
    calls = [
        ToolCall(
            id=c.get("id") or f"call_{i}",
            name=(c.get("function") or {}).get("name", ""),
            arguments=(c.get("function") or {}).get("arguments") or "{}",
        )
        for i, c in enumerate(message.get("tool_calls") or [])
    ]
    if tools.emulated(req, native_tools=native_tools):
        parsed = tools.parse_whole_output(
            text, req.tools, req.tool_choice, wrapped=_tool_schema(req) is not None, finish_reason=finish
        )
        text, calls, finish = parsed.text, parsed.calls, parsed.finish_reason
    elif calls:
        finish = "tool_calls"
    return ChatResponse(
        id=str(doc.get("id") or f"chatcmpl-{time.time_ns():x}"),
        model=str(doc.get("model") or req.model),
        created=int(doc.get("created") or time.time()),
        text=text,
        thinking=thinking,
        tool_calls=calls,
        finish_reason=finish,
        usage=_usage(doc.get("usage")) or Usage(),
    )


def cap_output(req: ChatRequest, cap: int | None) -> tuple[ChatRequest, bool]:
    """``req`` with ``max_tokens`` set to ``cap`` when it sets no output limit itself;
    the flag says whether the cap was applied."""
    if cap is None or req.max_tokens is not None:
        return req, False
    return msgspec.structs.replace(req, max_tokens=cap), True


_OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")


def cap_output_in_body(body: bytes, cap: int | None) -> tuple[bytes, bool]:
    """``cap_output`` for a relayed OpenAI body (chat or completions); the same bytes
    come back when the body names an output limit of its own (llama.cpp's ``n_predict`` too)."""
    if cap is None:
        return body, False
    doc = msgspec.json.decode(body)
    if not isinstance(doc, dict) or any(doc.get(k) is not None for k in _OUTPUT_LIMITS):
        return body, False
    doc["max_tokens"] = cap
    return msgspec.json.encode(doc), True


_ASKED_PROGRESS = b'"return_progress"'
_PROGRESS_EVENT = b'"prompt_progress":{'
"""Only a progress event has this in llama.cpp's compact JSON: inside a string the quotes
would be escaped."""


def ask_progress(body: bytes) -> tuple[bytes, bool]:
    """A relayed stream's body with llama.cpp's prompt-progress events turned on, and
    whether the gateway turned them on (so they are its own, to be filtered out).

    llama.cpp notices a closed connection only when it writes to it; with progress
    events it writes after each batch of the prompt, so a client that disconnects
    mid-prompt frees the slot within a batch instead of after the whole prompt. A body
    that names ``return_progress`` itself is relayed unchanged: the client's choice.
    """
    if _ASKED_PROGRESS in body:
        return body, False
    at = body.find(b"{") + 1
    if at == 0:
        return body, False
    sep = b"" if body[at:].lstrip().startswith(b"}") else b","
    return body[:at] + b'"return_progress":true' + sep + body[at:], True


class ProgressFilter:
    """Drops the engine's prompt-progress events from relayed SSE bytes, which may split
    anywhere; other events pass unchanged, each once whole."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        end = data.rfind(b"\n\n") + 2
        if end < 2:
            self._held = data
            return b""
        whole, self._held = data[:end], data[end:]
        if _PROGRESS_EVENT not in whole:
            return whole
        events = whole[:-2].split(b"\n\n")
        return b"".join(e + b"\n\n" for e in events if _PROGRESS_EVENT not in e)

    def flush(self) -> bytes:
        """What is held back (the start of an event not yet whole)."""
        held, self._held = self._held, b""
        return held


def context_advice(
    n_prompt: int | None, n_ctx: int | None, *, limit: int | None, extended: bool, model: str
) -> str:
    """What to do about a prompt over the context, offering only what can work: a larger
    context up to what the model can serve, else a shorter prompt or context extension."""
    table = f'[models."{model}"] in config.toml'
    if limit is None or n_ctx is None:
        return f"shorten it, or raise the context (Ollama `num_ctx`, or `ctx` under {table})"
    if n_ctx < limit and (n_prompt is None or n_prompt < limit):
        return (
            f"shorten it, or raise the context, at most to {limit} for this model "
            f"(Ollama `num_ctx`, or `ctx` under {table})"
        )
    if extended:
        return (
            f"shorten it: the context is at the {limit} tokens the configured extension allows "
            f"(a larger `rope_scale` under {table} extends it further)"
        )
    return (
        f"shorten it: {limit} tokens is the most this model was trained on, so a larger context "
        f'needs context extension (`rope_scaling = "yarn"` and `ctx` under {table})'
    )


_TOO_LARGE = re.compile(r"input \((?P<n>\d+) tokens\) is too large to process.*batch size: (?P<step>\d+)")
"""llama.cpp's words for an input to embed or rank that is longer than its prompt step."""


def classify_error(
    status: int,
    body: bytes,
    *,
    ctx_limit: int | None = None,
    extended: bool = False,
    model: str = "NAME",
) -> BlazarError:
    """What an error answer from llama.cpp means, as the error the gateway answers with.
    ``ctx_limit`` (the most a slot can hold) and ``extended`` shape the advice for a prompt
    over the context."""
    try:
        doc = msgspec.json.decode(body)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
    except msgspec.DecodeError:
        err = body.decode("utf-8", "replace")[:500]
    message = str(err.get("message", err)) if isinstance(err, dict) else str(err)
    if (big := _TOO_LARGE.search(message)) is not None:
        # An input to embed or rank over the engine's step, which is a slot's context there.
        n, step = int(big["n"]), int(big["step"])
        advice = context_advice(n, step, limit=ctx_limit, extended=extended, model=model)
        return prompt_too_long(n, step, advice=advice)
    if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
        n, ctx = int(err.get("n_prompt_tokens") or 0), int(err.get("n_ctx") or 0)
        advice = context_advice(n or None, ctx or None, limit=ctx_limit, extended=extended, model=model)
        return prompt_too_long(n, ctx, advice=advice)
    return BlazarError("BAD_REQUEST" if status < 500 else "BAD_GATEWAY", message)


def infill_refusal(status: int, body: bytes) -> BlazarError | None:
    """llama.cpp's 501 for a model without fill-in-the-middle tokens, as the gateway's 400."""
    if status != 501:
        return None
    try:
        said = msgspec.json.decode(body).get("error", {}).get("message", "")
    except (msgspec.DecodeError, AttributeError):
        said = ""
    return BlazarError(
        "MODEL_CANNOT_INFILL",
        "this model cannot fill in the middle: its vocabulary has no prefix, suffix and middle "
        f"tokens ({said.strip() or 'the engine refused'}); use a code model trained for it "
        "(Qwen2.5-Coder, CodeLlama, StarCoder2, DeepSeek-Coder…)",
    )
