"""Pulls are jobs: listed, followed and cancelled like any other, with or without the gateway.

``open_runtime`` registers the runner of the ``pull`` kind, so a program that embeds the
runtime pulls as the daemon does:

    job = await rt.pull("smollm2-135m")          # committed and queued; runs on the jobs actor
    async for event in rt.jobs.follow(job.id):   # until the job has ended
        print(event.kind, event.data)            # "progress" (a PullProgress) or one "error"

The job downloads with ``registry.pull`` and logs its progress as events (at most a
few per second, and every change of status): ``progress`` events carry a
``registry.pull.PullProgress`` as a dict, the last one of a pull that worked has the
status ``success``, and its result is the model's name; a pull that fails logs one
``error`` event (``code``, ``message``) and ends ``failed``. The gateway's ``/api/pull``
follows those events and renders them as Ollama's NDJSON lines. A pull cut by a crash runs
again on the next start, and the download resumes where the partial file stopped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from actors.errors import BlazarRuntimeError
from actors.jobs import JobContext, JobOutcome
from registry.errors import DiskFull, RegistryError, is_disk_full

if TYPE_CHECKING:
    from actors.runtime import Runtime
    from registry.pull import PullProgress

__all__ = ["EVERY_S", "KIND", "register", "run_pull"]

KIND = "pull"
EVERY_S = 0.25
"""Least time between two progress events of one status (a download reports far more often)."""


def register(runtime: Runtime) -> None:
    """Have ``runtime``'s jobs actor run pull jobs (``open_runtime`` does it)."""

    async def run(ctx: JobContext) -> JobOutcome:
        return await run_pull(runtime, ctx)

    runtime.jobs.register(KIND, run)


async def run_pull(runtime: Runtime, ctx: JobContext) -> JobOutcome:
    """Pull the model the job names into ``runtime``'s store, logging its progress."""
    # Here, not at the top: the downloader (and the hub clients it brings) is not on the way
    # to a daemon's first engine, which imports this module to register the runner.
    from registry.pull import pull

    name = ctx.job.request.decode()
    await ctx.restart_events()
    last: dict[str, Any] = {"status": None, "at": 0.0}

    def progress(p: PullProgress) -> None:
        now = time.monotonic()
        if p.status == last["status"] and now - last["at"] < EVERY_S:
            return
        last.update(status=p.status, at=now)
        ctx.event_nowait("progress", msgspec.to_builtins(p))

    try:
        record = await pull(
            runtime.store,
            name,
            catalog=runtime.catalog,
            cache_dir=Path(runtime.config.cache_dir),
            on_progress=progress,
        )
    except OSError as exc:  # a full or unwritable disk
        if is_disk_full(exc):
            code, message = "DISK_FULL", DiskFull("the pull", where="models/ in the data dir").message
        else:
            code = "INSUFFICIENT_STORAGE"
            message = f"the pull could not write to the model store: {exc.strerror or exc}"
        await ctx.event("error", {"code": code, "message": message})
        return JobOutcome(state="failed", error=message)
    except (RegistryError, BlazarRuntimeError) as exc:  # anything else is a bug: the job says so
        await ctx.event("error", {"code": exc.code, "message": exc.message})
        return JobOutcome(state="failed", error=exc.message)
    # A pull that changed nothing leaves a running engine alone (clients that pull before each
    # run, as Codex does, keep its warm cache); one that changed the files restarts it once
    # the requests on it have finished. The pull's own progress already said "success".
    await runtime.refresh(record)
    return JobOutcome(result=record.name.encode())
