"""How the ``blazar`` program starts: the command line, two quick ways past its parser,
and failures reported as one line.

The full command line (cyclopts, rich and every command's module) costs about a tenth of a
second before a command runs. Two starts should not wait for it: the background daemon that
``blazar run`` starts, whose engine waits for the daemon, and ``blazar run`` itself when no
daemon runs. So:

- ``serve`` with only plain options (``--preload=M``, ``--port N``, ``--host H``,
  ``--insecure-open``, ``--log-stderr``) goes straight to ``blazar.daemon.serve``, where the
  full parser would have sent it;
- ``run MODEL [PROMPT]`` with only plain options starts the background daemon, loading MODEL,
  before the full parser is imported, when no daemon runs and MODEL is installed; the command
  then finds that daemon starting and waits for it as if it had started it itself
  (``blazar.daemon.client.ensure_daemon``).

Anything else (``--help``, an option given twice, a value that is not plainly a number,
another command) goes to the full parser alone, which reads and reports it as always.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["main", "one_line", "run_target", "serve_options"]

# httpx imports its own command-line client (click, rich's progress bars, pygments) whenever
# click is installed: a few hundredths of a second in every process that imports httpx. No
# process this program starts uses that client; without the module, ``httpx.main`` is a stub.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    """Run ``blazar ARGV`` (``sys.argv[1:]`` by default)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if (options := serve_options(args)) is not None:
        _reporting(lambda: _serve(options))
        return
    if (target := run_target(args)) is not None:
        _start_for_run(*target)
    _reporting(lambda: _full(args))


def _full(args: list[str]) -> None:
    from blazar.cli import app

    app(args)


def _serve(options: dict[str, Any]) -> None:
    from blazar.daemon.serve import serve_foreground

    serve_foreground(**options)


def _reporting(command: Callable[[], None]) -> None:
    """Run ``command``; a failure exits non-zero with one line on stderr (a traceback only
    with ``BLAZAR_DEBUG=1``)."""
    try:
        command()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:
        if os.environ.get("BLAZAR_DEBUG"):
            raise
        sys.stderr.write(f"error: {one_line(exc)}\n")
        sys.exit(1)


def one_line(exc: BaseException) -> str:
    """What the command line prints for a failure: what went wrong and what to run next."""
    from blazar.config import ConfigError
    from blazar.daemon.client import CliError
    from blazar.errors.describe import describe_error

    # A failure inside the daemon's task tree arrives wrapped in exception groups:
    # the line names the failure itself (the first one when several happened at once).
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, (CliError, ConfigError)):
        return str(exc)
    if (described := describe_error(exc)) is not None:
        retry = described.retry_after
        return described.message + (f" (retry in {retry} s)" if retry is not None else "")
    import httpx

    if isinstance(exc, httpx.HTTPError):
        return f"could not reach the daemon ({exc}) — check `blazar ps` and `blazar logs`"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({exc.filename or ''})".strip()
    return f"{type(exc).__name__}: {exc}"


# -- the plain forms --------------------------------------------------------------------

_INT = re.compile(r"-?[0-9]+")
_PORT = re.compile(r"[0-9]+")


def _float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _options(
    tokens: list[str], valued: dict[str, Callable[[str], bool]], flags: frozenset[str] = frozenset()
) -> tuple[dict[str, str], list[str]] | None:
    """``tokens`` as ``{option: value}`` (a flag's value is "") and the positional words, when
    every option is one of ``valued`` (``--name=value``, or ``--name value`` with a value that
    does not start with "-"; each at most once, its value accepted by its check) or of
    ``flags``; None for anything else."""
    found: dict[str, str] = {}
    words: list[str] = []
    rest = iter(tokens)
    for token in rest:
        if not token.startswith("-"):
            words.append(token)
            continue
        name, eq, value = token.partition("=")
        if name in found:
            return None
        if name in flags and not eq:
            found[name] = ""
            continue
        check = valued.get(name)
        if check is None:
            return None
        if not eq:
            value = next(rest, "")
            if value.startswith("-"):  # another option, or a value only ``--name=value`` keeps whole
                return None
        if not value or not check(value):
            return None
        found[name] = value
    return found, words


_SERVE_VALUED: dict[str, Callable[[str], bool]] = {
    "--host": lambda v: True,
    "--port": lambda v: _PORT.fullmatch(v) is not None,
    "--preload": lambda v: True,
}
_SERVE_FLAGS = frozenset({"--insecure-open", "--log-stderr"})


def serve_options(argv: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of ``serve_foreground`` when ``argv`` is ``serve`` with plain
    options only (``--preload`` once at most), else None."""
    if not argv or argv[0] != "serve":
        return None
    parsed = _options(argv[1:], _SERVE_VALUED, _SERVE_FLAGS)
    if parsed is None or parsed[1]:
        return None
    found = parsed[0]
    preload = found.get("--preload")
    return {
        "host": found.get("--host"),
        "port": int(found["--port"]) if "--port" in found else None,
        "preload": [preload] if preload is not None else None,
        "insecure_open": "--insecure-open" in found,
        "log_stderr": "--log-stderr" in found,
    }


_INTENTS = ("agent", "batch", "coding", "reasoning", "vision")
_RUN_VALUED: dict[str, Callable[[str], bool]] = {
    "--temperature": _float,
    "--seed": lambda v: _INT.fullmatch(v) is not None,
    "--max-tokens": lambda v: _INT.fullmatch(v) is not None,
    "--intent": lambda v: v in _INTENTS,
}


def run_target(argv: list[str]) -> tuple[str, bool] | None:
    """``(MODEL, whether the daemon should load it)`` when ``argv`` is ``run MODEL [PROMPT]``
    with plain options only, else None. With ``--intent`` the command loads the model itself,
    with the intent's settings."""
    if not argv or argv[0] != "run":
        return None
    parsed = _options(argv[1:], _RUN_VALUED)
    if parsed is None or not 1 <= len(parsed[1]) <= 2:
        return None
    return parsed[1][0], "--intent" not in parsed[0]


def _start_for_run(model: str, preload: bool) -> None:
    """Start the background daemon ``blazar run MODEL`` is about to start, now, when no daemon
    runs and MODEL is installed. Whatever goes wrong here is left to the command, which does
    the same checks again and reports them."""
    try:
        from pathlib import Path

        from blazar.config import load_config, resolve_paths
        from blazar.daemon.client import start_background
        from blazar.daemon.files import read_daemon_info
        from registry.store import Store

        paths = resolve_paths()
        load_config(paths)  # a config the command will refuse starts nothing
        if read_daemon_info(paths) is not None:
            return
        if Store(Path(paths.models_dir)).find(model) is None:
            return
        start_background(paths, preload=model if preload else None)
    except Exception:
        return
