"""Disk care for the model store: storage, prune."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, human_size, listing, open_store, out, print_json, remove_model
from blazar.config import resolve_paths
from blazar.daemon.client import CliError


@app.command
def storage(*, json_: Json = False) -> None:
    """Disk used by the store: per model, shared files counted once, and free space."""
    from registry.disk import storage_report

    paths = resolve_paths()
    report = storage_report(open_store(paths), Path(paths.cache_dir))
    if json_:
        print_json(report)
        return
    rows = []
    for blob in report.blobs:
        for name in blob.names:
            others = ", ".join(n for n in blob.names if n != name) or "-"
            size = human_size(blob.size) + (" (link)" if blob.linked else "")
            rows.append((name, size, blob.digest.removeprefix("sha256:")[:12], others))
    out.print(
        listing(("NAME", "SIZE", "DIGEST", "SHARED WITH"), rows, wrap=("SHARED WITH",), drop=("DIGEST",))
    )
    partial, orphaned = human_size(report.partial_bytes), human_size(report.orphan_bytes)
    out.print(
        f"\nstore {report.root}: {human_size(report.used_bytes)} in {len(report.blobs)} file(s)"
        f", {partial} in partial downloads, {orphaned} orphaned"
        f"\ndownload cache {paths.cache_dir}: {human_size(report.cache_bytes)}"
        f"\ndisk: {human_size(report.free_bytes)} free of {human_size(report.total_bytes)}"
    )
    if report.orphan_bytes or report.partial_bytes or report.cache_bytes:
        out.print(
            "reclaim with `blazar prune --orphans` (add `--partials` for unfinished downloads,"
            " `--cache` for the download cache)"
        )


@app.command
def prune(
    *,
    orphans: Annotated[bool, Parameter(negative="", help="Files no model uses.")] = False,
    partials: Annotated[bool, Parameter(negative="", help="Unfinished downloads too.")] = False,
    cache: Annotated[bool, Parameter(negative="", help="The download cache (wheels pulls left).")] = False,
    unused: Annotated[float | None, Parameter(help="Remove models unused for this many days.")] = None,
    dry_run: Annotated[bool, Parameter(negative="", help="Say what would go; delete nothing.")] = False,
    json_: Json = False,
) -> None:
    """Reclaim disk: orphaned files, unfinished downloads, the download cache, models unused for DAYS."""
    from actors.ledger import last_used_by_model
    from registry.disk import prune_cache, prune_orphans, unused_models

    if not (orphans or partials or cache or unused is not None):
        raise CliError("say what to prune: --orphans, --partials, --cache and/or --unused DAYS")
    paths = resolve_paths()
    store = open_store(paths)
    removed: list[dict[str, Any]] = []
    if unused is not None:
        last_used = last_used_by_model(Path(paths.data_dir) / "blazar.db")
        for record in unused_models(store, unused, last_used):
            if not dry_run:
                remove_model(paths, record.name)
            removed.append({"kind": "model", "name": record.name, "size": record.size})
    if orphans or partials:
        for orphan in prune_orphans(store, orphans=orphans, partials=partials, dry_run=dry_run):
            removed.append({"kind": orphan.kind, "name": orphan.path, "size": orphan.size})
    if cache:
        for found in prune_cache(Path(paths.cache_dir), dry_run=dry_run):
            removed.append({"kind": found.kind, "name": found.path, "size": found.size})
    if json_:
        print_json({"dry_run": dry_run, "removed": removed})
        return
    verb = "would remove" if dry_run else "removed"
    for item in removed:
        out.print(f"{verb} {item['kind']} {item['name']} ({human_size(item['size'])})")
    total = sum(item["size"] for item in removed)
    out.print(f"{verb} {len(removed)} item(s), {human_size(total)}")
