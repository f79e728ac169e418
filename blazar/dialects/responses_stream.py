"""Responses output items from neutral deltas, and the event stream that shows them growing.

``OutputBuilder`` is fed neutral deltas (a whole answer is fed as one step per part)
and keeps the output items; every step also returns the events that describe it
(``response.output_item.added``, ``…delta``, ``…done``). ``StreamEncoder`` numbers
those events and frames them as SSE, between ``response.created`` /
``response.in_progress`` and ``response.completed`` / ``response.incomplete``
(a background response opens with ``response.created`` / ``response.queued`` instead,
logged when it is submitted: ``queued_events``).
Streamed or not, one request gets the same output items.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from blazar.dialects.neutral import ChatResponse, Delta, ToolCallDelta, Usage
from blazar.dialects.responses import (
    ResponsesRequest,
    Status,
    encode_response,
    new_id,
    sampled,
    split_name,
    usage_doc,
)

__all__ = [
    "Finished",
    "OutputBuilder",
    "StreamEncoder",
    "finished_response",
    "frame",
    "queued_events",
    "whole_response",
]

Event = dict[str, Any]


class Finished(msgspec.Struct, frozen=True, kw_only=True):
    """How an answer ended, in the Response's terms."""

    status: Status
    usage: dict[str, Any]
    incomplete: str | None = None


class OutputBuilder:
    """The output items of one answer, built step by step."""

    def __init__(self, namespaces: frozenset[str] = frozenset()) -> None:
        self._namespaces = namespaces
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, delta: Delta) -> list[Event]:
        events: list[Event] = []
        if delta.thinking:
            events += self._text("reasoning", "reasoning_text", delta.thinking)
        if delta.text:
            events += self._text("message", "output_text", delta.text)
        for call in delta.tool_calls:
            events += self._call(call)
        return events

    def finish(self, *, status: str = "completed") -> list[Event]:
        """Close what is open; ``status`` is the last item's (``incomplete`` when cut short)."""
        events = self._close(status)
        for item in self.items:
            if item.get("status") == "in_progress":
                item["status"] = status
                if item["type"] == "function_call":
                    events += self._done_call(item)
        return events

    # -- steps ------------------------------------------------------------------

    def _text(self, kind: str, part_type: str, text: str) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if item is None or item["type"] != kind:
            events += self._close("completed")
            item = self._add(kind)
            events.append(self._added(item))
            part: dict[str, Any] = {"type": part_type, "text": ""}
            if part_type == "output_text":
                part.update(annotations=[], logprobs=[])
            item["content"].append(part)
            events.append(self._part_event("response.content_part.added", item, part))
        index = self.items.index(item)
        part = item["content"][-1]
        part["text"] += text
        event: Event = {
            "type": f"response.{part_type}.delta",
            "item_id": item["id"],
            "output_index": index,
            "content_index": len(item["content"]) - 1,
            "delta": text,
        }
        if part_type == "output_text":
            event["logprobs"] = []
        events.append(event)
        return events

    def _call(self, delta: ToolCallDelta) -> list[Event]:
        events: list[Event] = []
        item = self._calls.get(delta.index)
        if item is None:
            events += self._close("completed")
            namespace, name = split_name(delta.name or "", self._namespaces)
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta.id or new_id("call"),
                "name": name,
                "arguments": "",
            }
            if namespace is not None:
                item["namespace"] = namespace
            self.items.append(item)
            self._calls[delta.index] = item
            events.append(self._added(item))
        if delta.arguments:
            item["arguments"] += delta.arguments
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": self.items.index(item),
                    "delta": delta.arguments,
                }
            )
        return events

    def mcp_started(self, call_id: str, server: str, tool: str, arguments: str) -> list[Event]:
        """A call the gateway runs on an MCP server: its ``mcp_call`` item, in progress."""
        events = self._close("completed")
        item: dict[str, Any] = {
            "id": f"mcp_{call_id}",
            "type": "mcp_call",
            "status": "in_progress",
            "server_label": server,
            "name": tool,
            "arguments": arguments,
            "output": None,
            "error": None,
        }
        self.items.append(item)
        index = len(self.items) - 1
        return [
            *events,
            self._added(item),
            {
                "type": "response.mcp_call_arguments.done",
                "item_id": item["id"],
                "output_index": index,
                "arguments": arguments,
            },
            {"type": "response.mcp_call.in_progress", "item_id": item["id"], "output_index": index},
        ]

    def mcp_ended(self, call_id: str, output: str, error: dict[str, Any] | None) -> list[Event]:
        """The call's result: ``output`` and status completed, or the ``error`` and failed."""
        item = next(i for i in self.items if i["id"] == f"mcp_{call_id}")
        index = self.items.index(item)
        item["status"] = "failed" if error is not None else "completed"
        item["output"], item["error"] = (None, error) if error is not None else (output, None)
        kind = "response.mcp_call.failed" if error is not None else "response.mcp_call.completed"
        return [
            {"type": kind, "item_id": item["id"], "output_index": index},
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)},
        ]

    def _add(self, kind: str) -> dict[str, Any]:
        if kind == "message":
            item: dict[str, Any] = {
                "id": new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        else:
            item = {
                "id": new_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
        self.items.append(item)
        self._open = item
        return item

    def _close(self, status: str) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self.items.index(item)
        part = item["content"][-1]
        kind = part["type"]
        done: Event = {
            "type": f"response.{kind}.done",
            "item_id": item["id"],
            "output_index": index,
            "content_index": len(item["content"]) - 1,
            "text": part["text"],
        }
        if kind == "output_text":
            done["logprobs"] = []
        item["status"] = status
        return [
            done,
            self._part_event("response.content_part.done", item, part),
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)},
        ]

    def _done_call(self, item: dict[str, Any]) -> list[Event]:
        index = self.items.index(item)
        return [
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": index,
                "name": item["name"],
                "arguments": item["arguments"],
            },
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)},
        ]

    def _added(self, item: dict[str, Any]) -> Event:
        return {
            "type": "response.output_item.added",
            "output_index": self.items.index(item),
            "item": _copy(item),
        }

    def _part_event(self, kind: str, item: dict[str, Any], part: dict[str, Any]) -> Event:
        return {
            "type": kind,
            "item_id": item["id"],
            "output_index": self.items.index(item),
            "content_index": item["content"].index(part),
            "part": dict(part),
        }


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return msgspec.json.decode(msgspec.json.encode(item))


