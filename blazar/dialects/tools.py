"""Tool calling for models whose chat template knows no tools (SmolLM2's, for one).

The tools are described in the system prompt, earlier tool calls and results
are rendered as plain turns, and the model's output is constrained to one JSON
object: ``{"tool":…,"arguments":{…}}`` for a call or, when the model may also
answer in words (``auto``), ``{"text":…}`` for an answer. The key that names the
tool is never the name of an argument: a model that has just written
``"name":"add_person"`` tends to repeat that value into an argument that is
also called ``name``.

``OutputParser`` reads that JSON as it is generated, so a text answer streams
as its characters arrive and a call's arguments stream as fragments; output
cut off by the token cap still yields the (partial) call it was.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from blazar.dialects.jsonstream import WHITESPACE, StringReader, Utf8Feed, ValueScanner
from blazar.dialects.neutral import (
    ChatRequest,
    Delta,
    FinishReason,
    Message,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)

__all__ = [
    "OutputParser",
    "ParsedOutput",
    "call_key",
    "constraint_schema",
    "emulated",
    "forced",
    "parse_output",
    "parse_whole_output",
    "prose_grammar",
    "render_for_prompt",
]

_CALL_KEYS = ("tool", "function", "call", "name")
"""Keys that name the tool: ours (the first no tool has as an argument), and the one
unconstrained models often write."""
_ARGUMENT_KEYS = ("arguments", "parameters")
_UNDECIDED = frozenset({"start", "open", "key", "colon", "value", "name"})
"""Parser states in which the output is not yet known to be a call or a text answer."""


class ParsedOutput(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    calls: list[ToolCall]
    finish_reason: FinishReason = "stop"


def emulated(req: ChatRequest, *, native_tools: bool) -> bool:
    """Whether the gateway emulates the request's tools (the template has none)."""
    return (
        bool(req.tools) and not native_tools and (req.tool_choice is None or req.tool_choice.mode != "none")
    )


def forced(choice: ToolChoice | None) -> bool:
    """Whether the model must call a tool (the output is then always a call)."""
    return choice is not None and choice.mode in ("required", "function")


def _describe(tool: ToolSpec) -> str:
    params = msgspec.json.encode(tool.parameters or {"type": "object"}).decode()
    doc = f" — {tool.description}" if tool.description else ""
    return f"- {tool.name}{doc}\n  arguments (JSON schema): {params}"


def call_key(specs: list[ToolSpec]) -> str:
    """The key that names the tool in a call: one that no tool has as an argument."""
    taken = {k for t in specs for k in (t.parameters or {}).get("properties") or {}}
    return next((k for k in _CALL_KEYS if k not in taken), "tool")


# The shapes use bare placeholders rather than sample strings, so there is no value
# a model could copy into an argument.
_TEXT_SHAPE = '{"text":ANSWER}, with ANSWER your answer as a JSON string'


def _instructions(specs: list[ToolSpec], choice: ToolChoice | None, *, wrapped: bool) -> str:
    listing = "\n".join(_describe(t) for t in specs)
    key = call_key(specs)
    shape = (
        f'{{"{key}":TOOL,"arguments":ARGUMENTS}}, with TOOL the name of the tool as a JSON string '
        "and ARGUMENTS an object that follows its schema"
    )
    if choice is not None and choice.mode == "function":
        name = msgspec.json.encode(choice.name).decode()
        shape = f'{{"{key}":{name},"arguments":ARGUMENTS}}, with ARGUMENTS an object that follows its schema'
        rule = f"You must call the tool {name} now. Reply with only a JSON object {shape}."
    elif choice is not None and choice.mode == "required":
        rule = f"You must call one of these tools now. Reply with only a JSON object {shape}."
    elif wrapped:
        rule = (
            f"To call a tool, reply with only a JSON object {shape}.\n"
            f"If no tool is needed, reply with only a JSON object {_TEXT_SHAPE}."
        )
    else:
        rule = (
            f"To call a tool, reply with only a JSON object {shape}.\n"
            "If no tool is needed, answer the user normally."
        )
    return f"You can use these tools:\n{listing}\n\n{rule}"


