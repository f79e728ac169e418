"""Commands on the model store: pull, search, import (and --scan), list, show, rm, cp."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from cyclopts import Parameter
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import (
    Json,
    err,
    forget,
    human_params,
    human_size,
    listing,
    open_store,
    out,
    print_json,
    refresh,
    remove_model,
    time_ago,
)
from blazar.config import Paths, resolve_paths
from blazar.daemon.client import CliError

if TYPE_CHECKING:
    from registry.store import ModelRecord, Store


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
    import trio
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from registry.catalog import Catalog
    from registry.pull import PullProgress
    from registry.pull import pull as do_pull

    paths = resolve_paths()
    store = open_store(paths)
    columns = (
        "{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    downloaded: list[int | None] = [None]
    reused = [0]
    with Progress(*columns, console=err, transient=True, disable=json_ or not err.is_terminal) as bar:
        task = bar.add_task(name, total=None)

        def on_progress(p: PullProgress) -> None:
            if p.status == "success":
                downloaded[0] = p.downloaded
            elif p.status == "reused":
                reused[0] += p.total or 0
            if json_:
                sys.stdout.write(msgspec.json.encode(p).decode() + "\n")
                return
            if p.status in ("trying next source", "not reused"):
                err.print(f"[yellow]{p.source}: {p.message}[/]")
            elif p.status == "reused":
                err.print(f"reused {p.message}")
            elif p.status == "resolving" and p.message and p.source:
                err.print(f"{p.source}: {p.message}")
            bar.update(
                task,
                description=f"{p.status} {p.source or ''}".strip(),
                total=p.total,
                completed=p.completed or 0,
            )

        before = {r.name: r.digest for r in store.list()}
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
    if before.get(record.name) not in (None, record.digest):
        forget(paths, record.name)  # a running daemon must not keep serving the old file
    if json_:
        print_json(record)
    else:
        traffic = []
        if downloaded[0] is not None:
            got = downloaded[0]
            traffic.append("0 bytes downloaded" if got == 0 else f"{human_size(got)} downloaded")
        if reused[0]:
            traffic.append(f"{human_size(reused[0])} reused from another tool's store")
        out.print(
            f"pulled {record.name} ({human_size(record.size)}, {record.digest[:19]}) from {record.source}"
            + (f": {', '.join(traffic)}" if traffic else ""),
            markup=False,
        )


@app.command
def search(
    query: str,
    *,
    limit: Annotated[int, Parameter(help="Hub repositories to list.")] = 10,
    offline: Annotated[bool, Parameter(negative="", help="The catalog only.")] = False,
    json_: Json = False,
) -> None:
    """Find models: catalog names first, then GGUF repositories on the Hugging Face Hub."""
    import trio

    from registry.catalog import Catalog
    from registry.search import search as do_search

    result = trio.run(lambda: do_search(query, Catalog.load(), limit=limit, hub=not offline))
    if json_:
        print_json(result)
        return
    if result.catalog:
        rows = [
            (
                hit.name, hit.parameter_size or "-", human_size(hit.size) if hit.size else "-",
                ", ".join(hit.capabilities), hit.description,
            )
            for hit in result.catalog
        ]  # fmt: skip
        headers = ("NAME", "PARAMS", "SIZE", "CAPABILITIES", "DESCRIPTION")
        out.print(
            listing(headers, rows, wrap=("CAPABILITIES", "DESCRIPTION"), drop=("PARAMS", "CAPABILITIES"))
        )
    if result.hub:
        out.print()
        hub_rows = []
        for repo in result.hub:
            quants = ", ".join(
                f"{f.quant or f.file} {human_size(f.size)}" if f.size else (f.quant or f.file)
                for f in repo.files
            )
            hub_rows.append((f"hf.co/{repo.repo}", f"{repo.downloads:,}", f"{repo.likes:,}", quants))
        hub_headers = ("HUGGING FACE", "DOWNLOADS", "LIKES", "QUANTS")
        drop = ("LIKES", "DOWNLOADS")
        out.print(listing(hub_headers, hub_rows, whole=("HUGGING FACE",), wrap=("QUANTS",), drop=drop))
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
    """Add a local model to the store (each file hardlinked when possible, else copied): a GGUF
    file; a Hugging Face safetensors directory (config.json and shards) or an MLX directory; a
    diffusion checkpoint (.safetensors, .ckpt, .gguf); a whisper.cpp ggml .bin; a whisper folder
    in CTranslate2 form; or a piper voice's .onnx (its .onnx.json beside).

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
    if not file.exists():
        raise CliError(f"no such file or folder: {file}")
    from registry.imports import import_path

    record = import_path(open_store(paths), file.absolute(), name, link=link)
    forget(paths, record.name)
    if json_:
        print_json(record)
    else:
        many = f", {len(record.files)} files" if len(record.files) > 1 else ""
        what = f"{record.kind}, {record.format}{many}"
        out.print(f"imported {record.name} ({what}, {human_size(record.size)}, {record.digest[:19]})")


