"""Policy hooks on the wire: what a hook is sent, the verdict it answers, and the answer text
a post hook judges, read from and written back into each dialect's answer, whole or streamed.

Sans-io: bytes and builtins in, bytes and msgspec types out. The calling and the decisions are
``blazar.serve.policy.hooks``; the format is documented in docs/security.md#policy-hooks.

A hook is sent one JSON object. Before the request runs (``stage`` ``pre``)::

    {"version": 1, "hook": "pii", "stage": "pre", "route": "/v1/chat/completions",
     "dialect": "openai", "model": "smollm2-135m", "key": "alice", "trace_id": "…",
     "request": {"model": "…", "messages": [{"role": "user", "content": "…"}], …}}

``request`` is the neutral chat request (``blazar.dialects.neutral.ChatRequest``); for a legacy
completion (``/v1/completions``) the neutral completion request, with ``prompt`` in place of
``messages``. After it (``post``), ``request`` is there too, with ``stream`` and the answer of
one choice::

    {…, "stage": "post", "stream": false, "answer": {"choice": 0, "text": "…"}}

It answers ``{"action": "allow"}``, ``{"action": "refuse", "reason": "…"}``, a pre hook
``{"action": "rewrite", "messages": [...]}`` (the request's whole new message list, in the
neutral form it was sent; for a legacy completion ``{"action": "rewrite", "prompt": "…"}``), a
post hook ``{"action": "redact", "text": "…"}`` (the choice's new text). An empty answer
(``null``, ``{}``) allows.

Where an answer's text is read and written depends on its wire shape (``Shape``): the three
dialects', and within OpenAI's, the Responses API's (``output`` items and its typed events) and
legacy completions' (``choices[].text``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from blazar.dialects.llamacpp import openai_message
from blazar.dialects.neutral import ChatRequest, CompletionRequest, Message
from blazar.errors import Dialect

__all__ = [
    "VERSION",
    "Shape",
    "Verdict",
    "VerdictError",
    "answer_texts",
    "decode_verdict",
    "hook_payload",
    "messages_into_body",
    "prompt_into_body",
    "stream_texts",
    "stream_with_texts",
    "with_texts",
]

VERSION = 1
"""The wire format's version, sent with every call; a change that breaks a hook raises it."""

Action = Literal["allow", "refuse", "rewrite", "redact"]
Shape = Literal["openai", "anthropic", "ollama", "responses", "completions"]
"""An answer's wire shape: a dialect's name (``Dialect`` is one), or one of OpenAI's other two."""


class VerdictError(ValueError):
    """A hook's answer that is not a verdict for its stage."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    action: Action = "allow"
    reason: str | None = None
    messages: list[Message] | None = None
    """``rewrite``: the request's new messages."""
    prompt: str | None = None
    """``rewrite`` of a legacy completion: its new prompt."""
    text: str | None = None
    """``redact``: the answer's new text."""


_ALLOWED: dict[str, frozenset[str]] = {
    "pre": frozenset({"allow", "refuse", "rewrite"}),
    "post": frozenset({"allow", "refuse", "redact"}),
}


def decode_verdict(answer: object, stage: Literal["pre", "post"], *, completion: bool = False) -> Verdict:
    """A hook's answer (decoded JSON, or what a Python hook returned) as a verdict; raises
    ``VerdictError`` saying what is wrong with it. ``completion``: the request is a legacy
    completion (a rewrite gives its prompt)."""
    if answer is None or answer == {}:
        return Verdict()
    try:
        verdict = msgspec.convert(answer, type=Verdict)
    except msgspec.ValidationError as exc:
        raise VerdictError(f"not a verdict: {exc}") from None
    if verdict.action not in _ALLOWED[stage]:
        raise VerdictError(f"a {stage} hook may not answer action {verdict.action!r}")
    if verdict.action == "rewrite" and completion and verdict.prompt is None:
        raise VerdictError("rewrite of a completion needs prompt: the request's new prompt")
    if verdict.action == "rewrite" and not completion and not verdict.messages:
        raise VerdictError("rewrite needs messages: the request's new message list")
    if verdict.action == "redact" and verdict.text is None:
        raise VerdictError("redact needs text: the answer's new text")
    return verdict


