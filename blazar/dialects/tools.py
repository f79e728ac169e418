"""Tool calling for models whose chat template knows no tools (SmolLM2's, for one).

The tools are described in the system prompt, earlier tool calls and results
are rendered as plain turns, and the model answers with a JSON object
``{"name": …, "arguments": {…}}``. When a tool is required (OpenAI
``tool_choice`` required or a named function, Anthropic ``any``/``tool``,
Ollama tools with ``format``) the output is constrained by a JSON schema, so a
well-formed call always comes back. With ``auto`` the model may answer in
prose; only an answer that is exactly such a JSON object becomes a call.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from blazar.dialects.neutral import Message, ToolCall, ToolChoice, ToolSpec

__all__ = ["ParsedOutput", "constraint_schema", "parse_output", "render_for_prompt"]


class ParsedOutput(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    calls: list[ToolCall]


def _describe(tool: ToolSpec) -> str:
    params = msgspec.json.encode(tool.parameters or {"type": "object"}).decode()
    doc = f" — {tool.description}" if tool.description else ""
    return f"- {tool.name}{doc}\n  arguments (JSON schema): {params}"


def _instructions(specs: list[ToolSpec], choice: ToolChoice | None) -> str:
    listing = "\n".join(_describe(t) for t in specs)
    call = '{"name": "<tool name>", "arguments": {<arguments>}}'
    if choice is not None and choice.mode == "function":
        rule = f'You must call the tool "{choice.name}" now. Reply with only this JSON object: {call}'
    elif choice is not None and choice.mode == "required":
        rule = f"You must call one of these tools now. Reply with only this JSON object: {call}"
    else:
        rule = (
            f"To call a tool, reply with only this JSON object and nothing else: {call}\n"
            "If no tool is needed, answer the user normally."
        )
    return f"You can use these tools:\n{listing}\n\n{rule}"


def render_for_prompt(
    messages: list[Message], specs: list[ToolSpec], choice: ToolChoice | None
) -> list[Message]:
    """The conversation with the tools described and tool turns written as plain text."""
    out: list[Message] = []
    instructions = _instructions(specs, choice)
    rest = messages
    if messages and messages[0].role == "system":
        out.append(Message(role="system", content=f"{messages[0].content}\n\n{instructions}"))
        rest = messages[1:]
    else:
        out.append(Message(role="system", content=instructions))
    names = {}
    for m in rest:
        if m.role == "assistant" and m.tool_calls:
            for c in m.tool_calls:
                names[c.id] = c.name
            calls = [_call_json(c) for c in m.tool_calls]
            text = calls[0] if len(calls) == 1 else "[" + ", ".join(calls) + "]"
            out.append(Message(role="assistant", content=(m.content + "\n" if m.content else "") + text))
        elif m.role == "tool":
            name = m.tool_name or names.get(m.tool_call_id or "", "the tool")
            out.append(Message(role="user", content=f"Result of {name}: {m.content}"))
        else:
            out.append(m)
    return out


def _call_json(call: ToolCall) -> str:
    try:
        args = msgspec.json.decode(call.arguments or "{}")
    except msgspec.DecodeError:
        args = {}
    return msgspec.json.encode({"name": call.name, "arguments": args}).decode()


def _call_schema(tool: ToolSpec) -> dict[str, Any]:
    params = tool.parameters or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": params},
        "required": ["name", "arguments"],
    }


def constraint_schema(specs: list[ToolSpec], choice: ToolChoice | None) -> dict[str, Any] | None:
    """The JSON schema that forces a call, or None when the model may answer freely."""
    if choice is None or choice.mode in ("auto", "none"):
        return None
    if choice.mode == "function":
        chosen = [t for t in specs if t.name == choice.name]
        if not chosen:
            return None
        return _call_schema(chosen[0])
    if len(specs) == 1:
        return _call_schema(specs[0])
    return {"anyOf": [_call_schema(t) for t in specs]}


def _strip_fence(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0]
    return t.strip()


def parse_output(text: str, specs: list[ToolSpec], choice: ToolChoice | None) -> ParsedOutput:
    """Turn the model's JSON answer into tool calls; anything else stays text."""
    known = {t.name for t in specs}
    try:
        doc = msgspec.json.decode(_strip_fence(text))
    except msgspec.DecodeError:
        return ParsedOutput(text=text, calls=[])
    items = doc if isinstance(doc, list) else [doc]
    calls: list[ToolCall] = []
    for item in items:
        if not (isinstance(item, dict) and item.get("name") in known):
            return ParsedOutput(text=text, calls=[])
        args = item.get("arguments", item.get("parameters", {}))
        if not isinstance(args, dict):
            return ParsedOutput(text=text, calls=[])
        calls.append(
            ToolCall(
                id=f"call_{secrets.token_hex(12)}",
                name=item["name"],
                arguments=msgspec.json.encode(args).decode(),
            )
        )
    return ParsedOutput(text="", calls=calls)
