"""Typed results: frozen dataclasses built from the daemon's JSON.

Each keeps the whole answer in ``raw`` (a dict), so a field this version does not model
is still there; ``meta`` says what the answer's headers said (trace id, parameters the
daemon ignored or changed, the loading status).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = [
    "ChatChoice",
    "ChatChunk",
    "ChatCompletion",
    "ChatMessage",
    "Embeddings",
    "Explanation",
    "FailoverChain",
    "FailoverTarget",
    "Job",
    "JobPage",
    "JobResult",
    "Meta",
    "Model",
    "PullProgress",
    "RequestCard",
    "Response",
    "ResponseEvent",
    "RunningModel",
    "Setting",
    "Speech",
    "Story",
    "ToolCall",
    "Transcription",
    "Usage",
]


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Meta:
    """What an answer's headers said."""

    status: int
    trace_id: Optional[str]
    headers: Mapping[str, str] = field(repr=False)

    @property
    def ignored(self) -> List[str]:
        """The parameters that had no effect (``X-Blazar-Ignored``)."""
        return _csv(self.headers.get("x-blazar-ignored"))

    @property
    def changed(self) -> List[str]:
        """The parameters run with another value (``X-Blazar-Changed``), as ``name=value``."""
        return _csv(self.headers.get("x-blazar-changed"))

    @property
    def loading(self) -> bool:
        """Whether the answer waited for its engine to start (``X-Blazar-Status: loading``)."""
        return self.headers.get("x-blazar-status") == "loading"

    @classmethod
    def of(cls, status: int, headers: Mapping[str, str]) -> Meta:
        return cls(status=status, trace_id=headers.get("x-blazar-trace-id"), headers=headers)


def _csv(value: Optional[str]) -> List[str]:
    return [part.strip() for part in value.split(",") if part.strip()] if value else []


@dataclass(frozen=True)
class Usage:
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    total_tokens: Optional[int]

    @classmethod
    def from_json(cls, doc: Any) -> Optional[Usage]:
        if not isinstance(doc, dict):
            return None
        prompt = _int(doc.get("prompt_tokens", doc.get("input_tokens")))
        completion = _int(doc.get("completion_tokens", doc.get("output_tokens")))
        total = _int(doc.get("total_tokens"))
        if total is None and prompt is not None and completion is not None:
            total = prompt + completion
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


@dataclass(frozen=True)
class ToolCall:
    id: Optional[str]
    name: str
    arguments: str
    """The arguments as the model wrote them: a JSON text (``parsed()`` decodes it)."""

    def parsed(self) -> Any:
        return json.loads(self.arguments) if self.arguments else {}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ToolCall:
        function = doc.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments) if arguments is not None else ""
        return cls(id=doc.get("id"), name=str(function.get("name") or ""), arguments=arguments)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: Optional[str]
    tool_calls: List[ToolCall]
    reasoning: Optional[str] = None

    @classmethod
    def from_json(cls, doc: Any) -> ChatMessage:
        doc = doc if isinstance(doc, dict) else {}
        content = doc.get("content")
        return cls(
            role=str(doc.get("role") or "assistant"),
            content=content if isinstance(content, str) else None,
            tool_calls=[ToolCall.from_json(c) for c in doc.get("tool_calls") or [] if isinstance(c, dict)],
            reasoning=doc.get("reasoning_content"),
        )


@dataclass(frozen=True)
class ChatChoice:
    index: int
    message: ChatMessage
    finish_reason: Optional[str]


@dataclass(frozen=True)
class ChatCompletion:
    id: str
    model: str
    choices: List[ChatChoice]
    usage: Optional[Usage]
    meta: Meta
    raw: Dict[str, Any] = field(repr=False)

    @property
    def text(self) -> str:
        """The first choice's text ('' when it answered with tool calls only)."""
        return (self.choices[0].message.content or "") if self.choices else ""

    @property
    def tool_calls(self) -> List[ToolCall]:
        return self.choices[0].message.tool_calls if self.choices else []

    @classmethod
    def from_json(cls, doc: Dict[str, Any], meta: Meta) -> ChatCompletion:
        choices = [
            ChatChoice(
                index=_int(c.get("index")) or 0,
                message=ChatMessage.from_json(c.get("message")),
                finish_reason=c.get("finish_reason"),
            )
            for c in doc.get("choices") or []
            if isinstance(c, dict)
        ]
        return cls(
            id=str(doc.get("id") or ""),
            model=str(doc.get("model") or ""),
            choices=choices,
            usage=Usage.from_json(doc.get("usage")),
            meta=meta,
            raw=doc,
        )


