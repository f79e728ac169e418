"""The transport-free half of the SDK: requests as values, answers decoded from bytes.

Both clients (``urllib`` and ``asyncio``) send the same ``Request`` values and hand what
comes back to the same decoders, so the two behave alike by construction.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar, Union
from urllib.parse import quote, urlencode

from ._errors import SDK_BAD_RESPONSE, SDK_STREAM_CUT, BlazarError, error_from_body, error_from_event
from ._types import ChatChunk, Meta, PullProgress, ResponseEvent

__all__ = [
    "DEFAULT_URL",
    "Answer",
    "Call",
    "ChatDecoder",
    "JobEventDecoder",
    "PullDecoder",
    "Request",
    "ResponseDecoder",
    "resolve",
]

DEFAULT_URL = "http://127.0.0.1:11435"
T = TypeVar("T")
FileArg = Union[bytes, Tuple[str, bytes], Tuple[str, bytes, str]]
"""An upload: its bytes, or ``(filename, bytes)``, or ``(filename, bytes, content_type)``."""


def resolve(base_url: Optional[str], api_key: Optional[str]) -> Tuple[str, Optional[str]]:
    """The daemon's URL and key: the arguments, else ``BLAZAR_URL`` / ``BLAZAR_API_KEY``."""
    url = base_url or os.environ.get("BLAZAR_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("BLAZAR_API_KEY") or None
    url = url.rstrip("/")
    if url.endswith("/v1"):  # an OpenAI-style base URL names the same daemon
        url = url[: -len("/v1")]
    return url, key


def path(*parts: str) -> str:
    """A path with each part quoted (a model name may contain ``/``, which stays)."""
    return "/" + "/".join(quote(p, safe="/:@") for p in parts)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    query: Dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return self.path + ("?" + urlencode(self.query) if self.query else "")


def json_request(
    method: str,
    path: str,
    body: Any = None,
    *,
    headers: Optional[Mapping[str, str]] = None,
    query: Optional[Mapping[str, Any]] = None,
) -> Request:
    hdrs = {"accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        hdrs["content-type"] = "application/json"
    hdrs.update(headers or {})
    q = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
    return Request(method, path, data, hdrs, q)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def multipart_request(
    path: str, fields: Mapping[str, Any], files: Mapping[str, FileArg], *, headers: Mapping[str, str]
) -> Request:
    """A ``multipart/form-data`` POST (uploads: transcriptions, batch input files)."""
    boundary = "blazar-sdk-" + uuid.uuid4().hex
    out: List[bytes] = []
    for name, value in fields.items():
        if value is None:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
            out.append(_query_value(v).encode("utf-8") + b"\r\n")
    for name, file in files.items():
        filename, data, ctype = _file_parts(file)
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {ctype}\r\n\r\n".encode()
        )
        out.append(data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    hdrs = {"accept": "application/json", "content-type": f"multipart/form-data; boundary={boundary}"}
    hdrs.update(headers)
    return Request("POST", path, b"".join(out), hdrs)


def _file_parts(file: FileArg) -> Tuple[str, bytes, str]:
    if isinstance(file, bytes):
        return "upload", file, "application/octet-stream"
    if len(file) == 2:
        return file[0], file[1], "application/octet-stream"
    return file[0], file[1], file[2]


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def meta(self) -> Meta:
        return Meta.of(self.status, self.headers)

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise BlazarError(
                f"the daemon's answer is not JSON: {self.body[:200]!r}",
                blazar_code=SDK_BAD_RESPONSE,
                status=self.status,
                trace_id=self.headers.get("x-blazar-trace-id"),
            ) from exc

    def check(self) -> Answer:
        if self.status >= 400:
            raise error_from_body(self.status, self.body, self.headers)
        return self


@dataclass(frozen=True)
class Call(Generic[T]):
    """A request and how to read its whole answer."""

    request: Request
    decode: Callable[[Answer], T]


# -- streams ------------------------------------------------------------------------------


class _Sse:
    """Server-sent events, one line at a time (the SSE format: ``event:``/``data:``, blank line)."""

    def __init__(self) -> None:
        self._event: Optional[str] = None
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Tuple[Optional[str], str]]:
        if line == "":
            if not self._data:
                self._event = None
                return None
            done = (self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return done
        if line.startswith(":"):
            return None  # a comment: keep-alives, MCP progress notes
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


class Decoder(Generic[T]):
    """Turns a stream's lines into items; ``end()`` checks the stream ended as it should."""

    trace_id: Optional[str] = None

    def feed(self, line: str) -> List[T]:
        raise NotImplementedError

    def end(self) -> None:
        return None


def _decode_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BlazarError(
            f"a stream event is not JSON: {text[:200]!r}", blazar_code=SDK_BAD_RESPONSE
        ) from exc


class ChatDecoder(Decoder[ChatChunk]):
    """OpenAI chat-completion chunks; a stream that ends without ``[DONE]`` failed."""

    def __init__(self) -> None:
        self._sse = _Sse()
        self.done = False

    def feed(self, line: str) -> List[ChatChunk]:
        got = self._sse.feed(line)
        if got is None:
            return []
        _, data = got
        if data == "[DONE]":
            self.done = True
            return []
        doc = _decode_json(data)
        err = error_from_event(doc, self.trace_id)
        if err is not None:
            raise err
        return [ChatChunk.from_json(doc)]

    def end(self) -> None:
        if not self.done:
            raise BlazarError(
                "the stream ended without [DONE]: the answer is incomplete",
                blazar_code=SDK_STREAM_CUT,
                trace_id=self.trace_id,
            )


_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


class ResponseDecoder(Decoder[ResponseEvent]):
    """Responses API events; an ``error`` event raises, and the stream must end with
    ``response.completed`` or ``response.incomplete``."""

    def __init__(self) -> None:
        self._sse = _Sse()
        self.done = False

    def feed(self, line: str) -> List[ResponseEvent]:
        got = self._sse.feed(line)
        if got is None:
            return []
        event, data = got
        doc = _decode_json(data)
        kind = str(doc.get("type") or event or "") if isinstance(doc, dict) else str(event or "")
        if kind == "error":
            raise error_from_event(doc, self.trace_id) or BlazarError(data, blazar_code=SDK_BAD_RESPONSE)
        if kind == "response.failed":
            error = (doc.get("response") or {}).get("error") or {}
            raise BlazarError(
                str(error.get("message") or "the response failed"),
                blazar_code=SDK_BAD_RESPONSE,
                trace_id=self.trace_id,
                body=doc,
            )
        if kind in _RESPONSE_ENDS:
            self.done = True
        return [ResponseEvent(type=kind, data=doc if isinstance(doc, dict) else {})]

    def end(self) -> None:
        if not self.done:
            raise BlazarError(
                "the stream ended before response.completed: the answer is incomplete",
                blazar_code=SDK_STREAM_CUT,
                trace_id=self.trace_id,
            )


class PullDecoder(Decoder[PullProgress]):
    """``/api/pull``'s NDJSON progress; an error line raises, the last line says ``success``."""

    def __init__(self) -> None:
        self.last: Optional[PullProgress] = None

    def feed(self, line: str) -> List[PullProgress]:
        if not line.strip():
            return []
        doc = _decode_json(line)
        err = error_from_event(doc, self.trace_id)
        if err is not None:
            raise err
        self.last = PullProgress.from_json(doc)
        return [self.last]

    def end(self) -> None:
        if self.last is None or self.last.status != "success":
            raise BlazarError(
                "the pull's progress stream ended before `success`",
                blazar_code=SDK_STREAM_CUT,
                trace_id=self.trace_id,
            )


class JobEventDecoder(Decoder[Dict[str, Any]]):
    """A job's events followed live (``GET /v1/jobs/{id}/events`` as SSE): ``seq``, ``kind``, ``data``."""

    def __init__(self) -> None:
        self._sse = _Sse()
        self._id: Optional[str] = None

    def feed(self, line: str) -> List[Dict[str, Any]]:
        if line.startswith("id:"):
            self._id = line[3:].strip()
            return []
        got = self._sse.feed(line)
        if got is None:
            return []
        event, data = got
        try:
            payload: Any = json.loads(data)
        except ValueError:
            payload = data
        seq = int(self._id) if self._id and self._id.isdigit() else None
        return [{"seq": seq, "kind": event or "message", "data": payload}]
