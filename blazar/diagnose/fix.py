"""``blazar doctor --fix``: the safe repairs, each checked again just before it is made.

Only what loses nothing is repaired: a stale pid file, an engine no daemon owns, an
unfinished download no pull is writing. A complete blob, a manifest and the ledger
are never touched.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
from pathlib import Path

from actors.process import cmdline
from blazar.diagnose.facts import Finding, Fixed
from blazar.diagnose.gather import is_daemon_argv

__all__ = ["apply_fixes"]


def apply_fixes(findings: list[Finding]) -> list[Fixed]:
    done = []
    for finding in findings:
        if not finding.fixable:
            continue
        match finding.code:
            case "STALE_DAEMON_FILE":
                done.append(_stale_daemon_file(finding))
            case "STALE_PID_FILE":
                done.append(_stale_pid_file(finding))
            case "ORPHAN_ENGINE":
                done.append(_orphan(finding))
            case "PARTIAL_DOWNLOAD":
                done.append(_partial(finding))
    return done


def _stale_daemon_file(f: Finding) -> Fixed:
    path = Path(f.path or "")
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except FileNotFoundError:
        return Fixed(code=f.code, done=f"{path} is already gone", ok=True)
    except (OSError, ValueError, KeyError, TypeError):
        pid = None
    if pid is not None and is_daemon_argv(cmdline(pid)):
        return Fixed(code=f.code, done=f"left {path}: pid {pid} is a running daemon now", ok=False)
    path.unlink(missing_ok=True)
    return Fixed(code=f.code, done=f"removed {path}", ok=True)


def _stale_pid_file(f: Finding) -> Fixed:
    path = Path(f.path or "")
    try:
        pid_s, _parent, argv = path.read_text().split("\n", 2)
        if cmdline(int(pid_s)).strip() == argv.strip():
            return Fixed(code=f.code, done=f"left {path}: pid {pid_s} runs the engine again", ok=False)
    except FileNotFoundError:
        return Fixed(code=f.code, done=f"{path} is already gone", ok=True)
    except (OSError, ValueError):
        pass  # unreadable: nothing runs under it
    path.unlink(missing_ok=True)
    return Fixed(code=f.code, done=f"removed {path}", ok=True)


def _orphan(f: Finding) -> Fixed:
    pid = f.pid
    assert pid is not None
    if cmdline(pid).strip() != (f.argv or "").strip():
        what = f"killed nothing: pid {pid} no longer runs the engine"
    else:
        try:
            os.kill(pid, signal.SIGKILL)
            what = f"killed orphan engine pid {pid}"
        except ProcessLookupError:
            what = f"pid {pid} had already exited"
        except PermissionError:
            return Fixed(code=f.code, done=f"cannot kill pid {pid}: not permitted", ok=False)
    if f.path:
        Path(f.path).unlink(missing_ok=True)
        what += f"; removed {f.path}"
    return Fixed(code=f.code, done=what, ok=True)


def _partial(f: Finding) -> Fixed:
    partial = Path(f.path or "")
    lock = partial.with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Fixed(code=f.code, done=f"left {partial}: a pull is writing it now", ok=False)
        partial.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)  # under the lock: a pull that waits re-creates its own
    finally:
        os.close(fd)
    return Fixed(code=f.code, done=f"deleted unfinished download {partial}", ok=True)
