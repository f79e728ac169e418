"""``blazar snapshot`` and ``blazar restore-snapshot`` (``blazar/ops/snapshot.py`` does the work)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import err, human_size, open_store, out
from blazar.config import resolve_paths
from blazar.daemon.client import CliError, find_daemon

__all__ = ["restore_snapshot", "snapshot"]


@app.command
def snapshot(
    *,
    out_: Annotated[
        Path | None,
        Parameter(name="--out", help="The archive to write (default: ./blazar-snapshot-DATE.tar.gz)."),
    ] = None,
) -> None:
    """Write the config, model manifests, keys and the ledger (stored responses, jobs, batches,
    files) to one tar.gz, consistent while the daemon runs. Model weights are not in it."""
    from blazar.ops.snapshot import SnapshotError, make_snapshot

    paths = resolve_paths()
    target = out_ or Path(f"blazar-snapshot-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz")
    try:
        info = make_snapshot(paths, target)
    except (SnapshotError, OSError) as exc:
        raise CliError(f"cannot write the snapshot: {exc}") from None
    size = human_size(target.stat().st_size)
    databases = ", ".join(info.databases) or "no databases"
    out.print(
        f"wrote {target} ({size}): {len(info.models)} model manifests, {databases}"
        + (", config.toml" if info.config else "")
        + (f", {info.jobs} job files" if info.jobs else "")
    )


@app.command(name="restore-snapshot")
def restore_snapshot(
    file: Path,
    *,
    force: Annotated[bool, Parameter(negative="", help="Overwrite a home that is in use.")] = False,
    no_pull: Annotated[
        bool, Parameter(negative="", help="Do not download models whose files are not on disk.")
    ] = False,
) -> None:
    """Bring a snapshot back into this home (BLAZAR_HOME): refused over a non-empty home unless
    --force. Models reuse their files when still on disk (hash-checked), else are pulled again."""
    import trio

    from blazar.ops.snapshot import ModelOutcome, SnapshotError
    from blazar.ops.snapshot import restore_snapshot as do_restore
    from registry.catalog import Catalog
    from registry.pull import pull as do_pull

    paths = resolve_paths()
    if find_daemon(paths) is not None:
        raise CliError("a daemon runs on this home: stop it (`blazar stop`) before restoring a snapshot")
    store = open_store(paths)

    def pull(name: str) -> None:
        err.print(f"pulling {name} …")
        trio.run(lambda: do_pull(store, name, catalog=Catalog.load(), cache_dir=Path(paths.cache_dir)))

    def report(outcome: ModelOutcome) -> None:
        line = f"{outcome.name}: {outcome.how}" + (f" ({outcome.detail})" if outcome.detail else "")
        (err if outcome.how == "failed" else out).print(line)

    try:
        info, outcomes = do_restore(paths, file, force=force, pull=None if no_pull else pull, on_model=report)
    except SnapshotError as exc:
        raise CliError(str(exc)) from None
    failed = [o.name for o in outcomes if o.how == "failed"]
    out.print(
        f"restored {file} (made {time.strftime('%Y-%m-%d %H:%M', time.localtime(info.created_at))}) into "
        f"{paths.data_dir}: {', '.join(info.databases) or 'no databases'}, {len(outcomes) - len(failed)} of "
        f"{len(outcomes)} models"
    )
    if failed:
        raise CliError(f"models not restored: {', '.join(failed)} — pull them with `blazar pull NAME`")