def render_for_prompt(
    messages: list[Message], specs: list[ToolSpec], choice: ToolChoice | None, *, wrapped: bool = True
) -> list[Message]:
    """The conversation with the tools described and tool turns written as plain text.

    ``wrapped``: the output is constrained to the JSON shapes (see ``constraint_schema``).
    """
    out: list[Message] = []
    instructions = _instructions(specs, choice, wrapped=wrapped)
    rest = messages
    if messages and messages[0].role == "system":
        out.append(Message(role="system", content=f"{messages[0].content}\n\n{instructions}"))
        rest = messages[1:]
    else:
        out.append(Message(role="system", content=instructions))
    names = {}
    key = call_key(specs)
    for m in rest:
        if m.role == "assistant" and m.tool_calls:
            for c in m.tool_calls:
                names[c.id] = c.name
            calls = [_call_json(c, key) for c in m.tool_calls]
            text = calls[0] if len(calls) == 1 else "[" + ",".join(calls) + "]"
            out.append(Message(role="assistant", content=(m.content + "\n" if m.content else "") + text))
        elif m.role == "tool":
            name = m.tool_name or names.get(m.tool_call_id or "", "the tool")
            out.append(Message(role="user", content=f"Result of {name}: {m.content}"))
        elif m.role == "assistant" and wrapped and m.content:
            # Earlier answers in the shape the model is asked for now.
            out.append(Message(role="assistant", content=_text_json(m.content)))
        else:
            out.append(m)
    return out


def _call_json(call: ToolCall, key: str) -> str:
    try:
        args = msgspec.json.decode(call.arguments or "{}")
    except msgspec.DecodeError:
        args = {}
    return msgspec.json.encode({key: call.name, "arguments": args}).decode()


def _text_json(text: str) -> str:
    return msgspec.json.encode({"text": text}).decode()


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """An argument schema that lists its properties and says nothing about others gets
    ``additionalProperties: false`` in the constraint: a small model otherwise keeps
    inventing keys until the token cap."""
    if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


def _call_schema(tool: ToolSpec, key: str) -> dict[str, Any]:
    params = _closed(tool.parameters or {"type": "object"})
    return {
        "type": "object",
        "properties": {key: {"const": tool.name}, "arguments": params},
        "required": [key, "arguments"],
        "additionalProperties": False,
    }


_TEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def constraint_schema(
    specs: list[ToolSpec], choice: ToolChoice | None, *, response_format: bool = False
) -> dict[str, Any] | None:
    """The JSON schema the output must follow, or None when it is free.

    ``response_format``: the caller constrains the answer itself; a free (``auto``)
    choice then leaves the output to that format, and a call is recognised only if
    the model writes one anyway.
    """
    if choice is not None and choice.mode == "none":
        return None
    key = call_key(specs)
    if choice is not None and choice.mode == "function":
        chosen = [t for t in specs if t.name == choice.name]
        return _call_schema(chosen[0], key) if chosen else None
    calls = [_call_schema(t, key) for t in specs]
    if choice is None or choice.mode == "auto":
        if response_format:
            return None
        return {"anyOf": [*calls, _TEXT_SCHEMA]}
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def prose_grammar(
    specs: list[ToolSpec], choice: ToolChoice | None, *, response_format: bool = False
) -> str | None:
    """For an engine that reads llguidance grammars: the grammar of a free (``auto``) choice,
    a call in our JSON shape or an answer in the model's own words; None when the choice is
    not free (``constraint_schema`` then holds). An answer is never wrapped in a JSON string
    here: a small model writes a quote or a code block as it would without tools, where a
    JSON string's grammar would end the answer at its first ``"``."""
    if response_format or not (choice is None or choice.mode == "auto"):
        return None
    key = call_key(specs)
    calls = [_call_schema(t, key) for t in specs]
    schema = {
        **(calls[0] if len(calls) == 1 else {"anyOf": calls}),
        "x-guidance": {"whitespace_flexible": False},
    }
    return (
        "%llguidance {}\n"
        "start: call | prose\n"
        f"call: %json {msgspec.json.encode(schema).decode()}\n"
        "prose: PROSE\n"
        "PROSE: /[^{\\s][\\s\\S]*/\n"
    )


def _strip_fence(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0]
    return t.strip()


