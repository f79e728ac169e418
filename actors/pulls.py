"""Pulls started from the daemon are jobs: listed, followed and cancelled like any other.

The job downloads with ``registry.pull`` and logs its progress as events (at most a
few per second, and every change of status); ``/api/pull`` follows those events and
renders them as Ollama's NDJSON lines. A pull cut by a crash runs again on the next
start, and the download resumes where the partial file stopped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import trio

from actors.jobs import JobContext, JobOutcome, read_job
from actors.runtime import Runtime
from blazar.dialects import ollama, ollama_models
from blazar.error_reply import describe_error
from blazar.errors import Dialect
from registry.pull import PullProgress, pull

__all__ = ["KIND", "lines", "register_runner"]

KIND = "pull"
EVERY_S = 0.25
"""Least time between two progress events of one status (a download reports far more often)."""


def register_runner(runtime: Runtime) -> None:
    async def run(ctx: JobContext) -> JobOutcome:
        return await _run(runtime, ctx)

    runtime.jobs.register(KIND, run)


async def _run(runtime: Runtime, ctx: JobContext) -> JobOutcome:
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
        message = f"the pull could not write to the model store: {exc.strerror or exc}"
        await ctx.event("error", {"code": "INSUFFICIENT_STORAGE", "message": message})
        return JobOutcome(state="failed", error=message)
    except Exception as exc:
        described = describe_error(exc, Dialect.OLLAMA)
        if described is None:
            raise
        await ctx.event("error", {"code": described.code, "message": described.message})
        return JobOutcome(state="failed", error=described.message)
    await runtime.forget(record.name)  # the pull's own progress already said "success"
    return JobOutcome(result=record.name.encode())


async def lines(runtime: Runtime, job_id: str) -> AsyncIterator[bytes]:
    """The pull's events as Ollama's NDJSON progress lines, until it has ended."""
    ended = False
    async for event in runtime.jobs.follow(job_id):
        ended = ended or event.kind == "error" or event.data.get("status") == "success"
        if event.kind == "error":
            yield ollama.encode_error(event.data["code"], event.data["message"])
        elif event.kind == "progress":
            p = event.data
            yield ollama_models.encode_pull_progress(
                ollama_models.pull_status(p["status"], p.get("digest")),
                digest=p.get("digest"),
                total=p.get("total"),
                completed=p.get("completed"),
            )
    if not ended:
        job = await trio.to_thread.run_sync(read_job, runtime.jobs.path, job_id)
        state = job.state if job is not None else "gone"
        message = f"the pull was {state} before it finished — pull again to resume it"
        yield ollama.encode_error("UNAVAILABLE", message)