def _import_scan(paths: Paths, *, adopt: bool, link: bool, json_: bool) -> None:
    """`blazar import --scan [--all]`: list, or adopt, the models other tools keep on disk."""

    from registry.reuse import Adoption, adopt_all
    from registry.scan import default_roots
    from registry.scan import scan as find_models

    roots = default_roots()
    found = find_models(roots)
    for warning in found.warnings:
        err.print(f"warning: {warning}", style="yellow", markup=False)
    if not adopt:
        if json_:
            print_json(found)
        elif not found.models:
            looked = [*roots.ollama, *roots.huggingface, *roots.lmstudio, *roots.llamacpp]
            out.print("no models found in other tools' stores; looked in:", markup=False)
            for folder in looked:
                out.print(f"  {folder}", markup=False)
        else:
            # Names stay whole; paths fold instead of ending in '…', so both can be copied.
            rows = [
                (m.name, m.store, m.format, m.quantization or "-", human_size(m.size), m.path)
                for m in found.models
            ]
            out.print(listing(("NAME", "STORE", "FORMAT", "QUANT", "SIZE", "PATH"), rows, wrap=("PATH",)))
            out.print(f"\nadopt them all with `blazar import --scan --all{' --link' if link else ''}`")
        return

    def report(a: Adoption) -> None:
        if json_:
            return
        if a.status == "adopted":
            how = {"hardlink": "hardlink", "copy": "copy", "symlink": "symlink", "existing": "already stored"}
            copied = "0 bytes copied" if a.bytes_copied == 0 else f"{human_size(a.bytes_copied)} copied"
            out.print(f"adopted {a.name} from {a.store} ({how[a.method or 'copy']}, {copied})", markup=False)
        elif a.status == "skipped":
            out.print(f"skipped {a.name}: {a.reason}", markup=False)
        else:
            err.print(f"failed {a.name}: {a.reason}", markup=False)

    results = adopt_all(open_store(paths), found.models, link=link, on_result=report)
    failed = [a for a in results if a.status == "failed"]
    if json_:
        print_json(results)
    else:
        adopted = [a for a in results if a.status == "adopted"]
        copied_bytes = sum(a.bytes_copied for a in adopted)
        copied = "0 bytes copied" if copied_bytes == 0 else f"{human_size(copied_bytes)} copied"
        out.print(
            f"adopted {len(adopted)} model(s), skipped {len(results) - len(adopted) - len(failed)}, {copied}",
            markup=False,
        )
    if failed:
        raise CliError(f"{len(failed)} model(s) could not be adopted — see the lines above")


Remote = Annotated[
    bool,
    Parameter(negative="", help="Add the peers' models (from the running daemon), marked with their peer."),
]


