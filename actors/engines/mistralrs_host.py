"""Serve a GGUF model through the ``mistralrs`` wheel as an OpenAI-style HTTP child process.

``python -m actors.engines.mistralrs_host -m MODEL.gguf --port N --api-key K --alias NAME``
loads the model with the wheel's Python API (the wheel has no HTTP server; the
tokenizer and chat template come from the GGUF itself, never from the network) and
serves ``GET /health`` (200 once loaded, 503 while loading), ``GET /v1/models``,
``GET /props`` (llama-server's shape: the context one request may hold and the
sequences the engine runs at once), ``POST /v1/chat/completions`` and
``POST /v1/completions``, streamed (SSE) or not. Every route but ``/health`` needs
the API key.

Lifetime rules, as for the llama.cpp host: SIGTERM/SIGINT stop accepting, let the
requests in flight finish for ``--drain-s`` and exit 0; end-of-file on stdin means
the daemon is gone (even after ``kill -9``) and the host exits at once.

A client that goes away mid-stream stops its generation: the host drops the wheel's
stream, and the engine cancels a sequence whose stream is gone at its next token.
"""

from __future__ import annotations

import argparse
import hmac
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator, MutableMapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from actors.engines import mistralrs_api as api
from actors.engines.lifeline import host_lifetime

__all__ = ["main", "parse_args", "prepare_env", "runner_kwargs"]

MAX_BODY = 32 * 1024 * 1024
_encode = msgspec.json.Encoder().encode


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mistralrs_host", description=__doc__)
    p.add_argument("-m", "--model", required=True, help="the GGUF file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed on READY)")
    p.add_argument("--api-key", default=None)
    p.add_argument("-a", "--alias", default=None, help="the model name requests and replies carry")
    p.add_argument("--max-seqs", type=int, default=1, help="sequences the engine runs at once")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU worker threads")
    p.add_argument("-s", "--seed", type=int, default=None, help="the engine's random seed")
    p.add_argument("--chat-template", default=None, help="a Jinja template file replacing the GGUF's")
    p.add_argument("--drain-s", type=float, default=3.0, help="how long TERM waits for requests in flight")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(list(argv))


def prepare_env(ns: argparse.Namespace, env: MutableMapping[str, str]) -> None:
    """Set before the wheel is imported: no network, quiet logs, the thread count."""
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env.setdefault("RUST_LOG", "info" if ns.verbose else "warn")
    if ns.threads:
        env["RAYON_NUM_THREADS"] = str(ns.threads)
        env["CANDLE_NUM_THREADS"] = str(ns.threads)


