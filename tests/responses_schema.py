"""The Responses API held to its published schemas, strictly.

Every Response object and every streamed event is checked twice:

(a) against the ``openai`` SDK's pydantic types (OpenAI's published reference as the SDK
    models it): pydantic's own validation in strict mode (a required field missing or of the
    wrong type fails), then an extra-field check that walks the validated model beside the
    JSON and fails on any key the chosen model does not declare, down through output items,
    content parts, tools, usage and errors;
(b) against ``openresponses-types`` (the Open Responses specification's models), in strict
    mode with the same extra-field check (the package's models ignore extra keys themselves).

Where the two disagree, OpenAI's reference wins (docs/api.md, OpenAI Responses routes). Each
departure from a plain check is named below, with its reason: what the SDK lacks that Open
Responses declares, what Open Responses lacks or shapes otherwise that OpenAI declares. A
key that is on no list fails.

``installed()`` puts the check on every HTTP response the tests' httpx clients (and httpx2's,
the openai SDK's own) receive from a ``/v1/responses`` route: JSON bodies once read, SSE events as
they arrive (tests/conftest.py turns it on for the whole suite).
"""

from __future__ import annotations

import json
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any

import httpx
import openresponses_types as orr
import pydantic
from openai import __version__ as OPENAI_VERSION
from openai.types import responses as sdk
from openai.types.responses import ResponseStreamEvent

__all__ = [
    "OPENAI_VERSION",
    "OPEN_RESPONSES_VERSION",
    "SEEN",
    "SchemaError",
    "check_event",
    "check_events",
    "check_response",
    "installed",
    "parse_sse",
]

OPEN_RESPONSES_VERSION = orr.__version__

SEEN: Counter[str] = Counter()
"""How many Response objects (``response``) and events (``event``) the hook has checked."""


Allowed = Callable[[type, str], bool]
"""Whether a model may carry a key it does not declare (one of the lists below)."""


class SchemaError(AssertionError):
    """A Response or event the published schemas refuse."""


# -- the departures, each with its reason ----------------------------------------

SDK_GAPS: dict[type[pydantic.BaseModel], tuple[type[pydantic.BaseModel], frozenset[str]]] = {
    # OpenAI's reference gives a Response its presence and frequency penalties; the SDK's type
    # (3.63) has not caught up, nor with ``store`` (whether the response was stored). Accepted
    # because Open Responses declares (and requires) them, so (b) checks their values.
    sdk.Response: (orr.ResponseResource, frozenset({"presence_penalty", "frequency_penalty", "store"})),
}
"""Keys OpenAI's reference has and the SDK's model lacks: accepted on the SDK side only where
the named Open Responses model declares them (checked when this module loads)."""

REFERENCE_ONLY: dict[type[pydantic.BaseModel], frozenset[str]] = {
    # OpenAI's reference requires the function's ``name`` on this event (its SDK's type lags,
    # and Open Responses leaves it out): a conflict, decided for OpenAI (docs/api.md).
    sdk.ResponseFunctionCallArgumentsDoneEvent: frozenset({"name"}),
    orr.ResponseFunctionCallArgumentsDoneStreamingEvent: frozenset({"name"}),
}
"""Keys OpenAI's reference requires that neither model declares."""

OPENAI_ONLY_FIELDS: dict[type[pydantic.BaseModel], tuple[type[pydantic.BaseModel], frozenset[str]]] = {
    # A Response's conversation and (deprecated) user: OpenAI's fields, not in Open Responses.
    orr.ResponseResource: (sdk.Response, frozenset({"conversation", "user"})),
    # OpenAI's usage counts the tokens written to its prompt cache (required by the SDK's type).
    orr.InputTokensDetails: (sdk.response_usage.InputTokensDetails, frozenset({"cache_write_tokens"})),
    # OpenAI's reasoning item carries its status; Open Responses' has none.
    orr.ReasoningBody: (sdk.ResponseReasoningItem, frozenset({"status"})),
    # A call to a function of a ``namespace`` tool names its namespace (OpenAI's field).
    orr.FunctionCall: (sdk.ResponseFunctionToolCall, frozenset({"namespace"})),
}
"""Keys the named SDK model declares (so (a) checks them) that Open Responses' lacks."""