def finished(final: Delta) -> Finished:
    # llama.cpp counts no thinking tokens apart from the answer's: the engine stream counts them
    usage = usage_doc(final.usage or Usage())
    if final.finish_reason == "length":
        return Finished(status="incomplete", usage=usage, incomplete="max_output_tokens")
    return Finished(status="completed", usage=usage)


def whole_response(
    req: ResponsesRequest, resp: ChatResponse, *, response_id: str, created_at: float, completed_at: float
) -> dict[str, Any]:
    """The Response object of an answer received whole."""
    builder = OutputBuilder(req.namespaces)
    builder.feed(Delta(thinking=resp.thinking))
    builder.feed(Delta(text=resp.text))
    for i, call in enumerate(resp.tool_calls):
        builder.feed(
            Delta(tool_calls=[ToolCallDelta(index=i, id=call.id, name=call.name, arguments=call.arguments)])
        )
    end = finished(Delta(finish_reason=resp.finish_reason, usage=resp.usage))
    builder.finish(status="incomplete" if end.status == "incomplete" else "completed")
    return encode_response(
        req,
        response_id=response_id,
        created_at=created_at,
        status=end.status,
        output=builder.items,
        usage=end.usage,
        incomplete=end.incomplete,
        completed_at=completed_at,
    )


def queued_events(queued: dict[str, Any]) -> list[Event]:
    """How a background response's stream opens, as OpenAI's does: ``response.created`` and
    ``response.queued``, both with the ``queued`` Response, before its job starts."""
    return [{"type": "response.created", "response": queued}, {"type": "response.queued", "response": queued}]


_FINISHING = (b"event: response.completed\n", b"event: response.incomplete\n", b"event: response.failed\n")