def hook_payload(
    *,
    hook: str,
    stage: str,
    route: str,
    dialect: Dialect,
    key: str | None,
    trace_id: str,
    req: ChatRequest | CompletionRequest,
    answer: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """The JSON object a hook is sent (as builtins: a Python hook gets it as it is)."""
    payload: dict[str, Any] = {
        "version": VERSION,
        "hook": hook,
        "stage": stage,
        "route": route,
        "dialect": str(dialect),
        "model": req.model,
        "key": key,
        "trace_id": trace_id,
        "request": msgspec.to_builtins(req),
    }
    if answer is not None:
        payload["stream"] = req.stream
        payload["answer"] = {"choice": answer[0], "text": answer[1]}
    return payload


def messages_into_body(body: bytes, messages: list[Message]) -> bytes:
    """An OpenAI chat body (relayed to the engine as it came) with ``messages`` in place of its own."""
    doc = msgspec.json.decode(body)
    doc["messages"] = [openai_message(m) for m in messages]
    return msgspec.json.encode(doc)


def prompt_into_body(body: bytes, prompt: str) -> bytes:
    """A legacy completion body (relayed as it came) with ``prompt`` in place of its own."""
    doc = msgspec.json.decode(body)
    doc["prompt"] = prompt
    return msgspec.json.encode(doc)


# -- an answer's text, whole --------------------------------------------------------------


def _doc(body: bytes) -> dict[str, Any] | None:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def answer_texts(shape: Shape, body: bytes) -> list[str] | None:
    """The text of each choice of a whole answer (None: not an answer this reads)."""
    doc = _doc(body)
    if doc is None:
        return None
    match shape:
        case "openai" | "completions":
            choices = doc.get("choices")
            if not isinstance(choices, list):
                return None
            if shape == "completions":
                return [_str(c.get("text")) for c in choices if isinstance(c, dict)]
            return [_str((c.get("message") or {}).get("content")) for c in choices if isinstance(c, dict)]
        case "anthropic":
            blocks = doc.get("content")
            if not isinstance(blocks, list):
                return None
            return ["".join(_str(b.get("text")) for b in blocks if _is_text_block(b))]
        case "responses":
            output = doc.get("output")
            if not isinstance(output, list) or doc.get("object") != "response":
                return None
            return ["".join(_str(p.get("text")) for p in _output_texts(output))]
        case _:
            if isinstance(message := doc.get("message"), dict):
                return [_str(message.get("content"))]
            return [_str(doc["response"])] if "response" in doc else None


def with_texts(shape: Shape, body: bytes, texts: list[str]) -> bytes:
    """A whole answer with each choice's text replaced by ``texts`` (as ``answer_texts`` read them)."""
    doc = _doc(body)
    if doc is None:
        return body
    match shape:
        case "openai":
            for choice, text in zip(doc.get("choices") or [], texts, strict=False):
                if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                    choice["message"]["content"] = text
        case "completions":
            for choice, text in zip(doc.get("choices") or [], texts, strict=False):
                if isinstance(choice, dict):
                    choice["text"] = text
        case "anthropic":
            blocks = doc.get("content") or []
            first = next((i for i, b in enumerate(blocks) if _is_text_block(b)), None)
            kept = [b for i, b in enumerate(blocks) if i == first or not _is_text_block(b)]
            if first is None:
                kept.insert(0, {"type": "text", "text": texts[0]})
            else:
                blocks[first]["text"] = texts[0]
            doc["content"] = kept
        case "responses":
            _put_text(_output_texts(doc.get("output") or []), texts[0])
        case _:
            if isinstance(doc.get("message"), dict):
                doc["message"]["content"] = texts[0]
            elif "response" in doc:
                doc["response"] = texts[0]
    return msgspec.json.encode(doc)


def _output_texts(output: list[Any]) -> list[dict[str, Any]]:
    """The ``output_text`` parts of a Response's message items, in order."""
    return [
        part
        for item in output
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]


def _put_text(parts: list[dict[str, Any]], text: str) -> None:
    """The whole ``text`` in the first part, the others emptied (a redaction keeps the shape)."""
    for i, part in enumerate(parts):
        part["text"] = text if i == 0 else ""
        if part.get("annotations"):
            part["annotations"] = []  # they point into the text that was replaced


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _is_text_block(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") == "text"


# -- an answer's text, streamed -----------------------------------------------------------
# A buffered stream is read as events: an SSE event (OpenAI, Anthropic) ends with a blank
# line, an Ollama line with a newline. The text is each choice's text deltas joined; a
# redaction puts the new text in the choice's first text delta and empties the others, so
# the stream keeps every event its clients count on (roles, usage, the end). A Responses
# stream also repeats the whole text in its closing events (the text's and its part's
# ``done``, the item's ``done``, the finished Response): those get the new text too.


def _events(shape: Shape, data: bytes) -> list[bytes]:
    sep = b"\n" if shape == "ollama" else b"\n\n"
    parts = data.split(sep)
    return [p + sep for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _event_json(shape: Shape, event: bytes) -> tuple[dict[str, Any], int, int] | None:
    """An event's JSON, with where it sits in the event (start, end) to write it back."""
    if shape == "ollama":
        start, end = 0, len(event.rstrip(b"\n"))
    else:
        at = event.find(b"data:")
        if at < 0:
            return None
        start = at + 5
        end = event.find(b"\n", start)
        end = len(event) if end < 0 else end
    doc = _doc(event[start:end].strip())
    return (doc, start, end) if doc is not None else None


def _delta_ref(shape: Shape, doc: dict[str, Any]) -> tuple[int, dict[str, Any], str] | None:
    """Where an event's text delta is: (choice, the dict that holds it, its key)."""
    match shape:
        case "openai" | "completions":
            holder, key = ("delta", "content") if shape == "openai" else (None, "text")
            refs = [
                (int(c.get("index") or 0), c[holder] if holder else c, key)
                for c in doc.get("choices") or []
                if isinstance(c, dict)
                and isinstance(held := (c.get(holder) if holder else c), dict)
                and key in held
            ]
            return refs[0] if refs else None
        case "anthropic":
            delta = doc.get("delta")
            if doc.get("type") == "content_block_delta" and isinstance(delta, dict):
                if delta.get("type") == "text_delta":
                    return 0, delta, "text"
            return None
        case "responses":
            return (0, doc, "delta") if doc.get("type") == "response.output_text.delta" else None
        case _:
            if isinstance(message := doc.get("message"), dict) and "content" in message:
                return 0, message, "content"
            return (0, doc, "response") if "response" in doc else None


def stream_texts(shape: Shape, data: bytes) -> list[str]:
    """Each choice's text, assembled from a whole buffered stream."""
    texts: dict[int, list[str]] = {}
    for event in _events(shape, data):
        if (found := _event_json(shape, event)) is None:
            continue
        if (ref := _delta_ref(shape, found[0])) is not None:
            choice, holder, key = ref
            texts.setdefault(choice, []).append(_str(holder.get(key)))
    return ["".join(texts.get(i, [])) for i in range(max(texts, default=0) + 1)]


def stream_with_texts(shape: Shape, data: bytes, texts: list[str]) -> bytes:
    """A buffered stream whose choices' texts are ``texts`` instead (see above)."""
    placed: set[int | str] = set()
    out: list[bytes] = []
    for event in _events(shape, data):
        found = _event_json(shape, event)
        ref = _delta_ref(shape, found[0]) if found is not None else None
        if found is not None and ref is None and shape == "responses":
            if not _closing_text(found[0], texts[0], placed):
                out.append(event)
                continue
        elif found is None or ref is None or ref[0] >= len(texts):
            out.append(event)
            continue
        else:
            choice, holder, key = ref
            holder[key] = "" if choice in placed else texts[choice]
            placed.add(choice)
        doc, start, end = found
        out.append(
            event[:start] + (b" " if shape != "ollama" else b"") + msgspec.json.encode(doc) + event[end:]
        )
    return b"".join(out)


def _closing_text(doc: dict[str, Any], text: str, placed: set[int | str]) -> bool:
    """A Responses event that repeats the whole text, given ``text`` (the first of its kind;
    later ones of the same kind get ""); False: not such an event."""
    kind = doc.get("type")
    first = kind not in placed
    match kind:
        case "response.output_text.done":
            doc["text"] = text if first else ""
        case "response.content_part.done" if isinstance(part := doc.get("part"), dict):
            if part.get("type") != "output_text":
                return False
            _put_text([part], text if first else "")
        case "response.output_item.done" if isinstance(item := doc.get("item"), dict):
            parts = _output_texts([item])
            if not parts:
                return False
            _put_text(parts, text if first else "")
        case "response.completed" | "response.incomplete" if isinstance(resp := doc.get("response"), dict):
            _put_text(_output_texts(resp.get("output") or []), text)
        case _:
            return False
    placed.add(str(kind))
    return True