OPENAI_ONLY_ITEMS = frozenset({"mcp_call"})
"""Output item types OpenAI declares and Open Responses does not (the gateway's MCP loop shows
its calls as OpenAI's ``mcp_call`` items): checked by (a), left out of a Response for (b)."""

OPENAI_ONLY_TOOLS = frozenset({"namespace"})
"""Tool types OpenAI declares and Open Responses does not (Open Responses has function tools
only): checked by (a), left out of a Response's ``tools`` for (b)."""

OPENAI_ONLY_EVENTS = frozenset(
    {
        # The MCP loop's progress, OpenAI's events for its mcp_call items.
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
        # OpenAI's error event has code, message and param at its top level; Open Responses
        # nests an error object instead: a conflict, decided for OpenAI (docs/api.md).
        "error",
    }
)
"""Event types checked by (a) only."""

RENAMED_EVENTS = {
    # OpenAI names the reasoning text's events after its content part (``reasoning_text``);
    # Open Responses calls the same events ``response.reasoning.*``: OpenAI's name is sent,
    # the body is checked against Open Responses' event of the other name.
    "response.reasoning_text.delta": "response.reasoning.delta",
    "response.reasoning_text.done": "response.reasoning.done",
}


def _untyped_schema(doc: Any) -> Any:
    """openresponses-types 2.4.0 types a Response's ``text.format.schema`` as null (its
    generator's reading of a free-form JSON schema), so no real schema could pass: (b) sees the
    key with null in it; (a) checks the value as an object."""
    if isinstance(doc, dict):
        text = doc.get("text")
        if isinstance(text, dict) and isinstance(text.get("format"), dict) and "schema" in text["format"]:
            doc = {**doc, "text": {**text, "format": {**text["format"], "schema": None}}}
    return doc


for _model, (_declared_by, _keys) in [*SDK_GAPS.items(), *OPENAI_ONLY_FIELDS.items()]:
    assert _keys <= set(_declared_by.model_fields), f"{_declared_by.__name__} does not declare {_keys}"


# -- the models, by event type ---------------------------------------------------


def _literal_type(model: type[pydantic.BaseModel]) -> str:
    (value,) = typing.get_args(model.model_fields["type"].annotation) or (None,)
    if value is None:  # an enum of one member
        annotation = model.model_fields["type"].annotation
        assert isinstance(annotation, type) and issubclass(annotation, Enum), model
        (member,) = list(annotation)
        value = member.value
    return str(value)