@dataclass(frozen=True)
class ChatChunk:
    """One ``chat.completion.chunk`` of a stream (its first choice; ``raw`` has them all)."""

    text: str
    finish_reason: Optional[str]
    tool_calls: List[Dict[str, Any]]
    """The tool-call deltas as sent: ``index``, then ``id``/``function.name`` once and
    ``function.arguments`` in pieces."""
    usage: Optional[Usage]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> ChatChunk:
        choices = [c for c in doc.get("choices") or [] if isinstance(c, dict)]
        first = choices[0] if choices else {}
        delta = first.get("delta") or {}
        text = delta.get("content")
        return cls(
            text=text if isinstance(text, str) else "",
            finish_reason=first.get("finish_reason"),
            tool_calls=[c for c in delta.get("tool_calls") or [] if isinstance(c, dict)],
            usage=Usage.from_json(doc.get("usage")),
            raw=doc,
        )


@dataclass(frozen=True)
class Response:
    """An OpenAI Responses object (``POST /v1/responses``)."""

    id: str
    status: str
    model: str
    output: List[Dict[str, Any]]
    usage: Optional[Usage]
    error: Optional[Dict[str, Any]]
    meta: Optional[Meta]
    raw: Dict[str, Any] = field(repr=False)

    @property
    def output_text(self) -> str:
        """The text of every ``output_text`` part of the ``message`` items, joined."""
        return "".join(
            part.get("text", "")
            for item in self.output
            if item.get("type") == "message"
            for part in item.get("content") or []
            if isinstance(part, dict) and part.get("type") == "output_text"
        )

    @classmethod
    def from_json(cls, doc: Dict[str, Any], meta: Optional[Meta] = None) -> Response:
        return cls(
            id=str(doc.get("id") or ""),
            status=str(doc.get("status") or ""),
            model=str(doc.get("model") or ""),
            output=[i for i in doc.get("output") or [] if isinstance(i, dict)],
            usage=Usage.from_json(doc.get("usage")),
            error=doc.get("error"),
            meta=meta,
            raw=doc,
        )


@dataclass(frozen=True)
class ResponseEvent:
    """One event of a streamed response: ``type`` (``response.output_text.delta``, …) and its data."""

    type: str
    data: Dict[str, Any] = field(repr=False)

    @property
    def delta(self) -> str:
        value = self.data.get("delta")
        return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class Embeddings:
    model: str
    vectors: List[List[float]]
    usage: Optional[Usage]
    meta: Meta
    raw: Dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Transcription:
    text: str
    meta: Meta
    raw: Any = field(repr=False)
    """The whole answer: a dict for ``json``/``verbose_json``, else the text (srt, vtt, text)."""


@dataclass(frozen=True)
class Speech:
    audio: bytes = field(repr=False)
    content_type: str
    sample_rate: Optional[int]
    meta: Meta


@dataclass(frozen=True)
class Model:
    id: str
    created: Optional[int]
    owned_by: Optional[str]
    raw: Dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class RunningModel:
    """A model whose engine is starting or ready (``GET /api/ps``)."""

    name: str
    engine: Optional[str]
    slots: Optional[int]
    in_flight: Optional[int]
    context_length: Optional[int]
    expires_at: Optional[str]
    size: Optional[int]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> RunningModel:
        return cls(
            name=str(doc.get("name") or doc.get("model") or ""),
            engine=doc.get("engine"),
            slots=_int(doc.get("slots")),
            in_flight=_int(doc.get("in_flight")),
            context_length=_int(doc.get("context_length")),
            expires_at=doc.get("expires_at"),
            size=_int(doc.get("size")),
            raw=doc,
        )


