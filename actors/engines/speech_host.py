"""What the whisper and piper hosts share: the HTTP framing, the key, the lifetime.

Each host is a child process the engine actor supervises like any engine:
``--port`` (0: any free port), ``--api-key`` checked on every route but ``/health``,
``GET /health`` 503 while the model loads and 200 once loaded, a ``READY`` line on
stderr with the address, SIGTERM/SIGINT to stop accepting and drain the requests
in flight for ``--drain-s``, and an exit at once when stdin reaches end-of-file
(the daemon is gone, even after ``kill -9``).
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
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from actors.engines.lifeline import host_lifetime

__all__ = ["BaseHandler", "Gone", "HostState", "add_common_args", "run_host"]

_encode = msgspec.json.Encoder().encode
_DRAIN_FACTOR = 4


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed on READY)")
    p.add_argument("--api-key", default=None)
    p.add_argument("-a", "--alias", default=None, help="the model name replies carry")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads for the engine")
    p.add_argument("--max-body-mb", type=float, default=25.0, help="the largest request body accepted")
    p.add_argument("--drain-s", type=float, default=3.0, help="how long TERM waits for requests in flight")


class Gone(Exception):
    """The client closed the connection."""


class HostState:
    """The loaded engine (None while loading) and the requests in flight."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self.alias: str = ns.alias or os.path.basename(os.path.normpath(ns.model))
        self.key = ns.api_key.encode() if ns.api_key else None
        self.max_body = int(ns.max_body_mb * 1024 * 1024)
        self.engine: Any = None
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


def error_json(message: str, *, kind: str, code: Any, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def state(self) -> HostState:
        return self.server.state

    def send_body(
        self, status: int, content_type: str, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, obj: Any) -> None:
        self.send_body(status, "application/json", _encode(obj))

    def error(
        self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        self.send_json(status, error_json(message, kind=kind, code=status, param=param))

    def start_chunked(self, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        if not data:
            return
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except OSError as exc:
            raise Gone from exc

    def end_chunked(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError as exc:
            raise Gone from exc

    def read_body(self) -> bytes | None:
        """The request body; None when it is over the limit (the 400 is then sent). An
        oversized body is read and dropped (up to ``_DRAIN_FACTOR`` times the limit), so the
        client, still sending, gets the answer rather than a reset connection."""
        limit = self.state.max_body
        size = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                n = int(self.rfile.readline(64).split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    if size <= limit:
                        return b"".join(parts)
                    break
                size += n
                if size > limit * _DRAIN_FACTOR:
                    break
                data = self.rfile.read(n)
                if size <= limit:
                    parts.append(data)
                else:
                    parts.clear()
                self.rfile.readline(2)
        else:
            size = int(self.headers.get("Content-Length") or 0)
            if size <= limit:
                return self.rfile.read(size) if size else b""
            if size <= limit * _DRAIN_FACTOR:
                left = size
                while left > 0 and (got := self.rfile.read(min(left, 1 << 20))):
                    left -= len(got)
        self.close_connection = True
        mib = 1024 * 1024
        self.error(
            400,
            f"the upload ({size / mib:.1f} MiB) is over this host's limit of {limit / mib:.0f} MiB: "
            "send a shorter file or a compressed format (mp3, opus, flac)",
        )
        return None

    def authorized(self) -> bool:
        key = self.state.key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else self.headers.get("X-Api-Key", "")
        if hmac.compare_digest(token.encode(), key):
            return True
        self.error(401, "Invalid API Key", kind="authentication_error")
        return False

    def check_client(self) -> None:
        """Raise ``Gone`` when the client has closed its end (it sends nothing more while it
        waits for the reply), so work for it stops between sentences or segments."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            gone = bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            raise Gone

    def route_path(self) -> str:
        return self.path.split("?", 1)[0]

    def health(self) -> bool:
        """Answer ``/health`` when that is the path; True when it was."""
        if self.route_path() not in ("/health", "/v1/health"):
            return False
        if self.state.engine is None:
            self.error(503, "Loading model", kind="unavailable_error")
        else:
            self.send_json(200, {"status": "ok"})
        return True

    def ready(self) -> bool:
        """Authorized and loaded; else the reply is sent."""
        if not self.authorized():
            return False
        if self.state.engine is None:
            self.error(503, "Loading model", kind="unavailable_error")
            return False
        return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHandler], state: HostState) -> None:
        self.state = state
        super().__init__(address, handler)


def run_host(
    ns: argparse.Namespace, state: HostState, handler: type[BaseHandler], load: Callable[[], Any], what: str
) -> int:
    """Listen, load the engine beside the main thread, print READY, and live until told to stop."""
    stop = host_lifetime()
    result = {"rc": 0}
    try:
        server = _Server((ns.host, ns.port), handler, state)
    except OSError as exc:
        print(f"error: cannot listen on {ns.host}:{ns.port}: {exc}", file=sys.stderr, flush=True)
        return 1
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()

    def loader() -> None:
        started = time.monotonic()
        try:
            state.engine = load()
        except Exception as exc:
            print(f"error: {what} could not load {ns.model}: {exc}", file=sys.stderr, flush=True)
            result["rc"] = 1
            stop.set()
            return
        port = server.server_address[1]
        took = time.monotonic() - started
        print(f"READY http://{ns.host}:{port} loaded in {took:.2f} s", file=sys.stderr, flush=True)

    threading.Thread(target=loader, name="load", daemon=True).start()
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    state.drain(ns.drain_s)
    sys.stderr.flush()
    # Threads may still be inside the engine past the drain: leave without the teardown.
    os._exit(result["rc"])