SDK_EVENTS: dict[str, type[pydantic.BaseModel]] = {
    _literal_type(m): m for m in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
ORR_EVENTS: dict[str, type[pydantic.BaseModel]] = {
    _literal_type(m): m
    for name in dir(orr)
    if name.endswith("StreamingEvent")
    and isinstance(m := getattr(orr, name), type)
    and issubclass(m, pydantic.BaseModel)
}


# -- the checks ------------------------------------------------------------------


def _validate(model: type[pydantic.BaseModel], doc: Any, where: str) -> pydantic.BaseModel:
    try:
        return model.model_validate_json(json.dumps(doc), strict=True)
    except pydantic.ValidationError as exc:
        raise SchemaError(f"{where}: {model.__module__}.{model.__name__} refuses it:\n{exc}") from None


def _extras(value: Any, raw: Any, path: str, allowed: Allowed) -> Iterator[str]:
    """Keys of ``raw`` that the model chosen for it (``value``) does not declare, recursively."""
    if isinstance(value, pydantic.RootModel):
        yield from _extras(value.root, raw, path, allowed)
    elif isinstance(value, pydantic.BaseModel) and isinstance(raw, dict):
        fields = {(f.alias or name): name for name, f in type(value).model_fields.items()}
        for key, inner in raw.items():
            if key not in fields:
                if not allowed(type(value), key):
                    yield f"{path}.{key} (not in {type(value).__name__})"
            else:
                yield from _extras(getattr(value, fields[key]), inner, f"{path}.{key}", allowed)
    elif isinstance(value, list | tuple) and isinstance(raw, list):
        for i, (v, r) in enumerate(zip(value, raw, strict=False)):
            yield from _extras(v, r, f"{path}[{i}]", allowed)
    elif isinstance(value, dict) and isinstance(raw, dict):
        for key, v in value.items():
            yield from _extras(v, raw.get(key), f"{path}.{key}", allowed)


def _listed(listing: dict[type[pydantic.BaseModel], frozenset[str]], model: type, key: str) -> bool:
    """Whether ``key`` is listed for ``model`` or a model it derives from (Open Responses derives
    an event's item models from the items')."""
    return any(key in listing.get(base, ()) for base in model.__mro__)


def _sdk_allowed(model: type, key: str) -> bool:
    gaps = {m: keys for m, (_, keys) in SDK_GAPS.items()}
    return _listed(gaps, model, key) or _listed(REFERENCE_ONLY, model, key)


def _orr_allowed(model: type, key: str) -> bool:
    only = {m: keys for m, (_, keys) in OPENAI_ONLY_FIELDS.items()}
    return _listed(only, model, key) or _listed(REFERENCE_ONLY, model, key)


def _strict(
    model: type[pydantic.BaseModel], doc: Any, where: str, allowed: Callable[[type, str], bool]
) -> None:
    value = _validate(model, doc, where)
    extra = list(_extras(value, doc, where, allowed))
    if extra:
        raise SchemaError(f"{where}: keys {model.__name__} does not declare: {', '.join(extra)}")


def _open_responses_view(response: dict[str, Any]) -> dict[str, Any]:
    """A Response as (b) checks it: without OpenAI's own item and tool types."""
    doc = dict(response)
    if isinstance(doc.get("output"), list):
        doc["output"] = [i for i in doc["output"] if i.get("type") not in OPENAI_ONLY_ITEMS]
    if isinstance(doc.get("tools"), list):
        doc["tools"] = [t for t in doc["tools"] if t.get("type") not in OPENAI_ONLY_TOOLS]
    return _untyped_schema(doc)


def check_response(doc: Any, where: str = "response") -> None:
    """A Response object, against both schemas."""
    if not isinstance(doc, dict):
        raise SchemaError(f"{where}: not a JSON object: {doc!r}")
    _strict(sdk.Response, doc, where, _sdk_allowed)
    _strict(orr.ResponseResource, _open_responses_view(doc), where, _orr_allowed)


def check_event(event: Any, where: str = "event") -> None:
    """One streamed event (its JSON, ``sequence_number`` included), against both schemas."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise SchemaError(f"{where}: not an event: {event!r}")
    kind: str = event["type"]
    where = f"{where} {kind}"
    model = SDK_EVENTS.get(kind)
    if model is None:
        raise SchemaError(f"{where}: the openai SDK has no event of this type")
    _strict(model, event, where, _sdk_allowed)
    if kind in OPENAI_ONLY_EVENTS:
        return
    item = event.get("item")
    if isinstance(item, dict) and item.get("type") in OPENAI_ONLY_ITEMS:
        return  # an output_item event of an item Open Responses does not have
    named = RENAMED_EVENTS.get(kind, kind)
    ours = ORR_EVENTS.get(named)
    if ours is None:
        raise SchemaError(f"{where}: Open Responses has no event of this type (and none is allowed)")
    view = {**event, "type": named}
    if isinstance(view.get("response"), dict):
        view["response"] = _open_responses_view(view["response"])
    _strict(ours, view, where, _orr_allowed)


def check_events(events: list[dict[str, Any]], where: str = "stream") -> None:
    """A stream's events, each checked, and numbered without a gap (from where it starts: a
    resumed stream starts after 0)."""
    for event in events:
        check_event(event, where)
    numbers = [e["sequence_number"] for e in events]
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise SchemaError(f"{where}: sequence numbers are not consecutive: {numbers}")


def parse_sse(text: str) -> list[dict[str, Any]]:
    """The events of an SSE body; each ``event:`` line must name its data's ``type``."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if not data:
            continue
        event = json.loads("\n".join(data))
        if name is not None and name != event.get("type"):
            raise SchemaError(f"SSE: `event: {name}` carries a {event.get('type')!r} event")
        events.append(event)
    return events


# -- on the wire -------------------------------------------------------------------


def _what(request: Any) -> str | None:
    """What a ``/v1/responses`` route answers: ``response``, or None (not a Response)."""
    path = request.url.path
    if not path.startswith("/v1/responses"):
        return None
    rest = path.removeprefix("/v1/responses").strip("/").split("/")
    if request.method == "POST" and rest == [""]:
        return "response"
    if request.method == "GET" and len(rest) == 1 and rest[0]:
        return "response"  # retrieve (or its stream)
    if request.method == "POST" and len(rest) == 2 and rest[1] == "cancel":
        return "response"
    return None


