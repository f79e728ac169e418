"""The jobs actor: the one owner of long work (background responses, batches, …).

A job is a row in the ledger before it is acknowledged, so nothing a client was
told about is lost. The actor queues jobs, runs at most ``max_running`` of them
at once, each in its own task and cancel scope, and records how each ended.
What a job does is its kind's *runner*, registered by the layer that knows how
(the gateway registers the response and batch runners): the runtime stays free
of HTTP, and a job whose runner is not registered yet simply waits.

Crash safety: on start, every job left ``queued`` or ``running`` by a crash is
queued again (``attempts`` counts the tries), so a runner must be safe to run
again from the start — generation has no side effects, and a batch runner skips
the items it already recorded.

A full disk never leaves a job running in silence. A runner that hits it ends the
job ``failed`` with the ``DISK_FULL`` message, unless it waits for the space itself
(the batch runner does, and says so with ``JobContext.stall``). A job whose start or
end cannot be recorded (the ledger's disk is full, or broken) is kept in memory and
recorded again with a backoff until it is: ``stalled`` says why meanwhile, and the
daemon's log says it once.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.errors import BlazarRuntimeError, JobNotFound, JobNotRunnable
from actors.ledger import LedgerActor, Write, read_rows
from actors.mailbox import Envelope
from registry.errors import DiskFull, RegistryError, disk_full_as, find_disk_full
from registry.files import atomic_write, shown_folder

log = logging.getLogger(__name__)

__all__ = [
    "FINISHED",
    "JobContext",
    "JobEvent",
    "JobOutcome",
    "JobRecord",
    "JobState",
    "JobsActor",
    "JobsStatistics",
    "Runner",
    "read_events",
    "read_job",
    "read_jobs",
]

JobState = Literal["queued", "running", "completed", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
RECORD_RETRY_FIRST_S = 1.0
RECORD_RETRY_MAX_S = 30.0
"""The backoff between tries to record a job's start or end that the ledger refused."""


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    state: JobState
    model: str | None
    request: bytes
    """What the runner needs to run the job (its kind's own encoding)."""
    result: bytes | None = None
    """A small result inline; a large one lives in ``artifact`` (a file under the data dir)."""
    artifact: str | None = None
    error: str | None = None
    progress: dict[str, Any] = {}
    attempts: int = 0
    created_at: float
    updated_at: float


class JobEvent(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    kind: str
    data: dict[str, Any]


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a runner says its job ended (a runner that raises ends it ``failed``)."""

    state: Literal["completed", "failed", "cancelled"] = "completed"
    result: bytes | None = None
    error: str | None = None


_INSERT_EVENT = "INSERT INTO job_events (job_id, seq, kind, data) VALUES (?, ?, ?, ?)"


class JobContext:
    """What a runner gets: its job, and ways to report on it."""

    def __init__(self, actor: JobsActor, job: JobRecord, first_seq: int) -> None:
        self.job = job
        self._actor = actor
        self._seq = first_seq
        self.changed = trio.Event()
        """Set (and replaced) whenever the job reports something: followers wait on it."""

    @property
    def cancel_requested(self) -> bool:
        """A client cancelled the job (not the daemon stopping, which leaves it to resume)."""
        return self.job.id in self._actor._cancels

    def stall(self, why: str | None) -> None:
        """Say why the job is not moving now (a full disk it waits on), or None once it moves
        again: ``JobsActor.stalled`` shows it, and followers are woken. Kept in memory, so it
        is shown even when the ledger cannot be written."""
        if why is None:
            self._actor._stalls.pop(self.job.id, None)
        else:
            self._actor._stalls[self.job.id] = why
        self._wake()

    async def event(self, kind: str, data: dict[str, Any]) -> int:
        """Append an event to the job's log (committed with the ledger's next batch)."""
        seq = self._seq
        self._seq += 1
        await self._actor.ledger.tell(
            Write(
                statements=(
                    (
                        _INSERT_EVENT,
                        (self.job.id, seq, kind, msgspec.json.encode(data)),
                    ),
                )
            )
        )
        self._wake()
        return seq

    async def restart_events(self, *, keep: int = 0) -> None:
        """Drop what an earlier try of this job logged: a runner that starts over logs anew,
        after the first ``keep`` events (those the job was submitted with, where it has them)."""
        await self._actor.ledger.ask(
            Write(statements=(("DELETE FROM job_events WHERE job_id = ? AND seq >= ?", (self.job.id, keep)),))
        )
        self._seq = await trio.to_thread.run_sync(_next_seq, self._actor.path, self.job.id)

    async def progress(self, progress: dict[str, Any]) -> None:
        """Record the job's progress (committed before this returns)."""
        await self._actor.ledger.ask(
            Write(
                statements=(
                    (
                        "UPDATE jobs SET progress = ?, updated_at = ? WHERE id = ?",
                        (msgspec.json.encode(progress), time.time(), self.job.id),
                    ),
                )
            )
        )
        self._wake()

    def event_nowait(self, kind: str, data: dict[str, Any]) -> bool:
        """``event`` without waiting (from a synchronous callback); False when the ledger's
        mailbox is full and the event was dropped."""
        try:
            self._actor.ledger.tell_nowait(
                Write(
                    statements=(
                        (
                            _INSERT_EVENT,
                            (self.job.id, self._seq, kind, msgspec.json.encode(data)),
                        ),
                    )
                )
            )
        except trio.WouldBlock:
            return False
        self._seq += 1
        self._wake()
        return True

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


