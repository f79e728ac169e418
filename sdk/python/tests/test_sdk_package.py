"""The SDK installs on its own: a clean virtual environment, ``pip install ./sdk/python``,
then one call against a real daemon from that environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

SDK = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from blazar_sdk import Client
try:
    import blazar  # the daemon's package must not come with the SDK
except ImportError:
    pass
else:
    sys.exit("the daemon's package is importable from the SDK's environment")
print(",".join(m.id for m in Client(base_url=sys.argv[1]).models()))
"""


def test_clean_venv_installs_and_calls_the_daemon(tmp_path: Path, sdk_daemon: DaemonProc) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # A copy: pip builds in the source folder (build/, *.egg-info), which stays clean so.
    source = tmp_path / "sdk-python"
    shutil.copytree(SDK, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    # As a user installs it: pip fetches the build backend (setuptools) from the configured index.
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    shown = subprocess.run(
        [str(python), "-m", "pip", "show", "blazar-sdk"], capture_output=True, text=True, timeout=60
    )
    assert "Requires: \n" in shown.stdout or "Requires:\n" in shown.stdout, shown.stdout
    probe = subprocess.run(
        [str(python), "-I", "-c", PROBE, sdk_daemon.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert MODEL in probe.stdout.strip().split(",")
    assert sys.executable != str(python)
