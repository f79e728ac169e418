"""Structured-output receipts: how an answer constrained by a schema or a grammar was held to
it, and whether it passed.

Every response to a request that asks for structure (OpenAI ``response_format``
``json_object``/``json_schema``, the Responses API's ``text.format``, Ollama's ``format``,
Anthropic's ``output_config.format``, llama.cpp's own ``grammar``/``json_schema`` fields)
carries ``X-Blazar-Structured-Output: enforced=HOW; valid=BOOL``:

* ``enforced=engine-grammar``: the engine sampled under a grammar made from the format;
* ``enforced=emulation``: the gateway's tool-call emulation made the grammar, with the format
  inside it (tools on a model whose template knows none);
* ``enforced=none``: nothing held the output to it (an engine without grammars).

``valid`` is the answer checked against the format (``jsonschema`` for a schema, a JSON
object for ``json_object``); a GBNF ``grammar`` has no check beyond itself, and an answer
that called tools has no text to check: ``valid`` is then left out. A stream's head carries
the enforcement; the check comes at its end where the dialect has room for it (an SSE
comment before OpenAI's ``data: [DONE]``, a ``blazar_structured_output`` field on Ollama's
last NDJSON object).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec

from actors.engine import EngineActor
from blazar.dialects.neutral import ResponseFormat
from blazar.dialects.stored_chat import StreamAssembler
from blazar.serve.candidates.choices import check_schema

__all__ = [
    "HEADER",
    "Enforced",
    "NdjsonReceipt",
    "ReceiptStream",
    "Wanted",
    "enforcement",
    "receipt",
    "valid",
    "wanted",
]

HEADER = "X-Blazar-Structured-Output"

Enforced = Literal["engine-grammar", "emulation", "none"]


class Wanted(msgspec.Struct, frozen=True):
    """The structure a request asks for: a format to check against, or a grammar (None)."""

    fmt: ResponseFormat | None


class _LlamaFields(msgspec.Struct):
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None


def wanted(fmt: ResponseFormat | None, body: bytes | None = None) -> Wanted | None:
    """What structure a request asks for; ``body`` is a relayed OpenAI body, whose llama.cpp
    fields (``grammar``, ``json_schema``) ask for it too."""
    if fmt is not None and fmt.kind != "text":
        return Wanted(fmt)
    if body is not None and (b'"grammar"' in body or b'"json_schema"' in body):
        try:
            extra = msgspec.json.decode(body, type=_LlamaFields)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if extra.json_schema is not None:
            return Wanted(ResponseFormat(kind="json_schema", schema=extra.json_schema))
        if extra.grammar:
            return Wanted(None)
    return None


def enforcement(engine: EngineActor | None, *, emulated: bool = False) -> Enforced:
    if engine is None or "json_schema" not in engine.lane.capabilities:
        return "none"
    return "emulation" if emulated else "engine-grammar"


def valid(want: Wanted, text: str) -> bool | None:
    if want.fmt is None:
        return None
    return check_schema(text, want.fmt) is None


def receipt(enforced: Enforced, ok: bool | None) -> str:
    return f"enforced={enforced}" if ok is None else f"enforced={enforced}; valid={str(ok).lower()}"


def content_of(body: bytes) -> str | None:
    """The first choice's text of a whole OpenAI chat completion (None: tools were called)."""
    try:
        doc = msgspec.json.decode(body)
        message = doc["choices"][0]["message"]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        return None
    if message.get("tool_calls"):
        return None
    return str(message.get("content") or "")


_DONE = b"data: [DONE]"


class ReceiptStream:
    """An OpenAI SSE stream, unchanged but for one comment line before ``data: [DONE]`` that
    says whether the assembled answer passed the format."""

    def __init__(self, inner: AsyncIterator[bytes], want: Wanted, enforced: Enforced) -> None:
        self._inner, self._want, self._enforced = inner, want, enforced
        self._asm = StreamAssembler()
        self._said = False

    def __aiter__(self) -> ReceiptStream:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._inner.__anext__()
        if self._said:
            return chunk
        self._asm.feed(chunk)
        if not self._asm.done or self._asm.failed:
            return chunk
        self._said = True
        choice = (self._asm.completion()["choices"] or [{}])[0]
        message = choice.get("message") or {}
        ok = None if message.get("tool_calls") else valid(self._want, message.get("content") or "")
        note = f": {HEADER.lower()} {receipt(self._enforced, ok)}\n\n".encode()
        at = chunk.find(_DONE)
        return chunk[:at] + note + chunk[at:] if at >= 0 else chunk + note

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


class NdjsonReceipt:
    """An Ollama NDJSON stream whose last object (``"done": true``) also carries
    ``blazar_structured_output``, the receipt with the answer's check (clients skip a field
    they do not know)."""

    def __init__(self, inner: AsyncIterator[bytes], want: Wanted, enforced: Enforced) -> None:
        self._inner, self._want, self._enforced = inner, want, enforced
        self._buf = b""
        self._text: list[str] = []
        self._calls = False

    def __aiter__(self) -> NdjsonReceipt:
        return self

    async def __anext__(self) -> bytes:
        while True:
            try:
                chunk = self._buf + await self._inner.__anext__()
            except StopAsyncIteration:
                if not self._buf:
                    raise
                rest, self._buf = self._buf, b""
                return rest
            head, sep, rest = chunk.rpartition(b"\n")
            if sep:  # whole lines, each read (and the last one told the check)
                self._buf = rest
                return b"\n".join(self._line(line) for line in head.split(b"\n")) + b"\n"
            self._buf = chunk

    def _line(self, line: bytes) -> bytes:
        try:
            doc = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return line
        if not isinstance(doc, dict):
            return line
        message = doc.get("message") or {}
        self._text.append(doc.get("response") or message.get("content") or "")
        self._calls = self._calls or bool(message.get("tool_calls"))
        if doc.get("done") is not True or "error" in doc:
            return line
        ok = None if self._calls else valid(self._want, "".join(self._text))
        doc["blazar_structured_output"] = receipt(self._enforced, ok)
        return msgspec.json.encode(doc)

    async def aclose(self) -> None:
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()