def finished_response(data: bytes) -> dict[str, Any] | None:
    """The Response carried by the event in ``data`` (framed by ``frame``) that finishes a
    stream (``response.completed``, ``.incomplete`` or ``.failed``); None when there is none."""
    at = max(data.rfind(kind) for kind in _FINISHING)
    if at < 0:
        return None
    start = data.find(b"data:", at) + 5
    end = data.find(b"\n", start)
    try:
        event = msgspec.json.decode(data[start : end if end >= 0 else len(data)])
    except msgspec.DecodeError:
        return None
    response = event.get("response") if isinstance(event, dict) else None
    return response if isinstance(response, dict) else None


def frame(event: Event, sequence_number: int) -> bytes:
    body = msgspec.json.encode({**event, "sequence_number": sequence_number})
    return b"event: " + event["type"].encode() + b"\ndata: " + body + b"\n\n"


class StreamEncoder:
    """Neutral deltas as the Responses event stream.

    ``on_event`` sees every event with its number (a background response keeps them
    for replay); ``final`` is the finished Response object once the stream ended."""

    def __init__(
        self,
        req: ResponsesRequest,
        *,
        response_id: str,
        created_at: float,
        clock: Callable[[], float],
        on_event: Callable[[Event, int], None] | None = None,
        queued: bool = False,
    ) -> None:
        self._req = req
        self._id = response_id
        self._created_at = created_at
        self._clock = clock
        self._on_event = on_event
        self._builder = OutputBuilder(req.namespaces)
        self._queued = queued
        """A background response: its ``queued_events`` went out when it was submitted, so
        the stream goes on from ``response.in_progress``."""
        self._seq = len(queued_events({})) if queued else 0
        self.final: dict[str, Any] | None = None

    def ran_with(self, temperature: float | None, top_p: float | None) -> None:
        """The sampling the engine runs with, for the Response objects not sent yet."""
        self._req = sampled(self._req, temperature, top_p)

    def _frames(self, events: list[Event]) -> bytes:
        out = []
        for event in events:
            if self._on_event is not None:
                self._on_event(event, self._seq)
            out.append(frame(event, self._seq))
            self._seq += 1
        return b"".join(out)

    def _snapshot(self, status: Status, **fields: Any) -> dict[str, Any]:
        return encode_response(
            self._req, response_id=self._id, created_at=self._created_at, status=status, **fields
        )

    def start(self, prompt: Usage | None = None) -> bytes:
        events: list[Event] = []
        if not self._queued:
            events.append({"type": "response.created", "response": self._snapshot("in_progress")})
        events.append({"type": "response.in_progress", "response": self._snapshot("in_progress")})
        return self._frames(events)

    def feed(self, delta: Delta) -> bytes:
        return self._frames(self._builder.feed(delta))

    def finish(self, final: Delta, timings: object = None) -> bytes:
        events = self._builder.feed(msgspec.structs.replace(final, finish_reason=None, usage=None))
        end = finished(final)
        events += self._builder.finish(status="incomplete" if end.status == "incomplete" else "completed")
        self.final = self._snapshot(
            end.status,
            output=self._builder.items,
            usage=end.usage,
            incomplete=end.incomplete,
            completed_at=self._clock(),
        )
        kind = "response.incomplete" if end.status == "incomplete" else "response.completed"
        events.append({"type": kind, "response": self.final})
        return self._frames(events)

    def error(self, code: str, message: str) -> bytes:
        error = {"code": "server_error", "message": message}
        self.final = self._snapshot("failed", output=self._builder.items, error=error)
        return self._frames(
            [
                {"type": "error", "code": code, "message": message, "param": None},
                {"type": "response.failed", "response": self.final},
            ]
        )

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"

    def mcp_started(self, call_id: str, server: str, tool: str, arguments: str) -> bytes:
        return self._frames(self._builder.mcp_started(call_id, server, tool, arguments))

    def mcp_ended(self, call_id: str, output: str, error: dict[str, Any] | None) -> bytes:
        return self._frames(self._builder.mcp_ended(call_id, output, error))
