"""Federation in the gateway: which machine serves a request, and the relay to a peer.

With ``[[remotes]]`` configured, the inference routes are wrapped (``wrap_routes``): before a
request reaches its local handler, its ``model`` is read. ``remote:PEER/MODEL`` goes to that
peer; a model this daemon does not have, or has cold while a peer has it warm, goes to the
peer the decision picks (``actors/federation.py``, which gathers its inputs from the
runtime too); anything else (and every request another daemon relayed here) is served here
as before. Without remotes nothing is wrapped.

The relay sends the caller's body to the same route of the peer, which speaks the same
dialects, and relays its bytes back as they come: streams stay streams. The caller's key is
never forwarded: the peer's client carries this daemon's key for it. A peer that fails
before its answer starts (no connection, a 5xx) is marked down and the next candidate is
tried; one that fails mid-stream ends the stream with the dialect's error event. A client
that disconnects closes the peer's response, which cancels the request there.
"""

from __future__ import annotations

import time

import httpx
import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors import federation
from actors.chain_walk import FailoverExhausted
from actors.config import FailoverChain
from actors.engine import EngineState
from actors.engines.multipart import FormError, Part, boundary_of, encode_form, parse_form
from actors.errors import PeerIsSelf, PeerNotFound, PeerUnavailable
from actors.failover import Step
from actors.federation import LOCAL, Decision, Ranked, decision_for
from actors.peer import RELAYED_HEADER, PeerActor, PeerView
from actors.runtime import Runtime
from blazar.errors import BlazarError, Dialect, error_body
from blazar.serve.failover import failed_reply, walk_for, walk_headers
from blazar.web.ask import ask_of
from blazar.web.auth import model_visible
from blazar.web.call import Call, Handler, Reply, Routes
from blazar.web.common import SSE_CACHE, app_runtime, dialect_for, json_response
from blazar.web.vectors import RERANK_ROUTES

__all__ = ["PEER_HEADER", "peer_targets", "register", "relay", "stream_error", "wrap_routes"]

PEER_HEADER = "X-Blazar-Peer"
"""On a relayed answer: the peer that served it."""

FEDERATED_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/api/chat",
    "/api/generate",
    "/v1/embeddings",
    "/api/embed",
    "/api/embeddings",
    *RERANK_ROUTES,
    "/api/rerank",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
)
"""The routes whose requests may be relayed (each peer serves the same ones)."""

