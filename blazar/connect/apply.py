"""Applying a plan: the file written atomically with a backup, the tool's test requests sent,
and the change undone when one fails. ``disconnect`` restores the backup.

The backup sits beside the file as ``<file>.blazar-backup``: the file as it was before the
first ``connect --write`` (a later connect keeps that first one, so disconnect always returns
to the user's own version). A file that did not exist gets ``<file>.blazar-created`` instead,
and disconnect removes the file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec

from blazar.connect._plan import Plan, Probe
from registry.files import atomic_write

__all__ = [
    "BACKUP_SUFFIX",
    "CREATED_SUFFIX",
    "Undo",
    "backup_path",
    "restore",
    "rollback",
    "send_probe",
    "write_plan",
]

BACKUP_SUFFIX = ".blazar-backup"
CREATED_SUFFIX = ".blazar-created"
_NEW_FILE_MODE = 0o600


class Undo(msgspec.Struct, frozen=True, kw_only=True):
    """What ``rollback`` needs to put the file back exactly as this write found it."""

    path: Path
    previous: bytes | None
    made_backup: bool
    made_marker: bool


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + CREATED_SUFFIX)


def write_plan(plan: Plan) -> Undo:
    """Write ``plan.new_text`` to ``plan.path``, keeping the user's original as the backup."""
    assert plan.path is not None and plan.new_text is not None
    path = plan.path
    previous = path.read_bytes() if path.exists() else None
    # A file this write creates may hold a key: readable by its owner alone.
    mode = path.stat().st_mode & 0o7777 if previous is not None else _NEW_FILE_MODE
    made_backup = made_marker = False
    if not backup_path(path).exists() and not _marker_path(path).exists():
        if previous is not None:
            atomic_write(backup_path(path), previous, mode=mode)
            made_backup = True
        else:
            atomic_write(_marker_path(path), b"", mode=_NEW_FILE_MODE)
            made_marker = True
    atomic_write(path, plan.new_text.encode(), mode=mode)
    return Undo(path=path, previous=previous, made_backup=made_backup, made_marker=made_marker)


def rollback(undo: Undo) -> None:
    """The file byte for byte as ``write_plan`` found it, and no backup this write made."""
    if undo.previous is None:
        undo.path.unlink(missing_ok=True)
    else:
        atomic_write(undo.path, undo.previous, mode=undo.path.stat().st_mode & 0o7777)
    if undo.made_backup:
        backup_path(undo.path).unlink(missing_ok=True)
    if undo.made_marker:
        _marker_path(undo.path).unlink(missing_ok=True)


def restore(path: Path) -> str | None:
    """Put back the file ``connect --write`` first found; what was done, or None: nothing to restore."""
    backup, marker = backup_path(path), _marker_path(path)
    if backup.exists():
        mode = backup.stat().st_mode & 0o7777
        atomic_write(path, backup.read_bytes(), mode=mode)
        backup.unlink()
        return f"restored {path} from {backup.name}"
    if marker.exists():
        path.unlink(missing_ok=True)
        marker.unlink()
        return f"removed {path} (connect had created it)"
    return None


def send_probe(base_url: str, probe: Probe, *, timeout_s: float = 300.0) -> str:
    """Send ``probe`` to the daemon; a short account of the answer, or ProbeFailed."""
    import httpx

    timeout = httpx.Timeout(10.0, read=timeout_s)
    body = json.dumps(probe.body).encode() if probe.body is not None else None
    headers = dict(probe.headers)
    if body is not None:
        headers.setdefault("content-type", "application/json")
    started = time.monotonic()
    try:
        with (
            httpx.Client(base_url=base_url, timeout=timeout, trust_env=False) as client,
            client.stream(probe.method, probe.path, content=body, headers=headers) as resp,
        ):
            text = resp.read().decode(errors="replace")
            status = resp.status_code
    except httpx.HTTPError as exc:
        raise ProbeFailed(f"{probe.method} {probe.path}: no answer from {base_url} ({exc})") from exc
    if status >= 400:
        raise ProbeFailed(f"{probe.method} {probe.path}: {status} {_error_text(text)}")
    took_s = time.monotonic() - started
    return f"{probe.method} {probe.path}: {status}, {check_answer(probe, text)} ({took_s:.1f} s)"


class ProbeFailed(Exception):
    """The tool's request did not succeed: the message says what came back."""


def _error_text(text: str) -> str:
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:200]
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err or text[:200])


def _sse_events(text: str) -> list[tuple[str, str]]:
    """(event name, data) pairs of an SSE body; the name is empty where none was sent."""
    events: list[tuple[str, str]] = []
    name, data = "", list[str]()
    for line in [*text.splitlines(), ""]:
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = "", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    return events


def check_answer(probe: Probe, text: str) -> str:
    """The answer read as the tool reads it: the end marker it waits for, and no error on the way."""
    match probe.answer:
        case "json":
            try:
                json.loads(text)
            except ValueError:
                raise ProbeFailed(f"{probe.path}: the answer is not JSON: {text[:120]!r}") from None
            return "JSON"
        case "sse-chat":
            events = _sse_events(text)
            for _, data in events:
                if data != "[DONE]" and "error" in json.loads(data):
                    raise ProbeFailed(f"{probe.path}: the stream failed: {_error_text(data)}")
            if not events or events[-1][1] != "[DONE]":
                raise ProbeFailed(f"{probe.path}: the stream ended without [DONE]")
            return f"{len(events) - 1} chunks, then [DONE]"
        case "sse-responses":
            names = [name for name, _ in _sse_events(text)]
            for bad in ("error", "response.failed"):
                if bad in names:
                    raise ProbeFailed(f"{probe.path}: the stream sent {bad}: {text[-300:]}")
            # The probe caps its answer: an `incomplete` for that cap still proves the route.
            for end in ("response.completed", "response.incomplete"):
                if end in names:
                    return f"{len(names)} events, then {end}"
            raise ProbeFailed(f"{probe.path}: the stream ended without response.completed")
        case "sse-anthropic":
            events = _sse_events(text)
            if any(name == "error" for name, _ in events):
                raise ProbeFailed(f"{probe.path}: the stream sent an error: {text[-300:]}")
            if not events or events[-1][0] != "message_stop":
                raise ProbeFailed(f"{probe.path}: the stream ended without message_stop")
            return f"{len(events)} events, then message_stop"
        case "ndjson":
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            for line in lines:
                if "error" in line:
                    raise ProbeFailed(f"{probe.path}: the stream failed: {line['error']}")
            if not lines or not lines[-1].get("done"):
                raise ProbeFailed(f"{probe.path}: the stream ended without done: true")
            return f"{len(lines)} lines, then done"
