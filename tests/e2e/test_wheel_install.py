"""Installed like a tool: the built wheel (not the source tree) gives a working ``blazar``.

The wheel is built from a copy of the tracked files, so that only what the repository holds
goes in, and installed into a fresh virtual environment. A full install of the dependencies
took close to three minutes on a busy two-core machine, so the wheel goes in with
``--no-deps`` and a ``.pth`` file lends the fresh environment the test environment's
site-packages for the dependencies alone: ``blazar``, ``actors`` and ``registry`` (code,
catalog, console, engine hosts) all come from the wheel, which the test checks. Commands
run from a directory outside the repository, so nothing is imported from the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL, ROOT, pull_env

pytestmark = pytest.mark.slow


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 300) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{argv}: {done.stderr[-2000:]}"
    return done.stdout


def _build_wheel(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout: the wheel is built from the tracked files")
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    for name in tracked.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], cwd=tmp_path)
    wheels = list(dist.glob("blazar-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_the_wheel_gives_a_working_blazar_on_path(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], cwd=tmp_path)
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path
        ).strip()
    )
    (site / "zz-blazar-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("port = 0\n")
    env = pull_env(home)
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert shutil.which("blazar", path=env["PATH"]) == str(venv / "bin" / "blazar")

    where = json.loads(
        _run(
            [
                str(python),
                "-c",
                "import json, blazar, actors, registry, registry.catalog as c, blazar.web.console.page as p;"
                "print(json.dumps([m.__file__ for m in (blazar, actors, registry, c, p)]))",
            ],
            cwd=work,
            env=env,
        )
    )
    assert all(path.startswith(str(site)) for path in where), where

    assert _run(["blazar", "--version"], cwd=work, env=env).strip() == "0.1.0"
    _run(["blazar", "pull", MODEL], cwd=work, env=env)
    assert MODEL in _run(["blazar", "list"], cwd=work, env=env)
    try:
        answer = _run(
            ["blazar", "run", MODEL, "Say hello.", "--temperature", "0", "--max-tokens", "8"],
            cwd=work,
            env=env,
        )
        assert answer.strip()
        ps = json.loads(_run(["blazar", "ps", "--json"], cwd=work, env=env))
        engine_pid = ps["engines"][0]["pid"]
        # The engine host is the installed package's, run by the fresh environment's python.
        cmdline = Path(f"/proc/{engine_pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].decode() == str(python) and b"actors.engines.llamacpp_host" in cmdline
        url = ps["daemon"]["url"]
        page = httpx.get(f"{url}/ui", timeout=10)  # the console's assets ship in the wheel
        assert page.status_code == 200 and "app.js" in page.text
        assert httpx.get(f"{url}/ui/app.js", timeout=10).status_code == 200
    finally:
        subprocess.run(["blazar", "stop"], cwd=work, env=env, capture_output=True, timeout=60)