def runner_kwargs(ns: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments for ``Which.GGUF`` and for ``Runner`` (the file need not end in .gguf)."""
    path = os.path.abspath(ns.model)
    which = {"quantized_model_id": os.path.dirname(path), "quantized_filename": os.path.basename(path)}
    runner: dict[str, Any] = {"token_source": "none", "max_seqs": ns.max_seqs}
    if ns.seed is not None:
        runner["seed"] = ns.seed
    if ns.chat_template:
        runner["jinja_explicit"] = ns.chat_template
    return which, runner


class Engine:
    """The loaded wheel, shared by the request threads.

    Each ``Runner`` call takes a mutable borrow of it, and a second call from another
    thread meanwhile fails ("Already borrowed"), so calls are serialised. A chat is
    always submitted as a stream: the lock is held only to submit it, and the engine
    queues the sequences itself. The wheel's completion call has no stream, so a
    completion holds the lock until it is done."""

    def __init__(self, mistralrs: Any, runner: Any, *, max_seqs: int) -> None:
        self._m = mistralrs
        self._runner = runner
        self._lock = threading.Lock()
        self.max_seqs = max_seqs
        with self._lock:
            self.ctx = runner.max_sequence_length()

    def chat(self, opts: dict[str, Any]) -> Iterator[Any]:
        request = self._m.ChatCompletionRequest(model="default", stream=True, **opts)
        with self._lock:
            stream: Iterator[Any] = self._runner.send_chat_completion_request(request)
        return stream

    def complete(self, opts: dict[str, Any]) -> Any:
        request = self._m.CompletionRequest(model="default", **opts)
        with self._lock:
            return self._runner.send_completion_request(request)


def load_engine(ns: argparse.Namespace) -> Engine:
    import mistralrs

    # Read untyped: the wheel's stubs declare ``Which.GGUF`` as a class apart from ``Which``.
    m: Any = mistralrs
    which, kwargs = runner_kwargs(ns)
    runner = m.Runner(which=m.Which.GGUF(**which), **kwargs)
    return Engine(m, runner, max_seqs=ns.max_seqs)


def _engine_error(exc: Exception) -> tuple[int, dict[str, Any]]:
    text = str(exc).strip()
    message = text.splitlines()[0] if text else type(exc).__name__
    if "sequence length is greater than" in message:
        return 400, api.error_json(message, kind="invalid_request_error", code="context_length_exceeded")
    return 500, api.error_json(f"engine error: {message}", kind="server_error", code=500)


def _client_gone(sock: socket.socket) -> bool:
    """The peer has closed its end (it sends nothing else while it waits for a reply)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class _Gone(Exception):
    """The client closed the connection."""


class Host:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.alias = ns.alias or os.path.basename(ns.model)
        self.model_path = os.path.abspath(ns.model)
        self.key = ns.api_key.encode() if ns.api_key else None
        self.engine: Engine | None = None
        self.created = int(time.time())
        self._inflight = 0
        self._idle = threading.Condition()

    def enter(self) -> None:
        with self._idle:
            self._inflight += 1

    def leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def drain(self, timeout_s: float) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- framing ------------------------------------------------------------

    def _send_json(self, status: int, obj: Any) -> None:
        data = _encode(obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(
        self, status: int, message: str, *, kind: str, code: Any = None, param: str | None = None
    ) -> None:
        self._send_json(status, api.error_json(message, kind=kind, code=code or status, param=param))

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as exc:
            raise _Gone from exc

    def _event(self, obj: Any) -> None:
        self._write_chunk(b"data: " + _encode(obj) + b"\n\n")

    def _end_stream(self, *, done: bool) -> None:
        if done:
            self._write_chunk(b"data: [DONE]\n\n")
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError as exc:
            raise _Gone from exc

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            size = 0
            while True:
                n = int(self.rfile.readline(64).split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                size += n
                if size > MAX_BODY:
                    return None
                parts.append(self.rfile.read(n))
                self.rfile.readline(2)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        return self.rfile.read(length) if length else b""

    def _authorized(self) -> bool:
        key = self.server.host.key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else self.headers.get("X-Api-Key", "")
        if hmac.compare_digest(token.encode(), key):
            return True
        self._error(401, "Invalid API Key", kind="authentication_error")
        return False

    # -- routes -------------------------------------------------------------

    def do_GET(self) -> None:
        host = self.server.host
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/v1/health"):
            if host.engine is None:
                self._error(503, "Loading model", kind="unavailable_error")
            else:
                self._send_json(200, {"status": "ok"})
            return
        if not self._authorized():
            return
        if host.engine is None:
            self._error(503, "Loading model", kind="unavailable_error")
        elif path in ("/v1/models", "/models"):
            model = {
                "id": host.alias,
                "object": "model",
                "created": host.created,
                "owned_by": "mistral.rs",
                "max_model_len": host.engine.ctx,
            }
            self._send_json(200, {"object": "list", "data": [model]})
        elif path == "/props":
            self._send_json(
                200,
                {
                    "default_generation_settings": {"n_ctx": host.engine.ctx},
                    "total_slots": host.engine.max_seqs,
                    "model_alias": host.alias,
                    "model_path": host.model_path,
                    "engine": "mistral.rs",
                },
            )
        else:
            self._error(404, f"no route GET {path}", kind="not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self._authorized():
            return
        body = self._read_body()
        if body is None:
            self.close_connection = True
            self._error(413, f"request body over {MAX_BODY} bytes", kind="invalid_request_error")
            return
        host = self.server.host
        if path not in ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"):
            self._error(404, f"no route POST {path}", kind="not_found_error")
            return
        if host.engine is None:
            self._error(503, "Loading model", kind="unavailable_error")
            return
        host.enter()
        try:
            if path.endswith("/chat/completions"):
                self._chat(host.engine, body)
            else:
                self._completion(host.engine, body)
        except api.RequestError as exc:
            self._error(400, exc.message, kind="invalid_request_error", code=exc.code, param=exc.param)
        except _Gone:
            self.close_connection = True
        finally:
            host.leave()

    def _chat(self, engine: Engine, body: bytes) -> None:
        req = api.decode_chat(body)
        opts = api.chat_options(req)
        model, rid, created = self.server.host.alias, api.new_id("chatcmpl"), int(time.time())
        try:
            stream = engine.chat(opts)
            first = next(stream, None)
        except ValueError as exc:
            self._send_json(*_engine_error(exc))
            return
        chunks = _chain(first, stream)
        if not req.stream:
            self._chat_whole(chunks, rid=rid, model=model)
            return
        usage_wanted = req.stream_options is not None and req.stream_options.include_usage
        self._start_stream()
        delta: dict[str, Any] = {"role": "assistant", "content": ""}
        self._event(api.chat_chunk_json(rid=rid, model=model, created=created, delta=delta))
        usage = None
        try:
            for chunk in chunks:
                if _client_gone(self.connection):
                    raise _Gone
                choice = chunk.choices[0]
                if choice.delta.content:
                    delta = {"content": choice.delta.content}
                    self._event(api.chat_chunk_json(rid=rid, model=model, created=created, delta=delta))
                if choice.finish_reason is not None:
                    usage = chunk.usage
                    last = api.chat_chunk_json(
                        rid=rid, model=model, created=created, delta={}, finish=choice.finish_reason
                    )
                    if usage is not None and not usage_wanted:
                        last["timings"] = api.timings_json(usage)  # the usage chunk has them otherwise
                    self._event(last)
        except ValueError as exc:
            self._event(_engine_error(exc)[1])
            self._end_stream(done=False)
            return
        if usage_wanted and usage is not None:
            self._event(api.chat_chunk_json(rid=rid, model=model, created=created, usage=usage))
        self._end_stream(done=True)

    def _chat_whole(self, chunks: Iterator[Any], *, rid: str, model: str) -> None:
        texts: list[str] = []
        finish = usage = None
        try:
            for chunk in chunks:
                if _client_gone(self.connection):
                    raise _Gone
                choice = chunk.choices[0]
                texts.append(choice.delta.content or "")
                if choice.finish_reason is not None:
                    finish, usage = choice.finish_reason, chunk.usage
        except ValueError as exc:
            self._send_json(*_engine_error(exc))
            return
        self._send_json(
            200,
            api.chat_response_json(rid=rid, model=model, content="".join(texts), finish=finish, usage=usage),
        )

    def _completion(self, engine: Engine, body: bytes) -> None:
        req = api.decode_completion(body)
        opts = api.completion_options(req)
        model, rid = self.server.host.alias, api.new_id("cmpl")
        try:
            res = engine.complete(opts)
        except ValueError as exc:
            self._send_json(*_engine_error(exc))
            return
        choice = res.choices[0]
        if not req.stream:
            self._send_json(
                200,
                api.completion_response_json(
                    rid=rid, model=model, text=choice.text, finish=choice.finish_reason, usage=res.usage
                ),
            )
            return
        # The wheel's completion call does not stream: the whole text goes in one event.
        self._start_stream()
        usage_wanted = req.stream_options is not None and req.stream_options.include_usage
        event = api.completion_response_json(
            rid=rid, model=model, text=choice.text, finish=choice.finish_reason, usage=None
        )
        if not usage_wanted:
            event["timings"] = api.timings_json(res.usage)
        self._event(event)
        if usage_wanted:
            usage_chunk = api.completion_response_json(
                rid=rid, model=model, text="", finish=None, usage=res.usage
            )
            usage_chunk["choices"] = []
            self._event(usage_chunk)
        self._end_stream(done=True)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    if first is not None:
        yield first
        yield from rest


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], host: Host) -> None:
        self.host = host
        super().__init__(address, Handler)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(ns.model):
        print(f"error: model file not found: {ns.model}", file=sys.stderr)
        return 2
    prepare_env(ns, os.environ)
    # The wheel logs to stdout; keep its lines with ours in the stderr tail the daemon keeps.
    os.dup2(2, 1)

    stop = host_lifetime()
    result = {"rc": 0}

    host = Host(ns)
    try:
        server = _Server((ns.host, ns.port), host)
    except OSError as exc:
        print(f"error: cannot listen on {ns.host}:{ns.port}: {exc}", file=sys.stderr, flush=True)
        return 1
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()

    def load() -> None:
        started = time.monotonic()
        try:
            host.engine = load_engine(ns)
        except Exception as exc:
            print(f"error: mistral.rs could not load {ns.model}: {exc}", file=sys.stderr, flush=True)
            result["rc"] = 1
            stop.set()
            return
        port = server.server_address[1]
        took = time.monotonic() - started
        print(f"READY http://{ns.host}:{port} loaded in {took:.2f} s", file=sys.stderr, flush=True)

    # The load runs beside the main thread, which stays free to take a TERM at any time.
    threading.Thread(target=load, name="load", daemon=True).start()
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    host.drain(ns.drain_s)
    sys.stderr.flush()
    # Threads may still be inside the wheel (a stream past the drain): leave without the
    # interpreter's teardown, which has nothing of ours to save.
    os._exit(result["rc"])


if __name__ == "__main__":
    sys.exit(main())