def _new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _parse_whole(text: str, known: set[str]) -> list[ToolCall] | None:
    """Calls in a whole answer that is exactly one call or a list of them (fences allowed)."""
    try:
        doc = msgspec.json.decode(_strip_fence(text))
    except msgspec.DecodeError:
        return None
    items = doc if isinstance(doc, list) else [doc]
    calls: list[ToolCall] = []
    for item in items:
        if not isinstance(item, dict):
            return None
        name = next((item[k] for k in _CALL_KEYS if k in item), None)
        if name not in known:
            return None
        args: Any = next((item[k] for k in _ARGUMENT_KEYS if k in item), {})
        if not isinstance(args, dict):
            return None
        calls.append(ToolCall(id=_new_call_id(), name=name, arguments=msgspec.json.encode(args).decode()))
    return calls


class OutputParser:
    """Reads the model's output as it streams and turns it into neutral deltas.

    ``wrapped``: the output was constrained by ``constraint_schema``, so it is one
    of our JSON shapes. Otherwise it may be prose (streamed as it comes), a call
    written by the model unprompted by a grammar, or other JSON (passed on as text).
    ``feed`` takes text or bytes (a character split between byte chunks waits).
    """

    def __init__(self, specs: list[ToolSpec], choice: ToolChoice | None, *, wrapped: bool) -> None:
        self._known = {t.name for t in specs}
        named = [choice.name] if choice is not None and choice.mode == "function" and choice.name else []
        self._candidates = named or [t.name for t in specs]
        self._wrapped = wrapped
        self._forced = forced(choice)
        self._utf8 = Utf8Feed()
        self._state = "start"
        self._seen: list[str] = []
        """All text so far, for the answers that are only understood whole."""
        self._word = ""  # a key or the tool's name being read
        self._reader: StringReader | None = None
        self._scanner: ValueScanner | None = None
        self._key = ""
        self.call: ToolCall | None = None
        """The call being read (its arguments grow as they stream)."""
        self._args: list[str] = []
        self.complete = False
        """The output ended its JSON object (a call that is whole)."""
        self._answered = False  # some of a text answer went out

    @property
    def calls(self) -> list[ToolCall]:
        return [] if self.call is None else [self._current_call()]

    def _current_call(self) -> ToolCall:
        assert self.call is not None
        return msgspec.structs.replace(self.call, arguments="".join(self._args))

    def feed(self, chunk: str | bytes) -> list[Delta]:
        text = self._utf8.feed(chunk) if isinstance(chunk, bytes) else chunk
        if not text:
            return []
        self._seen.append(text)
        out: list[Delta] = []
        while text:
            text = self._step(text, out)
        return out

    def finish(self, finish_reason: FinishReason) -> tuple[list[Delta], FinishReason]:
        """The last deltas, and the finish reason: ``tool_calls`` for a whole call;
        a call cut off keeps the engine's reason (``length``)."""
        out = self.feed(self._utf8.flush())
        state = self._state
        if state == "hold" or (not self._wrapped and state in _UNDECIDED):
            whole = "".join(self._seen)
            calls = _parse_whole(whole, self._known)
            if calls:
                deltas = [
                    Delta(tool_calls=[ToolCallDelta(index=i, id=c.id, name=c.name, arguments=c.arguments)])
                    for i, c in enumerate(calls)
                ]
                return out + deltas, "tool_calls"
            return out + ([Delta(text=whole)] if whole else []), finish_reason
        if self.call is None and self._forced and state in _UNDECIDED:
            # Cut off before the tool was named: the only tool it can be, if there is one.
            prefix = self._word if state == "name" else ""
            fits = [n for n in self._candidates if n.startswith(prefix)]
            if len(fits) == 1:
                out += self._start_call(fits[0])
        if self.call is not None:
            return out, "tool_calls" if self.complete else finish_reason
        return out, finish_reason

    # -- the states ----------------------------------------------------------

    def _step(self, text: str, out: list[Delta]) -> str:
        """Consume some of ``text`` in the current state; return the rest."""
        state = self._state
        if state == "raw":
            out.append(Delta(text=text))
            return ""
        if state in ("hold", "done"):
            return ""
        if state == "text":
            assert self._reader is not None
            piece, end = self._reader.feed(text)
            if piece:
                self._answered = True
                out.append(Delta(text=piece))
            if end is None:
                return ""
            self._state = "close"
            return text[end:]
        if state == "args":
            assert self._scanner is not None
            end = self._scanner.feed(text)
            piece = text if end is None else text[:end]
            if not self._scanner.started:
                return ""  # whitespace before the value
            piece = piece.lstrip(WHITESPACE) if not self._args else piece
            if piece:
                self._args.append(piece)
                out.append(Delta(tool_calls=[ToolCallDelta(index=0, arguments=piece)]))
            if end is None:
                return ""
            self._state = "close"
            return text[end:]
        if state in ("key", "name"):
            assert self._reader is not None
            piece, end = self._reader.feed(text)
            self._word += piece
            if end is None:
                return ""
            rest = text[end:]
            if state == "name":
                if self._word not in self._known:
                    return self._fall_back(out)
                out.extend(self._start_call(self._word))
                self._state = "after_name"
            else:
                self._key, self._state = self._word, "colon"
            return rest
        stripped = text.lstrip(WHITESPACE)
        if not stripped:
            return ""
        c, rest = stripped[0], stripped[1:]
        if state == "start":
            if c == "{":
                self._state = "open"
            elif c in "[`" and not self._wrapped:
                self._state = "hold"
            else:
                return self._fall_back(out)
            return rest
        if state in ("open", "next_key") and c == '"':
            self._begin_string("key")
            return rest
        if state == "colon" and c == ":":
            return self._after_colon(rest, out)
        if state == "value" and c == '"' and self._key in (*_CALL_KEYS, "text"):
            self._begin_string("name" if self._key in _CALL_KEYS else "text")
            return rest
        if state == "after_name" and c == ",":
            self._state = "next_key"
            return rest
        if state in ("after_name", "close") and c == "}":
            self._state = "done"
            self.complete = self.call is not None
            return ""
        return self._fall_back(out)

    def _after_colon(self, rest: str, out: list[Delta]) -> str:
        key = self._key
        if self.call is None and (key in _CALL_KEYS or (key == "text" and self._wrapped)):
            self._state = "value"
        elif self.call is not None and key in _ARGUMENT_KEYS:
            self._state = "args"
            self._scanner = ValueScanner()
        else:
            return self._fall_back(out)
        return rest

    def _begin_string(self, state: str) -> None:
        self._state = state
        self._reader = StringReader()
        self._word = ""

    def _start_call(self, name: str) -> list[Delta]:
        self.call = ToolCall(id=_new_call_id(), name=name, arguments="")
        return [Delta(tool_calls=[ToolCallDelta(index=0, id=self.call.id, name=name)])]

    def _fall_back(self, out: list[Delta]) -> str:
        """The output is not one of the shapes: what came so far and what follows is text.
        A call or an answer already under way just ends there."""
        if self.call is not None or self._answered:
            self._state = "done"
            return ""
        self._state = "raw"
        out.append(Delta(text="".join(self._seen)))
        return ""


def parse_output(
    text: str, specs: list[ToolSpec], choice: ToolChoice | None, *, wrapped: bool = False
) -> ParsedOutput:
    """A whole answer: the call it holds, or its text. ``wrapped`` as for ``OutputParser``."""
    return parse_whole_output(text, specs, choice, wrapped=wrapped, finish_reason="stop")


def parse_whole_output(
    text: str,
    specs: list[ToolSpec],
    choice: ToolChoice | None,
    *,
    wrapped: bool,
    finish_reason: FinishReason,
) -> ParsedOutput:
    parser = OutputParser(specs, choice, wrapped=wrapped)
    deltas = parser.feed(text)
    tail, finish = parser.finish(finish_reason)
    deltas += tail
    if parser.call is not None:
        return ParsedOutput(text="", calls=parser.calls, finish_reason=finish)
    held = [c for d in deltas for c in d.tool_calls]
    if held:
        calls = [ToolCall(id=c.id or _new_call_id(), name=c.name or "", arguments=c.arguments) for c in held]
        return ParsedOutput(text="", calls=calls, finish_reason=finish)
    return ParsedOutput(text="".join(d.text for d in deltas), calls=[], finish_reason=finish)
