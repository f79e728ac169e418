"""The asyncio client: the same operations as ``Client``, awaited.

It speaks HTTP/1.1 itself on ``asyncio`` streams (``_http11``), so a task that is cancelled
closes its connection, and the daemon stops the request at once, as it does for any client
that goes away.
"""

from __future__ import annotations

import asyncio
import time
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Generic,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
    overload,
)

from . import _ops
from ._errors import SDK_TIMEOUT, BlazarError, error_from_body
from ._http11 import AsyncResponse, open_request
from ._types import (
    ChatChunk,
    ChatCompletion,
    Embeddings,
    Explanation,
    FailoverChain,
    Job,
    JobPage,
    JobResult,
    Meta,
    Model,
    PullProgress,
    RequestCard,
    Response,
    ResponseEvent,
    RunningModel,
    Speech,
    Story,
    Transcription,
)
from ._wire import (
    Answer,
    Call,
    ChatDecoder,
    Decoder,
    FileArg,
    JobEventDecoder,
    PullDecoder,
    Request,
    ResponseDecoder,
    resolve,
)

__all__ = ["AsyncClient", "AsyncStream"]

T = TypeVar("T")


class AsyncStream(Generic[T]):
    """A streamed answer: ``async for`` its items; ``aclose()`` (or leaving ``async with``)
    ends the request, and the daemon stops generating for it at once."""

    def __init__(self, resp: AsyncResponse, decoder: Decoder[T], meta: Meta) -> None:
        self._resp = resp
        self._decoder = decoder
        self.meta = meta
        decoder.trace_id = meta.trace_id

    async def __aiter__(self) -> AsyncIterator[T]:
        try:
            while True:
                raw = await self._resp.readline()
                if not raw:
                    break
                for item in self._decoder.feed(raw.decode("utf-8").rstrip("\r\n")):
                    yield item
            for item in self._decoder.feed(""):
                yield item
            self._decoder.end()
        finally:
            self._resp.close()

    async def aclose(self) -> None:
        self._resp.close()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncClient:
    """The async twin of ``Client``: the same arguments, the same results, awaited."""

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = 300.0,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.base_url, self.api_key = resolve(base_url, api_key)
        self.timeout = timeout
        self.headers: Dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        if self.api_key:
            self.headers["authorization"] = f"Bearer {self.api_key}"
        self.jobs = AsyncJobs(self)
        self.batches = AsyncBatches(self)
        self.message_batches = AsyncMessageBatches(self)
        self.failover = AsyncFailover(self)

    def __repr__(self) -> str:
        return f"AsyncClient(base_url={self.base_url!r})"

    async def _open(self, request: Request) -> AsyncResponse:
        resp = await open_request(self.base_url, request, self.headers, self.timeout)
        if resp.status >= 400:
            try:
                body = await resp.read()
            finally:
                resp.close()
            raise error_from_body(resp.status, body, resp.headers)
        return resp

    async def _call(self, call: Call[T]) -> T:
        resp = await self._open(call.request)
        try:
            body = await resp.read()
        finally:
            resp.close()
        return call.decode(Answer(resp.status, resp.headers, body))

    async def _stream(self, request: Request, decoder: Decoder[T]) -> AsyncStream[T]:
        resp = await self._open(request)
        return AsyncStream(resp, decoder, Meta.of(resp.status, resp.headers))

    # -- inference ------------------------------------------------------------------------

    @overload
    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: Literal[False] = False,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        mcp: _ops.Mcp = None,
        best_of: Optional[int] = None,
        headers: Optional[Mapping[str, str]] = None,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: Literal[True],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        mcp: _ops.Mcp = None,
        best_of: Optional[int] = None,
        headers: Optional[Mapping[str, str]] = None,
        **params: Any,
    ) -> AsyncStream[ChatChunk]: ...

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: bool = False,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        mcp: _ops.Mcp = None,
        best_of: Optional[int] = None,
        headers: Optional[Mapping[str, str]] = None,
        **params: Any,
    ) -> Union[ChatCompletion, AsyncStream[ChatChunk]]:
        request = _ops.chat(
            model,
            messages,
            stream=stream,
            tools=tools,
            mcp=mcp,
            best_of=best_of,
            params=params,
            headers=headers or {},
        )
        if stream:
            return await self._stream(request, ChatDecoder())
        return await self._call(Call(request, _ops.decode_chat))

    @overload
    async def responses(
        self,
        model: str,
        input: Union[str, Sequence[Mapping[str, Any]]],
        *,
        stream: Literal[False] = False,
        instructions: Optional[str] = None,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        mcp: _ops.Mcp = None,
        best_of: Optional[int] = None,
        previous_response_id: Optional[str] = None,
        background: Optional[bool] = None,
        headers: Optional[Mapping[str, str]] = None,
        **params: Any,
    ) -> Response: ...

    @overload
    async def responses(
        self,
        model: str,
        input: Union[str, Sequence[Mapping[str, Any]]],
        *,
        stream: Literal[True],
        instructions: Optional[str] = None,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        mcp: _ops.Mcp = None,
        best_of: Optional[int] = None,
        previous_response_id: Optional[str] = None,
        background: Optional[bool] = None,
        headers: Optional[Mapping[str, str]] = None,
        **params: Any,
    ) -> AsyncStream[ResponseEvent]: ...

    async def responses(
        self,
        model: str,
        input: Union[str, Sequence[Mapping[str, Any]]],
        *,
        stream: bool = False,
        instructions: Optional[str] = None,
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        mcp: _ops.Mcp = None,
        best_of: Optional[int] = None,
        previous_response_id: Optional[str] = None,
        background: Optional[bool] = None,
        headers: Optional[Mapping[str, str]] = None,
        **params: Any,
    ) -> Union[Response, AsyncStream[ResponseEvent]]:
        request = _ops.responses(
            model,
            input,
            stream=stream,
            instructions=instructions,
            tools=tools,
            mcp=mcp,
            best_of=best_of,
            previous_response_id=previous_response_id,
            background=background,
            params=params,
            headers=headers or {},
        )
        if stream:
            return await self._stream(request, ResponseDecoder())
        return await self._call(Call(request, _ops.decode_response))

    async def get_response(self, response_id: str) -> Response:
        return await self._call(_ops.get_response(response_id))

    async def embed(
        self, model: str, input: Union[str, Sequence[str]], *, dimensions: Optional[int] = None, **params: Any
    ) -> Embeddings:
        return await self._call(_ops.embed(model, input, dimensions, params))

    async def transcribe(
        self,
        model: str,
        file: FileArg,
        *,
        language: Optional[str] = None,
        prompt: Optional[str] = None,
        response_format: str = "json",
        temperature: Optional[float] = None,
        translate: bool = False,
        **params: Any,
    ) -> Transcription:
        request = _ops.transcribe_request(
            model,
            file,
            language=language,
            prompt=prompt,
            response_format=response_format,
            temperature=temperature,
            translate=translate,
            job=False,
            params=params,
            headers={},
        )
        return await self._call(Call(request, _ops.decode_transcription))

    async def transcribe_job(
        self,
        model: str,
        file: FileArg,
        *,
        language: Optional[str] = None,
        prompt: Optional[str] = None,
        response_format: str = "json",
        translate: bool = False,
        **params: Any,
    ) -> Job:
        request = _ops.transcribe_request(
            model,
            file,
            language=language,
            prompt=prompt,
            response_format=response_format,
            temperature=None,
            translate=translate,
            job=True,
            params=params,
            headers={},
        )
        return await self._call(Call(request, lambda a: Job.from_json(a.json())))

    async def speech(
        self,
        model: str,
        input: str,
        *,
        voice: Optional[str] = None,
        response_format: str = "wav",
        speed: Optional[float] = None,
    ) -> Speech:
        return await self._call(_ops.speech(model, input, voice, response_format, speed))

    async def speech_stream(
        self,
        model: str,
        input: str,
        *,
        voice: Optional[str] = None,
        response_format: str = "pcm",
        speed: Optional[float] = None,
    ) -> AsyncIterator[bytes]:
        """The audio as it is made; the request ends when the iteration does."""
        resp = await self._open(_ops.speech(model, input, voice, response_format, speed).request)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    data = await resp.read_some()
                    if not data:
                        return
                    yield data
            finally:
                resp.close()

        return chunks()

    # -- models and the daemon ------------------------------------------------------------

    async def models(self, *, include_remote: bool = False) -> List[Model]:
        return await self._call(_ops.models(include_remote))

    async def ps(self) -> List[RunningModel]:
        return await self._call(_ops.ps())

    async def pull(
        self, name: str, *, progress: Optional[Callable[[PullProgress], Any]] = None
    ) -> PullProgress:
        """``progress`` may be a plain function or a coroutine function."""
        last: Optional[PullProgress] = None
        async with await self._stream(_ops.pull(name), PullDecoder()) as lines:
            async for line in lines:
                last = line
                if progress is not None:
                    got = progress(line)
                    if asyncio.iscoroutine(got):
                        await got
        assert last is not None  # PullDecoder.end() raised otherwise
        return last

    async def explain(self, model: str) -> Explanation:
        return await self._call(_ops.explain(model))

    async def why(self, trace_id: Optional[str] = None) -> Story:
        return await self._call(_ops.why(trace_id))

    async def requests(
        self, *, model: Optional[str] = None, state: Optional[str] = None
    ) -> List[RequestCard]:
        return await self._call(_ops.requests(model, state))

    async def cancel(self, request_id: str) -> bool:
        return await self._call(_ops.cancel(request_id, interrupt=False))

    async def interrupt(self, request_id: str) -> bool:
        return await self._call(_ops.cancel(request_id, interrupt=True))

    async def realtime(self, model: str, **kwargs: Any) -> Any:
        """``GET /v1/realtime``; needs ``pip install 'blazar-sdk[realtime]'``."""
        from .realtime import connect_async

        return await connect_async(self.base_url, model, self.headers, **kwargs)


