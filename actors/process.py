"""One child process: spawn, drain its pipes, keep a stderr tail, stop it politely.

The child's stdin is a pipe we never write to. Our hosts exit when it reaches
end-of-file, which happens whenever this process dies, ``kill -9`` included. A
pidfile under the run directory lets a restarted daemon reap what a crash left.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import msgspec
import trio

from registry.files import atomic_write

__all__ = ["ChildProcess", "PidFile", "TailBuffer", "cmdline", "read_pidfiles", "reap_orphans"]

_PIDFILE_SUFFIX = ".pid"


class TailBuffer:
    """The last ``limit`` bytes written to it, cheap to append to."""

    def __init__(self, limit: int = 64 * 1024) -> None:
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def write(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.popleft())

    def getvalue(self) -> bytes:
        data = b"".join(self._chunks)
        return data[-self._limit :]

    def last(self, size: int) -> bytes:
        """The last ``size`` bytes (or fewer), joining only the chunks they lie in."""
        picked: list[bytes] = []
        have = 0
        for chunk in reversed(self._chunks):
            if have >= size:
                break
            picked.append(chunk)
            have += len(chunk)
        return b"".join(reversed(picked))[-min(size, self._limit) :]

    def text(self) -> str:
        return self.getvalue().decode("utf-8", "replace")

    def summary(self, lines: int = 6) -> str:
        """The last few non-empty lines, for an error message, led by the last line that
        starts with ``error:`` when it is older: the engine's own logger writes from
        another thread, so its lines can land after the final error line."""
        every = [ln.strip() for ln in self.text().splitlines() if ln.strip()]
        kept = every[-lines:]
        errors = [ln for ln in every if ln.startswith("error:")]
        if errors and errors[-1] not in kept:
            kept = [errors[-1], *kept[1:]]
        return " | ".join(kept)


class ChildProcess:
    """A started child. ``wait()`` returns its exit code; ``stop()`` is TERM then KILL."""

    def __init__(self, proc: trio.Process, *, name: str, pidfile: Path | None) -> None:
        self.proc = proc
        self.name = name
        self.pidfile = pidfile
        self.stderr_tail = TailBuffer()
        self.stdout_tail = TailBuffer(8 * 1024)
        self.first_stdout_line = trio.Event()
        self.exited = trio.Event()
        self.ended_by: str | None = None
        """Why it ended when it did not end on its own (``stopped: …``); None: it exited."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def _drain(self, stream: trio.abc.ReceiveStream, tail: TailBuffer, signal_line: bool) -> None:
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            if not data:
                return
            tail.write(bytes(data))
            if signal_line and b"\n" in data:
                self.first_stdout_line.set()

    async def serve(self, *, task_status: trio.TaskStatus[ChildProcess] = trio.TASK_STATUS_IGNORED) -> int:
        """Drain the pipes until the child exits; returns its exit code."""
        try:
            async with trio.open_nursery() as nursery:
                assert self.proc.stdout is not None and self.proc.stderr is not None
                nursery.start_soon(self._drain, self.proc.stdout, self.stdout_tail, True)
                nursery.start_soon(self._drain, self.proc.stderr, self.stderr_tail, False)
                task_status.started(self)
                code = await self.proc.wait()
                nursery.cancel_scope.deadline = trio.current_time() + 0.5
            return code
        finally:
            self.exited.set()
            self.first_stdout_line.set()
            if self.pidfile is not None:
                self.pidfile.unlink(missing_ok=True)

    async def stop(self, grace_s: float) -> None:
        """TERM, wait up to ``grace_s``, then KILL. Always bounded; never raises."""
        with trio.CancelScope(shield=True):
            if self.proc.returncode is None:
                try:
                    self.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                with trio.move_on_after(grace_s):
                    await self.proc.wait()
                if self.proc.returncode is None:
                    try:
                        self.proc.kill()
                    except ProcessLookupError:
                        pass
                    with trio.move_on_after(grace_s):
                        await self.proc.wait()
            if self.proc.stdin is not None:
                with trio.move_on_after(0.1):
                    await self.proc.stdin.aclose()
            if self.pidfile is not None:
                self.pidfile.unlink(missing_ok=True)

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        name: str,
        env: dict[str, str] | None = None,
        pidfile: Path | None = None,
    ) -> ChildProcess:
        proc = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the daemon, not its engines
        )
        if pidfile is not None:
            # Atomic, not fsynced: after a crash of the machine its child is gone anyway.
            atomic_write(pidfile, f"{proc.pid}\n{os.getpid()}\n{' '.join(argv)}\n", durable=False)
        return cls(proc, name=name, pidfile=pidfile)


class PidFile(msgspec.Struct, frozen=True, kw_only=True):
    """What an engine's pid file says: the child, the daemon that started it, its command line."""

    path: str
    pid: int | None
    """None: the file cannot be read (damaged, half written by a crash)."""
    parent: int | None = None
    argv: str = ""


def cmdline(pid: int) -> str:
    """The command line of a running process, words joined by spaces; "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def read_pidfiles(run_dir: Path) -> list[PidFile]:
    """Every engine pid file under ``run_dir``, parsed (an unreadable one with ``pid`` None)."""
    engines = run_dir / "engines"
    if not engines.is_dir():
        return []
    found = []
    for pidfile in sorted(engines.glob(f"*{_PIDFILE_SUFFIX}")):
        try:
            pid_s, parent_s, argv = pidfile.read_text().split("\n", 2)
            found.append(PidFile(path=str(pidfile), pid=int(pid_s), parent=int(parent_s), argv=argv.strip()))
        except (OSError, ValueError):
            found.append(PidFile(path=str(pidfile), pid=None))
    return found


def reap_orphans(run_dir: Path) -> list[int]:
    """Kill engine children that a crashed daemon left behind; returns their pids.

    A pidfile names the child, the daemon that started it and the command line;
    the child is killed only when it still runs that command line and its
    daemon is gone, so a reused pid is never hit.
    """
    killed: list[int] = []
    for entry in read_pidfiles(run_dir):
        pidfile = Path(entry.path)
        if entry.pid is None or entry.parent is None:
            pidfile.unlink(missing_ok=True)
            continue
        pid, parent = entry.pid, entry.parent
        if parent != os.getpid() and not cmdline(parent) and cmdline(pid).strip() == entry.argv:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if parent != os.getpid():
            pidfile.unlink(missing_ok=True)
    return killed
