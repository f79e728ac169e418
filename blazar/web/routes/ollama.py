"""Ollama routes (``/``, ``/api/*``): chat, generate, embeddings and the model verbs.

Requests are translated to neutral types and run on the model's engine; the
answers are rendered as Ollama's NDJSON stream or single objects. Model verbs
work on the store. Errors use Ollama's ``{"error": "…"}`` shape.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio

from actors.engine import EngineState
from actors.errors import JobNotFound, JobNotRunnable
from actors.jobs import read_job
from actors.runtime import Runtime
from blazar.dialects import ollama, ollama_models, ollama_time
from blazar.dialects._wire import decode_json
from blazar.dialects.neutral import ChatRequest, DecodeError, Delta, Usage
from blazar.errors import CATALOG, BlazarError, Dialect
from blazar.serve import engine_call, mcp_loop, semantic_cache
from blazar.serve.candidates import translated
from blazar.serve.context import Relayed
from blazar.serve.engine_call import Timings
from blazar.serve.policy import hooks, structured
from blazar.serve.stores.semantic import semantic_cache_of
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.auth import model_visible, require_model
from blazar.web.asgi.call import Call, Reply, Routes
from blazar.web.asgi.replies import (
    NDJSON,
    app_runtime,
    json_reply,
    json_response,
    on_cleanup,
    read_body,
    stream_reply,
    stream_response,
)
from registry.disk import copy_model
from registry.errors import ChecksumMismatch
from registry.gguf import ModelInfo, check_complete
from registry.replica import BlobReceiver
from registry.store import ModelRecord, ModelSettings, Store, WeightFacts

if TYPE_CHECKING:
    from quart import Response
    from quart_trio import QuartTrio

log = logging.getLogger("blazar.web")

_WRITE_BYTES = 1 << 20
"""An upload's bytes are written to disk (in a worker thread) a MiB at a time."""

__all__ = ["OLLAMA_API_VERSION", "register", "register_routes"]

OLLAMA_API_VERSION = "0.13.4"
"""The Ollama API level these routes implement (clients compare it with their minimum).
0.13.4 is the first Ollama release that serves the OpenAI Responses API (``/v1/responses``),
which Codex's ``--oss`` mode checks for; Blazar serves it too."""


def _now() -> str:
    return ollama_time.rfc3339_ns(time.time_ns())


def _timings(t: Timings) -> ollama.Timings:
    return ollama.Timings(
        total_ns=t.total_ns,
        load_ns=t.load_ns if t.loaded else 0,
        prompt_eval_ns=t.prompt_eval_ns,
        eval_ns=t.eval_ns,
    )


class _Encoder:
    """Adapts the Ollama NDJSON encoder to the gateway's stream protocol."""

    def __init__(self, model: str, dialect: Literal["chat", "generate"], think: bool) -> None:
        self._enc = ollama.StreamEncoder(model, dialect=dialect, think=think)

    def start(self, prompt: Usage | None) -> bytes:
        return b""

    def feed(self, delta: Delta) -> bytes:
        return self._enc.feed(delta, created_at=_now())

    def finish(self, final: Delta, timings: Timings) -> bytes:
        head = self._enc.feed(final, created_at=_now())
        return head + self._enc.finish(created_at=_now(), timings=_timings(timings))

    def error(self, code: str, message: str) -> bytes:
        return ollama.encode_error(code, message)

    def keepalive(self) -> bytes:
        # NDJSON has no line a client would skip; Ollama itself stays silent too.
        return b""


def _details(info: ModelInfo, fmt: str = "gguf") -> ollama_models.ModelDetails:
    return ollama_models.ModelDetails(
        format=fmt,
        family=info.architecture,
        families=[info.architecture],
        parameter_size=ollama_models.format_parameter_size(info.parameter_count),
        quantization_level=info.file_type or "",
    )


def _model_info(info: ModelInfo) -> dict[str, Any]:
    arch = info.architecture
    doc: dict[str, Any] = {
        "general.architecture": arch,
        "general.parameter_count": info.parameter_count,
        "general.file_type": info.file_type,
    }
    if info.name:
        doc["general.name"] = info.name
    if info.size_label:
        doc["general.size_label"] = info.size_label
    for key, value in (
        ("context_length", info.context_length),
        ("block_count", info.block_count),
        ("attention.head_count", info.head_count),
        ("attention.head_count_kv", info.head_count_kv),
        ("embedding_length", info.embedding_length),
        ("feed_forward_length", info.feed_forward_length),
        ("vocab_size", info.vocab_size),
        ("rope.freq_base", info.rope_freq_base),
    ):
        if value is not None:
            doc[f"{arch}.{key}"] = value
    return doc


