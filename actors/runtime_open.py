"""``open_runtime``: start the actor tree of ``actors.runtime`` and hand over its ``Runtime``.

The tree (``actors.runtime`` draws it) starts in this order: the ledger, the jobs, admission,
the engines' supervisor, then lifecycle, MCP, the pools and peers where configured, and
the multi-node parts; it stops in the reverse order, so no idle unload races the shutdown
and the ledger writes what is still queued. Before it, what writes cut short left under the
data dir is swept and orphaned engine children of a killed daemon are reaped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import trio

from actors import pulls
from actors.admission import AdmissionActor
from actors.config import RuntimeConfig
from actors.jobs import JobsActor
from actors.ledger import LedgerActor
from actors.process import reap_orphans
from actors.profiles import read_profiles
from actors.runtime import Runtime
from actors.supervisor import ChildSpec, Supervisor
from registry.catalog import Catalog
from registry.files import remove_stale_temps
from registry.store import Store

__all__ = ["STALE_MODEL_TEMP_S", "open_runtime", "sweep_temps"]

log = logging.getLogger("blazar.runtime")

STALE_MODEL_TEMP_S = 3600.0
"""A temp file in the model store is swept at start only once this old: a CLI command
(``blazar import`` copying a file) may be writing it beside a starting daemon."""


def sweep_temps(home: Path) -> None:
    """Remove what writes cut short left under the data dir (a crash mid-write, or an unlink
    a full copy-on-write filesystem refused): the files and jobs folders, which only the
    daemon writes, wholly; the model store's, once old."""
    swept = remove_stale_temps(home / "files") + remove_stale_temps(home / "jobs")
    swept += remove_stale_temps(home / "models", min_age_s=STALE_MODEL_TEMP_S)
    if swept:
        log.warning("removed %d temp file(s) left by writes cut short (a crash, or a full disk)", len(swept))


@asynccontextmanager
async def open_runtime(config: RuntimeConfig) -> AsyncIterator[Runtime]:
    def prepare() -> tuple[list[int], Store, Catalog]:
        run_dir = Path(config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        sweep_temps(Path(config.home))
        return reap_orphans(run_dir), Store(Path(config.models_dir)), Catalog.load()

    reaped, store, catalog = await trio.to_thread.run_sync(prepare)
    if config.failover:
        models = {r.name for r in await trio.to_thread.run_sync(store.list)}
        for chain in config.failover:
            if chain.name in models:
                log.warning(
                    "failover chain '%s' has the name of an installed model: requests for '%s' go to "
                    "the chain (rename one of them to reach the model itself)",
                    chain.name,
                    chain.name,
                )
    # The tree of DESIGN §3. Children stop in reverse start order: lifecycle first (no
    # idle unload races the shutdown), then engines, then the ledger, which writes what
    # is still queued.
    async with trio.open_nursery() as nursery:
        root: Supervisor = await nursery.start(Supervisor("runtime").run)
        ledger = LedgerActor(Path(config.home) / "blazar.db", keep_records=config.ledger_keep_requests)
        await root.start_child(ChildSpec(name="ledger", start=ledger.run))
        stored = await trio.to_thread.run_sync(read_profiles, ledger.path)
        if stored:  # the embedder's own profiles win over the stored ones
            config = msgspec.structs.replace(config, profiles={**stored, **config.profiles})
        jobs = JobsActor(
            ledger,
            data_dir=Path(config.home),
            max_running=config.jobs_max_running,
            keep_s=config.jobs_keep_s,
        )
        await root.start_child(ChildSpec(name="jobs", start=jobs.run))
        admission = AdmissionActor(
            max_queue=config.max_queue, queue_timeout_s=config.queue_timeout_s, classes=config.admission
        )
        await root.start_child(ChildSpec(name="admission", start=admission.run))
        engines = Supervisor("engines")
        await root.start_child(ChildSpec(name="engines", start=engines.run))
        runtime = Runtime(
            config,
            store=store,
            catalog=catalog,
            root=root,
            engines=engines,
            ledger=ledger,
            admission=admission,
            jobs=jobs,
        )
        await root.start_child(ChildSpec(name="lifecycle", start=runtime.lifecycle.run))
        pulls.register(runtime)
        # Last started, first stopped: MCP servers end before the engines do.
        await root.start_child(ChildSpec(name="mcp", start=runtime.mcp.run, shutdown_s=15.0))
        if runtime.pools:  # before the peers, which poll the routers it starts
            await root.start_child(
                ChildSpec(name="pools", start=functools.partial(runtime.pools.run, runtime))
            )
        if config.remotes:
            await root.start_child(ChildSpec(name="peers", start=runtime.peers.run))
        await root.start_child(ChildSpec(name="parts", start=runtime.parts.run))
        runtime.reaped_orphans = reaped
        runtime._nursery = nursery
        if config.preload:
            await nursery.start(runtime.preload, list(config.preload))
        else:
            runtime.preloaded.set()
        try:
            yield runtime
        finally:
            nursery.cancel_scope.cancel()
