"""``blazar completions``: a script bash really completes with, and ``--install`` that puts
it where bash reads it (in a temporary home)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _blazar(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "SHELL": "/bin/bash"}
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )


def _complete(script: Path, *words: str) -> list[str]:
    """What bash's completion offers after ``words`` (the last one being typed)."""
    line = " ".join(words)
    probe = (
        f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        f"COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; _blazar; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_bash_script_completes_commands_and_options(tmp_path: Path) -> None:
    printed = _blazar("completions", "bash", home=tmp_path)
    assert printed.returncode == 0, printed.stderr
    script = tmp_path / "blazar.bash"
    script.write_text(printed.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert {"stop", "storage"} <= set(_complete(script, "blazar", "sto"))
    assert "completions" in _complete(script, "blazar", "compl")
    assert "--dry-run" in _complete(script, "blazar", "prune", "--dry")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_are_printed(tmp_path: Path, shell: str) -> None:
    printed = _blazar("completions", shell, home=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "blazar" in printed.stdout and "storage" in printed.stdout


def test_install_writes_where_bash_reads_it_and_loads_it_at_start(tmp_path: Path) -> None:
    done = _blazar("completions", "bash", "--install", home=tmp_path)
    assert done.returncode == 0, done.stderr
    installed = tmp_path / ".local/share/bash-completion/completions/blazar"
    assert installed.is_file() and "_blazar()" in installed.read_text()
    assert str(installed) in done.stdout
    assert {"stop", "storage"} <= set(_complete(installed, "blazar", "sto"))


def test_an_unknown_shell_is_refused_in_one_line(tmp_path: Path) -> None:
    done = _blazar("completions", "tcsh", home=tmp_path)
    assert done.returncode != 0 and "tcsh" in done.stderr


def test_output_without_install_is_refused_not_ignored(tmp_path: Path) -> None:
    done = _blazar("completions", "bash", "--output", str(tmp_path / "x"), home=tmp_path)
    assert done.returncode != 0 and "--install" in done.stderr and not (tmp_path / "x").exists()
