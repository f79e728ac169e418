"""The quick ways into ``blazar`` (``blazar.entry``): a cold ``blazar run`` starts its daemon
before the CLI's parser is imported, and that daemon starts its engine without the CLI's
modules, the downloader or the HTTP layer's imports.

What each process has imported is read from ``sys.modules`` in a fresh interpreter, so that
no other test's imports count; nothing here is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blazar.config import resolve_paths
from blazar.daemon import client
from blazar.entry import run_target, serve_options
from tests.support import MODEL, home_env

CLI_ONLY = ("cyclopts", "rich", "blazar.cli", "tomlkit")
"""What only the full command line needs: the daemon never imports it."""

NOT_BEFORE_THE_ENGINE = (
    *CLI_ONLY,
    "registry.pull",  # the downloader: imported when a pull runs
    "httpx",  # the engine actor's health probe imports it once the child is spawning
    "jsonschema",  # checks structured answers: imported when one is checked
    "jinja2",  # renders a chat template once; the store keeps what it found (Store.template_facts)
    "blazar.web",
    "quart",
    "hypercorn",
)


def _loaded(code: str, names: tuple[str, ...], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; which of ``names`` (and their submodules) it
    imported, and whether httpx's command-line module was kept out."""
    probe = (
        "import json, sys\n"
        f"{code}\n"
        f"names = {names!r}\n"
        "hit = sorted(m for m, mod in sys.modules.items() if mod is not None\n"
        "             and any(m == n or m.startswith(n + '.') for n in names))\n"
        "print(json.dumps({'loaded': hit, 'httpx_cli': sys.modules.get('httpx._main') is not None}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_daemon_imports_only_its_runtime_before_the_engine_spawns() -> None:
    """``python -m blazar serve --preload=M`` runs ``blazar.entry`` and then
    ``blazar.daemon.serve``, whose runtime spawns M's engine before the HTTP layer is imported."""
    seen = _loaded(
        "import blazar.entry\n"
        "assert blazar.entry.serve_options(['serve', '--preload=m']) is not None\n"
        "import blazar.daemon.serve, actors.runtime",
        NOT_BEFORE_THE_ENGINE,
    )
    assert seen == {"loaded": [], "httpx_cli": False}


def test_the_daemon_never_imports_the_command_line() -> None:
    seen = _loaded("import blazar.entry, blazar.daemon.serve, blazar.web.app", (*CLI_ONLY, "jsonschema"))
    assert seen == {"loaded": [], "httpx_cli": False}


_RUN_PROBE = """
import blazar.daemon.client as client
calls = []
def start_background(paths, *, preload=None):
    calls.append({'preload': preload, 'cli_loaded': 'cyclopts' in sys.modules or 'rich' in sys.modules})
    raise OSError('no daemon in this test')
client.start_background = start_background
from blazar.entry import main
try:
    main(ARGV)
except SystemExit:
    pass
print(json.dumps(calls))
"""


def _run_calls(argv: list[str], home: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\nARGV = " + json.dumps(argv) + _RUN_PROBE],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return calls


def test_run_starts_the_daemon_before_the_parser_is_imported(instant_home: Path) -> None:
    calls = _run_calls(["run", MODEL, "hi", "--temperature", "0", "--max-tokens=8"], instant_home)
    # The quick start, then the command's own try once the first failed (it reports that one).
    assert calls == [{"preload": MODEL, "cli_loaded": False}, {"preload": MODEL, "cli_loaded": True}]


def test_run_with_an_intent_starts_the_daemon_without_a_preload(instant_home: Path) -> None:
    calls = _run_calls(["run", MODEL, "hi", "--intent", "coding"], instant_home)
    assert calls[0] == {"preload": None, "cli_loaded": False}


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "not-installed", "hi"],  # the command says it is not installed, and starts nothing
        ["run", MODEL, "hi", "--max-tokens", "eight"],  # the parser reports it, and starts nothing
    ],
)
def test_run_starts_nothing_early_that_the_command_would_not(argv: list[str], instant_home: Path) -> None:
    calls = _run_calls(argv, instant_home)
    assert all(c["cli_loaded"] for c in calls)


def test_ensure_daemon_waits_for_the_daemon_started_before_parsing(
    instant_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command finds the daemon the quick start launched: it starts no second one, and
    says that it started this one."""
    paths = resolve_paths()

    class Started:
        pid = 4242
        returncode = None

        def poll(self) -> int | None:
            return None

    class Answering:
        pid = 4242
        url = "http://127.0.0.1:1"

    answers = iter([None, None, Answering()])
    monkeypatch.setattr(client, "find_daemon", lambda _paths: next(answers))

    def no_second(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a second daemon was started")

    monkeypatch.setattr(client, "start_background", no_second)
    monkeypatch.setitem(client._STARTED, paths.daemon_file, Started())
    daemon, started = client.ensure_daemon(paths, None, preload=MODEL)  # type: ignore[arg-type]
    assert (daemon.pid, started) == (4242, True)
    assert paths.daemon_file not in client._STARTED


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["serve"], {}),
        (["serve", "--preload=-odd-name"], {"preload": ["-odd-name"]}),
        (["serve", "--preload", "m", "--port", "0"], {"preload": ["m"], "port": 0}),
        (["serve", "--host=0.0.0.0", "--insecure-open", "--log-stderr"],
         {"host": "0.0.0.0", "insecure_open": True, "log_stderr": True}),
    ],
)  # fmt: skip
def test_plain_serve_options_take_the_quick_path(argv: list[str], options: dict[str, Any]) -> None:
    defaults = {"host": None, "port": None, "preload": None, "insecure_open": False, "log_stderr": False}
    assert serve_options(argv) == {**defaults, **options}


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--help"],
        ["serve", "-h"],
        ["serve", "--preload=a", "--preload=b"],  # given twice: the full parser makes the list
        ["serve", "--preload", "-odd-name"],
        ["serve", "--port", "eighty"],
        ["serve", "--port"],
        ["serve", "--host="],
        ["serve", "extra"],
        ["serve", "--unknown"],
        ["--version"],
        ["run", MODEL],
        [],
    ],
)
def test_anything_else_goes_to_the_full_parser(argv: list[str]) -> None:
    assert serve_options(argv) is None


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["run", "m"], ("m", True)),
        (["run", "m", "a prompt", "--temperature", "0.5", "--seed=-1", "--max-tokens", "8"], ("m", True)),
        (["run", "m", "--intent=agent"], ("m", False)),
        (["run", "m", "p", "--max-tokens", "1.5"], None),
        (["run", "m", "p", "--seed", "-1"], None),  # a value that starts with "-": the full parser reads it
        (["run", "m", "p", "--temperature", "0", "--temperature", "1"], None),
        (["run", "m", "p", "--intent", "chatting"], None),
        (["run", "m", "p", "extra"], None),
        (["run", "--help"], None),
        (["run", "-m"], None),
        (["run"], None),
        (["serve"], None),
    ],
)
def test_run_target(argv: list[str], target: tuple[str, bool] | None) -> None:
    assert run_target(argv) == target
