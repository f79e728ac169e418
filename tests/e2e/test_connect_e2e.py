"""``blazar connect --write`` against a real daemon and the real engine: each tool's test request
goes through, and when it cannot (a model the daemon lacks) the user's file is put back byte for
byte. One daemon for the module; every test answer is capped at a few tokens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import MODEL, DaemonProc

pytestmark = pytest.mark.slow

USER_CODEX = '# my own settings\napproval_policy = "on-request"  # ask first\n'


def connect(daemon: DaemonProc, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in daemon.env.items() if not k.startswith(("CODEX_", "XDG_", "LLM_", "CLAUDE_"))}
    env["HOME"] = str(home)
    env["PATH"] = os.defpath  # no real tool found by accident: only the configs made here count
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_connect_codex_write_passes_its_test_request(daemon: DaemonProc, tmp_path: Path) -> None:
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(USER_CODEX)
    done = connect(daemon, tmp_path, "connect", "codex", "--write")
    assert done.returncode == 0, done.stderr
    assert "test request passed: POST /v1/responses: 200" in done.stdout
    doc = tomllib.loads(config.read_text())
    assert doc["model"] == MODEL and doc["model_providers"]["blazar"]["base_url"] == f"{daemon.url}/v1"
    assert config.read_text().startswith("# my own settings")
    assert (tmp_path / ".codex" / "config.toml.blazar-backup").read_text() == USER_CODEX
    undone = connect(daemon, tmp_path, "disconnect", "codex")
    assert undone.returncode == 0 and config.read_text() == USER_CODEX


def test_a_failing_test_request_rolls_the_change_back(daemon: DaemonProc, tmp_path: Path) -> None:
    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes(USER_CODEX.encode())
    done = connect(daemon, tmp_path, "connect", "codex", "--write", "--model", "no-such-model")
    assert done.returncode == 1
    assert "test request failed: POST /v1/responses: 404" in done.stderr and "rolled back" in done.stderr
    assert config.read_bytes() == USER_CODEX.encode()
    assert sorted(p.name for p in config.parent.iterdir()) == ["config.toml"]


def test_every_found_tool_is_connected_through_its_own_route(daemon: DaemonProc, tmp_path: Path) -> None:
    # Each tool is "found" by its config directory: Claude Code (Anthropic messages), Continue
    # (chat completions), aider (Ollama show + chat) and opencode.
    for folder in (".claude", ".continue", ".config/opencode"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / ".aider.conf.yml").write_text("# aider\ndark-mode: true\n")
    done = connect(daemon, tmp_path, "connect", "--write")
    assert done.returncode == 0, done.stderr + done.stdout
    for route in ("/v1/messages?beta=true", "/v1/chat/completions", "/api/show", "/api/chat"):
        assert f"test request passed: POST {route}: 200" in done.stdout, route
    # Connected, but Claude Code's real first turn would not fit SmolLM2's slot: said, not hidden.
    assert "warning: Claude Code's first turn is about 19,000 tokens" in done.stdout
    assert "connected, but its first real turn does not fit" in done.stdout
    settings = json.loads((tmp_path / ".claude" / "settings.json").read_text())
    assert settings["env"]["ANTHROPIC_BASE_URL"] == daemon.url
    assert (tmp_path / ".aider.conf.yml").read_text().startswith("# aider\ndark-mode: true\n")


@pytest.mark.skipif(shutil.which("llm") is None, reason="the `llm` CLI is not installed (pip install llm)")
def test_the_real_llm_cli_answers_through_the_written_config(daemon: DaemonProc, tmp_path: Path) -> None:
    user = tmp_path / "llm-user"
    env = {**daemon.env, "HOME": str(tmp_path), "LLM_USER_PATH": str(user)}
    done = subprocess.run(
        [sys.executable, "-m", "blazar", "connect", "llm", "--write"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    llm = shutil.which("llm")
    assert llm is not None
    ran = subprocess.run(
        [llm, "-m", f"blazar/{MODEL}", "-o", "max_tokens", "16", "Say hello."],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr


def test_connect_write_sets_the_context_and_the_cap_on_the_running_daemon(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    """aider's turns carry no output cap: connect caps the model, sets the --ctx asked, and the
    running daemon reloads its config.toml; the file keeps what was there."""
    config = daemon.home / "config.toml"
    before = config.read_text() if config.exists() else ""
    done = connect(daemon, tmp_path, "connect", "aider", "--write", "--ctx", "8192")
    assert done.returncode == 0, done.stderr + done.stdout
    # The cap may be there already (another test connected aider to this daemon): the ctx is new.
    assert f'wrote models."{MODEL}".ctx = 8192' in done.stdout
    assert "no daemon is running" not in done.stdout
    assert "engines" in done.stdout  # the reload's account: engines restart, or use it as they start
    assert "test request passed: POST /api/chat: 200" in done.stdout
    text = config.read_text()
    assert text.startswith(before)
    assert tomllib.loads(text)["models"][MODEL] == {"ctx": 8192, "max_output_tokens": 2048}
    explained = daemon.cli("explain", MODEL, "--json")
    settings = {s["name"]: s for s in json.loads(explained.stdout)["settings"]}
    assert settings["max_output_tokens"]["value"] == 2048
