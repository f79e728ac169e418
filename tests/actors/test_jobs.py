"""The jobs actor on a real ledger file: queueing, running, cancelling, resuming."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from actors.errors import JobNotFound, JobNotRunnable
from actors.jobs import JobContext, JobOutcome, JobsActor, read_events, read_job, read_jobs
from actors.ledger import LedgerActor, Write


@asynccontextmanager
async def open_jobs(tmp_path: Path, **kwargs: object) -> AsyncIterator[JobsActor]:
    async with trio.open_nursery() as nursery:
        ledger = LedgerActor(tmp_path / "blazar.db")
        await nursery.start(ledger.run)
        jobs = JobsActor(ledger, data_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
        await nursery.start(jobs.run)
        yield jobs
        nursery.cancel_scope.cancel()


async def wait_state(jobs: JobsActor, job_id: str, state: str) -> None:
    # the ledger file is the truth a client reads: poll it as a client would
    while (job := read_job(jobs.path, job_id)) is None or job.state != state:  # noqa: ASYNC110
        await trio.sleep(0.01)


async def echo(ctx: JobContext) -> JobOutcome:
    await ctx.event("step", {"n": 1})
    await ctx.progress({"done": 1})
    return JobOutcome(result=ctx.job.request.upper())


async def test_a_job_runs_and_its_end_is_recorded(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with open_jobs(tmp_path) as jobs:
            job = await jobs.submit("echo", b"hi", model="m")
            assert read_job(jobs.path, job.id) is not None  # committed before submit returned
            jobs.register("echo", echo)
            await wait_state(jobs, job.id, "completed")
            done = read_job(jobs.path, job.id)
            assert done is not None and done.result == b"HI" and done.attempts == 1
            assert done.progress == {"done": 1}
            await trio.sleep(0.1)  # events commit with the ledger's next batch
            assert [(e.seq, e.kind, e.data) for e in read_events(jobs.path, job.id)] == [
                (0, "step", {"n": 1})
            ]
            assert [j.id for j in read_jobs(jobs.path, state="completed")] == [job.id]


async def test_at_most_max_running_at_once(tmp_path: Path) -> None:
    running, peak = 0, 0
    release = trio.Event()

    async def slow(ctx: JobContext) -> JobOutcome:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return JobOutcome()

    with trio.fail_after(10):
        async with open_jobs(tmp_path, max_running=2) as jobs:
            jobs.register("slow", slow)
            ids = [(await jobs.submit("slow", b"")).id for _ in range(5)]
            while running < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
            await trio.sleep(0.05)
            assert peak == 2 and jobs.statistics().queued_jobs == 3
            release.set()
            for job_id in ids:
                await wait_state(jobs, job_id, "completed")
            assert peak == 2


async def test_cancel_queued_running_and_finished(tmp_path: Path) -> None:
    started = trio.Event()
    cleaned = []

    async def forever(ctx: JobContext) -> JobOutcome:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cleaned.append(ctx.cancel_requested)
        return JobOutcome()

    with trio.fail_after(10):
        async with open_jobs(tmp_path, max_running=1) as jobs:
            jobs.register("forever", forever)
            first = await jobs.submit("forever", b"")
            second = await jobs.submit("forever", b"")
            await started.wait()
            assert (await jobs.cancel(second.id)).state == "cancelled"  # never started
            ended = await jobs.cancel(first.id)  # returns once the runner has stopped
            assert ended.state == "cancelled" and cleaned == [True]
            assert read_job(jobs.path, first.id).state == "cancelled"  # type: ignore[union-attr]
            with pytest.raises(JobNotRunnable, match="already ended"):
                await jobs.cancel(first.id)
            with pytest.raises(JobNotFound):
                await jobs.cancel("job_nope")


async def test_a_runner_that_raises_fails_its_job(tmp_path: Path) -> None:
    async def broken(ctx: JobContext) -> JobOutcome:
        raise ValueError("bad input")

    with trio.fail_after(10):
        async with open_jobs(tmp_path) as jobs:
            jobs.register("broken", broken)
            job = await jobs.submit("broken", b"")
            await wait_state(jobs, job.id, "failed")
            assert read_job(jobs.path, job.id).error == "ValueError: bad input"  # type: ignore[union-attr]


async def test_a_job_cut_by_a_stop_resumes_on_the_next_start(tmp_path: Path) -> None:
    started = trio.Event()

    async def hang(ctx: JobContext) -> JobOutcome:
        started.set()
        await trio.sleep_forever()
        return JobOutcome()

    with trio.fail_after(10):
        async with open_jobs(tmp_path) as jobs:
            jobs.register("work", hang)
            job = await jobs.submit("work", b"x")
            await started.wait()
        # stopped mid-run: the ledger still says running, as after a crash
        assert read_job(tmp_path / "blazar.db", job.id).state == "running"  # type: ignore[union-attr]
        async with open_jobs(tmp_path) as jobs:
            assert jobs.statistics().queued_jobs == 1 and jobs.statistics().recovered == 1
            jobs.register("work", echo)
            await wait_state(jobs, job.id, "completed")
            done = read_job(jobs.path, job.id)
            assert done is not None and done.attempts == 2 and done.result == b"X"


async def test_a_large_result_spills_to_a_file(tmp_path: Path) -> None:
    async def big(ctx: JobContext) -> JobOutcome:
        return JobOutcome(result=b"x" * 5000)

    with trio.fail_after(10):
        async with open_jobs(tmp_path, spill_bytes=1000) as jobs:
            jobs.register("big", big)
            job = await jobs.submit("big", b"")
            await wait_state(jobs, job.id, "completed")
            done = read_job(jobs.path, job.id)
            assert done is not None and done.result is None and done.artifact is not None
            assert await trio.Path(done.artifact).read_bytes() == b"x" * 5000


async def test_old_finished_jobs_are_pruned_with_their_files(tmp_path: Path) -> None:
    async def big(ctx: JobContext) -> JobOutcome:
        return JobOutcome(result=b"x" * 50)

    with trio.fail_after(10):
        async with open_jobs(tmp_path, spill_bytes=10) as jobs:
            jobs.register("big", big)
            job = await jobs.submit("big", b"")
            await wait_state(jobs, job.id, "completed")
            artifact = trio.Path(read_job(jobs.path, job.id).artifact)  # type: ignore[arg-type, union-attr]
            old = time.time() - 30 * 86400
            await jobs.ledger.ask(
                Write(statements=(("UPDATE jobs SET updated_at = ? WHERE id = ?", (old, job.id)),))
            )
        async with open_jobs(tmp_path, keep_s=86400.0) as jobs:
            assert read_job(jobs.path, job.id) is None
            assert not await artifact.exists()


async def test_a_jobs_first_events_are_logged_with_it_and_kept_when_it_starts_over(tmp_path: Path) -> None:
    """Events given at submit are in the log before the job runs (a follower sees them while it
    waits), and a runner that starts over (after a stop) keeps them and logs after them."""
    started = trio.Event()

    async def hang(ctx: JobContext) -> JobOutcome:
        await ctx.restart_events(keep=1)
        await ctx.event("step", {"try": 1})
        started.set()
        await trio.sleep_forever()
        return JobOutcome()

    async def again(ctx: JobContext) -> JobOutcome:
        await ctx.restart_events(keep=1)
        await ctx.event("step", {"try": 2})
        return JobOutcome()

    with trio.fail_after(10):
        async with open_jobs(tmp_path) as jobs:
            job = await jobs.submit("work", b"x", events=(("opened", {"n": 0}),))
            assert [(e.seq, e.kind) for e in read_events(jobs.path, job.id)] == [(0, "opened")]
            jobs.register("work", hang)
            await started.wait()
            await trio.sleep(0.1)  # events commit with the ledger's next batch
        assert [e.data for e in read_events(tmp_path / "blazar.db", job.id)] == [{"n": 0}, {"try": 1}]
        async with open_jobs(tmp_path) as jobs:
            jobs.register("work", again)
            await wait_state(jobs, job.id, "completed")
            await trio.sleep(0.1)
            assert [(e.seq, e.data) for e in read_events(jobs.path, job.id)] == [
                (0, {"n": 0}),
                (1, {"try": 2}),
            ]
