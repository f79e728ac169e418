"""The audit log: one JSON line per request, written by a thread of its own.

A request only appends a tuple to a bounded queue (``submit``, never blocking: a
full queue drops the line and counts it); every fifth of a second the writer thread
turns what has accumulated into JSON lines, scrubs whatever text they hold, and
appends them to ``audit.jsonl`` in one write, rotated by size (``audit.jsonl.1`` …
``.N``; a file may pass ``audit_max_mb`` by what one such write adds).

A line: ``time`` (UTC, ISO 8601), ``trace_id``, ``key`` (the API key's *name*),
``method``, ``route``, ``model``, ``status``, ``code`` (the ``blazar_code`` of an
error), ``prompt_tokens``, ``completion_tokens``, ``duration_ms``, ``ttft_ms``,
``error`` (scrubbed). With ``audit_prompts`` on, also ``prompt`` and ``answer``:
the text of the request and of the reply, scrubbed (``blazar.telemetry.scrub``) and cut
at ``TEXT_MAX`` characters. Keys, bearer tokens and client addresses are never
written.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from actors.ledger import RequestRecord
from blazar.telemetry.scrub import scrub

__all__ = ["TEXT_MAX", "AuditLine", "AuditLog", "text_of"]

TEXT_MAX = 32_768
"""The longest prompt or answer text a line keeps (characters)."""
_TEXT_KEYS = frozenset(
    {"content", "text", "prompt", "system", "input", "response", "thinking", "reasoning_content", "arguments"}
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
    """``submit`` from any thread or task; ``start`` once, ``close`` at shutdown.

    A request only appends to a deque (no lock, no wake-up); the writer thread wakes
    every ``interval_s``, turns what has accumulated into lines and appends them with one
    write. Per-line work and a thread switch per request would cost the serving loop a
    fifth of a millisecond each (the overhead benchmark measured it)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        backups: int = 5,
        prompts: bool = False,
        queue_max: int = 10_000,
        interval_s: float = 0.2,
    ) -> None:
        self.path = Path(path)
        self.prompts = prompts
        """Whether lines carry the request's and the reply's text (scrubbed)."""
        self.max_bytes = max_bytes
        self.backups = backups
        self.queue_max = queue_max
        self.interval_s = interval_s
        self.written = 0
        self.dropped = 0
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._submitted = 0
        self._handled = 0
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._size = 0

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open()
        self._thread = threading.Thread(target=self._run, name="blazar-audit", daemon=True)
        self._thread.start()

    def submit(
        self, record: RequestRecord, route: str, body: bytes | None = None, answer: bytes | None = None
    ) -> None:
        """Queue one request's line without waiting (past ``queue_max`` it is dropped, counted)."""
        if len(self._pending) >= self.queue_max:
            self.dropped += 1
            return
        self._pending.append((record, route, body, answer))
        self._submitted += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (within ``timeout_s``), then stop the writer."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._thread = None

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until everything submitted so far is written (tests, shutdown)."""
        target = self._submitted
        self._wake.set()
        with self._progress:
            self._progress.wait_for(lambda: self._handled >= target, timeout_s)

    def _run(self) -> None:
        encoder = msgspec.json.Encoder()
        try:
            while True:
                self._wake.wait(self.interval_s)
                self._wake.clear()
                stopping = self._stopping
                self._write_pending(encoder)
                if stopping:
                    return
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _write_pending(self, encoder: msgspec.json.Encoder) -> None:
        lines: list[bytes] = []
        taken = 0
        while self._pending:
            item = self._pending.popleft()
            taken += 1
            try:
                lines.append(encoder.encode(_line(*item)))
            except Exception:
                self.dropped += 1
        if lines:
            data = b"\n".join(lines) + b"\n"
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            try:
                assert self._fd is not None
                os.write(self._fd, data)
                self._size += len(data)
                self.written += len(lines)
            except OSError:
                self.dropped += len(lines)
        with self._progress:
            self._handled += taken
            self._progress.notify_all()

    def _open(self) -> None:
        # private to the daemon's user: a line names keys and models, and with
        # ``audit_prompts`` holds what users wrote; rotation renames, keeping the mode
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        """``audit.jsonl`` becomes ``.1``, ``.1`` becomes ``.2`` … (as the standard library's
        rotating handler does), keeping ``backups`` old files."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._open()
