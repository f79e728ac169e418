"""Edits of the user's TOML files run on two tomlkit versions: the one installed (the lock's) and
the oldest that pyproject.toml allows, pinned by hash in requirements/tomlkit-oldest.txt.

tomlkit is pure Python, so the oldest is installed once with uv into ``.cache/tomlkit/VERSION``
(reused by later runs) and a scenario runs on it in a child interpreter whose PYTHONPATH puts that
folder before the venv's own copy. A scenario is a module-level function ``(home) -> result``: it
edits files under ``home`` (which is also ``$BLAZAR_HOME``) through blazar's own code and returns
the texts to compare, as JSON-able values (strings, lists, dicts).

requirements/tomlkit-oldest.txt is written by
``echo 'tomlkit==VERSION' | .venv/bin/uv pip compile - --generate-hashes --python-version 3.11
-o requirements/tomlkit-oldest.txt``, VERSION being pyproject.toml's floor for tomlkit
(tests/test_tomlkit_versions.py checks that they agree).

``python -m tests.tomlkit_versions FILE MODULE:FUNCTION HOME OUT VERSION`` is the child's side.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "tomlkit-oldest.txt"
CACHE = ROOT / ".cache" / "tomlkit"

Scenario = Callable[[Path], Any]


def oldest_version() -> str:
    found = re.search(r"^tomlkit==(\S+)", LOCK.read_text(), re.MULTILINE)
    assert found, f"{LOCK} pins no tomlkit version"
    return found.group(1)


def _uv() -> str:
    """The venv's uv (requirements/uv.txt); another venv (``make test-latest``) borrows it."""
    for candidate in (Path(sys.executable).parent / "uv", ROOT / ".venv" / "bin" / "uv"):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("uv")
    if found is None:
        raise RuntimeError("uv is not installed: `make install` puts it in the venv")
    return found


def install_oldest() -> Path:
    """The folder holding the oldest tomlkit, installed from the hash-pinned file on first use."""
    version = oldest_version()
    target = CACHE / version
    stamp = target / ".installed"

    def installed() -> bool:
        return stamp.exists() and stamp.read_text() == LOCK.read_text()

    if installed():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=CACHE))
    try:
        install = ["pip", "install", "--quiet", "--python", sys.executable, "--target", str(scratch)]
        done = subprocess.run(
            [_uv(), *install, "--require-hashes", "-r", str(LOCK)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"installing tomlkit {version} from {LOCK} failed:\n{done.stderr}")
        (scratch / ".installed").write_text(LOCK.read_text())
        if not installed():  # another test run (or xdist worker) may have finished first
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)  # a copy from an older pin
            try:
                scratch.rename(target)  # whole or not at all, for a run that stops half-way
            except OSError:
                if not installed():  # not a worker beside us that got there first
                    raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def run_oldest(scenario: Scenario, home: Path, site: Path) -> Any:
    """``scenario(home)`` in a child interpreter that imports tomlkit from ``site``."""
    version = oldest_version()
    result = home.parent / f"{home.name}-result.json"
    env = {k: v for k, v in os.environ.items() if k not in ("EDITOR", "VISUAL")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    target = f"{scenario.__module__}:{scenario.__qualname__}"
    source = inspect.getfile(scenario)
    done = subprocess.run(
        [sys.executable, "-m", "tests.tomlkit_versions", source, target, str(home), str(result), version],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{target} on tomlkit {version} failed:\n{done.stdout}\n{done.stderr}"
    answer = json.loads(result.read_text())
    assert answer["tomlkit"] == version  # the child's own check, read back
    return answer["result"]


def _child(source: str, target: str, home: str, out: str, version: str) -> None:
    import tomlkit

    if tomlkit.__version__ != version:
        raise SystemExit(
            f"expected tomlkit {version}, imported {tomlkit.__version__} from {tomlkit.__file__}"
        )
    # The test module by its file, under the name pytest gave it (its rootdir-relative imports
    # need no sys.path entry of their own).
    name, _, function = target.partition(":")
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    scenario = getattr(module, function)
    os.environ["BLAZAR_HOME"] = home
    result = scenario(Path(home))
    Path(out).write_text(json.dumps({"tomlkit": tomlkit.__version__, "result": result}))


if __name__ == "__main__":
    _child(*sys.argv[1:])
