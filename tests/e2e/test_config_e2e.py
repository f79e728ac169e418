"""``blazar config`` and ``blazar run --intent`` against a real daemon and the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import MODEL, home_env, make_home

pytestmark = pytest.mark.slow

CONFIG = """\
# settings for the test daemon
port = 0   # a free port
"""


def blazar(env: dict[str, str], *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


def engine(env: dict[str, str]) -> dict[str, object]:
    engines = json.loads(blazar(env, "ps", "--json").stdout)["engines"]
    assert len(engines) == 1
    return engines[0]  # type: ignore[no-any-return]


@pytest.fixture
def env(tmp_path: Path, model_path: Path) -> Iterator[dict[str, str]]:
    home = make_home(tmp_path / "home", model_path, config=CONFIG)
    env = home_env(home)
    yield env
    blazar(env, "stop")


def test_low_memory_preset_then_changes_to_the_running_daemon(env: dict[str, str]) -> None:
    home = Path(env["BLAZAR_HOME"])
    done = blazar(env, "config", "preset", "low-memory", "--yes")
    assert done.returncode == 0, done.stderr
    assert 'engine.extra_args = ["-ctk", "q8_0", "-ctv", "q8_0"]' in done.stdout

    # The preset's quantized KV cache and small context are what the real engine runs with.
    ran = blazar(env, "run", MODEL, "Say hello.", "--temperature", "0", "--max-tokens", "8")
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    first = engine(env)
    assert (first["slots"], first["ctx_per_slot"]) == (1, 2048)
    assert "-ctk q8_0 -ctv q8_0" in (home / "logs" / "daemon.log").read_text()

    done = blazar(env, "config", "set", "keep_alive_s", "600")
    assert done.returncode == 0, done.stderr
    assert "applied now by the running daemon: keep_alive_s" in done.stdout
    done = blazar(env, "config", "set", f"models.{MODEL}.slots", "2")
    assert f"engines that restart with the new settings once their requests end: {MODEL}" in done.stdout
    done = blazar(env, "config", "set", "port", "1")
    assert "needs a daemon restart (`blazar stop`, then `blazar serve`): port" in done.stdout
    done = blazar(env, "config", "set", "slots", "two")
    assert done.returncode == 1 and "slots takes an integer" in done.stderr

    ran = blazar(env, "run", MODEL, "Say hello.", "--temperature", "0", "--max-tokens", "8")
    assert ran.returncode == 0, ran.stderr
    now = engine(env)
    assert (now["slots"], now["pid"] != first["pid"]) == (2, True)  # restarted with 2 slots
    text = (home / "config.toml").read_text()
    assert text.startswith(CONFIG.replace("port = 0", "port = 1"))  # comments kept, value changed
    assert tomllib.loads(text)["models"][MODEL] == {"slots": 2}


def test_run_intent_prints_the_ready_card(env: dict[str, str]) -> None:
    ran = blazar(env, "run", MODEL, "Say hello.", "--intent", "batch", "--max-tokens", "8")
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    assert f"ready: {MODEL} on llamacpp" in ran.stderr and "intent batch" in ran.stderr
    assert "2048 tokens per slot" in ran.stderr and "slots      8" in ran.stderr
    assert "evicted    none" in ran.stderr and "memory     ~" in ran.stderr
    assert (engine(env)["slots"], engine(env)["ctx_per_slot"]) == (8, 2048)

    ran = blazar(env, "run", MODEL, "Say hello.", "--intent", "agent", "--max-tokens", "8")
    assert ran.returncode == 0, ran.stderr
    assert "8192 tokens per slot (asked 16384: the most this model serves)" in ran.stderr
    assert "keep-alive forever" in ran.stderr
    assert (engine(env)["slots"], engine(env)["ctx_per_slot"]) == (1, 8192)

    ran = blazar(env, "run", MODEL, "Describe this image.", "--intent", "vision")
    assert ran.returncode == 1 and "no vision projector" in ran.stderr
    ran = blazar(env, "run", MODEL, "hi", "--intent", "poetry")
    assert ran.returncode != 0 and "agent" in ran.stderr and "reasoning" in ran.stderr
