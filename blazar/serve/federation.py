"""The relay to a peer: a request's bytes sent to the same route of another daemon (or a
pass-through OpenAI server), its answer relayed back as it comes.

The peer speaks the same dialects, so streams stay streams. The caller's key is never
forwarded: the peer's client carries this daemon's key for it. A peer that fails before
its answer starts (no connection, a 5xx) is marked down and the next candidate is tried;
one that fails mid-stream ends the stream with the dialect's error event. A client that
disconnects closes the peer's response, which cancels the request there. Which machine
serves is the runtime's decision (``actors/federation.py``); the HTTP layer wraps the
inference routes with it (``blazar.web.routes.federation``).
"""

from __future__ import annotations

import httpx
import msgspec
import trio

from actors import federation
from actors.engines.multipart import FormError, Part, boundary_of, encode_form, parse_form
from actors.errors import PeerIsSelf, PeerNotFound, PeerUnavailable
from actors.federation import LOCAL, Decision, Ranked
from actors.peer import RELAYED_HEADER, PeerActor
from actors.runtime import Runtime
from actors.upstream import UpstreamError, UpstreamResponse
from blazar.errors import BlazarError, Dialect, error_body
from blazar.serve.context import Relayed
from blazar.serve.relay import Pipe
from blazar.serve.reply import Reply, dialect_for, stream_reply

__all__ = [
    "OPENAI_PATHS",
    "PEER_HEADER",
    "model_of",
    "peer_targets",
    "relay",
    "rewrite_model",
    "speaks_openai",
    "split_remote",
    "stream_error",
    "targets",
]

PEER_HEADER = "X-Blazar-Peer"
"""On a relayed answer: the peer that served it."""

_FORWARDED = (
    "content-type",
    "accept",
    "anthropic-version",
    "anthropic-beta",
    "x-blazar-priority",
    "x-blazar-class",
    "x-blazar-deadline-ms",
    "x-blazar-keep-alive",
    "x-blazar-engine",
    "traceparent",
)
"""The caller's headers the peer gets; never ``authorization`` nor ``x-api-key``."""

_KEPT = ("retry-after", "cache-control")


class _ModelOnly(msgspec.Struct):
    model: str | None = None


def _form_type(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "multipart/form-data"


def model_of(body: bytes, content_type: str = "application/json") -> str | None:
    """The ``model`` of a JSON body or of a multipart form (a transcription's upload)."""
    if _form_type(content_type):
        try:
            parts = parse_form(body, content_type).get("model") or []
        except FormError:
            return None
        return parts[0].text.strip() if parts else None
    try:
        return msgspec.json.decode(body, type=_ModelOnly).model
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # the local handler says what is wrong with the body


def split_remote(name: str) -> tuple[str, str] | None:
    """``remote:PEER/MODEL`` → (PEER, MODEL); None for any other name."""
    if not name.startswith("remote:"):
        return None
    peer, _, model = name[len("remote:") :].partition("/")
    if not peer or not model:
        raise BlazarError("BAD_REQUEST", f"model {name!r}: write remote:PEER/MODEL", param="model")
    return peer, model


# -- the relay --------------------------------------------------------------------------------------


def stream_error(dialect: Dialect, code: str, message: str) -> bytes:
    """The event that ends a failed stream in ``dialect`` (nothing follows it)."""
    body = msgspec.json.encode(error_body(dialect, code, message))
    match dialect:
        case Dialect.ANTHROPIC:
            return b"event: error\ndata: " + body + b"\n\n"
        case Dialect.OLLAMA:
            return body + b"\n"
        case _:
            return b"data: " + body + b"\n\n"


def rewrite_model(body: bytes, model: str, content_type: str = "application/json") -> bytes:
    """``body`` naming ``model`` (a form keeps its boundary, so its Content-Type still holds)."""
    if _form_type(content_type):
        form = parse_form(body, content_type)
        form["model"] = [Part(name="model", data=model.encode())]
        return encode_form([p for ps in form.values() for p in ps], boundary_of(content_type))
    doc = msgspec.json.decode(body)
    doc["model"] = model
    return msgspec.json.encode(doc)


class _Broken(Exception):
    """The peer could not be sent the request, or its answer broke off (what went wrong)."""


class _PoolAnswer:
    """A plain-HTTP peer's answer, read from the relay's own pool (``PeerActor.relay_pool``)."""

    def __init__(self, response: UpstreamResponse) -> None:
        self.response = response
        self.status_code = response.status_code
        self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]

    async def receive_some(self) -> bytes:
        """The next bytes of the body; ``b""`` at its end."""
        try:
            return await self.response.receive_some()
        except UpstreamError as exc:
            raise _Broken(str(exc)) from exc

    async def aclose(self) -> None:
        await self.response.aclose()  # before the end, a reset: the peer cancels the request


