"""A stand-in ``vllm`` for the multi-node tests (no GPU, no vLLM here): it records how it was
started, and the head serves the smallest OpenAI API.

Run as ``[engine] vllm`` through ``install()``. Every start appends one JSON line to
``FAKE_LOG``: its argv (``argv[0]`` is the configured program), its pid and the environment
the multi-node plan sets (``VLLM_*``, ``NCCL_*``, ``GLOO_*``). A node started with
``--headless`` (a worker) serves nothing and waits for a signal; the head serves ``/health``,
``/v1/models`` (with ``max_model_len``) and a chat completion that says ``FAKE_REPLY``,
checking the ``--api-key`` it was given.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_PREFIXES = ("VLLM_", "NCCL_", "GLOO_", "SGLANG_")


def install(folder: Path) -> Path:
    """An executable fake named ``vllm`` in ``folder`` (give each daemon its ``FAKE_LOG``)."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "vllm"
    program.write_text(
        f"#!{sys.executable}\nimport os, runpy, sys\nos.environ['FAKE_ARGV0'] = sys.argv[0]\n"
        f"runpy.run_path({str(Path(__file__))!r}, run_name='__main__')\n"
    )
    program.chmod(0o755)
    return program


def starts(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def _flag(name: str, default: str | None = None) -> str | None:
    argv = sys.argv
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print("0.0.0+fake")
        return
    env = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    with open(os.environ["FAKE_LOG"], "a") as f:
        argv = [os.environ.get("FAKE_ARGV0", sys.argv[0]), *sys.argv[1:]]  # as started, not runpy's
        f.write(json.dumps({"argv": argv, "pid": os.getpid(), "env": env}) + "\n")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if "--headless" in sys.argv:
        done.wait()
        return
    key = _flag("--api-key")
    name = _flag("--served-model-name", "fake")
    max_len = int(_flag("--max-model-len", "2048") or 2048)
    reply = os.environ.get("FAKE_REPLY", "hello from the head")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, obj: Any, status: int = 200) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            if key is None or self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._json({"error": {"message": "bad key"}}, 401)
            return False

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json({})
            elif self.path == "/v1/models" and self._authorized():
                self._json({"object": "list", "data": [{"id": name, "max_model_len": max_len}]})
            elif self.path != "/v1/models":
                self._json({"error": {"message": "not found"}}, 404)

        def do_POST(self) -> None:
            doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not self._authorized():
                return
            usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
            base = {"id": "chatcmpl-fake", "created": 1, "model": name}
            if not doc.get("stream"):
                message = {"role": "assistant", "content": reply}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                self._json({**base, "object": "chat.completion", "choices": [choice], "usage": usage})
                return
            chunk = {**base, "object": "chat.completion.chunk"}
            events = [
                {**chunk, "choices": [{"index": 0, "delta": {"content": reply}, "finish_reason": None}]},
                {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage},
            ]
            body = (
                b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", int(_flag("--port", "0") or 0)), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    done.wait()
    server.shutdown()


if __name__ == "__main__":
    main()
