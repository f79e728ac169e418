"""The blocking client, on the standard library's ``urllib``."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
    overload,
)
from urllib.parse import urlsplit

from . import _ops
from ._errors import SDK_CONNECTION, SDK_STREAM_CUT, SDK_TIMEOUT, BlazarError, error_from_body
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

__all__ = ["Client", "Stream"]

T = TypeVar("T")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _headers(resp: Any) -> Dict[str, str]:
    return {k.lower(): v for k, v in resp.headers.items()}


class Stream(Generic[T]):
    """A streamed answer: iterate it for its items; ``close()`` (or leaving a ``with`` block)
    ends the request, and the daemon stops generating for it at once."""

    def __init__(self, resp: Any, decoder: Decoder[T], meta: Meta) -> None:
        self._resp = resp
        self._decoder = decoder
        self.meta = meta
        decoder.trace_id = meta.trace_id

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                try:
                    raw = self._resp.readline()
                except socket.timeout as exc:
                    raise BlazarError("no data within the timeout", blazar_code=SDK_TIMEOUT) from exc
                except (OSError, http.client.HTTPException) as exc:
                    raise BlazarError(
                        f"the stream broke: {exc}", blazar_code=SDK_STREAM_CUT, trace_id=self.meta.trace_id
                    ) from exc
                if not raw:
                    break
                yield from self._decoder.feed(raw.decode("utf-8").rstrip("\r\n"))
            yield from self._decoder.feed("")
            self._decoder.end()
        finally:
            self.close()

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ByteStream:
    """Audio as it is made (``speech_stream``): iterate it for ``bytes`` chunks."""

    def __init__(self, resp: Any, meta: Meta, chunk_size: int) -> None:
        self._resp = resp
        self.meta = meta
        self._size = chunk_size
        self.content_type = meta.headers.get("content-type", "")
        rate = meta.headers.get("x-sample-rate")
        self.sample_rate = int(rate) if rate and rate.isdigit() else None

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                try:
                    chunk = self._resp.read1(self._size)
                except (OSError, http.client.HTTPException) as exc:
                    raise BlazarError(f"the stream broke: {exc}", blazar_code=SDK_STREAM_CUT) from exc
                if not chunk:
                    return
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> ByteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """A Blazar daemon: ``Client()`` reads ``BLAZAR_URL`` and ``BLAZAR_API_KEY``, else calls
    ``http://127.0.0.1:11435`` without a key.

    ``timeout`` bounds each network wait (connecting, then each read), not a whole answer:
    a long generation streams for as long as it needs.
    """

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
        host = urlsplit(self.base_url).hostname or ""
        # A proxy from the environment must not capture calls to a daemon on this machine.
        handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
        self._opener = urllib.request.build_opener(*handlers)
        self.jobs = Jobs(self)
        self.batches = Batches(self)
        self.message_batches = MessageBatches(self)
        self.failover = Failover(self)

    def __repr__(self) -> str:
        return f"Client(base_url={self.base_url!r})"

    # -- transport ------------------------------------------------------------------------

    def _open(self, request: Request) -> Any:
        headers = {**request.headers, **self.headers}
        req = urllib.request.Request(
            self.base_url + request.target, data=request.body, headers=headers, method=request.method
        )
        try:
            return self._opener.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            with exc:
                raise error_from_body(exc.code, exc.read(), _headers(exc)) from None
        except socket.timeout as exc:
            raise BlazarError(f"{self.base_url} did not answer in time", blazar_code=SDK_TIMEOUT) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, socket.timeout):
                raise BlazarError(f"{self.base_url} did not answer in time", blazar_code=SDK_TIMEOUT) from exc
            raise BlazarError(
                f"cannot reach the daemon at {self.base_url}: {reason} — is `blazar serve` running?",
                blazar_code=SDK_CONNECTION,
            ) from exc

    def _answer(self, request: Request) -> Answer:
        with self._open(request) as resp:
            try:
                body = resp.read()
            except socket.timeout as exc:
                raise BlazarError("the answer did not come in time", blazar_code=SDK_TIMEOUT) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise BlazarError(f"the answer broke off: {exc}", blazar_code=SDK_STREAM_CUT) from exc
            return Answer(resp.status, _headers(resp), body)

    def _call(self, call: Call[T]) -> T:
        return call.decode(self._answer(call.request).check())

    def _stream(self, request: Request, decoder: Decoder[T]) -> Stream[T]:
        resp = self._open(request)
        return Stream(resp, decoder, Meta.of(resp.status, _headers(resp)))

    # -- inference ------------------------------------------------------------------------

    @overload
    def chat(
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
    def chat(
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
    ) -> Stream[ChatChunk]: ...

    def chat(
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
    ) -> Union[ChatCompletion, Stream[ChatChunk]]:
        """``POST /v1/chat/completions``. Other OpenAI fields (``max_tokens``, ``temperature``,
        ``response_format``, …) go in ``params``; ``headers`` adds request headers
        (``X-Blazar-Priority``, ``X-Blazar-Deadline-Ms``, …)."""
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
            return self._stream(request, ChatDecoder())
        return self._call(Call(request, _ops.decode_chat))

    @overload
    def responses(
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
    def responses(
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
    ) -> Stream[ResponseEvent]: ...

    def responses(
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
    ) -> Union[Response, Stream[ResponseEvent]]:
        """``POST /v1/responses`` (stored by default; ``background=True`` makes it a job)."""
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
            return self._stream(request, ResponseDecoder())
        return self._call(Call(request, _ops.decode_response))

    def get_response(self, response_id: str) -> Response:
        """``GET /v1/responses/{id}``: a stored response (a background one as it stands)."""
        return self._call(_ops.get_response(response_id))

    def embed(
        self, model: str, input: Union[str, Sequence[str]], *, dimensions: Optional[int] = None, **params: Any
    ) -> Embeddings:
        """``POST /v1/embeddings``: one vector per input, in order."""
        return self._call(_ops.embed(model, input, dimensions, params))

    def transcribe(
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
        """``POST /v1/audio/transcriptions`` (``translate=True``: ``/v1/audio/translations``)."""
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
        return self._call(Call(request, _ops.decode_transcription))

    def transcribe_job(
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
        """The same as a durable job (``async=true``): poll ``jobs.wait(id)``, then ``jobs.result(id)``."""
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
        return self._call(Call(request, lambda a: Job.from_json(a.json())))

    def speech(
        self,
        model: str,
        input: str,
        *,
        voice: Optional[str] = None,
        response_format: str = "wav",
        speed: Optional[float] = None,
    ) -> Speech:
        """``POST /v1/audio/speech``: the whole audio."""
        return self._call(_ops.speech(model, input, voice, response_format, speed))

    def speech_stream(
        self,
        model: str,
        input: str,
        *,
        voice: Optional[str] = None,
        response_format: str = "pcm",
        speed: Optional[float] = None,
        chunk_size: int = 16384,
    ) -> ByteStream:
        """``POST /v1/audio/speech``, its audio as it is made (``pcm``: 24 kHz, 16-bit mono)."""
        request = _ops.speech(model, input, voice, response_format, speed).request
        resp = self._open(request)
        return ByteStream(resp, Meta.of(resp.status, _headers(resp)), chunk_size)

    # -- models and the daemon ------------------------------------------------------------

    def models(self, *, include_remote: bool = False) -> List[Model]:
        """``GET /v1/models``: installed models and failover chains (peers' with ``include_remote``)."""
        return self._call(_ops.models(include_remote))

    def ps(self) -> List[RunningModel]:
        """``GET /api/ps``: models whose engine is starting or ready."""
        return self._call(_ops.ps())

    def pull(self, name: str, *, progress: Optional[Callable[[PullProgress], None]] = None) -> PullProgress:
        """``POST /api/pull``: download a model; ``progress`` is called with each progress line.
        Returns the last line (``status == "success"``)."""
        last: Optional[PullProgress] = None
        with self._stream(_ops.pull(name), PullDecoder()) as lines:
            for line in lines:
                last = line
                if progress is not None:
                    progress(line)
        assert last is not None  # PullDecoder.end() raised otherwise
        return last

    def explain(self, model: str) -> Explanation:
        """``GET /api/explain/{model}``: the settings the model runs with and where each came from."""
        return self._call(_ops.explain(model))

    def why(self, trace_id: Optional[str] = None) -> Story:
        """``GET /api/why/{trace_id}``: one request's story (without an id: the newest that
        failed, else the slowest). ``trace_id`` is an answer's ``meta.trace_id``."""
        return self._call(_ops.why(trace_id))

    def requests(self, *, model: Optional[str] = None, state: Optional[str] = None) -> List[RequestCard]:
        """``GET /v1/requests``: live requests first, then recent ones."""
        return self._call(_ops.requests(model, state))

    def cancel(self, request_id: str) -> bool:
        """``POST /v1/requests/{id}/cancel``: end a running request from here; False if it had ended."""
        return self._call(_ops.cancel(request_id, interrupt=False))

    def interrupt(self, request_id: str) -> bool:
        """``POST /v1/requests/{id}/interrupt``: end it cleanly with what was generated so far."""
        return self._call(_ops.cancel(request_id, interrupt=True))

    def realtime(self, model: str, **kwargs: Any) -> Any:
        """``GET /v1/realtime`` as a WebSocket session; needs ``pip install 'blazar-sdk[realtime]'``."""
        from .realtime import connect

        return connect(self.base_url, model, self.headers, **kwargs)


class Jobs:
    """Durable jobs: background responses, batches, pulls, transcriptions (``/v1/jobs``)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        limit: Optional[int] = None,
        after: Optional[str] = None,
    ) -> JobPage:
        return self._c._call(_ops.jobs_list(state, kind, limit, after))

    def get(self, job_id: str) -> Job:
        return self._c._call(_ops.job_get(job_id))

    def cancel(self, job_id: str) -> Job:
        return self._c._call(_ops.job_cancel(job_id))

    def result(self, job_id: str) -> JobResult:
        return self._c._call(_ops.job_result(job_id))

    def events(self, job_id: str, *, after: Optional[int] = None) -> List[Dict[str, Any]]:
        return self._c._call(_ops.job_events(job_id, after))

    def follow(self, job_id: str, *, after: Optional[int] = None) -> Stream[Dict[str, Any]]:
        """The job's events live (SSE) until it has ended."""
        return self._c._stream(_ops.job_follow(job_id, after), JobEventDecoder())

    def wait(self, job_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Job:
        """Poll until the job has ended (completed, failed or cancelled)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if job.done:
                return job
            if time.monotonic() >= deadline:
                raise BlazarError(
                    f"job {job_id} still {job.status} after {timeout_s} s", blazar_code=SDK_TIMEOUT
                )
            time.sleep(poll_s)


class Batches:
    """OpenAI's Batch API: ``/v1/files`` and ``/v1/batches``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def upload(
        self, content: bytes, *, filename: str = "batch.jsonl", purpose: str = "batch"
    ) -> Dict[str, Any]:
        return self._c._call(_ops.file_upload(content, filename, purpose, {}))

    def create(
        self,
        requests: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        endpoint: str = "/v1/chat/completions",
        input_file_id: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> Dict[str, Any]:
        """A batch from ``requests`` (each ``{"custom_id", "body"}``, uploaded as its input
        file) or from an uploaded ``input_file_id``."""
        if input_file_id is None:
            if not requests:
                raise ValueError("give the batch's requests, or the input_file_id of an uploaded file")
            input_file_id = str(self.upload(_ops.batch_lines(requests, endpoint))["id"])
        return self._c._call(_ops.batch_create(input_file_id, endpoint, metadata))

    def get(self, batch_id: str) -> Dict[str, Any]:
        return self._c._call(_ops.batch_get(batch_id))

    def list(self, *, limit: Optional[int] = None, after: Optional[str] = None) -> List[Dict[str, Any]]:
        return self._c._call(_ops.batch_list(limit, after))

    def cancel(self, batch_id: str) -> Dict[str, Any]:
        return self._c._call(_ops.batch_cancel(batch_id))

    def results(self, batch_id: str) -> List[Dict[str, Any]]:
        """Every line of the batch's output and error files, in input order."""
        batch = self.get(batch_id)
        lines: List[Dict[str, Any]] = []
        for key in ("output_file_id", "error_file_id"):
            if batch.get(key):
                lines += _ops.parse_jsonl(self._c._call(_ops.file_content(str(batch[key]))))
        return lines

    def wait(self, batch_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.get(batch_id)
            if batch.get("status") in ("completed", "failed", "cancelled", "expired"):
                return batch
            if time.monotonic() >= deadline:
                raise BlazarError(f"batch {batch_id} still {batch.get('status')}", blazar_code=SDK_TIMEOUT)
            time.sleep(poll_s)


class MessageBatches:
    """Anthropic's Message Batches: ``/v1/messages/batches``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, requests: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        """Each request is ``{"custom_id", "params"}``, ``params`` a Messages request."""
        return self._c._call(_ops.message_batch_create(requests))

    def get(self, batch_id: str) -> Dict[str, Any]:
        return self._c._call(_ops.message_batch_get(batch_id))

    def list(self, *, limit: Optional[int] = None, after_id: Optional[str] = None) -> List[Dict[str, Any]]:
        return self._c._call(_ops.message_batch_list(limit, after_id))

    def cancel(self, batch_id: str) -> Dict[str, Any]:
        return self._c._call(_ops.message_batch_cancel(batch_id))

    def delete(self, batch_id: str) -> Dict[str, Any]:
        return self._c._call(_ops.message_batch_delete(batch_id))

    def results(self, batch_id: str) -> List[Dict[str, Any]]:
        return self._c._call(_ops.message_batch_results(batch_id))

    def wait(self, batch_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.get(batch_id)
            if batch.get("processing_status") == "ended":
                return batch
            if time.monotonic() >= deadline:
                raise BlazarError(f"message batch {batch_id} has not ended", blazar_code=SDK_TIMEOUT)
            time.sleep(poll_s)


class Failover:
    """The ``[[failover]]`` chains: list them, pin one to a target, unpin it."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> List[FailoverChain]:
        return self._c._call(_ops.failover_list())

    def pin(self, chain: str, target: str) -> Dict[str, Any]:
        return self._c._call(_ops.failover_pin(chain, target))

    def unpin(self, chain: str) -> Dict[str, Any]:
        return self._c._call(_ops.failover_unpin(chain))
