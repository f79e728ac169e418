"""A stand-in ``llama-server`` for fast gateway tests: it records what it is sent.

Run as ``[engine] llama_server`` through ``install()``. It takes llama-server's flags,
gives each slot ``-c / -np`` capped at ``FAKE_CTX_TRAIN`` (times ``--rope-scale`` with
``--rope-scaling yarn``), as llama.cpp's server does, and reports that in ``/props`` and
``/slots``. Every start appends its flags, and every POST its body, as one JSON line to
``FAKE_LOG``. Chat and completions answer one short text (streamed when asked), and
``max_tokens`` as the completion token count, so tests can see the cap arrive.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def install(tmp_path: Path, *, ctx_train: int = 8192) -> tuple[Path, Path, dict[str, str]]:
    """An executable fake, its log file, and the environment it reads."""
    binary = tmp_path / "llama-server"
    binary.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(Path(__file__))!r}, run_name='__main__')\n"
    )
    binary.chmod(0o755)
    log = tmp_path / "fake-engine.jsonl"
    return binary, log, {"FAKE_LOG": str(log), "FAKE_CTX_TRAIN": str(ctx_train)}


def records(log: Path, kind: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line]
    return [r["data"] for r in rows if r["kind"] == kind]


def _write(kind: str, data: Any) -> None:
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps({"kind": kind, "data": data}) + "\n")


def _per_slot(ns: argparse.Namespace) -> int:
    per_slot = ns.ctx_size // max(1, ns.parallel)
    limit = int(os.environ.get("FAKE_CTX_TRAIN", "0")) or per_slot
    if ns.rope_scaling == "yarn" and ns.rope_scale:
        limit = int(limit * ns.rope_scale)
    return min(per_slot, limit)


def main() -> None:
    if sys.argv[1:] == ["--list-devices"]:
        print("Available devices:")
        return
    if sys.argv[1:] == ["--version"]:
        print("version: 1 (fake)", file=sys.stderr)
        return
    p = argparse.ArgumentParser()
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rope-scaling", default=None)
    p.add_argument("--rope-scale", type=float, default=None)
    ns, _ = p.parse_known_args()
    n_ctx = _per_slot(ns)
    _write("start", sys.argv[1:])

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

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json({"status": "ok"})
            elif self.path == "/props":
                self._json({"default_generation_settings": {"n_ctx": n_ctx}, "total_slots": ns.parallel})
            elif self.path == "/slots":
                self._json([{"id": i, "n_ctx": n_ctx} for i in range(ns.parallel)])
            else:
                self._json({"error": {"message": "not found"}}, 404)

        def do_POST(self) -> None:
            doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            _write("body", {"path": self.path, "body": doc})
            n = int(doc.get("max_tokens") or 3)
            usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
            if not doc.get("stream"):
                message = {"role": "assistant", "content": "ok"}
                self._json(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": 1,
                        "model": "fake",
                        "choices": [
                            {"index": 0, "message": message, "text": "ok", "finish_reason": "length"}
                        ],
                        "usage": usage,
                    }
                )
                return
            base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
            events = [
                {**base, "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]},
                {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                {**base, "choices": [], "usage": usage},
            ]
            body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            body += b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer(("127.0.0.1", ns.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