async def _wait(
    get: Callable[[], Any], done: Callable[[Any], bool], what: str, timeout_s: float, poll_s: float
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await get()
        if done(got):
            return got
        if time.monotonic() >= deadline:
            raise BlazarError(f"{what} has not ended after {timeout_s} s", blazar_code=SDK_TIMEOUT)
        await asyncio.sleep(poll_s)


class AsyncJobs:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        limit: Optional[int] = None,
        after: Optional[str] = None,
    ) -> JobPage:
        return await self._c._call(_ops.jobs_list(state, kind, limit, after))

    async def get(self, job_id: str) -> Job:
        return await self._c._call(_ops.job_get(job_id))

    async def cancel(self, job_id: str) -> Job:
        return await self._c._call(_ops.job_cancel(job_id))

    async def result(self, job_id: str) -> JobResult:
        return await self._c._call(_ops.job_result(job_id))

    async def events(self, job_id: str, *, after: Optional[int] = None) -> List[Dict[str, Any]]:
        return await self._c._call(_ops.job_events(job_id, after))

    async def follow(self, job_id: str, *, after: Optional[int] = None) -> AsyncStream[Dict[str, Any]]:
        return await self._c._stream(_ops.job_follow(job_id, after), JobEventDecoder())

    async def wait(self, job_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Job:
        job: Job = await _wait(lambda: self.get(job_id), lambda j: j.done, f"job {job_id}", timeout_s, poll_s)
        return job


class AsyncBatches:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def upload(
        self, content: bytes, *, filename: str = "batch.jsonl", purpose: str = "batch"
    ) -> Dict[str, Any]:
        return await self._c._call(_ops.file_upload(content, filename, purpose, {}))

    async def create(
        self,
        requests: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        endpoint: str = "/v1/chat/completions",
        input_file_id: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> Dict[str, Any]:
        if input_file_id is None:
            if not requests:
                raise ValueError("give the batch's requests, or the input_file_id of an uploaded file")
            input_file_id = str((await self.upload(_ops.batch_lines(requests, endpoint)))["id"])
        return await self._c._call(_ops.batch_create(input_file_id, endpoint, metadata))

    async def get(self, batch_id: str) -> Dict[str, Any]:
        return await self._c._call(_ops.batch_get(batch_id))

    async def list(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> List[Dict[str, Any]]:
        return await self._c._call(_ops.batch_list(limit, after))

    async def cancel(self, batch_id: str) -> Dict[str, Any]:
        return await self._c._call(_ops.batch_cancel(batch_id))

    async def results(self, batch_id: str) -> List[Dict[str, Any]]:
        batch = await self.get(batch_id)
        lines: List[Dict[str, Any]] = []
        for key in ("output_file_id", "error_file_id"):
            if batch.get(key):
                lines += _ops.parse_jsonl(await self._c._call(_ops.file_content(str(batch[key]))))
        return lines

    async def wait(self, batch_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Dict[str, Any]:
        ended = ("completed", "failed", "cancelled", "expired")
        batch: Dict[str, Any] = await _wait(
            lambda: self.get(batch_id),
            lambda b: b.get("status") in ended,
            f"batch {batch_id}",
            timeout_s,
            poll_s,
        )
        return batch


class AsyncMessageBatches:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, requests: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        return await self._c._call(_ops.message_batch_create(requests))

    async def get(self, batch_id: str) -> Dict[str, Any]:
        return await self._c._call(_ops.message_batch_get(batch_id))

    async def list(
        self, *, limit: Optional[int] = None, after_id: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        return await self._c._call(_ops.message_batch_list(limit, after_id))

    async def cancel(self, batch_id: str) -> Dict[str, Any]:
        return await self._c._call(_ops.message_batch_cancel(batch_id))

    async def delete(self, batch_id: str) -> Dict[str, Any]:
        return await self._c._call(_ops.message_batch_delete(batch_id))

    async def results(self, batch_id: str) -> List[Dict[str, Any]]:
        return await self._c._call(_ops.message_batch_results(batch_id))

    async def wait(self, batch_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Dict[str, Any]:
        batch: Dict[str, Any] = await _wait(
            lambda: self.get(batch_id),
            lambda b: b.get("processing_status") == "ended",
            f"message batch {batch_id}",
            timeout_s,
            poll_s,
        )
        return batch


class AsyncFailover:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[FailoverChain]:
        return await self._c._call(_ops.failover_list())

    async def pin(self, chain: str, target: str) -> Dict[str, Any]:
        return await self._c._call(_ops.failover_pin(chain, target))

    async def unpin(self, chain: str) -> Dict[str, Any]:
        return await self._c._call(_ops.failover_unpin(chain))