_FORWARDED = (
    "content-type",
    "accept",
    "anthropic-version",
    "anthropic-beta",
    "x-blazar-priority",
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


def _model_of(body: bytes, content_type: str = "application/json") -> str | None:
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


def _rewrite_model(body: bytes, model: str, content_type: str = "application/json") -> bytes:
    """``body`` naming ``model`` (a form keeps its boundary, so its Content-Type still holds)."""
    if _form_type(content_type):
        form = parse_form(body, content_type)
        form["model"] = [Part(name="model", data=model.encode())]
        return encode_form([p for ps in form.values() for p in ps], boundary_of(content_type))
    doc = msgspec.json.decode(body)
    doc["model"] = model
    return msgspec.json.encode(doc)


class _PeerStream:
    """The peer's answer bytes as they come; a failure midway ends them with the dialect's
    error event. Closing it closes the peer's response (the peer cancels the request)."""

    def __init__(self, response: httpx.Response, actor: PeerActor, dialect: Dialect) -> None:
        self._response = response
        self._chunks = response.aiter_raw()
        self._actor = actor
        self._dialect = dialect
        self._done = False

    def __aiter__(self) -> _PeerStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            self._done = True
            await self.aclose()
            raise
        except httpx.HTTPError as exc:
            self._done = True
            await self.aclose()
            reason = f"peer '{self._actor.peer}' failed during the answer: {exc or type(exc).__name__}"
            self._actor.failed_nowait(reason)
            return stream_error(self._dialect, "PEER_FAILED", reason + " — retry; see `blazar peers`")

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await self._response.aclose()


def _headers_for(call: Call) -> dict[str, str]:
    headers = {k: v for k in _FORWARDED if (v := call.headers.get(k)) is not None}
    headers[RELAYED_HEADER] = call.trace_id
    return headers


def _answer_headers(response: httpx.Response, peer: str) -> dict[str, str]:
    out = {PEER_HEADER: peer}
    for name, value in response.headers.items():
        low = name.lower()
        if low == "x-blazar-trace-id":
            out["X-Blazar-Peer-Trace-Id"] = value
        elif low.startswith("x-blazar-") or low in _KEPT:
            out[name] = value
    return out


async def relay(call: Call, targets: list[tuple[PeerActor, str]]) -> Reply:
    """Send ``call`` to each of ``targets`` (a peer and the model's name there) in turn until
    one starts answering; raises ``PEER_UNAVAILABLE`` when none does."""
    dialect = dialect_for(call.path, call.headers)
    passed: list[str] = []
    for i, (actor, model) in enumerate(targets):
        last = i == len(targets) - 1
        content_type = call.headers.get("content-type", "application/json")
        if _model_of(call.body, content_type) == model:
            body = call.body
        else:
            body = _rewrite_model(call.body, model, content_type)
        request = actor.client.build_request("POST", call.path, content=body, headers=_headers_for(call))
        try:
            response = await actor.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            actor.failed_nowait(reason)
            passed.append(f"{actor.peer}: {reason}")
            continue
        headers = _answer_headers(response, actor.peer)
        if passed:
            headers["X-Blazar-Peers-Passed"] = ", ".join(p.split(":", 1)[0] for p in passed)
        content_type = response.headers.get("content-type", "application/json")
        if response.status_code >= 500 and not last:
            await response.aclose()
            passed.append(f"{actor.peer}: answered {response.status_code}")
            continue
        if call.card is not None:
            call.card.engine = f"peer:{actor.peer}"
        streaming = content_type.startswith(("text/event-stream", "application/x-ndjson"))
        if not streaming or response.status_code != 200:
            try:
                content = await response.aread()
            except httpx.HTTPError as exc:
                actor.failed_nowait(str(exc) or type(exc).__name__)
                passed.append(f"{actor.peer}: the answer broke off ({type(exc).__name__})")
                continue
            finally:
                await response.aclose()
            if response.status_code >= 400:
                call.code = call.code or _code_of(content)
            return Reply(content, status=response.status_code, content_type=content_type, headers=headers)
        stream = _PeerStream(response, actor, dialect)
        call.on_cleanup(stream.aclose)
        return Reply(stream, content_type=content_type, headers={**SSE_CACHE, **headers})
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


# -- the wrapper ------------------------------------------------------------------------------------


_OPENAI_PATHS = frozenset(
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


def _speaks(call: Call, row: Ranked) -> bool:
    return not row.pass_through or (call.path in _OPENAI_PATHS and "anthropic-version" not in call.headers)


def _targets(runtime: Runtime, call: Call, decision: Decision, model: str) -> list[tuple[PeerActor, str]]:
    """The ranked peers of ``decision`` (this machine excluded) that speak the call's dialect."""
    out = []
    for row in decision.candidates:
        if row.rank is None or row.where == LOCAL or not _speaks(call, row):
            continue
        actor = runtime.peers.get(row.where)
        if actor is not None:
            out.append((actor, model))
    return out


def peer_targets(runtime: Runtime, call: Call, peer: str, model: str) -> list[tuple[PeerActor, str]]:
    """Where ``remote:PEER/MODEL`` goes (``actors.federation.peer_targets``), among the peers
    that speak the call's dialect; raises ``PEER_NOT_FOUND`` or ``PEER_UNAVAILABLE``."""
    try:
        actors = federation.peer_targets(runtime.peers, peer, model, speaks=lambda row: _speaks(call, row))
    except (PeerIsSelf, PeerNotFound) as exc:
        raise BlazarError(exc.code, exc.message, param="model") from None
    except PeerUnavailable as exc:
        raise BlazarError(exc.code, exc.message) from None
    return [(actor, model) for actor in actors]


async def route(runtime: Runtime, call: Call, local: Handler) -> Reply:
    """Serve ``call`` here with ``local``, or relay it to a peer (see the module doc)."""
    model = _model_of(call.body, call.headers.get("content-type", "application/json"))
    if model is None or RELAYED_HEADER in call.headers:
        return await local(call)
    if (chain := runtime.failover.chains.get(model)) is not None:
        if any(t.peer is not None for t in chain.parsed()):
            return await walk_chain(runtime, call, chain, local)
        return await local(call)  # all its targets are here: the chain's own walk
    remote = split_remote(model)
    if remote is not None:
        peer, name = remote
        call.set_model(model)
        call.check_model(name)
        return await relay(call, peer_targets(runtime, call, peer, name))
    engine = runtime.engine_named(model)
    if engine is not None and engine.state in (EngineState.READY, EngineState.STARTING):
        return await local(call)  # warm here: local wins, no census, no peer consulted
    decision = await decision_for(runtime, model)
    if decision.winner == LOCAL:
        return await local(call)
    targets = _targets(runtime, call, decision, model)
    here = any(c.where == LOCAL and c.rank is not None for c in decision.candidates)
    if not targets:
        down = [c.where for c in decision.candidates if c.skipped and c.skipped.startswith("down")]
        elsewhere = [c.where for c in decision.candidates if c.rank is not None and c.where != LOCAL]
        call.set_model(model)
        if elsewhere and not here:  # only pass-through peers have it, and this route is not OpenAI's
            raise BlazarError(
                "MODEL_NOT_FOUND",
                f"model '{model}' is not installed here; the pass-through peer {', '.join(elsewhere)} has "
                f"it, which is reached only through OpenAI's routes ({', '.join(sorted(_OPENAI_PATHS))})",
            )
        if down and not here:
            raise BlazarError(
                "PEER_UNAVAILABLE",
                f"model '{model}' is not installed here and no reachable peer has it (down: "
                f"{', '.join(down)}) — see `blazar peers` and `blazar route {model}`",
            )
        return await local(call)  # nowhere else: the local handler says MODEL_NOT_FOUND
    call.set_model(model)
    if call.card is not None:
        call.card.failover.append(f"federation: {decision.why}")
    try:
        return await relay(call, targets)
    except BlazarError as exc:
        if exc.code != "PEER_UNAVAILABLE" or not here:
            raise
        if call.card is not None:
            call.card.failover.append(f"federation: served here after the peers failed: {exc.message}")
        return await local(call)  # installed here (cold): the next candidate after the peers


async def walk_chain(runtime: Runtime, call: Call, chain: FailoverChain, local: Handler) -> Reply:
    """A request for a chain with ``remote:`` targets, walked here: each target in the order
    the chain's plan gives, a local one through the route's own handler (the body naming the
    target's model, ``x-blazar-engine`` its lane), a remote one relayed; a failure before the
    answer starts benches the target and moves on, as on a chain of local targets."""
    ask = ask_of(call)
    walk = walk_for(runtime, chain, ask, remote=True)
    body = call.body

    async def attempt(step: Step, engine: object) -> Reply:
        target = step.target
        call.headers.pop("x-blazar-engine", None)
        if target.peer is not None:
            return await relay(call, peer_targets(runtime, call, target.peer, target.model))
        call.body = body if target.model == chain.name else _rewrite_model(body, target.model)
        if target.lane is not None:
            call.headers["x-blazar-engine"] = target.lane
        call.asked = ask.but(lane=target.lane)  # the route's handler runs on the target's lane
        return await local(call)

    call.set_model(chain.name)
    try:
        reply = await walk.run(attempt, refused=lambda reply: failed_reply(call, reply))
    except FailoverExhausted:
        call.set_model(chain.name)
        raise
    reply.headers = {**(reply.headers or {}), **walk_headers(walk)}
    return reply


def wrap_routes(routes: Routes, runtime: Runtime) -> None:
    """Put the federation in front of the inference routes (only with ``[[remotes]]``)."""
    if not runtime.peers:
        return
    for path in FEDERATED_PATHS:
        local = routes.post.get(path)
        if local is not None:
            routes.post[path] = _wrapped(runtime, local)


def _wrapped(runtime: Runtime, local: Handler) -> Handler:
    async def handler(call: Call) -> Reply:
        return await route(runtime, call, local)

    return handler


# -- routes -----------------------------------------------------------------------------------------


def _visible(view: PeerView) -> PeerView:
    """``view`` with only the models the caller's key may use (as its own listings do)."""
    snap = view.snapshot
    if snap is None:
        return view
    snap = msgspec.structs.replace(
        snap,
        loaded=[m for m in snap.loaded if model_visible(m.model)],
        installed=[m for m in snap.installed if model_visible(m.name)],
    )
    return msgspec.structs.replace(view, snapshot=snap)


async def peers() -> Response:
    runtime = app_runtime()
    views = await runtime.peers.poll_all() if runtime.peers else []
    return json_response({"peers": [_visible(v) for v in views], "polled_at": time.time()})


async def route_of(model: str) -> Response:
    runtime = app_runtime()
    return json_response(await decision_for(runtime, model))


def remote_models(runtime: Runtime) -> list[dict[str, object]]:
    """The peers' models for ``/v1/models?include=remote``: ``remote:PEER/MODEL``, marked."""
    out: list[dict[str, object]] = []
    for view in runtime.peers.views():
        if view.snapshot is None:
            continue
        for m in view.snapshot.installed:
            if not model_visible(m.name):
                continue
            out.append(
                {
                    "id": f"remote:{view.name}/{m.name}",
                    "object": "model",
                    "created": 0,
                    "owned_by": view.name,
                    "blazar_peer": view.name,
                    "blazar_peer_state": view.state,
                }
            )
    return out


def register(app: QuartTrio) -> None:
    """``GET /api/peers`` and ``GET /api/route/<model>``."""
    app.get("/api/peers")(peers)
    app.get("/api/route/<path:model>")(route_of)