class _Watch:
    """Reads a response's bytes as they pass: SSE events are checked one by one as each
    completes, a JSON body once it has all come."""

    def __init__(self, request: Any, response: Any) -> None:
        self.where = f"{request.method} {request.url.path}"
        self.sse = response.headers.get("content-type", "").startswith("text/event-stream")
        self.buffer = b""
        self.numbers: list[int] = []

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if not self.sse:
            return
        *blocks, self.buffer = self.buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for block in blocks:
            for event in parse_sse(block.decode()):
                check_event(event, self.where)
                SEEN["event"] += 1
                number = event["sequence_number"]
                if self.numbers and number != self.numbers[-1] + 1:
                    raise SchemaError(f"{self.where}: event {number} follows {self.numbers[-1]}")
                self.numbers.append(number)

    def end(self) -> None:
        if self.sse:
            self.feed(b"\n\n")
        elif self.buffer:
            check_response(json.loads(self.buffer), self.where)
            SEEN["response"] += 1


class _Hook:
    """The check, put on one httpx-like package's transports (httpx, and httpx2 which the openai
    SDK uses: the same API, other classes)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        sync_base: type = lib.SyncByteStream
        async_base: type = lib.AsyncByteStream

        class Stream(sync_base):
            def __init__(self, inner: Any, watch: _Watch) -> None:
                self._inner, self._watch = inner, watch

            def __iter__(self) -> Iterator[bytes]:
                for chunk in self._inner:
                    self._watch.feed(chunk)
                    yield chunk
                self._watch.end()

            def close(self) -> None:
                self._inner.close()

        class AsyncStream(async_base):
            def __init__(self, inner: Any, watch: _Watch) -> None:
                self._inner, self._watch = inner, watch

            async def __aiter__(self) -> typing.AsyncIterator[bytes]:
                async for chunk in self._inner:
                    self._watch.feed(chunk)
                    yield chunk
                self._watch.end()

            async def aclose(self) -> None:
                await self._inner.aclose()

        self.stream, self.async_stream = Stream, AsyncStream
        self.sync_send = lib.HTTPTransport.handle_request
        self.async_send = lib.AsyncHTTPTransport.handle_async_request

    def checked(self, request: Any, response: Any) -> Any:
        """``response`` whose body is checked as it is read, when it is a successful answer of
        a Responses route; otherwise ``response`` itself."""
        if _what(request) is None or not 200 <= response.status_code < 300:
            return response
        watch = _Watch(request, response)
        if isinstance(response.stream, self.lib.AsyncByteStream):
            response.stream = self.async_stream(response.stream, watch)
        else:
            response.stream = self.stream(response.stream, watch)
        return response

    def install(self) -> None:
        sync_send, async_send, checked = self.sync_send, self.async_send, self.checked

        def handle_request(transport: Any, request: Any) -> Any:
            return checked(request, sync_send(transport, request))

        async def handle_async_request(transport: Any, request: Any) -> Any:
            return checked(request, await async_send(transport, request))

        self.lib.HTTPTransport.handle_request = handle_request
        self.lib.AsyncHTTPTransport.handle_async_request = handle_async_request

    def remove(self) -> None:
        self.lib.HTTPTransport.handle_request = self.sync_send
        self.lib.AsyncHTTPTransport.handle_async_request = self.async_send


def _clients() -> list[Any]:
    """httpx, and httpx2 where it is installed (the openai SDK's own HTTP client since 3.x)."""
    libs: list[Any] = [httpx]
    try:
        import httpx2  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pass
    else:
        libs.append(httpx2)
    return libs


@contextmanager
def installed() -> Iterator[None]:
    """Check the Responses routes' answers to every httpx or httpx2 client in this process
    while open."""
    if _INSTALLED:  # already, by an outer conftest (the repository's and the SDK's both ask)
        yield
        return
    hooks = [_Hook(lib) for lib in _clients()]
    for hook in hooks:
        hook.install()
    _INSTALLED.append(True)
    try:
        yield
    finally:
        _INSTALLED.clear()
        for hook in hooks:
            hook.remove()


_INSTALLED: list[bool] = []