class _Body(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None
    stream: bool = True
    insecure: bool = False

    def target(self) -> str:
        name = self.model or self.name
        if not name:
            raise DecodeError("missing required field `model`")
        return name


class _CreateBody(_Body, kw_only=True):
    from_: str | None = msgspec.field(default=None, name="from")
    files: dict[str, str] | None = None
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] | None = None
    quantize: str | None = None


def _hex(digest: str) -> str:
    hexpart = digest.removeprefix("sha256:").removeprefix("sha256-")
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise BlazarError("BAD_REQUEST", f"invalid digest {digest!r}: expected sha256:<64 hex digits>")
    return hexpart


class _CopyBody(msgspec.Struct, kw_only=True):
    source: str
    destination: str


def register_routes(routes: Routes, runtime: Runtime) -> None:
    """``POST /api/chat`` and ``/api/generate``, served by the gateway layer itself."""

    async def run_chat(call: Call, req: ChatRequest, dialect: Literal["chat", "generate"]) -> Reply:
        call.set_model(req.model)
        think = req.think is not False
        action = ollama.load_action(req)
        if action == "unload":
            await trio.to_thread.run_sync(runtime.store.get, req.model)
            # as Ollama: another client's request in flight finishes first
            await runtime.lifecycle.unload(req.model, when_idle=True)
            body = ollama.encode_load_response(
                req.model, created_at=_now(), done_reason="unload", dialect=dialect
            )
            return json_reply(body)
        if (
            dialect == "chat"
            and action is None
            and (picked := await translated.answer(runtime, call, ask_of(call), req))
        ):
            tr, resp, said = picked
            body = ollama.encode_chat_response(
                resp, created_at=_now(), timings=_timings(tr.timings), think=think, model=resp.model
            )
            return json_reply(body, headers={**tr.headers(), **said})
        if dialect == "chat" and action is None and (servers := mcp_loop.selected_servers(runtime, call)):
            if not req.stream:
                loop, resp = await mcp_loop.answer(runtime, req, servers, ask_of(call))
                body = ollama.encode_chat_response(
                    resp, created_at=_now(), timings=_timings(loop.timings()), think=think, model=req.model
                )
                return json_reply(body, headers={**loop.headers(), "X-Blazar-Mcp": loop.run.header()})
            looped = await mcp_loop.McpStream.open(
                runtime, req, servers, _Encoder(req.model, dialect, think), mcp_loop.SILENT, ask_of(call)
            )
            call.on_cleanup(looped.aclose)
            return stream_reply(looped, content_type=NDJSON, headers=looped.headers())
        tr = engine_call.EngineCall(runtime, req, ask_of(call))
        await tr.prepare()
        if action == "load":
            tr.release()
            body = ollama.encode_load_response(
                req.model, created_at=_now(), done_reason="load", dialect=dialect
            )
            return json_reply(body)
        if not req.stream:
            resp = await tr.complete()
            encode = ollama.encode_chat_response if dialect == "chat" else ollama.encode_generate_response
            return json_reply(
                encode(resp, created_at=_now(), timings=_timings(tr.timings), think=think, model=req.model),
                headers=tr.headers(),
            )
        stream = await tr.stream(_Encoder(req.model, dialect, think))
        call.on_cleanup(stream.aclose)
        sent: AsyncIterator[bytes] = stream
        if (want := structured.wanted(req.response_format)) is not None:
            sent = structured.NdjsonReceipt(stream, want, tr.enforced())  # its check on the last line
        return stream_reply(sent, content_type=NDJSON, headers=tr.headers())

    async def chat(call: Call) -> Reply:
        req = ollama.decode_chat_request(call.body)
        if ollama.load_action(req) is not None:  # a load or an unload: nothing to cache nor judge
            return await run_chat(call, req, "chat")
        ask = ask_of(call)
        call.set_model(req.model)  # the key's scope first: a hook is not asked about a refused model

        async def cached(_: Relayed, req: ChatRequest) -> Reply:  # the body is not relayed: ``call`` stands
            return await semantic_cache.through(runtime, call, ask, req, lambda: run_chat(call, req, "chat"))

        return await hooks.through(runtime, call, req, Dialect.OLLAMA, cached)

    async def generate(call: Call) -> Reply:
        req = ollama.decode_generate_request(call.body)
        if ollama.load_action(req) is not None:
            return await run_chat(call, req, "generate")
        call.set_model(req.model)
        return await hooks.through(
            runtime, call, req, Dialect.OLLAMA, lambda _, req: run_chat(call, req, "generate")
        )

    routes.add("/api/chat", chat)
    routes.add("/api/generate", generate)


