"""Child processes: stderr tail, TERM then KILL, reaping what a crashed daemon left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from actors.process import ChildProcess, TailBuffer, reap_orphans
from tests.support import pid_alive


def test_tail_buffer_keeps_the_last_bytes() -> None:
    tail = TailBuffer(limit=10)
    for i in range(100):
        tail.write(f"{i}\n".encode())
    assert tail.getvalue().endswith(b"98\n99\n")
    assert len(tail.getvalue()) <= 10
    assert tail.summary(lines=2) == "98 | 99"
    assert tail.last(3) == b"99\n" and tail.last(5) == b"8\n99\n" and tail.last(100) == tail.getvalue()


def test_tail_summary_leads_with_the_error_line() -> None:
    """The engine's logger thread may write after the host's final error line."""
    tail = TailBuffer()
    tail.write(b"E load failed\nerror: llama.cpp could not start with model m.gguf\n")
    tail.write(b"E late log 1\nE late log 2\n")
    assert tail.summary(lines=2) == "error: llama.cpp could not start with model m.gguf | E late log 2"
    assert (
        tail.summary(lines=3)
        == "error: llama.cpp could not start with model m.gguf | E late log 1 | E late log 2"
    )


async def test_stderr_is_drained_and_kept(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('x' * 200000 + 'the end\\n'); sys.exit(3)"
    child = await ChildProcess.spawn([sys.executable, "-c", code], name="t", pidfile=tmp_path / "e.pid")
    with trio.fail_after(20):
        rc = await child.serve()
    assert rc == 3
    assert child.stderr_tail.text().endswith("the end\n")
    assert len(child.stderr_tail.getvalue()) == 64 * 1024
    assert not (tmp_path / "e.pid").exists()


async def test_stop_kills_a_child_that_ignores_term(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    child = await ChildProcess.spawn([sys.executable, "-c", code], name="t")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(child.serve)
        with trio.fail_after(20):
            await child.first_stdout_line.wait()
            await child.stop(grace_s=0.3)
    assert child.returncode == -9


def test_reap_orphans_kills_children_of_a_dead_daemon(tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    engines.mkdir()
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = subprocess.Popen(argv)
    dead_parent = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_parent.wait()
    (engines / "m.pid").write_text(f"{orphan.pid}\n{dead_parent.pid}\n{' '.join(argv)}\n")
    # A pidfile whose pid now runs something else must not be killed.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "other"])
    (engines / "n.pid").write_text(f"{bystander.pid}\n{dead_parent.pid}\nsomething else entirely\n")
    try:
        assert reap_orphans(tmp_path) == [orphan.pid]
        assert orphan.wait(timeout=10) == -9
        assert pid_alive(bystander.pid)
        assert list(engines.iterdir()) == []
    finally:
        for p in (orphan, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert os.getpid()  # the test process itself is untouched