class _HttpxAnswer:
    """A TLS peer's answer, read through httpx (its trust settings are the client's)."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = response.aiter_raw()
        self.status_code = response.status_code
        self.headers = list(response.headers.items())

    async def receive_some(self) -> bytes:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return b""
        except httpx.HTTPError as exc:
            raise _Broken(_said(exc)) from exc

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await self._response.aclose()


def _said(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _send(
    actor: PeerActor, path: str, body: bytes, headers: dict[str, str]
) -> _PoolAnswer | _HttpxAnswer:
    """POST ``body`` to the peer; the answer once its head has come. ``_Broken`` where it
    cannot be sent."""
    if (relay := actor.relay_pool) is not None:
        pool, prefix = relay
        try:
            return _PoolAnswer(await pool.request("POST", prefix + path, body=body, headers=headers))
        except UpstreamError as exc:
            raise _Broken(_said(exc)) from exc
    request = actor.client.build_request("POST", path, content=body, headers=headers)
    try:
        return _HttpxAnswer(await actor.client.send(request, stream=True))
    except httpx.HTTPError as exc:
        raise _Broken(_said(exc)) from exc


async def _read(answer: _PoolAnswer | _HttpxAnswer) -> bytes:
    parts = []
    while chunk := await answer.receive_some():
        parts.append(chunk)
    return b"".join(parts)


class _PeerStream:
    """The peer's answer bytes as they come; a failure midway ends them with the dialect's
    error event. Closing it closes the peer's response (the peer cancels the request)."""

    def __init__(self, answer: _PoolAnswer | _HttpxAnswer, actor: PeerActor, dialect: Dialect) -> None:
        self._answer = answer
        self._actor = actor
        self._dialect = dialect
        self._done = False
        self.pipeable = isinstance(answer, _PoolAnswer)
        """A plain-HTTP peer's answer can be relayed by the connection's pump (``pipe_into``)."""

    def __aiter__(self) -> _PeerStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        try:
            if chunk := await self._answer.receive_some():
                return chunk
        except _Broken as exc:
            self._done = True
            await self.aclose()
            reason = f"peer '{self._actor.peer}' failed during the answer: {exc}"
            self._actor.failed_nowait(reason)
            return stream_error(self._dialect, "PEER_FAILED", reason + " — retry; see `blazar peers`")
        self._done = True
        await self.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await self._answer.aclose()

    async def pipe_into(self, pipe: Pipe) -> bool:
        """Hand the rest of a plain-HTTP peer's answer to ``pipe`` (``Exchange.pipe``: one
        epoll for every such stream); the iteration then reads its end, or its failure."""
        if isinstance(answer := self._answer, _PoolAnswer) and not self._done:
            await pipe(answer.response, _ignore)
        return True


def _ignore(_chunk: bytes) -> None:
    pass


def _headers_for(call: Relayed) -> dict[str, str]:
    headers = {k: v for k in _FORWARDED if (v := call.headers.get(k)) is not None}
    headers[RELAYED_HEADER] = call.trace_id
    return headers


def _answer_headers(answer: list[tuple[str, str]], peer: str) -> dict[str, str]:
    out = {PEER_HEADER: peer}
    for name, value in answer:
        low = name.lower()
        if low == "x-blazar-trace-id":
            out["X-Blazar-Peer-Trace-Id"] = value
        elif low.startswith("x-blazar-") or low in _KEPT:
            out[name] = value
    return out