async def _info_of(store: Store, record: ModelRecord) -> ModelInfo:
    return await trio.to_thread.run_sync(store.info, record)


# -- probes ------------------------------------------------------------


async def root() -> Response:
    from quart import Response

    return Response("Ollama is running", content_type="text/plain; charset=utf-8")


async def version() -> Response:
    from blazar import __version__

    return json_response({"version": OLLAMA_API_VERSION, "blazar_version": __version__})


# -- listings ----------------------------------------------------------


async def tags() -> Response:
    store = app_runtime().store
    records = await trio.to_thread.run_sync(store.list)
    entries = []
    for r in records:
        if not model_visible(r.name):
            continue
        info = await _info_of(store, r)
        entries.append(
            ollama_models.TagEntry(
                name=r.name,
                size=r.size,
                digest=r.digest,
                modified_at=r.modified_at,
                details=_details(info, r.format),
            )
        )
    return json_response(ollama_models.encode_tags(entries))


async def ps() -> Response:
    runtime = app_runtime()
    store = runtime.store
    entries = []
    for engine in runtime.loaded():
        if engine.state not in (EngineState.READY, EngineState.STARTING):
            continue
        record = await trio.to_thread.run_sync(store.find, engine.spec.model)
        if record is None or not model_visible(record.name):
            continue
        info = await _info_of(store, record)
        asleep = await runtime.sleeping(engine.spec.model)
        entries.append(
            ollama_models.PsEntry(
                name=record.name,
                size=record.size,
                digest=record.digest,
                details=_details(info),
                context_length=engine.served_ctx or engine.spec.ctx_per_slot,
                expires_at=runtime.lifecycle.expires_at(engine.spec.model),
                engine=engine.engine_kind,
                slots=engine.spec.slots,
                in_flight=engine.in_flight,
                extras=_ps_extras(runtime, record.name, asleep, [d.name for d in engine.degrades]),
            )
        )
    return json_response(ollama_models.encode_ps(entries))


def _ps_extras(runtime: Runtime, model: str, asleep: bool | None, degrades: list[str]) -> dict[str, Any]:
    """Blazar's own fields of a ``/api/ps`` entry: whether the engine sleeps, what it logged at
    start it does less than asked (``X-Blazar-Warnings``'s engine names), and what the semantic
    cache did for requests to the model."""
    extras: dict[str, Any] = {} if asleep is None else {"blazar_sleeping": asleep}
    if degrades:
        extras["blazar_degrades"] = degrades
    cache = semantic_cache_of(runtime)
    if cache is not None and cache.usable:  # what the semantic cache did for requests to it
        extras["blazar_semantic_cache"] = cache.stats(model)
    return extras


async def show() -> Response:
    store = app_runtime().store
    name = decode_json(await read_body(), _Body).target()
    require_model(name)
    record = await trio.to_thread.run_sync(store.get, name)
    require_model(record.name)
    info = await _info_of(store, record)
    template = info.chat_template or ""
    modelfile = f"# Modelfile generated by Blazar\nFROM {record.path}\n"
    if template:
        modelfile += f'TEMPLATE """{template}"""\n'
    model_info = _model_info(info)
    # Tools work on every chat model: emulated when the template has none.
    capabilities = ollama_models.model_capabilities(
        embedding=record.kind == "embedding",
        rerank=record.kind == "rerank" or info.reranker,
        tools=True,
        vision=record.projector is not None,
    )
    if record.files:  # not one GGUF: its facts, and for all but a text model its kind as its capability
        facts = msgspec.to_builtins(record.speech) if record.speech else {}
        model_info = {"general.architecture": info.architecture, "general.kind": record.kind}
        model_info |= {
            f"{info.architecture}.{key}": value for key, value in facts.items() if key != "architecture"
        }
        model_info["general.file_count"] = len(record.files)
        if record.facts is not None:
            model_info |= _weight_info(info.architecture, record.facts)
        if record.kind == "chat":
            capabilities = ollama_models.model_capabilities(tools=True)
        elif record.kind == "embedding":
            capabilities = ollama_models.model_capabilities(embedding=True)
        else:
            capabilities = [record.kind]
    # Ollama's `capabilities` keep their meaning (what the model is built for); what the
    # certificate saw it do is Blazar's own field beside them.
    cert = app_runtime().certificates.get(record.name)
    certified = (
        {
            "engine": cert.engine,
            "created_at": ollama_time.rfc3339_ns(int(cert.created_at * 1e9)),
            "capabilities": cert.summary(),
        }
        if cert is not None
        else None
    )
    body = ollama_models.encode_show(
        extras={"blazar_certificate": certified},
        modelfile=modelfile,
        parameters="",
        template=template,
        details=_details(info, record.format),
        model_info=model_info,
        capabilities=capabilities,
        modified_at=record.modified_at,
    )
    return json_response(body)


