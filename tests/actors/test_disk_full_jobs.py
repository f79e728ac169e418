"""A full disk under the ledger and the jobs: an answer with ``DISK_FULL``, never a job that
stays ``running`` in silence; what was kept in memory is recorded once the space is back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from actors.errors import LedgerError
from actors.jobs import JobContext, JobOutcome, JobsActor, read_job
from actors.ledger import LedgerActor, Write
from registry.errors import DiskFull
from tests.support import fill_filesystem, small_filesystem


@asynccontextmanager
async def open_jobs(ledger_path: Path, data_dir: Path, **kwargs: object) -> AsyncIterator[JobsActor]:
    async with trio.open_nursery() as nursery:
        ledger = LedgerActor(ledger_path)
        await nursery.start(ledger.run)
        jobs = JobsActor(ledger, data_dir=data_dir, **kwargs)  # type: ignore[arg-type]
        await nursery.start(jobs.run)
        yield jobs
        nursery.cancel_scope.cancel()


async def wait_state(jobs: JobsActor, job_id: str, state: str) -> None:
    while (job := read_job(jobs.path, job_id)) is None or job.state != state:  # noqa: ASYNC110
        await trio.sleep(0.02)


async def test_a_full_ledger_disk_is_a_disk_full_answer_and_the_ledger_goes_on(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "small", "2m") as small, trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            ledger = LedgerActor(small / "blazar.db")
            await nursery.start(ledger.run)
            filler = fill_filesystem(small)
            big = (
                (
                    "INSERT INTO job_events (job_id, seq, kind, data) VALUES (?, ?, ?, ?)",
                    ("j", 0, "k", b"x" * (1 << 20)),
                ),
            )
            try:
                await ledger.ask(Write(statements=big))
            except LedgerError as exc:
                refused = exc
            else:
                raise AssertionError("a 1 MiB write fitted on a full disk")
            assert refused.code == "DISK_FULL"
            assert "blazar.db in the data dir" in refused.message and "free space" in refused.message
            assert str(tmp_path) not in refused.message
            filler.unlink()
            await ledger.ask(Write(statements=big))  # the space is back: the same write holds
            nursery.cancel_scope.cancel()


async def test_a_job_whose_end_cannot_be_written_is_recorded_once_the_space_is_back(tmp_path: Path) -> None:
    async def big(ctx: JobContext) -> JobOutcome:
        return JobOutcome(result=b"r" * (64 * 1024))

    with small_filesystem(tmp_path / "data", "2m") as data, trio.fail_after(60):
        async with open_jobs(tmp_path / "blazar.db", data, spill_bytes=1024) as jobs:
            filler = fill_filesystem(data)
            job = await jobs.submit("big", b"")
            jobs.register("big", big)
            while jobs.statistics().unrecorded == 0:  # noqa: ASYNC110
                await trio.sleep(0.02)
            stalled = jobs.stalled(job.id)
            assert stalled is not None and "the disk is full: the job's result (64.0 KiB)" in stalled
            assert "jobs/ in the data dir" in stalled and str(data) not in stalled
            assert not list(data.rglob("*.tmp"))
            filler.unlink()
            await wait_state(jobs, job.id, "completed")
            done = read_job(jobs.path, job.id)
            assert done is not None and done.artifact is not None
            assert await trio.Path(done.artifact).read_bytes() == b"r" * (64 * 1024)
            assert jobs.stalled(job.id) is None and jobs.statistics().unrecorded == 0


async def test_a_runner_that_finds_the_disk_full_fails_its_job_with_what_to_do(tmp_path: Path) -> None:
    async def writes(ctx: JobContext) -> JobOutcome:
        raise DiskFull("the job's output", where="out/ in the data dir", needed_bytes=2048)

    with trio.fail_after(10):
        async with open_jobs(tmp_path / "blazar.db", tmp_path) as jobs:
            jobs.register("writes", writes)
            job = await jobs.submit("writes", b"")
            await wait_state(jobs, job.id, "failed")
            done = read_job(jobs.path, job.id)
            assert done is not None and done.error == (
                "the disk is full: the job's output (2.0 KiB) could not be written to out/ in the data "
                "dir — free space on the disk holding the data dir, then retry"
            )
