"""examples/embed.py, run as a real program: a Trio program with no HTTP layer goes
through admission (the second request queues behind the only slot), a cancel frees
the slot at once, and no engine process outlives the program."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, pid_alive

pytestmark = pytest.mark.slow


def test_embedding_example(home: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed.py"), "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    events = {}
    order = []
    for line in out.stdout.splitlines():
        doc = json.loads(line)
        events[doc["event"]] = doc
        order.append(doc["event"])
    assert order == [
        "first-granted",
        "second-queued",
        "first-cancelled",
        "second-granted",
        "second-answered",
        "engine",
        "exited",
    ]
    # One slot: while the first streams, the second is queued behind it.
    assert events["second-queued"]["slot"] == {"running": 1, "queued": 1}
    # The cancelled request's slot went straight to the waiter, before its block ended.
    assert events["first-cancelled"]["slot"] == {"running": 1, "queued": 0}
    assert events["second-granted"]["slot"] == {"running": 1, "queued": 0}
    assert events["second-granted"]["queued_s"] > 0
    assert events["second-answered"]["status"] == 200
    assert events["second-answered"]["chars"] > 0
    pid = events["engine"]["pid"]
    assert isinstance(pid, int)
    assert events["exited"]["alive"] is False
    assert not pid_alive(pid)