def _weight_info(arch: str, facts: WeightFacts) -> dict[str, Any]:
    """``model_info`` keys of what a directory's or checkpoint's headers say, in GGUF's names."""
    doc: dict[str, Any] = {
        "general.parameter_count": facts.parameters,
        "general.quantization": facts.quantization,
        "general.dtype": facts.dtype,
        f"{arch}.context_length": facts.context_length,
    }
    doc |= {f"{arch}.{key}": value for key, value in facts.hparams.items()}
    return {key: value for key, value in doc.items() if value is not None}


# -- model verbs -------------------------------------------------------


async def _pull_lines(runtime: Runtime, job_id: str) -> AsyncIterator[bytes]:
    """The pull job's events (``actors/pulls.py``) as Ollama's NDJSON progress lines, until it
    has ended."""
    ended = False
    async for event in runtime.jobs.follow(job_id):
        ended = ended or event.kind == "error" or event.data.get("status") == "success"
        if event.kind == "error":
            code = event.data["code"]
            yield ollama.encode_error(code if code in CATALOG else "INTERNAL", event.data["message"])
        elif event.kind == "progress":
            p = event.data
            yield ollama_models.encode_pull_progress(
                ollama_models.pull_status(p["status"], p.get("digest")),
                digest=p.get("digest"),
                total=p.get("total"),
                completed=p.get("completed"),
            )
    if not ended:
        job = await trio.to_thread.run_sync(read_job, runtime.jobs.path, job_id)
        state = job.state if job is not None else "gone"
        message = f"the pull was {state} before it finished — pull again to resume it"
        yield ollama.encode_error("UNAVAILABLE", message)


async def pull_model() -> Response:
    """A pull is a job (``blazar jobs`` lists it); this request follows it, and cancels it
    if the client leaves before it has ended, as Ollama does."""
    runtime = app_runtime()
    body: _Body = decode_json(await read_body(), _Body)
    name = body.target()
    job = await runtime.pull(name)

    async def cancel() -> None:
        try:
            await runtime.jobs.cancel(job.id)
        except (JobNotFound, JobNotRunnable):
            pass  # it has ended: nothing to stop

    on_cleanup(cancel)
    if body.stream:
        return stream_response(_pull_lines(runtime, job.id), content_type=NDJSON)
    last = b""
    async for line in _pull_lines(runtime, job.id):
        last = line
    doc = msgspec.json.decode(last)
    if "error" in doc:
        raise BlazarError(doc.get("blazar_code", "BAD_GATEWAY"), doc["error"])
    return json_response(last)


async def delete() -> Response:
    from quart import Response

    runtime = app_runtime()
    store = runtime.store
    name = decode_json(await read_body(), _Body).target()
    record = await trio.to_thread.run_sync(store.get, name)
    engine = runtime.engine_if_loaded(record.name)
    if engine is not None and engine.in_flight:
        raise BlazarError(
            "MODEL_BUSY",
            f"model '{record.name}' is serving {engine.in_flight} request(s) — wait for them to finish "
            "or unload it (`keep_alive: 0`), then delete again",
        )
    await runtime.forget(record.name)
    await trio.to_thread.run_sync(store.remove, record.name)
    return Response(b"", 200)


async def copy() -> Response:
    from quart import Response

    runtime = app_runtime()
    store = runtime.store
    body: _CopyBody = decode_json(await read_body(), _CopyBody)
    copied = await trio.to_thread.run_sync(
        functools.partial(copy_model, store, body.source, body.destination, replace=True)
    )
    await runtime.forget(copied.name)
    return Response(b"", 200)


async def blob_exists(digest: str) -> Response:
    from quart import Response

    store = app_runtime().store
    return Response(b"", 200 if await trio.to_thread.run_sync(store.has_blob, _hex(digest)) else 404)