async def relay(call: Relayed, targets: list[tuple[PeerActor, str]]) -> Reply:
    """Send ``call`` to each of ``targets`` (a peer and the model's name there) in turn until
    one starts answering; raises ``PEER_UNAVAILABLE`` when none does."""
    dialect = dialect_for(call.path, call.headers)
    passed: list[str] = []
    for i, (actor, model) in enumerate(targets):
        last = i == len(targets) - 1
        content_type = call.headers.get("content-type", "application/json")
        if model_of(call.body, content_type) == model:
            body = call.body
        else:
            body = rewrite_model(call.body, model, content_type)
        try:
            answer = await _send(actor, call.path, body, _headers_for(call))
        except _Broken as exc:
            actor.failed_nowait(str(exc))
            passed.append(f"{actor.peer}: {exc}")
            continue
        headers = _answer_headers(answer.headers, actor.peer)
        if passed:
            headers["X-Blazar-Peers-Passed"] = ", ".join(p.split(":", 1)[0] for p in passed)
        content_type = next((v for k, v in answer.headers if k == "content-type"), "application/json")
        if answer.status_code >= 500 and not last:
            await answer.aclose()
            passed.append(f"{actor.peer}: answered {answer.status_code}")
            continue
        if call.card is not None:
            call.card.engine = f"peer:{actor.peer}"
        streaming = content_type.startswith(("text/event-stream", "application/x-ndjson"))
        if not streaming or answer.status_code != 200:
            try:
                content = await _read(answer)
            except _Broken as exc:
                actor.failed_nowait(str(exc))
                passed.append(f"{actor.peer}: the answer broke off ({exc})")
                continue
            finally:
                await answer.aclose()
            if answer.status_code >= 400:
                call.code = call.code or _code_of(content)
            return Reply(content, status=answer.status_code, content_type=content_type, headers=headers)
        stream = _PeerStream(answer, actor, dialect)
        call.on_cleanup(stream.aclose)
        return stream_reply(stream, content_type=content_type, headers=headers)
    raise BlazarError(
        "PEER_UNAVAILABLE",
        f"no peer could serve the request ({'; '.join(passed)}) — see `blazar peers`; "
        "the next poll marks a peer that is back up again",
    )


def _code_of(body: bytes) -> str | None:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    code = doc.get("blazar_code")
    if code is None and isinstance(error := doc.get("error"), dict):
        code = error.get("blazar_code")
    return code if isinstance(code, str) else None


OPENAI_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    }
)
"""What a pass-through peer (any OpenAI-compatible server) can be asked."""


def speaks_openai(call: Relayed) -> bool:
    """Whether ``call`` is one a pass-through peer (any OpenAI-compatible server) can answer."""
    return call.path in OPENAI_PATHS and "anthropic-version" not in call.headers


def _speaks(call: Relayed, row: Ranked) -> bool:
    return not row.pass_through or speaks_openai(call)


def targets(runtime: Runtime, call: Relayed, decision: Decision, model: str) -> list[tuple[PeerActor, str]]:
    """The ranked peers of ``decision`` (this machine excluded) that speak the call's dialect."""
    out = []
    for row in decision.candidates:
        if row.rank is None or row.where == LOCAL or not _speaks(call, row):
            continue
        actor = runtime.peers.get(row.where)
        if actor is not None:
            out.append((actor, model))
    return out


def peer_targets(runtime: Runtime, call: Relayed, peer: str, model: str) -> list[tuple[PeerActor, str]]:
    """Where ``remote:PEER/MODEL`` goes (``actors.federation.peer_targets``), among the peers
    that speak the call's dialect; raises ``PEER_NOT_FOUND`` or ``PEER_UNAVAILABLE``."""
    try:
        actors = federation.peer_targets(runtime.peers, peer, model, speaks=lambda row: _speaks(call, row))
    except (PeerIsSelf, PeerNotFound) as exc:
        raise BlazarError(exc.code, exc.message, param="model") from None
    except PeerUnavailable as exc:
        raise BlazarError(exc.code, exc.message) from None
    return [(actor, model) for actor in actors]
