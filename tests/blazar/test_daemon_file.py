"""run/daemon.json: a daemon is found only while the process it names runs, and is not this one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from blazar.config import resolve_paths
from blazar.daemon.files import read_daemon_info, write_daemon_info


def test_a_file_naming_this_process_is_a_stale_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A container restarted on the same volume gets the pid its killed daemon had: `serve`
    # must not take that daemon's file for a daemon that still runs.
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    paths = resolve_paths()
    write_daemon_info(paths, "0.0.0.0", 11435)
    assert json.loads(Path(paths.daemon_file).read_text())["pid"] == os.getpid()
    assert read_daemon_info(paths) is None
    info = json.loads(Path(paths.daemon_file).read_text())
    info["pid"] = os.getppid()  # another process that runs: a daemon
    Path(paths.daemon_file).write_text(json.dumps(info))
    assert read_daemon_info(paths) == info
