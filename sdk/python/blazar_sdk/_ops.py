"""Every operation of the SDK as a value: the request to send and how to read its answer.

The daemon's routes, each in one place (see the daemon's docs/api.md for what they do).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._types import (
    ChatCompletion,
    Embeddings,
    Explanation,
    FailoverChain,
    Job,
    JobPage,
    JobResult,
    Model,
    RequestCard,
    Response,
    RunningModel,
    Speech,
    Story,
    Transcription,
    Usage,
)
from ._wire import Answer, Call, FileArg, Request, json_request, multipart_request, path

Mcp = Union[str, Sequence[str], None]
"""MCP servers whose tools the daemon runs for a request: a name, names, ``"all"`` or ``"none"``."""


def _body(base: Dict[str, Any], **optional: Any) -> Dict[str, Any]:
    base.update({k: v for k, v in optional.items() if v is not None})
    return base


def _mcp(value: Mcp) -> Any:
    return value if value is None or isinstance(value, str) else list(value)


# -- inference ----------------------------------------------------------------------------


def chat(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    stream: bool,
    tools: Optional[Sequence[Mapping[str, Any]]],
    mcp: Mcp,
    best_of: Optional[int],
    params: Mapping[str, Any],
    headers: Mapping[str, str],
) -> Request:
    body = _body(
        {"model": model, "messages": list(messages)},
        tools=list(tools) if tools is not None else None,
        mcp=_mcp(mcp),
        best_of=best_of,
    )
    body.update(params)
    if stream:
        body["stream"] = True
        return json_request(
            "POST", "/v1/chat/completions", body, headers={"accept": "text/event-stream", **headers}
        )
    return json_request("POST", "/v1/chat/completions", body, headers=headers)


def decode_chat(answer: Answer) -> ChatCompletion:
    return ChatCompletion.from_json(answer.json(), answer.meta)


def responses(
    model: str,
    input: Union[str, Sequence[Mapping[str, Any]]],
    *,
    stream: bool,
    instructions: Optional[str],
    tools: Optional[Sequence[Mapping[str, Any]]],
    mcp: Mcp,
    best_of: Optional[int],
    previous_response_id: Optional[str],
    background: Optional[bool],
    params: Mapping[str, Any],
    headers: Mapping[str, str],
) -> Request:
    body = _body(
        {"model": model, "input": input if isinstance(input, str) else list(input)},
        instructions=instructions,
        tools=list(tools) if tools is not None else None,
        mcp=_mcp(mcp),
        best_of=best_of,
        previous_response_id=previous_response_id,
        background=background,
    )
    body.update(params)
    if stream:
        body["stream"] = True
        return json_request("POST", "/v1/responses", body, headers={"accept": "text/event-stream", **headers})
    return json_request("POST", "/v1/responses", body, headers=headers)


def decode_response(answer: Answer) -> Response:
    return Response.from_json(answer.json(), answer.meta)


def get_response(response_id: str) -> Call[Response]:
    return Call(json_request("GET", path("v1", "responses", response_id)), decode_response)


def embed(
    model: str, input: Union[str, Sequence[str]], dimensions: Optional[int], params: Mapping[str, Any]
) -> Call[Embeddings]:
    body = _body(
        {"model": model, "input": input if isinstance(input, str) else list(input)}, dimensions=dimensions
    )
    body.update(params)

    def decode(answer: Answer) -> Embeddings:
        doc = answer.json()
        rows = sorted(
            (d for d in doc.get("data") or [] if isinstance(d, dict)), key=lambda d: d.get("index", 0)
        )
        return Embeddings(
            model=str(doc.get("model") or model),
            vectors=[list(d.get("embedding") or []) for d in rows],
            usage=Usage.from_json(doc.get("usage")),
            meta=answer.meta,
            raw=doc,
        )

    return Call(json_request("POST", "/v1/embeddings", body), decode)


def transcribe_request(
    model: str,
    file: FileArg,
    *,
    language: Optional[str],
    prompt: Optional[str],
    response_format: str,
    temperature: Optional[float],
    translate: bool,
    job: bool,
    params: Mapping[str, Any],
    headers: Mapping[str, str],
) -> Request:
    fields: Dict[str, Any] = {
        "model": model,
        "language": language,
        "prompt": prompt,
        "response_format": response_format,
        "temperature": temperature,
    }
    fields.update(params)
    if job:
        fields["async"] = True
    route = "/v1/audio/translations" if translate else "/v1/audio/transcriptions"
    return multipart_request(route, fields, {"file": file}, headers=headers)


def decode_transcription(answer: Answer) -> Transcription:
    ctype = answer.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        doc = answer.json()
        return Transcription(text=str(doc.get("text") or ""), meta=answer.meta, raw=doc)
    text = answer.body.decode("utf-8")
    return Transcription(text=text, meta=answer.meta, raw=text)


def speech(
    model: str, input: str, voice: Optional[str], response_format: str, speed: Optional[float]
) -> Call[Speech]:
    body = _body(
        {"model": model, "input": input, "response_format": response_format}, voice=voice, speed=speed
    )

    def decode(answer: Answer) -> Speech:
        rate = answer.headers.get("x-sample-rate")
        return Speech(
            audio=answer.body,
            content_type=answer.headers.get("content-type", ""),
            sample_rate=int(rate) if rate and rate.isdigit() else None,
            meta=answer.meta,
        )

    return Call(json_request("POST", "/v1/audio/speech", body, headers={"accept": "*/*"}), decode)


# -- models and the daemon ----------------------------------------------------------------


def models(include_remote: bool) -> Call[List[Model]]:
    def decode(answer: Answer) -> List[Model]:
        return [
            Model(id=str(m.get("id")), created=m.get("created"), owned_by=m.get("owned_by"), raw=m)
            for m in answer.json().get("data") or []
            if isinstance(m, dict)
        ]

    query = {"include": "remote"} if include_remote else None
    return Call(json_request("GET", "/v1/models", query=query), decode)


def ps() -> Call[List[RunningModel]]:
    def decode(answer: Answer) -> List[RunningModel]:
        return [RunningModel.from_json(m) for m in answer.json().get("models") or [] if isinstance(m, dict)]

    return Call(json_request("GET", "/api/ps"), decode)


def pull(name: str) -> Request:
    return json_request(
        "POST", "/api/pull", {"model": name, "stream": True}, headers={"accept": "application/x-ndjson"}
    )


def explain(model: str) -> Call[Explanation]:
    return Call(json_request("GET", path("api", "explain", model)), lambda a: Explanation.from_json(a.json()))


def why(trace_id: Optional[str]) -> Call[Story]:
    route = path("api", "why", trace_id) if trace_id else "/api/why"
    return Call(json_request("GET", route), lambda a: Story.from_json(a.json()))


def requests(model: Optional[str], state: Optional[str]) -> Call[List[RequestCard]]:
    def decode(answer: Answer) -> List[RequestCard]:
        return [RequestCard.from_json(c) for c in answer.json().get("data") or [] if isinstance(c, dict)]

    return Call(json_request("GET", "/v1/requests", query={"model": model, "state": state}), decode)


def cancel(request_id: str, *, interrupt: bool) -> Call[bool]:
    verb = "interrupt" if interrupt else "cancel"
    return Call(
        json_request("POST", path("v1", "requests", request_id, verb), {}),
        lambda a: bool(a.json().get("cancelled", a.json().get("interrupted", False))),
    )


# -- jobs ---------------------------------------------------------------------------------


def _job(answer: Answer) -> Job:
    return Job.from_json(answer.json())


def jobs_list(
    state: Optional[str], kind: Optional[str], limit: Optional[int], after: Optional[str]
) -> Call[JobPage]:
    def decode(answer: Answer) -> JobPage:
        doc = answer.json()
        return JobPage(
            data=[Job.from_json(j) for j in doc.get("data") or [] if isinstance(j, dict)],
            has_more=bool(doc.get("has_more")),
            first_id=doc.get("first_id"),
            last_id=doc.get("last_id"),
        )

    query = {"state": state, "kind": kind, "limit": limit, "after": after}
    return Call(json_request("GET", "/v1/jobs", query=query), decode)


def job_get(job_id: str) -> Call[Job]:
    return Call(json_request("GET", path("v1", "jobs", job_id)), _job)


def job_cancel(job_id: str) -> Call[Job]:
    return Call(json_request("POST", path("v1", "jobs", job_id, "cancel"), {}), _job)


def job_result(job_id: str) -> Call[JobResult]:
    return Call(
        json_request("GET", path("v1", "jobs", job_id, "result"), headers={"accept": "*/*"}),
        lambda a: JobResult(content=a.body, content_type=a.headers.get("content-type", "")),
    )


def job_events(job_id: str, after: Optional[int]) -> Call[List[Dict[str, Any]]]:
    return Call(
        json_request("GET", path("v1", "jobs", job_id, "events"), query={"after": after}),
        lambda a: [e for e in a.json().get("data") or [] if isinstance(e, dict)],
    )


def job_follow(job_id: str, after: Optional[int]) -> Request:
    return json_request(
        "GET",
        path("v1", "jobs", job_id, "events"),
        headers={"accept": "text/event-stream"},
        query={"after": after},
    )


# -- OpenAI batches -----------------------------------------------------------------------


def _doc(answer: Answer) -> Dict[str, Any]:
    doc = answer.json()
    return doc if isinstance(doc, dict) else {"value": doc}


def _list(answer: Answer) -> List[Dict[str, Any]]:
    return [d for d in answer.json().get("data") or [] if isinstance(d, dict)]


def jsonl(lines: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode("utf-8") + b"\n" for line in lines)


def parse_jsonl(data: bytes) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def file_upload(
    content: bytes, filename: str, purpose: str, headers: Mapping[str, str]
) -> Call[Dict[str, Any]]:
    request = multipart_request(
        "/v1/files", {"purpose": purpose}, {"file": (filename, content, "application/jsonl")}, headers=headers
    )
    return Call(request, _doc)


def file_content(file_id: str) -> Call[bytes]:
    return Call(
        json_request("GET", path("v1", "files", file_id, "content"), headers={"accept": "*/*"}),
        lambda a: a.body,
    )


def batch_lines(requests: Iterable[Mapping[str, Any]], endpoint: str) -> bytes:
    """A batch input file: each request ``{"custom_id", "body"}`` as a ``POST endpoint`` line."""
    return jsonl(
        {"custom_id": r["custom_id"], "method": "POST", "url": r.get("url", endpoint), "body": r["body"]}
        for r in requests
    )


def batch_create(
    input_file_id: str, endpoint: str, metadata: Optional[Mapping[str, str]]
) -> Call[Dict[str, Any]]:
    body = _body(
        {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": "24h"}, metadata=metadata
    )
    return Call(json_request("POST", "/v1/batches", body), _doc)


def batch_get(batch_id: str) -> Call[Dict[str, Any]]:
    return Call(json_request("GET", path("v1", "batches", batch_id)), _doc)


def batch_list(limit: Optional[int], after: Optional[str]) -> Call[List[Dict[str, Any]]]:
    return Call(json_request("GET", "/v1/batches", query={"limit": limit, "after": after}), _list)


def batch_cancel(batch_id: str) -> Call[Dict[str, Any]]:
    return Call(json_request("POST", path("v1", "batches", batch_id, "cancel"), {}), _doc)


# -- Anthropic message batches ------------------------------------------------------------


def message_batch_create(requests: Iterable[Mapping[str, Any]]) -> Call[Dict[str, Any]]:
    body = {"requests": [{"custom_id": r["custom_id"], "params": r["params"]} for r in requests]}
    return Call(json_request("POST", "/v1/messages/batches", body), _doc)


def message_batch_get(batch_id: str) -> Call[Dict[str, Any]]:
    return Call(json_request("GET", path("v1", "messages", "batches", batch_id)), _doc)


def message_batch_list(limit: Optional[int], after_id: Optional[str]) -> Call[List[Dict[str, Any]]]:
    query = {"limit": limit, "after_id": after_id}
    return Call(json_request("GET", "/v1/messages/batches", query=query), _list)


def message_batch_cancel(batch_id: str) -> Call[Dict[str, Any]]:
    return Call(json_request("POST", path("v1", "messages", "batches", batch_id, "cancel"), {}), _doc)


def message_batch_delete(batch_id: str) -> Call[Dict[str, Any]]:
    return Call(json_request("DELETE", path("v1", "messages", "batches", batch_id)), _doc)


def message_batch_results(batch_id: str) -> Call[List[Dict[str, Any]]]:
    request = json_request(
        "GET", path("v1", "messages", "batches", batch_id, "results"), headers={"accept": "*/*"}
    )
    return Call(request, lambda a: parse_jsonl(a.body))


# -- failover chains ----------------------------------------------------------------------


def failover_list() -> Call[List[FailoverChain]]:
    def decode(answer: Answer) -> List[FailoverChain]:
        return [FailoverChain.from_json(c) for c in answer.json().get("chains") or [] if isinstance(c, dict)]

    return Call(json_request("GET", "/api/failover"), decode)


def failover_pin(name: str, target: str) -> Call[Dict[str, Any]]:
    return Call(json_request("POST", path("api", "failover", name, "pin"), {"target": target}), _doc)


def failover_unpin(name: str) -> Call[Dict[str, Any]]:
    return Call(json_request("POST", path("api", "failover", name, "unpin"), {}), _doc)
