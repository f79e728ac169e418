"""OpenAI stored chat completions, sans-io: what a ``store: true`` request keeps and how the
stored objects look on the wire.

A stored completion is the chat completion object the client was answered with (a stream
is assembled into that object from its chunks), its ``metadata``, and the request's
messages, each given an id (``<completion id>-<index>``) for the messages list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from blazar.dialects.neutral import DecodeError

__all__ = [
    "MAX_KEYS",
    "MAX_KEY_CHARS",
    "MAX_VALUE_CHARS",
    "StreamAssembler",
    "check_metadata",
    "decode_update",
    "encode_deleted",
    "metadata_filter",
    "store_fields",
    "stored_messages",
]

MAX_KEYS = 16
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 512


class _StoreFields(msgspec.Struct):
    store: bool | None = None
    metadata: dict[str, Any] | None = None


class _Update(msgspec.Struct, forbid_unknown_fields=True):
    metadata: dict[str, Any] | None


def check_metadata(metadata: Mapping[str, Any] | None, *, param: str = "metadata") -> dict[str, str]:
    """OpenAI's limits on ``metadata``: at most 16 keys, keys up to 64 characters, string
    values up to 512 characters."""
    if metadata is None:
        return {}
    if len(metadata) > MAX_KEYS:
        raise DecodeError(
            f"invalid field `{param}`: {len(metadata)} keys, at most {MAX_KEYS} are allowed — drop some",
            param=param,
        )
    out: dict[str, str] = {}
    for key, value in metadata.items():
        if len(key) > MAX_KEY_CHARS:
            raise DecodeError(
                f"invalid field `{param}`: key {key[:20]!r}… has {len(key)} characters, at most "
                f"{MAX_KEY_CHARS} are allowed",
                param=f"{param}.{key}",
            )
        if not isinstance(value, str):
            raise DecodeError(
                f"invalid field `{param}.{key}`: values are strings (got {type(value).__name__})",
                param=f"{param}.{key}",
            )
        if len(value) > MAX_VALUE_CHARS:
            raise DecodeError(
                f"invalid field `{param}.{key}`: {len(value)} characters, at most {MAX_VALUE_CHARS} "
                "are allowed",
                param=f"{param}.{key}",
            )
        out[key] = value
    return out


def store_fields(body: bytes) -> tuple[bool, dict[str, str]]:
    """Whether a chat completion request asks to be stored, and its checked ``metadata``.
    Cheap when the body does not mention ``store`` (the usual case)."""
    if b'"store"' not in body:
        return False, {}
    try:
        wire = msgspec.json.decode(body, type=_StoreFields)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"invalid field: {exc}") from None
    except msgspec.DecodeError:
        return False, {}  # the route's own decoder words a body that is not JSON
    if not wire.store:
        return False, {}
    return True, check_metadata(wire.metadata)


def decode_update(body: bytes) -> dict[str, str]:
    """``POST /v1/chat/completions/{id}``: only ``metadata`` may change (null clears it)."""
    try:
        wire = msgspec.json.decode(body, type=_Update)
    except msgspec.ValidationError as exc:
        raise DecodeError(
            f"invalid body: {exc} — a stored chat completion's only changeable field is `metadata`",
            param="metadata",
        ) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"the body is not JSON: {exc}", code="INVALID_JSON") from None
    return check_metadata(wire.metadata)


def metadata_filter(args: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The ``metadata[key]=value`` query parameters of the list route."""
    out: dict[str, str] = {}
    for name, value in args:
        if name.startswith("metadata[") and name.endswith("]"):
            out[name[len("metadata[") : -1]] = value
        elif name == "metadata":
            raise DecodeError(
                "invalid query `metadata`: filter with `metadata[KEY]=VALUE`, once per key",
                param="metadata",
            )
    return out


def stored_messages(completion_id: str, messages: list[Any]) -> list[dict[str, Any]]:
    """The request's messages as OpenAI lists them: each with an ``id``, its text in
    ``content`` and, when it came as parts, the parts in ``content_parts``."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        item = {k: v for k, v in message.items() if k != "content"}
        content = message.get("content")
        if isinstance(content, list):
            item["content"] = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
            item["content_parts"] = content
        else:
            item["content"] = content
            item["content_parts"] = None
        item.setdefault("name", None)
        item["id"] = f"{completion_id}-{index}"
        out.append(item)
    return out


def encode_deleted(completion_id: str) -> dict[str, Any]:
    return {"object": "chat.completion.deleted", "id": completion_id, "deleted": True}


class _Choice:
    __slots__ = ("calls", "content", "finish_reason", "logprobs", "reasoning", "refusal", "role")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.logprobs: list[Any] | None = None

    def feed(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        self.role = delta.get("role") or self.role
        if content := delta.get("content"):
            self.content.append(content)
        if reasoning := delta.get("reasoning_content"):
            self.reasoning.append(reasoning)
        if refusal := delta.get("refusal"):
            self.refusal.append(refusal)
        for i, c in enumerate(delta.get("tool_calls") or []):
            call = self.calls.setdefault(
                int(c.get("index", i)), {"id": None, "type": "function", "name": "", "arguments": []}
            )
            call["id"] = c.get("id") or call["id"]
            fn = c.get("function") or {}
            call["name"] += fn.get("name") or ""
            call["arguments"].append(fn.get("arguments") or "")
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if (lp := choice.get("logprobs")) and isinstance(lp, dict):
            self.logprobs = (self.logprobs or []) + list(lp.get("content") or [])

    def encode(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": self.role,
            "content": "".join(self.content) if self.content or not self.calls else None,
            "refusal": "".join(self.refusal) or None,
        }
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c["id"] or f"call_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
                }
                for i, c in sorted(self.calls.items())
            ]
        return {
            "index": index,
            "message": message,
            "logprobs": {"content": self.logprobs} if self.logprobs is not None else None,
            "finish_reason": self.finish_reason or "stop",
        }


class StreamAssembler:
    """Builds the chat completion object a stream of ``chat.completion.chunk`` events
    describes. ``done`` once ``data: [DONE]`` arrived; ``failed`` when the stream carried
    an error event (such a stream is not stored)."""

    def __init__(self) -> None:
        self._buf = b""
        self._choices: dict[int, _Choice] = {}
        self._head: dict[str, Any] = {}
        self._usage: Any = None
        self.done = False
        self.failed = False

    def feed(self, data: bytes) -> None:
        self._buf += data
        while (end := self._buf.find(b"\n\n")) >= 0:
            event, self._buf = self._buf[:end], self._buf[end + 2 :]
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            doc = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            return
        if not isinstance(doc, dict):
            return
        if "error" in doc:
            self.failed = True
            return
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if doc.get(key) is not None and key not in self._head:
                self._head[key] = doc[key]
        if doc.get("usage"):
            self._usage = doc["usage"]
        for choice in doc.get("choices") or []:
            index = int(choice.get("index", 0))
            self._choices.setdefault(index, _Choice()).feed(choice)

    @property
    def completion_id(self) -> str | None:
        return self._head.get("id")

    def completion(self) -> dict[str, Any]:
        return {
            "id": self._head.get("id"),
            "object": "chat.completion",
            "created": self._head.get("created"),
            "model": self._head.get("model"),
            "choices": [c.encode(i) for i, c in sorted(self._choices.items())],
            "usage": self._usage,
            "system_fingerprint": self._head.get("system_fingerprint"),
            "service_tier": self._head.get("service_tier"),
        }
