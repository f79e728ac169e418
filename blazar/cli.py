"""The ``blazar`` command line.

Every failing command prints one line that says what went wrong and what to
run next, and exits non-zero; tracebacks only with ``BLAZAR_DEBUG=1``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import cyclopts
import msgspec
import trio
from cyclopts import Parameter
from rich.console import Console
from rich.table import Table

from blazar import __version__
from blazar.client import CliError, Daemon, ensure_daemon, find_daemon
from blazar.config import Config, ConfigError, Paths, load_config, resolve_paths

__all__ = ["app", "main"]

app = cyclopts.App(name="blazar", help="A control plane for local AI inference.", version=__version__)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Json = Annotated[bool, Parameter(name="--json", negative="", help="Print JSON instead of a table.")]


def _setup() -> tuple[Paths, Config]:
    paths = resolve_paths()
    return paths, load_config(paths)


def _store(paths: Paths) -> Any:
    from registry.store import Store

    return Store(Path(paths.models_dir))


def _forget(paths: Paths, name: str) -> None:
    """Make a running daemon drop its engine for ``name`` (the file behind the name changed)."""
    daemon = find_daemon(paths)
    if daemon is not None:
        daemon.post(f"/admin/models/{name}/forget")


def _print_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")


def _size(n: int | float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _params(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def _ago(ts: float) -> str:
    delta = max(0.0, time.time() - ts)
    for secs, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if delta >= secs:
            n = int(delta // secs)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


# -- serving ------------------------------------------------------------------


@app.command
def serve(*, host: str | None = None, port: int | None = None) -> None:
    """Run the gateway in the foreground (default http://127.0.0.1:11435)."""
    from blazar.server import BindError, run_server, setup_logging

    paths, config = _setup()
    config = msgspec.structs.replace(
        config, host=host or config.host, port=config.port if port is None else port
    )
    running = find_daemon(paths)
    if running is not None:
        raise CliError(f"a daemon already runs at {running.url} (pid {running.pid}) — `blazar stop` it first")
    setup_logging(paths, config, to_stderr=sys.stderr.isatty())
    try:
        trio.run(run_server, config, paths)
    except BindError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(3)


@app.command
def run(
    model: str,
    prompt: str | None = None,
    *,
    temperature: float | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
) -> None:
    """Chat with MODEL: answer PROMPT, or open a REPL without one. Starts a daemon if none runs."""
    paths, config = _setup()
    if _store(paths).find(model) is None:
        raise CliError(f"model '{model}' is not installed — run `blazar pull {model}` or see `blazar list`")
    daemon, started = ensure_daemon(paths, config)
    if started:
        err.print(
            f"[dim]started a background daemon (pid {daemon.pid}) at {daemon.url}; `blazar stop` ends it[/]"
        )
    options: dict[str, Any] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if seed is not None:
        options["seed"] = seed
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    if prompt is not None:
        _answer(daemon, model, [{"role": "user", "content": prompt}], options)
        return
    _repl(daemon, model, options, paths)


def _answer(daemon: Daemon, model: str, messages: list[dict[str, str]], options: dict[str, Any]) -> str:
    parts: list[str] = []
    for text in daemon.stream_chat({"model": model, "messages": messages, **options}):
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


def _repl(daemon: Daemon, model: str, options: dict[str, Any], paths: Paths) -> None:
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
                answer = _answer(daemon, model, messages, options)
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
    """Show loaded engines: model, engine, pid, port, slots, in-flight requests, restarts."""
    paths = resolve_paths()
    daemon = find_daemon(paths)
    engines = daemon.get("/admin/engines")["engines"] if daemon else []
    if json_:
        _print_json(
            {"daemon": {"url": daemon.url, "pid": daemon.pid} if daemon else None, "engines": engines}
        )
        return
    if daemon is None:
        out.print("no daemon is running — start one with `blazar serve`")
        return
    table = Table("MODEL", "ENGINE", "STATE", "PID", "PORT", "SLOTS", "IN-FLIGHT", "RESTARTS", box=None)
    for e in engines:
        busy = min(e["in_flight"], e["slots"])
        table.add_row(
            e["model"], e["engine"], e["state"], str(e["pid"] or "-"), str(e["port"] or "-"),
            f"{busy}/{e['slots']}", str(e["in_flight"]), str(e["restarts"]),
        )  # fmt: skip
    out.print(f"daemon {daemon.url} (pid {daemon.pid})")
    out.print(table)


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
    from urllib.parse import quote

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


# -- the model store ----------------------------------------------------------


@app.command
def pull(
    name: str,
    *,
    link: Annotated[
        bool, Parameter(negative="", help="Symlink files reused from another tool's store.")
    ] = False,
    json_: Json = False,
) -> None:
    """Download a model: a catalog name (smollm2-135m), ORG/REPO[:QUANT] or ollama:NAME[:TAG].

    Bytes another tool already has on disk (Ollama, the Hugging Face cache, LM Studio,
    llama.cpp) are hardlinked instead of downloaded."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from registry.catalog import Catalog
    from registry.pull import PullProgress
    from registry.pull import pull as do_pull

    paths = resolve_paths()
    store = _store(paths)
    columns = (
        "{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=json_ or not err.is_terminal) as bar:
        task = bar.add_task(name, total=None)

        def on_progress(p: PullProgress) -> None:
            if json_:
                sys.stdout.write(msgspec.json.encode(p).decode() + "\n")
                return
            if p.status in ("trying next source", "not reused"):
                err.print(f"[yellow]{p.source}: {p.message}[/]")
            elif p.status == "reused":
                err.print(f"reused {p.message}")
            bar.update(
                task,
                description=f"{p.status} {p.source or ''}".strip(),
                total=p.total,
                completed=p.completed or 0,
            )

        record = trio.run(
            lambda: do_pull(
                store,
                name,
                catalog=Catalog.load(),
                cache_dir=Path(paths.cache_dir),
                on_progress=on_progress,
                link=link,
            )
        )
    if json_:
        _print_json(record)
    else:
        out.print(f"pulled {record.name} ({_size(record.size)}, {record.digest[:19]}) from {record.source}")


@app.command
def search(
    query: str,
    *,
    limit: Annotated[int, Parameter(help="Hub repositories to list.")] = 10,
    offline: Annotated[bool, Parameter(negative="", help="The catalog only.")] = False,
    json_: Json = False,
) -> None:
    """Find models: catalog names first, then GGUF repositories on the Hugging Face Hub."""
    from registry.catalog import Catalog
    from registry.search import search as do_search

    result = trio.run(lambda: do_search(query, Catalog.load(), limit=limit, hub=not offline))
    if json_:
        _print_json(result)
        return
    if result.catalog:
        table = Table("NAME", "PARAMS", "SIZE", "CAPABILITIES", "DESCRIPTION", box=None)
        for hit in result.catalog:
            size = _size(hit.size) if hit.size else "-"
            table.add_row(
                hit.name, hit.parameter_size or "-", size, ", ".join(hit.capabilities), hit.description
            )
        out.print(table)
    if result.hub:
        out.print()
        table = Table("HUGGING FACE", "DOWNLOADS", "LIKES", "QUANTS", box=None)
        for repo in result.hub:
            quants = ", ".join(
                f"{f.quant or f.file} {_size(f.size)}" if f.size else (f.quant or f.file) for f in repo.files
            )
            table.add_row(f"hf.co/{repo.repo}", f"{repo.downloads:,}", f"{repo.likes:,}", quants)
        out.print(table)
        out.print("pull one with `blazar pull hf.co/ORG/REPO:QUANT`")
    if not result.catalog and not result.hub:
        out.print(f"no model matches {query!r}")
    if result.note:
        err.print(f"[yellow]{result.note}[/]")


@app.command(name="import")
def import_(
    file: Path | None = None,
    *,
    name: str | None = None,
    scan: Annotated[
        bool,
        Parameter(negative="", help="List models in Ollama, Hugging Face, LM Studio and llama.cpp stores."),
    ] = False,
    all_: Annotated[
        bool, Parameter(name="--all", negative="", help="With --scan: adopt every model found.")
    ] = False,
    link: Annotated[bool, Parameter(negative="", help="Symlink instead of hardlink/copy.")] = False,
    json_: Json = False,
) -> None:
    """Add a local GGUF file to the store (hardlinked when possible, else copied).

    With --scan, find the models other tools already keep on disk; --scan --all adopts them.
    """
    paths = resolve_paths()
    if scan:
        if file is not None or name is not None:
            raise CliError(
                "--scan finds the files itself — give FILE --name NAME, or --scan [--all], not both"
            )
        _import_scan(paths, adopt=all_, link=link, json_=json_)
        return
    if all_:
        raise CliError("--all adopts what --scan finds — run `blazar import --scan --all`")
    if file is None or name is None:
        raise CliError(
            "give a GGUF file and a name (`blazar import FILE --name NAME`), "
            "or look for models other tools keep with `blazar import --scan`"
        )
    if not file.is_file():
        raise CliError(f"no such file: {file}")
    record = _store(paths).import_file(file.resolve(), name, link=link, source=f"import:{file.resolve()}")
    _forget(paths, record.name)
    if json_:
        _print_json(record)
    else:
        out.print(f"imported {record.name} ({_size(record.size)}, {record.digest[:19]})")


def _import_scan(paths: Paths, *, adopt: bool, link: bool, json_: bool) -> None:
    """`blazar import --scan [--all]`: list, or adopt, the models other tools keep on disk."""
    from rich.markup import escape

    from registry.scan import Adoption, adopt_all, default_roots
    from registry.scan import scan as find_models

    roots = default_roots()
    found = find_models(roots)
    for warning in found.warnings:
        err.print(f"warning: {warning}", style="yellow", markup=False)
    if not adopt:
        if json_:
            _print_json(found)
        elif not found.models:
            looked = [*roots.ollama, *roots.huggingface, *roots.lmstudio, *roots.llamacpp]
            out.print("no models found in other tools' stores; looked in:", markup=False)
            for folder in looked:
                out.print(f"  {folder}", markup=False)
        else:
            from rich.table import Column

            # Paths fold instead of ending in '…', so they can be copied from a narrow terminal.
            table = Table("NAME", "STORE", "QUANT", "SIZE", Column("PATH", overflow="fold"), box=None)
            for m in found.models:
                table.add_row(escape(m.name), m.store, m.quantization or "-", _size(m.size), escape(m.path))
            out.print(table)
            out.print(f"\nadopt them all with `blazar import --scan --all{' --link' if link else ''}`")
        return

    def report(a: Adoption) -> None:
        if json_:
            return
        if a.status == "adopted":
            how = {"hardlink": "hardlink", "copy": "copy", "symlink": "symlink", "existing": "already stored"}
            copied = "0 bytes copied" if a.bytes_copied == 0 else f"{_size(a.bytes_copied)} copied"
            out.print(f"adopted {a.name} from {a.store} ({how[a.method or 'copy']}, {copied})", markup=False)
        elif a.status == "skipped":
            out.print(f"skipped {a.name}: {a.reason}", markup=False)
        else:
            err.print(f"failed {a.name}: {a.reason}", markup=False)

    results = adopt_all(_store(paths), found.models, link=link, on_result=report)
    failed = [a for a in results if a.status == "failed"]
    if json_:
        _print_json(results)
    else:
        adopted = [a for a in results if a.status == "adopted"]
        copied_bytes = sum(a.bytes_copied for a in adopted)
        copied = "0 bytes copied" if copied_bytes == 0 else f"{_size(copied_bytes)} copied"
        out.print(
            f"adopted {len(adopted)} model(s), skipped {len(results) - len(adopted) - len(failed)}, {copied}",
            markup=False,
        )
    if failed:
        raise CliError(f"{len(failed)} model(s) could not be adopted — see the lines above")


@app.command(name="list")
def list_(*, json_: Json = False) -> None:
    """List installed models."""
    paths = resolve_paths()
    records = _store(paths).list()
    if json_:
        _print_json(records)
        return
    table = Table("NAME", "DIGEST", "SIZE", "MODIFIED", "SOURCE", box=None)
    for r in records:
        table.add_row(
            r.name, r.digest.removeprefix("sha256:")[:12], _size(r.size), _ago(r.modified_at), r.source
        )
    out.print(table)


@app.command
def show(name: str, *, json_: Json = False) -> None:
    """Show a model's GGUF facts: architecture, parameters, quantization, context, layers, heads."""
    paths = resolve_paths()
    store = _store(paths)
    record = store.get(name)
    info = store.info(record)
    if json_:
        doc = msgspec.to_builtins(info)
        doc.pop("tensors", None)
        _print_json({"model": record, "info": doc})
        return
    rows = [
        ("name", record.name),
        ("architecture", info.architecture),
        ("parameters", _params(info.parameter_count)),
        ("quantization", info.file_type or "-"),
        ("context length", str(info.context_length or "-")),
        ("layers", str(info.block_count or "-")),
        ("attention heads", str(info.head_count or "-")),
        ("KV heads", str(info.head_count_kv or "-")),
        ("embedding length", str(info.embedding_length or "-")),
        ("chat template", "present" if info.chat_template else "absent"),
        ("size", _size(record.size)),
        ("digest", record.digest),
        ("source", record.source),
    ]  # fmt: skip
    table = Table(box=None, show_header=False)
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    out.print(table)


def _bin(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


_FIT_FIELDS = ("weights", "kv", "k", "v", "recurrent", "compute", "overhead", "total")


@app.command
def fit(
    target: str,
    *,
    ctx: int | None = None,
    slots: int | None = None,
    cache_type: Literal["f16", "q8_0", "q4_0"] = "f16",
    json_: Json = False,
) -> None:
    """Estimate a model's memory (weights, KV cache, compute) and whether it fits on this machine.

    TARGET is an installed model name or a path to a .gguf file. --ctx is per slot (the engine
    gets ctx x slots); the defaults are the ones the daemon would use. Needs no daemon.
    """
    from blazar.census import take_census
    from registry import fit as fitting

    paths, config = _setup()
    path, override = Path(target).expanduser(), None
    name = path.name
    if not path.is_file():
        record = _store(paths).get(target)
        path, name, override = Path(record.path), record.name, config.models.get(record.name)
    shape = fitting.read_shape(path)
    ctx = ctx or (override.ctx if override else None) or fitting.default_ctx(shape, config.default_ctx)
    settings = fitting.Settings(
        ctx_per_slot=ctx,
        slots=slots or (override.slots if override else None) or config.slots,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
    )
    census = take_census()
    report = fitting.fit(shape, settings, census.memory())
    est = report.estimate
    notes = [*report.notes, *([census.note] if census.note else [])]
    if json_:
        doc = {
            "model": name,
            "path": str(path),
            "architecture": shape.architecture,
            "quantization": shape.file_type,
            "parameters": shape.parameter_count,
            "layers": shape.n_layer,
            **{k: getattr(est, k) for k in _FIT_FIELDS},
            "weights_by_type": est.weights_by_type,
            "cells_per_slot": est.cells_per_slot,
            "swa_cells_per_slot": est.swa_cells_per_slot,
            "settings": settings,
            "verdict": report.verdict,
            "device": report.device,
            "available": report.available,
            "ram_available": report.ram_available,
            "gpu_layers": report.gpu_layers,
            "n_layers": report.n_layers,
            "headroom": report.headroom,
            "tight": report.tight,
            "levers": report.levers,
            "census": census,
            "notes": notes,
        }
        _print_json(doc)
        return
    quant, params = shape.file_type or "?", _params(shape.parameter_count)
    out.print(f"[bold]{name}[/]  {shape.architecture} · {quant} · {params} params · {shape.n_layer} layers")
    out.print(
        f"ctx {settings.ctx_per_slot} per slot x {settings.slots} slot(s), "
        f"KV cache {cache_type}, flash attention on"
    )
    by_type = sorted(est.weights_by_type.items(), key=lambda kv: -kv[1])
    cells = f"{est.cells_per_slot} cells per slot"
    if est.swa_cells_per_slot is not None:
        cells += f", {est.swa_cells_per_slot} on sliding-window layers"
    rows = [
        ("weights", _bin(est.weights), ", ".join(f"{t} {_bin(b)}" for t, b in by_type)),
        ("KV cache", _bin(est.kv), f"K {_bin(est.k)} + V {_bin(est.v)}; {cells}"),
        *([("recurrent", _bin(est.recurrent), "fixed state per slot")] if est.recurrent else []),
        ("compute", _bin(est.compute), "graph and output buffers (estimate)"),
        ("overhead", _bin(est.overhead), "engine process"),
        ("total", _bin(est.total), ""),
    ]  # fmt: skip
    table = Table(box=None, show_header=False)
    for key, value, detail in rows:
        table.add_row(f"[bold]{key}[/]", value, f"[dim]{detail}[/]")
    out.print(table)
    where = "free VRAM" if report.device == "gpu" else "available RAM"
    verdict = {
        "fits": "fits",
        "offload": f"fits with {report.gpu_layers} of {report.n_layers} layers on the GPU, the rest in RAM"
        if report.gpu_layers
        else "fits in RAM only: no layer fits on the GPU",
        "no_fit": "does not fit",
    }[report.verdict]
    room = f"{_bin(report.available)} {where}, headroom {_bin(report.headroom)}"
    out.print(f"[bold]verdict[/]  {verdict} ({room})")
    if report.levers:
        table = Table("LEVER", "WEIGHTS", "KV", "TOTAL", "VERDICT", box=None)
        for lever in report.levers:
            result: str = lever.verdict
            if lever.verdict == "offload":
                result = f"offload, {lever.gpu_layers} GPU layers"
            table.add_row(lever.change, _bin(lever.weights), _bin(lever.kv), _bin(lever.total), result)
        out.print(table)
    for note in notes:
        out.print(f"[dim]note: {note}[/]")


@app.command
def rm(name: str) -> None:
    """Remove a model from the store (its blob goes when no other name uses it).

    Refused while the model is serving requests."""
    paths = resolve_paths()
    record = _remove(paths, name)
    out.print(f"deleted {record.name}")


def _remove(paths: Paths, name: str) -> Any:
    store = _store(paths)
    record = store.get(name)
    daemon = find_daemon(paths)
    if daemon is not None:
        # The daemon owns running engines: it refuses while the model serves, else stops it first.
        daemon.delete("/api/delete", {"model": record.name})
    else:
        store.remove(record.name)
    return record


@app.command
def cp(source: str, destination: str) -> None:
    """Give a model a second name (no bytes are copied)."""
    from registry.storage import copy_model

    paths = resolve_paths()
    record = copy_model(_store(paths), source, destination)
    out.print(f"copied {source} to {record.name} (same file, 0 bytes copied)")


# -- disk care ------------------------------------------------------------------


@app.command
def storage(*, json_: Json = False) -> None:
    """Disk used by the store: per model, shared files counted once, and free space."""
    from registry.storage import storage_report

    report = storage_report(_store(resolve_paths()))
    if json_:
        _print_json(report)
        return
    table = Table("NAME", "SIZE", "DIGEST", "SHARED WITH", box=None)
    for blob in report.blobs:
        for name in blob.names:
            others = ", ".join(n for n in blob.names if n != name) or "-"
            size = _size(blob.size) + (" (link)" if blob.linked else "")
            table.add_row(name, size, blob.digest.removeprefix("sha256:")[:12], others)
    out.print(table)
    out.print(
        f"\nstore {report.root}: {_size(report.used_bytes)} in {len(report.blobs)} file(s)"
        f", {_size(report.partial_bytes)} in partial downloads, {_size(report.orphan_bytes)} orphaned"
        f"\ndisk: {_size(report.free_bytes)} free of {_size(report.total_bytes)}"
    )
    if report.orphan_bytes or report.partial_bytes:
        out.print("reclaim with `blazar prune --orphans` (add `--partials` for unfinished downloads)")


@app.command
def prune(
    *,
    orphans: Annotated[bool, Parameter(negative="", help="Files no model uses.")] = False,
    partials: Annotated[bool, Parameter(negative="", help="Unfinished downloads too.")] = False,
    unused: Annotated[float | None, Parameter(help="Remove models unused for this many days.")] = None,
    dry_run: Annotated[bool, Parameter(negative="", help="Say what would go; delete nothing.")] = False,
    json_: Json = False,
) -> None:
    """Reclaim disk: orphaned files, unfinished downloads, models unused for DAYS."""
    from actors.ledger import last_used_by_model
    from registry.storage import prune_orphans, unused_models

    if not (orphans or partials or unused is not None):
        raise CliError("say what to prune: --orphans, --partials and/or --unused DAYS")
    paths = resolve_paths()
    store = _store(paths)
    removed: list[dict[str, Any]] = []
    if unused is not None:
        last_used = last_used_by_model(Path(paths.data_dir) / "blazar.db")
        for record in unused_models(store, unused, last_used):
            if not dry_run:
                _remove(paths, record.name)
            removed.append({"kind": "model", "name": record.name, "size": record.size})
    if orphans or partials:
        for orphan in prune_orphans(store, partials=partials, dry_run=dry_run):
            removed.append({"kind": orphan.kind, "name": orphan.path, "size": orphan.size})
    if json_:
        _print_json({"dry_run": dry_run, "removed": removed})
        return
    verb = "would remove" if dry_run else "removed"
    for item in removed:
        out.print(f"{verb} {item['kind']} {item['name']} ({_size(item['size'])})")
    total = sum(item["size"] for item in removed)
    out.print(f"{verb} {len(removed)} item(s), {_size(total)}")


def main(argv: list[str] | None = None) -> None:
    try:
        app(argv if argv is not None else sys.argv[1:])
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:
        if os.environ.get("BLAZAR_DEBUG"):
            raise
        sys.stderr.write(f"error: {_one_line(exc)}\n")
        sys.exit(1)


def _one_line(exc: BaseException) -> str:
    from registry.errors import RegistryError

    if isinstance(exc, (CliError, ConfigError)):
        return str(exc)
    if isinstance(exc, RegistryError):
        return exc.message
    import httpx

    if isinstance(exc, httpx.HTTPError):
        return f"could not reach the daemon ({exc}) — check `blazar ps` and `blazar logs`"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({exc.filename or ''})".strip()
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    main()
