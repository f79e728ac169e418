"""The CLI imports only what a command needs.

Parsing arguments, listing models and asking for a daemon that does not run must
not load the gateway (quart, hypercorn), the hub client, the GGUF reader's numpy,
plotting, or the trio runtime: each of them costs the command tenths of a second
before it can print a line. Each case runs in a fresh interpreter, so that no other
test's imports count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import MODEL, home_env

HEAVY = (
    "quart",
    "quart_trio",
    "hypercorn",
    "huggingface_hub",
    "matplotlib",
    "gguf",
    "numpy",
    "trio",
    "blazar.web",
    "blazar.daemon.serve",
    "actors.runtime",
    "actors.planning",
)

_PROBE = """
import json, sys
from blazar.cli import main
argv, heavy, report = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
try:
    main(argv)
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
open(report, "w").write(json.dumps(loaded))
"""


def loaded_after(argv: list[str], home: Path, report: Path) -> tuple[list[str], str]:
    """The heavy modules in ``sys.modules`` once ``blazar ARGV`` has run, and what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argv), json.dumps(HEAVY), str(report)],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text()), done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["list", "--json"], ["run", "--help"], ["serve", "--help"]])
def test_command_loads_nothing_heavy(argv: list[str], instant_home: Path, tmp_path: Path) -> None:
    loaded, printed = loaded_after(argv, instant_home, tmp_path / "modules.json")
    assert loaded == []
    assert printed


def test_list_names_the_installed_model(instant_home: Path, tmp_path: Path) -> None:
    loaded, printed = loaded_after(["list"], instant_home, tmp_path / "modules.json")
    assert MODEL in printed
    assert loaded == []


def test_ps_without_a_daemon_says_so(instant_home: Path, tmp_path: Path) -> None:
    loaded, printed = loaded_after(["ps"], instant_home, tmp_path / "modules.json")
    assert "no daemon is running" in printed
    assert loaded == []


def test_show_reads_the_header_without_numpy(instant_home: Path, tmp_path: Path) -> None:
    """The header reader takes the gguf package's constants alone, not the package."""
    loaded, printed = loaded_after(["show", MODEL], instant_home, tmp_path / "modules.json")
    assert "architecture" in printed
    assert loaded == []


def test_the_probe_sees_a_heavy_import(instant_home: Path, tmp_path: Path) -> None:
    """``plan`` without a daemon runs the runtime's planner, on trio: the probe must see both."""
    loaded, printed = loaded_after(["plan", MODEL], instant_home, tmp_path / "modules.json")
    assert {"trio", "actors.planning"} <= set(loaded)
    assert printed