@dataclass(frozen=True)
class PullProgress:
    """One progress line of a pull: ``status`` in Ollama's words, byte counts while downloading."""

    status: str
    digest: Optional[str]
    total: Optional[int]
    completed: Optional[int]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> PullProgress:
        return cls(
            status=str(doc.get("status") or ""),
            digest=doc.get("digest"),
            total=_int(doc.get("total")),
            completed=_int(doc.get("completed")),
            raw=doc,
        )


@dataclass(frozen=True)
class Setting:
    name: str
    value: Any
    source: str
    key: Optional[str]
    note: Optional[str]


@dataclass(frozen=True)
class Explanation:
    """The settings a model runs (or would run) with, and where each came from."""

    model: str
    path: Optional[str]
    loaded: bool
    settings: List[Setting]
    raw: Dict[str, Any] = field(repr=False)

    def __getitem__(self, name: str) -> Setting:
        for setting in self.settings:
            if setting.name == name:
                return setting
        raise KeyError(name)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> Explanation:
        settings = [
            Setting(
                name=str(s.get("name")),
                value=s.get("value"),
                source=str(s.get("source")),
                key=s.get("key"),
                note=s.get("note"),
            )
            for s in doc.get("settings") or []
            if isinstance(s, dict)
        ]
        return cls(
            model=str(doc.get("model") or ""),
            path=doc.get("path"),
            loaded=bool(doc.get("loaded")),
            settings=settings,
            raw=doc,
        )


@dataclass(frozen=True)
class Story:
    """One request's story (``GET /api/why``): the ledger's record and its sentences."""

    trace_id: str
    model: Optional[str]
    outcome: Optional[str]
    status: Optional[int]
    code: Optional[str]
    duration_ms: Optional[float]
    lines: List[str]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> Story:
        return cls(
            trace_id=str(doc.get("trace_id") or ""),
            model=doc.get("model"),
            outcome=doc.get("outcome"),
            status=_int(doc.get("status")),
            code=doc.get("code"),
            duration_ms=doc.get("duration_ms"),
            lines=[str(line) for line in doc.get("lines") or []],
            raw=doc,
        )


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    status: str
    """``queued``, ``running``, ``completed``, ``failed`` or ``cancelled``."""
    model: Optional[str]
    error: Any
    progress: Dict[str, Any]
    raw: Dict[str, Any] = field(repr=False)

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> Job:
        progress = doc.get("progress")
        return cls(
            id=str(doc.get("id") or ""),
            kind=str(doc.get("kind") or ""),
            status=str(doc.get("status") or ""),
            model=doc.get("model"),
            error=doc.get("error"),
            progress=progress if isinstance(progress, dict) else {},
            raw=doc,
        )


@dataclass(frozen=True)
class JobPage:
    data: List[Job]
    has_more: bool
    first_id: Optional[str]
    last_id: Optional[str]


@dataclass(frozen=True)
class JobResult:
    """A completed job's result as its runner made it (a transcript, a pulled model's name)."""

    content: bytes = field(repr=False)
    content_type: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass(frozen=True)
class FailoverTarget:
    target: str
    state: str
    pinned: bool
    failures: Optional[int]
    reason: Optional[str]
    raw: Dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class FailoverChain:
    name: str
    pinned: Optional[str]
    targets: List[FailoverTarget]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> FailoverChain:
        targets = [
            FailoverTarget(
                target=str(t.get("target")),
                state=str(t.get("state")),
                pinned=bool(t.get("pinned")),
                failures=_int(t.get("failures")),
                reason=t.get("reason"),
                raw=t,
            )
            for t in doc.get("targets") or []
            if isinstance(t, dict)
        ]
        return cls(name=str(doc.get("name")), pinned=doc.get("pinned"), targets=targets, raw=doc)


@dataclass(frozen=True)
class RequestCard:
    """A live or recent request (``GET /v1/requests``); its ``id`` is the trace id."""

    id: str
    model: Optional[str]
    state: str
    path: Optional[str]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> RequestCard:
        return cls(
            id=str(doc.get("id") or ""),
            model=doc.get("model"),
            state=str(doc.get("state") or ""),
            path=doc.get("path"),
            raw=doc,
        )
