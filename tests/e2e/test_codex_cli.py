"""OpenAI's Codex CLI (``codex exec``) against a real daemon, the way docs/clients.md sets it up.

Codex's default turn carries a ``namespace`` tool (its sub-agents) and a ``web_search`` tool,
which the Responses route refuses, and about 6,300 tokens of instructions and tool schemas.
These tests run it with the configuration the docs give (built-in tools off, short
instructions), with which the turn is a few hundred tokens and fits the test model's slot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

_RESEARCH_COPY = Path("/tmp/codex-research/node_modules/.bin/codex")


def _codex() -> str | None:
    found = shutil.which("codex")
    if found:
        return found
    if _RESEARCH_COPY.exists() and os.access(_RESEARCH_COPY, os.X_OK):
        return str(_RESEARCH_COPY)
    return None


CODEX = _codex()
if not os.environ.get("BLAZAR_TEST_CODEX"):
    pytest.skip(
        "set BLAZAR_TEST_CODEX=1 to run Codex against the daemon: its pass depends on how long the"
        " 135M test model answers (a run-away answer fills the slot, and Codex counts the incomplete"
        " response as a failure); the protocol itself is checked by the Codex replay in"
        " test_client_replays.py",
        allow_module_level=True,
    )
if CODEX is None:
    pytest.skip(
        f"Codex CLI not installed: no `codex` on PATH and none at {_RESEARCH_COPY}"
        " (npm install @openai/codex)",
        allow_module_level=True,
    )

INSTRUCTIONS = "You are a helpful assistant. Answer briefly."

# What docs/clients.md gives, with the provider's base_url filled in.
CONFIG = """\
model = "{model}"
model_provider = "blazar"
web_search = "disabled"
model_instructions_file = "{instructions}"

[model_providers.blazar]
name = "Blazar"
base_url = "{url}/v1"
env_key = "BLAZAR_API_KEY"
wire_api = "responses"

[features]
multi_agent = false
goals = false
view_image = false
shell_tool = false
unified_exec = false

[tools.experimental_request_user_input]
enabled = false

[skills]
include_instructions = false
"""


@pytest.fixture
def own(tmp_path: Path, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path / "home", model_path))
    try:
        yield d
    finally:
        d.stop()


def _codex_home(tmp_path: Path, url: str) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    instructions = home / "instructions.md"
    instructions.write_text(INSTRUCTIONS + "\n")
    (home / "config.toml").write_text(CONFIG.format(model=MODEL, instructions=instructions, url=url))
    return home


def _run_codex(
    tmp_path: Path, codex_home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    assert CODEX is not None
    return subprocess.run(
        [CODEX, "exec", "--skip-git-repo-check", "--ephemeral", "--strict-config", *args, "say hello"],
        cwd=work,
        env={**os.environ, "CODEX_HOME": str(codex_home), "BLAZAR_API_KEY": "unused", **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _responses_calls(daemon: DaemonProc) -> list[dict[str, object]]:
    rows = httpx.get(f"{daemon.url}/admin/requests", timeout=10).json()["data"]
    return [r for r in rows if r["path"] == "/v1/responses"]


def test_codex_exec_with_a_custom_provider(tmp_path: Path, own: DaemonProc) -> None:
    out = _run_codex(tmp_path, _codex_home(tmp_path, own.url))
    assert out.returncode == 0, f"codex exec exited {out.returncode}:\n{out.stderr[-3000:]}"
    assert out.stdout.strip(), out.stderr[-3000:]
    calls = _responses_calls(own)
    assert calls and all(c["status"] == 200 for c in calls), json.dumps(calls)


def test_codex_exec_oss_mode(tmp_path: Path, own: DaemonProc) -> None:
    # --oss asks /v1/models, /api/version (0.13.4 at least) and /api/tags, then the Responses
    # route; `:latest` matches the /api/tags name, so Codex pulls nothing.
    out = _run_codex(
        tmp_path,
        _codex_home(tmp_path, own.url),
        "--oss",
        "--local-provider",
        "ollama",
        "-m",
        f"{MODEL}:latest",
        env={"CODEX_OSS_BASE_URL": f"{own.url}/v1"},
    )
    assert out.returncode == 0, f"codex exec --oss exited {out.returncode}:\n{out.stderr[-3000:]}"
    assert out.stdout.strip(), out.stderr[-3000:]
    calls = _responses_calls(own)
    assert calls and all(c["status"] == 200 for c in calls), json.dumps(calls)