async def blob_upload(digest: str) -> Response:
    """Receive a file for ``/api/create``; the bytes must hash to the digest in the path."""
    from quart import Response, request

    store = app_runtime().store
    sha = _hex(digest)
    if await trio.to_thread.run_sync(store.has_blob, sha):
        # Read the body anyway: unread bytes would be taken for the next request.
        async for _ in request.body:
            pass
        return Response(b"", 200)
    # Hashed as it is written; bytes that are not the digest are deleted, never stored.
    with BlobReceiver(store, sha, expected_bytes=request.content_length) as receiver:
        pending: list[bytes] = []
        size = 0
        async for chunk in request.body:
            pending.append(chunk)
            size += len(chunk)
            if size >= _WRITE_BYTES:
                await trio.to_thread.run_sync(receiver.write, b"".join(pending))
                pending, size = [], 0
        await trio.to_thread.run_sync(receiver.write, b"".join(pending))
        try:
            await trio.to_thread.run_sync(receiver.finish)
        except ChecksumMismatch as exc:
            raise BlazarError("BAD_REQUEST", f"blob {digest}: {exc} — upload again") from exc
    return Response(b"", 201)


async def create() -> Response:
    runtime = app_runtime()
    store = runtime.store
    body: _CreateBody = decode_json(await read_body(), _CreateBody)
    name = body.target()
    if body.quantize:
        raise BlazarError(
            "BAD_REQUEST", "quantize is not supported: create from a GGUF that is already quantized"
        )
    base: ModelRecord | None = None
    lines: list[bytes] = []
    if body.from_:
        base = await trio.to_thread.run_sync(store.get, body.from_)
        lines.append(ollama_models.encode_pull_progress(f"using existing model {base.name}"))
    elif body.files:
        ggufs = [d for f, d in body.files.items() if f.endswith(".gguf")] or list(body.files.values())
        sha = _hex(ggufs[0])
        if not await trio.to_thread.run_sync(store.has_blob, sha):
            raise BlazarError(
                "BAD_REQUEST",
                f"blob {ggufs[0]} is not on this machine — upload it with POST /api/blobs/{ggufs[0]}",
            )
        blob = store.blob_path(sha)
        now = time.time()
        size = (await trio.Path(blob).stat()).st_size
        base = ModelRecord(
            name=name, digest=f"sha256:{sha}", size=size, path=str(blob), source="create", created_at=now,
            modified_at=now,
        )  # fmt: skip
        lines.append(ollama_models.encode_pull_progress(f"using existing layer sha256:{sha}"))
    else:
        raise DecodeError("send `from` (an installed model) or `files` (uploaded blobs) to create a model")
    previous = base.settings or ModelSettings()
    settings = ModelSettings(
        system=body.system if body.system is not None else previous.system,
        template=body.template if body.template is not None else previous.template,
        parameters={**previous.parameters, **(body.parameters or {})},
    )
    now = time.time()
    record = msgspec.structs.replace(
        base,
        name=name,
        settings=settings,
        created_at=now,
        modified_at=now,
        source=f"create:{base.source}",
    )
    info = await trio.to_thread.run_sync(store.info, record)  # refuse a blob that is not a GGUF
    if body.files and not body.from_:
        # A blob cut short makes a model that fails only at its first request: refused now, as
        # `blazar import` refuses the same file.
        check_complete(
            info,
            record.size,
            f"blob {ggufs[0]}",
            advice=f"upload the whole file again with POST /api/blobs/{ggufs[0]}",
        )
    await trio.to_thread.run_sync(store.write_manifest, record)
    await runtime.forget(record.name)
    lines += [
        ollama_models.encode_pull_progress("writing manifest"),
        ollama_models.encode_pull_progress("success"),
    ]
    if body.stream:
        return stream_response(b"".join(lines), content_type=NDJSON)
    return json_response(lines[-1])


async def push() -> Response:
    raise BlazarError(
        "LOCAL_ONLY",
        "Blazar never pushes models to a registry: push is refused by design (copy a model to "
        "another Blazar daemon with `blazar replicate NAME --to PEER`, or copy the files from "
        "`blazar show NAME --json`)",
    )


def register(app: QuartTrio) -> None:
    """The Ollama routes the framework serves (chat and generate are the gateway's)."""
    app.route("/", methods=["GET", "HEAD"])(root)
    app.get("/api/version")(version)
    app.get("/api/tags")(tags)
    app.get("/api/ps")(ps)
    app.post("/api/show")(show)
    app.post("/api/pull")(pull_model)
    app.delete("/api/delete")(delete)
    app.post("/api/copy")(copy)
    app.route("/api/blobs/<digest>", methods=["HEAD"])(blob_exists)
    app.post("/api/blobs/<digest>")(blob_upload)
    app.post("/api/create")(create)
    app.post("/api/push")(push)


async def _drain(recv: trio.MemoryReceiveChannel[bytes]) -> AsyncIterator[bytes]:
    async with recv:
        async for line in recv:
            yield line
