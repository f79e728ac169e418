"""Engine versions for real: two xllamacpp releases from the package index side by side, a
switch that passes the probe and the gate while requests flow (they drain, none fails), a
rollback, and a broken version that is refused while the active one keeps serving."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc, home_env, make_home, start_daemon

pytestmark = pytest.mark.slow

OLDER = "2026.9.11063"
"""An xllamacpp release before the one the project pins (pyproject.toml)."""
HI = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}


def blazar(home: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args],
        env={**home_env(home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    home = make_home(tmp_path_factory.mktemp("versions") / "home", model_path, config="slots = 2\n")
    done = blazar(home, "engine", "install", f"llamacpp@{OLDER}")
    assert done.returncode == 0, done.stderr
    return home


@pytest.fixture(scope="module")
def daemon(home: Path) -> Iterator[DaemonProc]:
    d = start_daemon(home)
    try:
        assert httpx.post(f"{d.url}/v1/chat/completions", json=HI, timeout=120).status_code == 200
        yield d
    finally:
        d.stop()


def _version(d: DaemonProc) -> str:
    return str(next(e for e in d.engines() if e["model"] == MODEL)["version"])


def _listed(home: Path) -> dict[str, Any]:
    doc = json.loads(blazar(home, "engine", "list", "--json").stdout)
    return {f"{e['lane']}@{e['version']}": e for e in doc["engines"]}


def test_a_switch_under_load_drains_then_a_rollback_returns(home: Path, daemon: DaemonProc) -> None:
    listed = _listed(home)
    assert listed["llamacpp@bundled"]["active"] and not listed[f"llamacpp@{OLDER}"]["active"]
    assert len(listed[f"llamacpp@{OLDER}"]["package"] or "") > 0
    bundled = _version(daemon)
    assert bundled.startswith("xllamacpp ") and OLDER not in bundled
    statuses: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        # One client with a pause between its requests: enough that requests are in flight
        # while the switch drains the engine, little enough that the gate's timing of each
        # version (on the same two cores) is not spent waiting behind them.
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                statuses.append(client.post(f"{daemon.url}/v1/chat/completions", json=HI).status_code)
                stop.wait(0.2)

    threads = [threading.Thread(target=traffic)]
    for t in threads:
        t.start()
    try:
        # Each version's speed is the median of three answers, measured in turn on two cores
        # the traffic also uses: a wide margin, as the two can still differ by chance (the
        # gate's arithmetic: tests/actors/test_versions.py).
        done = blazar(
            home, "engine", "use", f"llamacpp@{OLDER}", "--model", MODEL, "--margin", "0.8", "--rounds", "3"
        )
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert "PASS chat" in text and "PASS tool call" in text and "PASS embeddings" in text, text
    assert "PASS regression gate" in text and "medians of 3 and 3 answers" in text, text
    assert f"llamacpp@{OLDER} is active" in text and MODEL in text
    assert statuses and set(statuses) == {200}, statuses  # the switch drained: no request failed
    assert _version(daemon) == f"xllamacpp {OLDER}"
    receipts = json.loads(blazar(home, "engine", "list", "--json").stdout)["receipts"]
    assert {r["version"] for r in receipts} >= {OLDER, "bundled"}

    back = blazar(home, "engine", "rollback", "llamacpp")
    assert back.returncode == 0 and "llamacpp@bundled is active again" in back.stdout, back.stderr
    assert httpx.post(f"{daemon.url}/v1/chat/completions", json=HI, timeout=120).status_code == 200
    assert _version(daemon) == bundled
    assert _listed(home)["llamacpp@bundled"]["active"]


def test_a_broken_version_is_refused_and_the_active_one_keeps_serving(
    home: Path, daemon: DaemonProc, tmp_path: Path
) -> None:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\necho 'error: this build is broken' >&2\nexit 1\n")
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    wrong = blazar(home, "engine", "install", "llamacpp@broken", "--from", str(script), "--sha256", "0" * 64)
    assert wrong.returncode == 1 and "not installed" in wrong.stderr, wrong.stderr
    done = blazar(home, "engine", "install", "llamacpp@broken", "--from", str(script), "--sha256", digest)
    assert done.returncode == 0, done.stderr
    refused = blazar(home, "engine", "use", "llamacpp@broken", "--model", MODEL)
    assert refused.returncode == 1, refused.stdout
    assert (
        "FAIL start and health" in " ".join(refused.stdout.split())
        and "this build is broken" in refused.stdout
    )
    assert "was refused" in refused.stderr and "stays active" in refused.stderr
    assert _listed(home)["llamacpp@bundled"]["active"]
    assert httpx.post(f"{daemon.url}/v1/chat/completions", json=HI, timeout=120).status_code == 200
    assert blazar(home, "engine", "rm", "llamacpp@bundled").returncode == 1  # not an installed version
    assert blazar(home, "engine", "rm", "llamacpp@broken").returncode == 0
    assert "llamacpp@broken" not in _listed(home)
    check = blazar(home, "engine", "update", "llamacpp", "--check")  # asks the package index, changes nothing
    assert check.returncode == 0 and ("is the newest" in check.stdout or "is available" in check.stdout)
    assert _listed(home)["llamacpp@bundled"]["active"]
