"""The audit log: one JSON line per request, written by a thread of its own.

A request only puts a tuple on a bounded queue (``submit``, never blocking: a
full queue drops the line and counts it); the writer thread turns it into JSON,
scrubs whatever text it holds, and appends it to ``audit.jsonl`` through the
standard library's size-rotating file handler (``audit.jsonl.1`` … ``.N``).

A line: ``time`` (UTC, ISO 8601), ``trace_id``, ``key`` (the API key's *name*),
``method``, ``route``, ``model``, ``status``, ``code`` (the ``blazar_code`` of an
error), ``prompt_tokens``, ``completion_tokens``, ``duration_ms``, ``ttft_ms``,
``error`` (scrubbed). With ``audit_prompts`` on, also ``prompt`` and ``answer``:
the text of the request and of the reply, scrubbed (``blazar.scrub``) and cut
at ``TEXT_MAX`` characters. Keys, bearer tokens and client addresses are never
written.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from actors.ledger import RequestRecord
from blazar.scrub import scrub

__all__ = ["TEXT_MAX", "AuditLine", "AuditLog", "text_of"]

TEXT_MAX = 32_768
"""The longest prompt or answer text a line keeps (characters)."""
_TEXT_KEYS = frozenset(
    {"content", "text", "prompt", "system", "input", "response", "thinking", "reasoning_content", "arguments"}
)
_STOP = object()


class _PrivateRotatingHandler(logging.handlers.RotatingFileHandler):
    """Files readable by the daemon's user only (mode 0600): a line names keys and models,
    and with ``audit_prompts`` holds what users wrote. Rotation renames, keeping the mode."""

    def _open(self) -> Any:
        return open(
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=lambda path, flags: os.open(path, flags, 0o600),
        )


class AuditLine(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    time: str
    trace_id: str
    key: str | None = None
    method: str
    route: str
    model: str | None = None
    status: int
    code: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    duration_ms: float
    ttft_ms: float | None = None
    error: str | None = None
    prompt: str | None = None
    answer: str | None = None


def _strings(node: Any, out: list[str], key: str | None = None) -> None:
    if isinstance(node, str):
        if key in _TEXT_KEYS:
            out.append(node)
    elif isinstance(node, dict):
        for k, v in node.items():
            _strings(v, out, k)
    elif isinstance(node, list):
        for v in node:
            _strings(v, out, key)


def text_of(raw: bytes, *, sep: str) -> str:
    """The human text in a JSON body, an SSE stream or NDJSON lines (message contents,
    prompts, deltas), joined with ``sep``; anything that is not JSON is skipped."""
    docs: list[Any] = []
    try:
        docs.append(msgspec.json.decode(raw))
    except msgspec.DecodeError:
        for line in raw.splitlines():
            line = line.strip()
            if line.startswith(b"data:"):
                line = line[5:].strip()
            if not line or line == b"[DONE]" or line[:1] not in (b"{", b"["):
                continue
            try:
                docs.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                continue
    out: list[str] = []
    for doc in docs:
        _strings(doc, out)
    return sep.join(out)[:TEXT_MAX]


def _line(record: RequestRecord, route: str, body: bytes | None, answer: bytes | None) -> AuditLine:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.started_at))
    millis = int((record.started_at % 1) * 1000)
    return AuditLine(
        time=f"{stamp}.{millis:03d}Z",
        trace_id=record.trace_id,
        key=record.key,
        method=record.method,
        route=route,
        model=record.model,
        status=record.status,
        code=record.blazar_code,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        duration_ms=round(record.duration_ms, 3),
        ttft_ms=round(record.ttft_ms, 3) if record.ttft_ms is not None else None,
        error=scrub(record.error) if record.error else None,
        prompt=scrub(text_of(body, sep="\n")) if body else None,
        answer=scrub(text_of(answer, sep="")) if answer else None,
    )


class AuditLog:
    """``submit`` from any thread or task; ``start`` once, ``close`` at shutdown."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        backups: int = 5,
        prompts: bool = False,
        queue_max: int = 10_000,
    ) -> None:
        self.path = Path(path)
        self.prompts = prompts
        """Whether lines carry the request's and the reply's text (scrubbed)."""
        self.max_bytes = max_bytes
        self.backups = backups
        self.written = 0
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_max)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handler = _PrivateRotatingHandler(
            self.path, maxBytes=self.max_bytes, backupCount=self.backups, encoding="utf-8"
        )
        self._thread = threading.Thread(target=self._run, args=(handler,), name="blazar-audit", daemon=True)
        self._thread.start()

    def submit(
        self, record: RequestRecord, route: str, body: bytes | None = None, answer: bytes | None = None
    ) -> None:
        """Queue one request's line without waiting (a full queue drops it, counted)."""
        try:
            self._queue.put_nowait((record, route, body, answer))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (within ``timeout_s``), then stop the writer."""
        if self._thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        self._thread = None

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything submitted so far is written (tests, shutdown)."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return
        done.wait(timeout_s)

    def _run(self, handler: logging.Handler) -> None:
        encoder = msgspec.json.Encoder()
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    handler.flush()
                    item.set()
                    continue
                try:
                    line = encoder.encode(_line(*item)).decode()
                except Exception:
                    self.dropped += 1
                    continue
                handler.emit(logging.makeLogRecord({"msg": line, "args": None}))
                self.written += 1
        finally:
            handler.close()