@app.command(name="list")
def list_(*, remote: Remote = False, json_: Json = False) -> None:
    """List installed models (with --remote, the [[remotes]] peers' models beside them)."""
    paths = resolve_paths()
    records = open_store(paths).list()
    peers = _remote_models(paths) if remote else []
    if json_:
        print_json({"local": records, "remote": peers} if remote else records)
        return
    columns = ("NAME", "KIND", "FORMAT", "DIGEST", "SIZE", "MODIFIED", "SOURCE")
    rows: list[tuple[str, ...]] = []
    for r in records:
        quant = r.facts.quantization if r.facts else None
        row = (
            r.name,
            r.kind,
            f"{r.format} {quant}" if quant and r.format == "safetensors" else r.format,
            r.digest.removeprefix("sha256:")[:12],
            human_size(r.size),
            time_ago(r.modified_at),
            r.source,
        )
        rows.append(("here", *row) if remote else row)
    for m in peers:
        digest = (m["digest"] or "").removeprefix("sha256:")[:12] or "-"
        size = human_size(m["size_bytes"]) if m["size_bytes"] is not None else "-"
        where = m["peer"] + ("" if m["peer_state"] == "up" else f" ({m['peer_state']})")
        name = m["name"] + ("*" if m["warm"] else "")
        rows.append((where, name, m["kind"], "-", digest, size, "-", f"remote:{m['peer']}/{m['name']}"))
    # a name is what the user types next: never cut; narrow terminals lose columns instead
    headers = ("WHERE", *columns) if remote else columns
    out.print(listing(headers, rows, whole=("WHERE", "NAME"), drop=("SOURCE", "DIGEST", "FORMAT", "KIND")))
    if peers:
        out.print("[dim]* warm on that peer; ask for a peer's model by name, or as remote:PEER/MODEL[/]")


def _remote_models(paths: Paths) -> list[dict[str, Any]]:
    """Every model of every peer, as the running daemon's fresh poll of them says."""
    from blazar.daemon.client import find_daemon

    daemon = find_daemon(paths)
    if daemon is None:
        raise CliError("--remote needs the running daemon (it polls the peers) — start it: `blazar serve`")
    rows: list[dict[str, Any]] = []
    for p in daemon.get("/api/peers")["peers"]:
        snap = p["snapshot"] or {}
        warm = {m["model"] for m in snap.get("loaded", [])}
        for m in snap.get("installed", []):
            rows.append(
                {
                    "peer": p["name"],
                    "peer_state": p["state"],
                    "name": m["name"],
                    "kind": m.get("kind", "chat"),
                    "size_bytes": m.get("size_bytes"),
                    "digest": m.get("digest"),
                    "warm": m["name"] in warm,
                }
            )
    return rows


@app.command
def show(name: str, *, json_: Json = False) -> None:
    """Show a model's facts: for GGUF its architecture, parameters, quantization, context,
    layers and heads; for a safetensors or MLX directory, a diffusion checkpoint or a
    whisper.cpp file what their headers say; for a speech model its language, sample rate;
    for every model of several files, its files."""
    paths = resolve_paths()
    store = open_store(paths)
    record = store.get(name)
    if record.files:
        _show_files(store, record, json_=json_)
        return
    info = store.info(record)
    cert = _certificate(paths, record.name)
    if json_:
        doc = msgspec.to_builtins(info)
        doc.pop("tensors", None)
        print_json({"model": record, "info": doc, "certificate": cert})
        return
    rows = [
        ("name", record.name),
        ("kind", record.kind),
        ("architecture", info.architecture),
        ("parameters", human_params(info.parameter_count)),
        ("quantization", info.file_type or "-"),
        ("context length", str(info.context_length or "-")),
        ("layers", str(info.block_count or "-")),
        ("attention heads", str(info.head_count or "-")),
        ("KV heads", str(info.head_count_kv or "-")),
        ("embedding length", str(info.embedding_length or "-")),
        ("chat template", "present" if info.chat_template else "absent"),
        ("size", human_size(record.size)),
        ("digest", record.digest),
        ("source", record.source),
    ]  # fmt: skip
    if cert is None:
        rows.append(("capabilities", f"not certified (`blazar model-doctor {record.name}`)"))
    else:
        caps = "  ".join(f"{name} {status}" for name, status in cert["capabilities"].items())
        rows.append(("capabilities", f"{caps}  ({cert['engine']}, {time_ago(cert['created_at'])})"))
    table = Table(box=None, show_header=False)
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    out.print(table)


def _certificate(paths: Paths, model: str) -> dict[str, Any] | None:
    """The newest capability certificate of ``model`` from the ledger (read-only), if any."""
    ledger = Path(paths.data_dir) / "blazar.db"
    if not ledger.exists():
        return None  # no daemon ever ran here: nothing certified (and no runtime to import)
    from actors.certificates import read_certificate

    cert = read_certificate(ledger, model)
    if cert is None:
        return None
    return {"engine": cert.engine, "created_at": cert.created_at, "capabilities": cert.summary()}