Runner = Callable[[JobContext], Awaitable[JobOutcome]]


# -- messages -----------------------------------------------------------------


class Submit(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str
    request: bytes
    model: str | None = None
    job_id: str | None = None
    statements: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """Committed in the job's own transaction: what the job works on, stored with it."""
    events: tuple[tuple[str, dict[str, Any]], ...] = ()
    """The job's first events (kind, data), logged with it: a follower sees them while it waits."""


class Cancel(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job_id: str


class Register(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    kind: str


class _Ended(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    job_id: str
    outcome: JobOutcome


JobsMessage = Submit | Cancel | Register | _Ended


class JobsStatistics(ActorStatistics, frozen=True, kw_only=True):
    queued_jobs: int
    running_jobs: int
    finished: int
    recovered: int
    kinds: list[str]
    unrecorded: int = 0
    """Jobs that ended but whose end the ledger has not taken yet (retried with a backoff)."""


_COLUMNS = (
    "id, kind, state, model, request, result, artifact, error, progress, attempts, created_at, updated_at"
)


def _record(row: tuple[Any, ...]) -> JobRecord:
    return JobRecord(
        id=row[0],
        kind=row[1],
        state=row[2],
        model=row[3],
        request=bytes(row[4]),
        result=bytes(row[5]) if row[5] is not None else None,
        artifact=row[6],
        error=row[7],
        progress=msgspec.json.decode(row[8]) if row[8] else {},
        attempts=row[9],
        created_at=row[10],
        updated_at=row[11],
    )


def read_job(path: Path, job_id: str) -> JobRecord | None:
    rows = read_rows(path, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
    return _record(rows[0]) if rows else None


def read_jobs(
    path: Path,
    *,
    state: str | None = None,
    kind: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> list[JobRecord]:
    """Jobs newest first (``after``: the page after that job's id)."""
    where, params = [], []
    if state is not None:
        where.append("state = ?")
        params.append(state)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    if after is not None:
        where.append("rowid < (SELECT rowid FROM jobs WHERE id = ?)")
        params.append(after)
    sql = f"SELECT {_COLUMNS} FROM jobs"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY rowid DESC LIMIT ?"
    params.append(str(limit))
    return [_record(r) for r in read_rows(path, sql, params)]


def read_events(path: Path, job_id: str, *, after: int = -1, limit: int = 1000) -> list[JobEvent]:
    rows = read_rows(
        path,
        "SELECT seq, kind, data FROM job_events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (job_id, after, limit),
    )
    return [JobEvent(seq=r[0], kind=r[1], data=msgspec.json.decode(r[2])) for r in rows]


def _running(job: JobRecord) -> tuple[str, tuple[Any, ...]]:
    return (
        "UPDATE jobs SET state = 'running', attempts = ?, updated_at = ? WHERE id = ?",
        (job.attempts, job.updated_at, job.id),
    )


def _insert(job: JobRecord) -> tuple[str, tuple[Any, ...]]:
    return (
        f"INSERT INTO jobs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            job.id,
            job.kind,
            job.state,
            job.model,
            job.request,
            job.result,
            job.artifact,
            job.error,
            msgspec.json.encode(job.progress),
            job.attempts,
            job.created_at,
            job.updated_at,
        ),
    )


class JobsActor(Actor[JobsMessage]):
    """Owner of every job. Start it with ``nursery.start(jobs.run)`` after the ledger."""

    def __init__(
        self,
        ledger: LedgerActor,
        *,
        data_dir: Path,
        max_running: int = 2,
        keep_s: float = 7 * 86400,
        spill_bytes: int = 1 << 20,
    ) -> None:
        super().__init__("jobs")
        self.ledger = ledger
        self.data_dir = Path(data_dir)
        self.max_running = max_running
        self.keep_s = keep_s
        """Finished jobs older than this are pruned, with their files."""
        self.spill_bytes = spill_bytes
        """Results larger than this go to a file under ``data_dir/jobs/<id>/``."""
        self._runners: dict[str, Runner] = {}
        self._queue: deque[JobRecord] = deque()
        self._active: dict[str, tuple[JobContext, trio.CancelScope]] = {}
        self._cancels: dict[str, list[Envelope[JobsMessage]]] = {}
        self._finished = 0
        self._recovered = 0
        self._prune_at = 0.0
        self._stalls: dict[str, str] = {}
        # Ended jobs whose end the ledger refused: (job, outcome, next try's delay, when).
        self._unrecorded: dict[str, tuple[JobRecord, JobOutcome, float, float]] = {}
        # After a refused start: no job starts before this trio time, and the next delay.
        self._hold_until = 0.0
        self._hold_s = 0.0

    def __repr__(self) -> str:
        return f"<JobsActor queued={len(self._queue)} running={len(self._active)}>"

    # -- the API ----------------------------------------------------------------

    def register(self, kind: str, runner: Runner) -> None:
        """Name the runner of ``kind``; queued jobs of that kind start once it is known."""
        self._runners[kind] = runner
        self.tell_nowait(Register(kind=kind))

    async def submit(
        self,
        kind: str,
        request: bytes,
        *,
        model: str | None = None,
        job_id: str | None = None,
        statements: tuple[tuple[str, tuple[Any, ...]], ...] = (),
        events: tuple[tuple[str, dict[str, Any]], ...] = (),
    ) -> JobRecord:
        """Queue a job; it is committed to the ledger when this returns, together with
        ``statements`` (the rows it works on), so neither exists without the other, and with
        ``events``, its log's first entries (numbered from 0), which a runner that starts over
        keeps (``restart_events(keep=…)``)."""
        job: JobRecord = await self.ask(
            Submit(
                kind=kind, request=request, model=model, job_id=job_id, statements=statements, events=events
            )
        )
        return job

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job and return it once it has ended (``JobNotFound``, or
        ``JobNotRunnable`` for a job that had already ended)."""
        job: JobRecord = await self.ask(Cancel(job_id=job_id))
        return job

    async def follow(self, job_id: str, *, after: int = -1, poll_s: float = 0.25) -> AsyncIterator[JobEvent]:
        """The job's events from ``after`` on, as they are committed, until the job has ended.
        Woken by the running job, and reading the ledger at least every ``poll_s``."""
        path = self.path
        while True:
            live = self.live(job_id)
            changed = live.changed if live is not None else None
            events = await trio.to_thread.run_sync(_events_after, path, job_id, after)
            for event in events:
                yield event
                after = event.seq
            if not events:
                job = await trio.to_thread.run_sync(read_job, path, job_id)
                if job is None or job.state in FINISHED:
                    # one more read: what the job logged just before it ended
                    for event in await trio.to_thread.run_sync(_events_after, path, job_id, after):
                        yield event
                    return
            with trio.move_on_after(poll_s):
                if changed is not None:
                    await changed.wait()
                else:
                    await trio.sleep_forever()

    def live(self, job_id: str) -> JobContext | None:
        """The context of a running job (followers wait on its ``changed``)."""
        entry = self._active.get(job_id)
        return entry[0] if entry is not None else None

    def stalled(self, job_id: str) -> str | None:
        """Why the job is not moving now (its runner waits on a full disk, or its start or end
        waits to be recorded), or None."""
        return self._stalls.get(job_id)

    @property
    def path(self) -> Path:
        return self.ledger.path

    def statistics(self) -> JobsStatistics:
        return JobsStatistics(
            **self.actor_fields(),
            queued_jobs=len(self._queue),
            running_jobs=len(self._active),
            finished=self._finished,
            recovered=self._recovered,
            kinds=sorted(self._runners),
            unrecorded=len(self._unrecorded),
        )

    # -- the loop's hooks -------------------------------------------------------

    async def on_start(self) -> None:
        # What a crash left queued or running goes back to the queue, in order.
        rows = await trio.to_thread.run_sync(
            read_rows,
            self.path,
            f"SELECT {_COLUMNS} FROM jobs WHERE state IN ('queued', 'running') ORDER BY rowid",
            (),
        )
        for job in map(_record, rows):
            if job.state == "running":
                self._recovered += 1
            self._queue.append(msgspec.structs.replace(job, state="queued"))
        await self._prune()

    def dispatch(self, env: Envelope[JobsMessage]) -> Awaitable[None] | None:
        match env.message:
            case Submit() as submit:
                return self._submit(env, submit)
            case Cancel(job_id=job_id):
                return self._cancel(env, job_id)
            case Register():
                env.answer(None)
            case _Ended(job_id=job_id, outcome=outcome):
                return self._ended(env, job_id, outcome)
            case _:
                assert_never(env.message)
        return None

    def next_deadline(self) -> float:
        deadlines = [self._prune_at if self.keep_s > 0 else math.inf]
        deadlines += [at for *_, at in self._unrecorded.values()]
        if self._queue and self._hold_until > trio.current_time():
            deadlines.append(self._hold_until)
        return min(deadlines)

    def on_deadline(self) -> None:
        if self.keep_s > 0 and trio.current_time() >= self._prune_at:
            self._prune_at = trio.current_time() + 3600.0
            self.start_soon(self._prune)

    def settle(self) -> Awaitable[None] | None:
        now = trio.current_time()
        due = [job_id for job_id, (*_, at) in self._unrecorded.items() if at <= now]
        if due or self._ready():
            return self._settle(due)
        return None

    async def _settle(self, due: list[str]) -> None:
        for job_id in due:
            job, outcome, *_ = self._unrecorded[job_id]
            await self._finish(job, outcome)
        if self._ready():
            await self._start_ready()

    async def on_stop(self) -> None:
        # Running jobs are cancelled with the actor's nursery and stay `running` in the
        # ledger: the next start resumes them.
        for waiters in self._cancels.values():
            for env in waiters:
                env.fail(JobNotRunnable("the daemon is stopping; the job resumes when it starts again"))

    # -- steps ------------------------------------------------------------------

    async def _submit(self, env: Envelope[JobsMessage], submit: Submit) -> None:
        now = time.time()
        job = JobRecord(
            id=submit.job_id or f"job_{secrets.token_hex(12)}",
            kind=submit.kind,
            state="queued",
            model=submit.model,
            request=submit.request,
            created_at=now,
            updated_at=now,
        )
        logged = tuple(
            (_INSERT_EVENT, (job.id, seq, kind, msgspec.json.encode(data)))
            for seq, (kind, data) in enumerate(submit.events)
        )
        await self.ledger.ask(Write(statements=(*submit.statements, _insert(job), *logged)))
        self._queue.append(job)
        env.answer(job)

    async def _cancel(self, env: Envelope[JobsMessage], job_id: str) -> None:
        if job_id in self._active:
            self._cancels.setdefault(job_id, []).append(env)
            self._active[job_id][1].cancel()
            return
        queued = next((j for j in self._queue if j.id == job_id), None)
        if queued is not None:
            self._queue.remove(queued)
            env.answer(await self._finish(queued, JobOutcome(state="cancelled")))
            return
        job = await trio.to_thread.run_sync(read_job, self.path, job_id)
        if job is None:
            env.fail(JobNotFound(f"no job '{job_id}'"))
        else:
            env.fail(JobNotRunnable(f"job '{job_id}' has already ended ({job.state}): nothing to cancel"))

    async def _ended(self, env: Envelope[JobsMessage], job_id: str, outcome: JobOutcome) -> None:
        entry = self._active.pop(job_id, None)
        env.answer(None)
        if entry is None:
            return
        ctx, _ = entry
        job = await self._finish(ctx.job, outcome)
        ctx._wake()
        for waiter in self._cancels.pop(job_id, []):
            waiter.answer(job)

    async def _finish(self, job: JobRecord, outcome: JobOutcome) -> JobRecord:
        """Record how ``job`` ended; when the ledger or the disk refuses, keep it to record
        again later (``_unrecorded``) and return the ended job as it will be recorded."""
        try:
            done = await self._record_end(job, outcome)
        except (BlazarRuntimeError, RegistryError, OSError) as exc:
            self._retry_end(job, outcome, exc)
            return msgspec.structs.replace(
                job, state=outcome.state, result=outcome.result, error=outcome.error, updated_at=time.time()
            )
        if self._unrecorded.pop(job.id, None) is not None:
            self._stalls.pop(job.id, None)
            log.warning("job %s: its end (%s) is recorded now", job.id, outcome.state)
        self._finished += 1
        return done

    def _retry_end(self, job: JobRecord, outcome: JobOutcome, exc: Exception) -> None:
        previous = self._unrecorded.get(job.id)
        delay = RECORD_RETRY_FIRST_S if previous is None else min(previous[2] * 2, RECORD_RETRY_MAX_S)
        self._unrecorded[job.id] = (job, outcome, delay, trio.current_time() + delay)
        why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        self._stalls[job.id] = f"the job ended ({outcome.state}) but its end is not recorded yet: {why}"
        if previous is None:  # said once; the next tries are quiet
            log.warning("job %s: cannot record its end yet, retrying with a backoff: %s", job.id, why)

    async def _record_end(self, job: JobRecord, outcome: JobOutcome) -> JobRecord:
        result, artifact = outcome.result, None
        if result is not None and len(result) > self.spill_bytes:
            path = self.data_dir / "jobs" / job.id / "result"
            where = shown_folder(path.parent.parent, self.data_dir)
            with disk_full_as("the job's result", where=where, needed_bytes=len(result)):
                await trio.to_thread.run_sync(atomic_write, path, result)
            result, artifact = None, str(path)
        done = msgspec.structs.replace(
            job,
            state=outcome.state,
            result=result,
            artifact=artifact,
            error=outcome.error,
            updated_at=time.time(),
        )
        await self.ledger.ask(
            Write(
                statements=(
                    (
                        "UPDATE jobs SET state = ?, result = ?, artifact = ?, error = ?, updated_at = ?"
                        " WHERE id = ?",
                        (done.state, done.result, done.artifact, done.error, done.updated_at, done.id),
                    ),
                )
            )
        )
        return done

    def _ready(self) -> bool:
        return (
            len(self._active) < self.max_running
            and trio.current_time() >= self._hold_until
            and any(j.kind in self._runners for j in self._queue)
        )

    async def _start_ready(self) -> None:
        while len(self._active) < self.max_running:
            job = next((j for j in self._queue if j.kind in self._runners), None)
            if job is None:
                return
            queued = job
            self._queue.remove(job)
            job = msgspec.structs.replace(
                job, state="running", attempts=job.attempts + 1, updated_at=time.time()
            )
            try:
                await self.ledger.ask(Write(statements=(_running(job),)))
            except BlazarRuntimeError as exc:  # the ledger refused: the job waits, first in line
                self._queue.appendleft(queued)
                self._hold_s = min(self._hold_s * 2, RECORD_RETRY_MAX_S) or RECORD_RETRY_FIRST_S
                self._hold_until = trio.current_time() + self._hold_s
                self._stalls[queued.id] = f"the job cannot start yet: {exc.message}"
                log.warning("job %s cannot start yet (retrying in %.0f s): %s", job.id, self._hold_s, exc)
                return
            self._hold_s = 0.0
            self._stalls.pop(job.id, None)
            first_seq = await trio.to_thread.run_sync(_next_seq, self.path, job.id)
            ctx = JobContext(self, job, first_seq)
            scope = trio.CancelScope()
            self._active[job.id] = (ctx, scope)
            self.start_soon(self._run_one, ctx, scope, self._runners[job.kind])

    async def _run_one(self, ctx: JobContext, scope: trio.CancelScope, runner: Runner) -> None:
        # Only a client's cancel lands on the job's own scope (ending it `cancelled`); the
        # daemon stopping cancels the actor's nursery, which goes through and leaves
        # the job `running` in the ledger, to be resumed.
        outcome = JobOutcome(state="cancelled")
        with scope:
            try:
                outcome = await runner(ctx)
            except Exception as exc:
                if find_disk_full(exc) is not None:
                    log.warning("job %s (%s) failed: %s", ctx.job.id, ctx.job.kind, _describe(exc))
                else:
                    log.error("job %s (%s) failed", ctx.job.id, ctx.job.kind, exc_info=exc)
                outcome = JobOutcome(state="failed", error=_describe(exc))
        self._stalls.pop(ctx.job.id, None)
        with trio.CancelScope(shield=True):
            await self.tell(_Ended(job_id=ctx.job.id, outcome=outcome))

    async def _prune(self) -> None:
        self._prune_at = trio.current_time() + 3600.0
        if self.keep_s <= 0:
            return
        cutoff = time.time() - self.keep_s
        rows = await trio.to_thread.run_sync(
            read_rows,
            self.path,
            "SELECT id, artifact FROM jobs"
            " WHERE state IN ('completed', 'failed', 'cancelled') AND updated_at < ?",
            (cutoff,),
        )
        if not rows:
            return
        ids = tuple(r[0] for r in rows)
        marks = ", ".join("?" * len(ids))
        await self.ledger.ask(
            Write(
                statements=(
                    (f"DELETE FROM job_events WHERE job_id IN ({marks})", ids),
                    (f"DELETE FROM jobs WHERE id IN ({marks})", ids),
                )
            )
        )
        for job_id, _artifact in rows:
            folder = self.data_dir / "jobs" / job_id
            await trio.to_thread.run_sync(_remove_tree, folder)


def _events_after(path: Path, job_id: str, after: int) -> list[JobEvent]:
    return read_events(path, job_id, after=after)


def _describe(exc: BaseException) -> str:
    """One line for a job's ``error``: the first leaf of an exception group, which says what
    broke; a full disk says what could not be written and what to do."""
    if (full := find_disk_full(exc)) is not None:
        named = getattr(full, "message", None) if getattr(full, "code", None) == "DISK_FULL" else None
        return named or DiskFull("the job's work").message
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _next_seq(path: Path, job_id: str) -> int:
    rows = read_rows(path, "SELECT COALESCE(MAX(seq), -1) + 1 FROM job_events WHERE job_id = ?", (job_id,))
    return int(rows[0][0]) if rows else 0


def _remove_tree(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
