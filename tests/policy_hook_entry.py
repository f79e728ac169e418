"""Policy hooks as Python entry points (``entry = "tests.policy_hook_entry:…"``), and a small
real HTTP hook server, for tests/e2e/test_policy_hooks_e2e.py.

Each hook decides by a word in the request's last user message, so one daemon serves every case:

* ``REFUSE-REQUEST``: the HTTP pre hook refuses; ``SECRET``: it rewrites the messages (a
  completion's prompt) to ``REWRITTEN_PROMPT``; ``HOOK-SLOW``: it answers after its timeout (it fails closed).
* ``PY-SLOW``: the async Python pre hook sleeps past its timeout (it fails open).
* ``REDACT-ANSWER``: the HTTP post hook replaces the answer's text with ``REDACTED``;
  ``REFUSE-ANSWER``: it refuses the answer.
* ``PY-REDACT``: the sync Python post hook (no ``buffer_streams``) replaces it with ``PY_REDACTED``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import trio

REWRITTEN_PROMPT = "Say hello."
REDACTED = "[redacted by policy]"
PY_REDACTED = "[redacted by the python hook]"


def last_user(payload: dict[str, Any]) -> str:
    """The last user message's text, or a legacy completion's prompt."""
    request = payload["request"]
    if "prompt" in request:
        return str(request["prompt"])
    messages = request["messages"]
    return next((m.get("content", "") for m in reversed(messages) if m["role"] == "user"), "")


def decide_pre(payload: dict[str, Any]) -> dict[str, Any] | None:
    text = last_user(payload)
    if "REFUSE-REQUEST" in text:
        return {"action": "refuse", "reason": "the request names a forbidden word"}
    if "SECRET" in text and "prompt" in payload["request"]:
        return {"action": "rewrite", "prompt": REWRITTEN_PROMPT}
    if "SECRET" in text:
        return {"action": "rewrite", "messages": [{"role": "user", "content": REWRITTEN_PROMPT}]}
    if "HOOK-SLOW" in text:
        time.sleep(2.0)
    return {"action": "allow"}


def decide_post(payload: dict[str, Any]) -> dict[str, Any] | None:
    text = last_user(payload)
    if "REDACT-ANSWER" in text:
        return {"action": "redact", "text": REDACTED}
    if "REFUSE-ANSWER" in text:
        return {"action": "refuse", "reason": "the answer may not leave"}
    return None  # an empty verdict allows


async def py_pre(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An async entry point."""
    if "PY-SLOW" in last_user(payload):
        await trio.sleep(5)
    return None


def py_post(payload: dict[str, Any]) -> dict[str, Any]:
    """A sync entry point (the daemon runs it in a thread)."""
    if "PY-REDACT" in last_user(payload):
        return {"action": "redact", "text": PY_REDACTED}
    return {"action": "allow"}


class HookServer:
    """A real HTTP hook server on a free loopback port: ``/pre`` and ``/post``, each call's JSON kept."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.seen: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"


@contextmanager
def hook_server() -> Iterator[HookServer]:
    holder: list[HookServer] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
            holder[0].seen.append(payload)
            verdict = decide_pre(payload) if self.path == "/pre" else decide_post(payload)
            body = json.dumps(verdict).encode()
            try:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the daemon gave up on a slow answer
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(HookServer(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