def _show_files(store: Store, record: ModelRecord, *, json_: bool) -> None:
    """``blazar show`` of a multi-file model: its facts from the manifest, its files."""
    from registry.kinds import describe

    facts, weights, files = record.speech, record.facts, record.files
    doc: dict[str, Any] = {
        "name": record.name,
        "kind": record.kind,
        "format": record.format,
        "architecture": facts.architecture if facts else weights.architecture if weights else None,
        "language": facts.language if facts else None,
        "sample_rate": facts.sample_rate if facts else None,
        "quality": facts.quality if facts else None,
        "speakers": facts.speakers if facts else None,
        "files": len(record.files),
        "size": record.size,
        "path": str(store.materialize(record)),
    }
    if weights is not None:
        doc |= {k: getattr(weights, k) for k in ("quantization", "parameters", "dtype", "container",
                "context_length", "kv_bytes_per_token", "weights_bytes", "hparams")}  # fmt: skip
    if json_:
        print_json({"model": record, "facts": doc})
        return
    rows = [
        ("name", record.name),
        ("kind", f"{record.kind} ({describe(record.kind)})"),
        ("architecture", doc["architecture"] or "-"),
        ("format", record.format),
        *_weight_rows(record),
        *([("language", doc["language"] or "-")] if facts else []),
        *([("sample rate", f"{doc['sample_rate']} Hz" if doc["sample_rate"] else "-")] if facts else []),
        *([("quality", str(doc["quality"]))] if doc["quality"] else []),
        *([("speakers", str(doc["speakers"]))] if doc["speakers"] else []),
        ("files", f"{len(record.files)}: " + ", ".join(f"{f.name} {human_size(f.size)}" for f in files)),
        ("size", human_size(record.size)),
        ("digest", record.digest),
        ("source", record.source),
        ("path", doc["path"]),
    ]  # fmt: skip
    table = Table(box=None, show_header=False)
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    out.print(table)


def _weight_rows(record: ModelRecord) -> list[tuple[str, str]]:
    """``blazar show`` rows of what a directory's, checkpoint's or ggml file's headers say."""
    w = record.facts
    if w is None:
        return []
    rows = [("quantization", w.quantization or (f"none ({w.dtype})" if w.dtype else "-"))]
    if w.parameters:
        rows.append(("parameters", human_params(w.parameters)))
    if w.context_length:
        rows.append(("context length", str(w.context_length)))
    if w.container:
        rows.append(("container", w.container))
    if w.kv_bytes_per_token:
        rows.append(("KV cache", f"{human_size(w.kv_bytes_per_token)} per token (16-bit)"))
    if w.weights_bytes:
        rows.append(("weights", human_size(w.weights_bytes)))
    rows += [(key.replace("_", " "), str(value)) for key, value in w.hparams.items()]
    return rows


@app.command
def rm(name: str) -> None:
    """Remove a model from the store (its blob goes when no other name uses it).

    Refused while the model is serving requests."""
    paths = resolve_paths()
    record = remove_model(paths, name)
    out.print(f"deleted {record.name}")


@app.command
def cp(source: str, destination: str) -> None:
    """Give a model a second name (no bytes are copied)."""
    from registry.disk import copy_model

    paths = resolve_paths()
    record = copy_model(open_store(paths), source, destination)
    out.print(f"copied {source} to {record.name} (same file, 0 bytes copied)")


@app.command
def mmproj(
    model: str,
    path: Path,
    *,
    link: Annotated[bool, Parameter(negative="", help="Symlink the file instead of copying it.")] = False,
) -> None:
    """Give MODEL a vision projector (an mmproj GGUF): it then reads images.

    A running daemon starts the model's engine again with it at its next request."""
    from registry.imports import attach_projector

    paths = resolve_paths()
    record = attach_projector(open_store(paths), model, path, link=link)
    refresh(paths, record.name)
    out.print(f"{record.name} now reads images with {path.name}", markup=False)
