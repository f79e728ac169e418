"""``explain`` and ``doctor`` against a real daemon and its real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc, home_env, make_home, start_daemon

pytestmark = pytest.mark.slow

CONFIG = f'slots = 2\nkeep_alive_s = 120\n[models."{MODEL}"]\nctx = 1024\nprompt_batch = 64\n'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("explain") / "home", model_path, config=CONFIG)
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


def settings(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in doc["settings"]}


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def engine_argv(d: DaemonProc) -> list[str]:
    (engine,) = [e for e in d.engines() if e["model"] == MODEL]
    return Path(f"/proc/{engine['pid']}/cmdline").read_bytes().decode().split("\0")


def test_offline_and_daemon_explanations_agree(served: DaemonProc, tmp_path: Path, model_path: Path) -> None:
    offline_home = make_home(tmp_path / "offline", model_path, config=CONFIG)
    out = subprocess.run(
        [sys.executable, "-m", "blazar", "explain", MODEL, "--json"], env=home_env(offline_home),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    offline = json.loads(out.stdout)
    online = httpx.get(f"{served.url}/api/explain/{MODEL}").json()
    assert offline["loaded"] is False
    strip = lambda doc: [(s["name"], s["value"], s["source"]) for s in doc["settings"]]  # noqa: E731
    assert strip(offline) == strip(online)
    s = settings(online)
    assert (s["ctx_per_slot"]["value"], s["ctx_per_slot"]["source"]) == (1024, "override")
    assert (s["slots"]["value"], s["slots"]["source"]) == (2, "config")
    assert (s["keep_alive_s"]["value"], s["keep_alive_s"]["source"]) == (120.0, "config")
    assert (s["ctx_train"]["value"], s["ctx_train"]["source"]) == (8192, "model")
    assert (s["threads"]["value"], s["threads"]["source"]) == (None, "default")


def test_explain_matches_the_engine_command_line(served: DaemonProc) -> None:
    reply = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=120,
    )
    assert reply.status_code == 200
    doc = httpx.get(f"{served.url}/api/explain/{MODEL}").json()
    assert doc["loaded"] is True
    s = settings(doc)
    argv = engine_argv(served)
    assert flag(argv, "-c") == str(s["ctx_total"]["value"]) == "2048"
    assert flag(argv, "-np") == str(s["slots"]["value"])
    assert flag(argv, "-b") == str(s["prompt_batch"]["value"]) == "64"
    assert s["prompt_batch"]["source"] == "override"
    assert ("--embeddings" in argv) is s["embeddings"]["value"]


def test_a_request_that_changes_the_context_is_named(served: DaemonProc) -> None:
    reply = httpx.post(
        f"{served.url}/api/chat",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
              "options": {"num_ctx": 3000, "num_predict": 2}},
        timeout=120,
    )  # fmt: skip
    assert reply.status_code == 200
    s = settings(httpx.get(f"{served.url}/api/explain/{MODEL}").json())
    assert (s["ctx_per_slot"]["value"], s["ctx_per_slot"]["source"]) == (3000, "request")
    assert "1024 from override" in s["ctx_per_slot"]["note"]
    assert flag(engine_argv(served), "-c") == str(s["ctx_total"]["value"]) == "6000"
    assert s["slots"]["source"] == "config"


def test_doctor_beside_a_running_daemon(served: DaemonProc) -> None:
    done = served.cli("doctor", "--json", check=False)
    doc = json.loads(done.stdout)
    found = {f["code"]: f for f in doc["findings"]}
    assert done.returncode == 0, doc
    assert found["DAEMON_RUNNING"]["pid"] == served.proc.pid
    assert "ORPHAN_ENGINE" not in found and "STALE_PID_FILE" not in found
    assert "LEDGER_OK" in found
    assert found["ENGINE_RUNNING"]["pid"] == next(e["pid"] for e in served.engines() if e["model"] == MODEL)
    explain = served.cli("explain", MODEL)
    assert "ctx_per_slot" in explain.stdout and "loaded" in explain.stdout
    missing = served.cli("explain", "nope", check=False)
    assert missing.returncode == 1 and "not installed" in missing.stderr
