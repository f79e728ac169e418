"""Commands that drive the daemon: serve, run (and its REPL), ps, stop, unload, logs."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, err, human_size, listing, load_setup, open_store, out, print_json
from blazar.config import Paths, resolve_paths
from blazar.config.presets import INTENTS
from blazar.daemon.client import CliError, Daemon, ensure_daemon, find_daemon


@app.command
def serve(
    *,
    host: str | None = None,
    port: int | None = None,
    preload: Annotated[
        list[str] | None,
        Parameter(
            negative="",
            help="Start loading MODEL's engine while the daemon starts (repeatable), "
            "before the models of the config's preload.",
        ),
    ] = None,
    insecure_open: Annotated[
        bool,
        Parameter(
            negative="",
            help="Serve a non-loopback --host even though no API key exists: anyone who reaches "
            "the port may use every model and admin route.",
        ),
    ] = False,
    log_stderr: Annotated[
        bool,
        Parameter(
            negative="",
            help="Also write the daemon log to stderr when it is not a terminal (in a container, "
            "where the orchestrator collects stderr).",
        ),
    ] = False,
) -> None:
    """Run the gateway in the foreground (default http://127.0.0.1:11435)."""
    from blazar.daemon.serve import serve_foreground

    serve_foreground(
        host=host, port=port, preload=preload, insecure_open=insecure_open, log_stderr=log_stderr
    )


Intent = Literal["agent", "batch", "coding", "reasoning", "vision"]


@app.command
def run(
    model: str,
    prompt: str | None = None,
    *,
    temperature: float | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    intent: Annotated[
        Intent | None,
        Parameter(
            help="The workload, which sets the context, slots, keep-alive and sampling defaults of "
            "this run and prints the model's ready card: agent, batch, coding, reasoning or vision."
        ),
    ] = None,
) -> None:
    """Chat with MODEL: answer PROMPT, or open a REPL without one. Starts a daemon if none runs."""
    paths, config = load_setup()
    if open_store(paths).find(model) is None:
        raise CliError(f"model '{model}' is not installed — run `blazar pull {model}` or see `blazar list`")
    # With an intent the model loads once, with the intent's settings, instead of the config's first.
    daemon, started = ensure_daemon(paths, config, preload=None if intent else model)
    if started:
        err.print(
            f"[dim]started a background daemon (pid {daemon.pid}) at {daemon.url}; `blazar stop` ends it[/]"
        )
    options: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if intent is not None:
        chosen = INTENTS[intent]
        options.update(chosen.options)
        headers["x-blazar-keep-alive"] = f"{chosen.keep_alive_s:g}"
        card = daemon.post(
            f"/admin/models/{quote(model, safe=':/')}/load",
            {
                "ctx": chosen.ctx,
                "slots": chosen.slots,
                "keep_alive_s": chosen.keep_alive_s,
                "vision": chosen.vision,
            },
        )
        _print_card(intent, card)
    if temperature is not None:
        options["temperature"] = temperature
    if seed is not None:
        options["seed"] = seed
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    if prompt is not None:
        _answer(daemon, model, [{"role": "user", "content": prompt}], options, headers)
        return
    _repl(daemon, model, options, paths, headers)


def _print_card(intent: str, card: dict[str, Any]) -> None:
    """The daemon's ready card, on stderr (stdout keeps the answer alone)."""
    version = f" {card['version']}" if card.get("version") else ""
    err.print(
        f"[bold]ready[/]: {card['model']} on {card['engine']}{version} (pid {card['pid']}), intent {intent}"
    )
    ctx = f"{card['ctx_per_slot']} tokens per slot"
    if card.get("ctx_asked"):
        ctx += f" (asked {card['ctx_asked']}: the most this model serves)"
    memory = card.get("memory_bytes")
    keep = card.get("keep_alive_s")
    keep_text = "default" if keep is None else ("forever" if keep < 0 else f"{keep:g} s")
    rows = [
        ("context", ctx),
        ("slots", str(card["slots"])),
        ("memory", f"~{human_size(memory)} (estimate)" if memory else "unknown"),
        ("evicted", ", ".join(card["evicted"]) or "none"),
        ("loaded in", f"{card['load_s']:.1f} s"),
        ("keep-alive", keep_text),
    ]
    for label, value in rows:
        err.print(f"  {label:<10} {value}", markup=False)


def _answer(
    daemon: Daemon,
    model: str,
    messages: list[dict[str, str]],
    options: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> str:
    parts: list[str] = []
    for text in daemon.stream_chat({"model": model, "messages": messages, **options}, headers=headers):
        parts.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(parts)


def _read_prompt() -> str | None:
    try:
        line = input(">>> ")
    except EOFError:
        return None
    if not line.startswith('"""'):
        return line
    lines = [line[3:]]
    while not lines[-1].endswith('"""'):
        try:
            lines.append(input("... "))
        except EOFError:
            break
    lines[-1] = lines[-1].removesuffix('"""')
    return "\n".join(lines).strip()


def _repl(
    daemon: Daemon, model: str, options: dict[str, Any], paths: Paths, headers: dict[str, str] | None = None
) -> None:
    try:
        import readline
    except ImportError:  # pragma: no cover - not on every platform
        readline = None  # type: ignore[assignment]
    history = Path(paths.run_dir).parent / "history"
    if readline is not None:
        try:
            readline.read_history_file(history)
        except OSError:
            pass
    err.print('[dim]Type a message; """ starts multi-line input; /bye quits.[/]')
    messages: list[dict[str, str]] = []
    try:
        while True:
            text = _read_prompt()
            if text is None or text.strip() in ("/bye", "/exit", "/quit"):
                break
            if not text.strip():
                continue
            if text.strip() == "/clear":
                messages.clear()
                continue
            messages.append({"role": "user", "content": text})
            try:
                answer = _answer(daemon, model, messages, options, headers)
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                messages.pop()
                continue
            messages.append({"role": "assistant", "content": answer})
    finally:
        if readline is not None:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(history)
            except OSError:
                pass


@app.command
def ps(*, json_: Json = False) -> None:
    """Show loaded engines: model, engine, pid, port, slots, context per slot, in-flight requests,
    restarts. The context is what the running engine serves, as it reports it."""
    paths = resolve_paths()
    daemon = find_daemon(paths)
    engines = daemon.get("/admin/engines")["engines"] if daemon else []
    if json_:
        print_json({"daemon": {"url": daemon.url, "pid": daemon.pid} if daemon else None, "engines": engines})
        return
    if daemon is None:
        out.print("no daemon is running — start one with `blazar serve`")
        return
    headers = ("MODEL", "ENGINE", "STATE", "PID", "PORT", "SLOTS", "CONTEXT", "IN-FLIGHT", "RESTARTS")
    rows = []
    for e in engines:
        busy = min(e["in_flight"], e["slots"])
        ctx = e.get("ctx_served") or e["ctx_per_slot"]
        rows.append((
            e["model"], e["engine"], e["state"], str(e["pid"] or "-"), str(e["port"] or "-"),
            f"{busy}/{e['slots']}", str(ctx), str(e["in_flight"]), str(e["restarts"]),
        ))  # fmt: skip
    out.print(f"daemon {daemon.url} (pid {daemon.pid})")
    out.print(listing(headers, rows, whole=("MODEL",), drop=("RESTARTS", "PORT", "PID", "IN-FLIGHT")))


def _alive(pid: int) -> bool:
    """True while the process runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    except PermissionError:
        return True
    return not stat.rsplit(") ", 1)[-1].startswith("Z")


@app.command
def stop(*, timeout_s: float = 30.0) -> None:
    """Stop the daemon: drain requests, terminate every engine, exit."""
    paths = resolve_paths()
    daemon = find_daemon(paths)
    if daemon is None:
        out.print("no daemon is running")
        return
    pid = daemon.pid
    try:
        daemon.post("/admin/shutdown")
    except Exception:
        if pid:
            os.kill(pid, signal.SIGTERM)
    daemon.http.close()  # an open keep-alive connection would hold up the daemon's drain
    deadline = time.monotonic() + timeout_s
    while pid and time.monotonic() < deadline:
        if not _alive(pid):
            out.print(f"stopped the daemon (pid {pid})")
            return
        time.sleep(0.05)
    if pid:
        os.kill(pid, signal.SIGKILL)
        raise CliError(f"the daemon (pid {pid}) did not stop within {timeout_s:.0f} s and was killed")


@app.command
def unload(model: str) -> None:
    """Unload MODEL's engine from the running daemon; the next request loads it again."""
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        raise CliError("no daemon is running, so nothing is loaded — start one with `blazar serve`")
    result = daemon.post(f"/admin/models/{quote(model, safe=':/')}/unload")
    out.print(f"unloaded {model}" if result.get("unloaded") else f"{model} was not loaded")


@app.command
def logs(
    *, follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative="")] = False, lines: int = 50
) -> None:
    """Print the daemon's log (``-f`` follows it)."""
    paths = resolve_paths()
    path = Path(paths.log_file)
    if not path.exists():
        raise CliError(f"no log yet at {path} — the daemon writes it once `blazar serve` runs")
    with path.open("rb") as f:
        tail = f.read().splitlines()[-lines:]
        for line in tail:
            sys.stdout.write(line.decode(errors="replace") + "\n")
        sys.stdout.flush()
        while follow:
            chunk = f.read()
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            else:
                time.sleep(0.2)
                if path.exists() and path.stat().st_size < f.tell():  # rotated
                    f.close()
                    f = path.open("rb")
