"""The durable ledger: one SQLite file (WAL, ``synchronous=NORMAL``) behind one writer actor.

Request handlers never wait on the disk: they ``record_nowait`` and move on, and a
full or stopped ledger costs a counted drop rather than latency. The writer takes
its mailbox in batches so one commit (one WAL append) covers many records. Readers
open their own read-only connections; WAL lets them run beside the writer.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.errors import ActorStopped, LedgerError
from actors.mailbox import Envelope
from registry.errors import DiskFull, is_disk_full

__all__ = [
    "MIGRATIONS",
    "Flush",
    "LedgerActor",
    "LedgerMessage",
    "LedgerStatistics",
    "RequestRecord",
    "Write",
    "last_used_by_model",
    "read_requests",
    "read_rows",
]


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    trace_id: str
    started_at: float  # unix time, seconds
    method: str
    path: str
    model: str | None
    status: int
    duration_ms: float
    ttft_ms: float | None
    blazar_code: str | None
    bytes_out: int
    client: str | None
    # What `blazar why` tells a request's story from (None when it did not apply or is
    # not known: a request that never reached an engine has no queue wait nor tokens).
    dialect: str | None = None
    key: str | None = None
    """The name of the API key it came with, never the secret."""
    engine: str | None = None
    queue_ms: float | None = None
    load_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    error: str | None = None
    """The error's message, scrubbed of secrets and personal data."""
    tools: str | None = None
    """The MCP tool calls the gateway ran for it, as a JSON list of ``{"tool", "ok", "why",
    "ms", "truncated_bytes"}``."""
    overhead_ms: float | None = None
    """The gateway's own time (docs/observability.md: arrival to last byte less the queue,
    the load, the engine's reported prompt and decode time and the MCP tools' time)."""


class Flush(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``ask(Flush())`` returns once everything told before it is committed."""


class Write(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Statements that commit together or not at all; ``ask(Write(...))`` returns once
    they are committed (a ``kill -9`` after that cannot undo them) and raises
    ``LedgerError`` when they failed. What durable work acknowledges goes this way."""

    statements: tuple[tuple[str, tuple[Any, ...]], ...]


LedgerMessage = RequestRecord | Flush | Write


class LedgerStatistics(ActorStatistics, frozen=True, kw_only=True):
    path: str
    written: int
    dropped: int
    batches: int
    last_error: str | None


# Migration N (1-based) brings the file from user_version N-1 to N. Entries are
# history: never edit one that has shipped, append a new one instead.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE requests (
            id INTEGER PRIMARY KEY,
            trace_id TEXT NOT NULL,
            started_at REAL NOT NULL,
            method TEXT NOT NULL,
            path TEXT NOT NULL,
            model TEXT,
            status INTEGER NOT NULL,
            duration_ms REAL NOT NULL,
            ttft_ms REAL,
            blazar_code TEXT,
            bytes_out INTEGER NOT NULL,
            client TEXT
        )
        """,
        "CREATE INDEX requests_started_at ON requests (started_at)",
        "CREATE INDEX requests_trace_id ON requests (trace_id)",
    ),
    (
        # Stored Responses API objects: the create body, this turn's input items and
        # the Response as last known, all JSON; a chain is walked through
        # previous_response_id.
        """
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            status TEXT NOT NULL,
            model TEXT NOT NULL,
            previous_response_id TEXT,
            conversation_id TEXT,
            background INTEGER NOT NULL DEFAULT 0,
            request BLOB NOT NULL,
            input_items BLOB NOT NULL,
            response BLOB NOT NULL
        )
        """,
        "CREATE INDEX responses_created_at ON responses (created_at)",
        """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            metadata BLOB NOT NULL
        )
        """,
        """
        CREATE TABLE conversation_items (
            conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            id TEXT NOT NULL,
            item BLOB NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )
        """,
    ),
    (
        # Durable jobs (actors/jobs.py) and their append-only event logs.
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            state TEXT NOT NULL,
            model TEXT,
            request BLOB NOT NULL,
            result BLOB,
            artifact TEXT,
            error TEXT,
            progress BLOB,
            attempts INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
        "CREATE INDEX jobs_state ON jobs (state, kind)",
        """
        CREATE TABLE job_events (
            job_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (job_id, seq)
        )
        """,
    ),
    (
        # Uploaded and written files (the bytes live under <home>/files/), batches of
        # both dialects and their items, one row per request with its recorded answer.
        """
        CREATE TABLE files (
            id TEXT PRIMARY KEY,
            filename TEXT NOT NULL,
            purpose TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            path TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL
        )
        """,
        """
        CREATE TABLE batches (
            id TEXT PRIMARY KEY,
            dialect TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            input_file_id TEXT,
            metadata BLOB,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            in_progress_at REAL,
            finalizing_at REAL,
            cancelling_at REAL,
            ended_at REAL,
            output_file_id TEXT,
            error_file_id TEXT,
            archived_at REAL
        )
        """,
        """
        CREATE TABLE batch_items (
            batch_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            custom_id TEXT NOT NULL,
            url TEXT NOT NULL,
            body BLOB NOT NULL,
            state TEXT NOT NULL,
            status_code INTEGER,
            response BLOB,
            request_id TEXT,
            PRIMARY KEY (batch_id, idx)
        )
        """,
    ),
    (
        # A request's story: its dialect and key, the engine that served it, where its
        # time went and what it cost. Old rows read these as NULL.
        "ALTER TABLE requests ADD COLUMN dialect TEXT",
        "ALTER TABLE requests ADD COLUMN key TEXT",
        "ALTER TABLE requests ADD COLUMN engine TEXT",
        "ALTER TABLE requests ADD COLUMN queue_ms REAL",
        "ALTER TABLE requests ADD COLUMN load_ms REAL",
        "ALTER TABLE requests ADD COLUMN prompt_tokens INTEGER",
        "ALTER TABLE requests ADD COLUMN completion_tokens INTEGER",
        "ALTER TABLE requests ADD COLUMN prefill_ms REAL",
        "ALTER TABLE requests ADD COLUMN decode_ms REAL",
        "ALTER TABLE requests ADD COLUMN error TEXT",
    ),
    (
        # The name of the API key a batch was made with (never its secret): its items run
        # as that key. Batches made before read NULL and run as the daemon's local token.
        "ALTER TABLE batches ADD COLUMN key TEXT",
    ),
    (
        # The MCP tool calls the gateway ran for a request (JSON). Old rows read NULL.
        "ALTER TABLE requests ADD COLUMN tools TEXT",
    ),
    (
        # Stored chat completions (OpenAI `store: true`): the completion object as answered,
        # the request's messages, metadata, and the name of the key that made it (the only
        # key that sees it, besides admin keys). seq orders and pages the list.
        """
        CREATE TABLE chat_completions (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            model TEXT NOT NULL,
            owner TEXT,
            metadata BLOB NOT NULL,
            messages BLOB NOT NULL,
            completion BLOB NOT NULL
        )
        """,
        "CREATE INDEX chat_completions_model ON chat_completions (model)",
    ),
    (
        # Capability certificates (`blazar model-doctor`): one row per run; the newest per
        # model is the one admission trusts. ``probes`` is JSON (actors/certificates.py).
        """
        CREATE TABLE certificates (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            model TEXT NOT NULL,
            engine TEXT NOT NULL,
            created_at REAL NOT NULL,
            job_id TEXT,
            probes BLOB NOT NULL
        )
        """,
        "CREATE INDEX certificates_model ON certificates (model, created_at)",
        # Benchmark receipts (`blazar bench`): speeds per concurrency level, JSON.
        """
        CREATE TABLE bench_receipts (
            id TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            engine TEXT NOT NULL,
            created_at REAL NOT NULL,
            settings BLOB NOT NULL,
            levels BLOB NOT NULL
        )
        """,
        "CREATE INDEX bench_receipts_model ON bench_receipts (model, created_at)",
    ),
    (
        # Tuned profiles (`blazar tune`): one per model, the launch settings measured fastest
        # with every trial's figures; JSON (actors/profiles.py).
        """
        CREATE TABLE profiles (
            model TEXT PRIMARY KEY,
            engine TEXT NOT NULL,
            created_at REAL NOT NULL,
            profile BLOB NOT NULL,
            trials BLOB NOT NULL,
            workload BLOB NOT NULL
        )
        """,
    ),
    (
        # The gateway's own time per request (its overhead). Old rows read NULL.
        "ALTER TABLE requests ADD COLUMN overhead_ms REAL",
    ),
)

_COLUMNS = (
    "trace_id",
    "started_at",
    "method",
    "path",
    "model",
    "status",
    "duration_ms",
    "ttft_ms",
    "blazar_code",
    "bytes_out",
    "client",
    "dialect",
    "key",
    "engine",
    "queue_ms",
    "load_ms",
    "prompt_tokens",
    "completion_tokens",
    "prefill_ms",
    "decode_ms",
    "error",
    "tools",
    "overhead_ms",
)
_INSERT = f"INSERT INTO requests ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM requests"

Row = tuple[Any, ...]


def _row(record: RequestRecord) -> Row:
    return tuple(getattr(record, column) for column in _COLUMNS)


def _migrate(conn: sqlite3.Connection) -> None:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise LedgerError(f"ledger schema version {version} is newer than this build ({len(MIGRATIONS)})")
    for target in range(version + 1, len(MIGRATIONS) + 1):
        # IMMEDIATE takes the write lock up front, so two processes opening the
        # same file cannot both run one migration; user_version commits with it.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[target - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _open(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch is
    # exactly one transaction. check_same_thread=False: trio's worker threads
    # differ from call to call, but only this actor uses it, one call at a time.
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(f"ledger {path}: SQLite refused WAL mode (got {mode!r})")
        # NORMAL in WAL mode: a power cut may lose the last commits but never
        # corrupts the file; FULL would fsync on every batch.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        _migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _write(
    conn: sqlite3.Connection, rows: list[Row], keep: int, writes: list[Write]
) -> list[sqlite3.Error | None]:
    """Insert a batch and, with ``keep`` > 0, drop what falls out of the newest ``keep``
    records: in one transaction, a range delete on the rowid (nothing to scan when
    nothing is old). Each ``Write`` runs in its own savepoint, so one that fails is
    undone alone; the result says, per write, why it failed (None: it holds)."""
    failures: list[sqlite3.Error | None] = []
    conn.execute("BEGIN")
    try:
        if rows:
            conn.executemany(_INSERT, rows)
        if keep > 0 and rows:
            conn.execute("DELETE FROM requests WHERE id <= (SELECT MAX(id) FROM requests) - ?", (keep,))
        for write in writes:
            conn.execute("SAVEPOINT write")
            try:
                for sql, params in write.statements:
                    conn.execute(sql, params)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO write")
                failures.append(exc)
            else:
                failures.append(None)
            conn.execute("RELEASE write")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return failures


class LedgerActor(Actor[LedgerMessage]):
    """The only writer of the ledger file. Start it with ``nursery.start(ledger.run)``.

    A record joins the open batch; the batch commits in one transaction when it is
    full, when someone waits on a ``Flush``, or ``linger_s`` after it opened
    (``next_deadline``), whichever comes first."""

    def __init__(
        self,
        path: Path,
        *,
        capacity: int = 4096,
        batch_max: int = 256,
        keep_records: int = 0,
        linger_s: float = 0.05,
    ) -> None:
        super().__init__("ledger", capacity=capacity)
        self.path = Path(path)
        self.batch_max = batch_max
        self.linger_s = linger_s
        """How long a batch waits for more records before its commit (a flush ends the wait):
        under load one commit, and one trip to a worker thread, covers a burst of requests."""
        self.keep_records = keep_records
        """Keep only the newest this many request records (0: all)."""
        self.stop_grace_s = 2.0
        self._conn: sqlite3.Connection | None = None
        # The open batch: taken from the mailbox but not yet committed. Kept on the
        # actor, and emptied only once written, so a cancel in the middle of a commit
        # cannot lose it.
        self._rows: list[Row] = []
        self._flushes: list[Envelope[LedgerMessage]] = []
        self._opened_s = 0.0
        self._written = 0
        self._dropped = 0
        self._batches = 0
        self._last_error: str | None = None

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return (
            f"<LedgerActor {self.name} {state} written={self._written} "
            f"dropped={self._dropped} path={self.path}>"
        )

    def record_nowait(self, record: RequestRecord) -> bool:
        """Queue ``record`` without waiting; on a full or stopped ledger, count a drop."""
        try:
            self.mailbox.tell_nowait(record)
        except (trio.WouldBlock, ActorStopped):
            self._dropped += 1
            return False
        return True

    def statistics(self) -> LedgerStatistics:
        return LedgerStatistics(
            **self.actor_fields(),
            path=str(self.path),
            written=self._written,
            dropped=self._dropped,
            batches=self._batches,
            last_error=self._last_error,
        )

    # -- the loop's hooks -------------------------------------------------------

    async def on_start(self) -> None:
        try:
            self._conn = await trio.to_thread.run_sync(_open, self.path)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"cannot open ledger {self.path}: {exc}") from exc
        self._rows, self._flushes = [], []

    def dispatch(self, env: Envelope[LedgerMessage]) -> Awaitable[None] | None:
        self._take(env)
        return self._commit() if len(self._rows) >= self.batch_max else None

    def next_deadline(self) -> float:
        return self._opened_s + self.linger_s if self._rows else math.inf

    def settle(self) -> Awaitable[None] | None:
        if self._flushes or (self._rows and trio.current_time() >= self._opened_s + self.linger_s):
            return self._commit()
        return None

    async def on_stop(self) -> None:
        """Commit what is already queued (within ``stop_grace_s``), then close."""
        with trio.move_on_after(self.stop_grace_s):
            while True:
                self._take_queued(self.batch_max)
                if not self._rows and not self._flushes:
                    break
                await self._commit()
        # Past the grace period what is left is lost, and counted as such; no await
        # between this drain and close(), so nothing slips in between.
        self._take_queued(math.inf)
        self._dropped += len(self._rows)
        for env in self._flushes:
            env.fail(ActorStopped(f"actor '{self.name}' stopped before answering"))
        self._rows, self._flushes = [], []
        self.mailbox.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            await trio.to_thread.run_sync(conn.close)

    # -- batches ----------------------------------------------------------------

    def _take(self, env: Envelope[LedgerMessage]) -> None:
        """Add one message to the open batch (opening it when it is empty)."""
        if not self._rows and not self._flushes:
            self._opened_s = trio.current_time()
        match env.message:
            case RequestRecord() as record:
                self._rows.append(_row(record))
            case Flush() | Write():
                self._flushes.append(env)
            case _:
                assert_never(env.message)

    def _take_queued(self, limit: float) -> None:
        while len(self._rows) < limit:
            try:
                self._take(self.mailbox.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return

    async def _commit(self) -> None:
        """Write the open batch in one transaction, then answer its flushes and writes."""
        rows, flushes = self._rows, self._flushes
        writes = [env.message for env in flushes if isinstance(env.message, Write)]
        error: LedgerError | None = None
        failures: list[sqlite3.Error | None] = []
        if rows or writes:
            assert self._conn is not None
            try:
                # not abandoned on cancel: once started, the commit finishes
                failures = await trio.to_thread.run_sync(_write, self._conn, rows, self.keep_records, writes)
            except sqlite3.Error as exc:
                # a full or broken disk must not take serving down with it:
                # count the loss, tell whoever flushes, carry on
                self._dropped += len(rows)
                self._last_error = f"{type(exc).__name__}: {exc}"
                error = self._error(exc)
            else:
                self._written += len(rows)
                self._batches += 1
        self._rows, self._flushes = [], []
        outcomes = iter(failures)
        for env in flushes:
            failure = next(outcomes, None) if isinstance(env.message, Write) else None
            if error is not None:
                env.fail(error)
            elif failure is not None:
                self._last_error = f"{type(failure).__name__}: {failure}"
                env.fail(self._error(failure))
            else:
                env.answer(None)

    def _error(self, exc: sqlite3.Error) -> LedgerError:
        """What a writer is told when its write failed: ``DISK_FULL`` when the disk is full."""
        if is_disk_full(exc):
            full = DiskFull("the ledger's new records", where=f"{self.path.name} in the data dir")
            error = LedgerError(full.message, code=full.code)
        else:
            error = LedgerError(f"ledger write failed: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error


def _read(path: Path, sql: str, params: Sequence[Any]) -> list[Row]:
    """Rows of one query on a read-only connection; a missing or not yet migrated file reads as empty."""
    path = Path(path)
    if not path.exists():
        return []
    # as_uri percent-encodes the path, so odd characters cannot change the URI
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'requests'"
        ).fetchone()
        if has_table is None:
            return []
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def read_rows(path: Path, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    """Rows of one query on a read-only connection; a file or table not yet created reads
    as empty. Synchronous: call it from a worker thread in async code."""
    path = Path(path)
    if not path.exists():
        return []
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        conn.close()


def read_requests(
    path: Path, *, limit: int = 100, trace_id: str | None = None, since: float | None = None
) -> list[RequestRecord]:
    """The newest ``limit`` records (optionally of one trace, or started at or after
    ``since``, epoch seconds), newest first.

    Synchronous, with its own read-only connection: call it from a worker thread
    in async code.
    """
    sql = _SELECT
    where: list[str] = []
    params: list[Any] = []
    if trace_id is not None:
        where.append("trace_id = ?")
        params.append(trace_id)
    if since is not None:
        where.append("started_at >= ?")
        params.append(since)
    if where:
        sql += " WHERE " + " AND ".join(where)
    # id breaks ties between records started in the same instant
    sql += " ORDER BY started_at DESC, id DESC LIMIT ?"
    params.append(limit)
    rows = _read(path, sql, params)
    return [RequestRecord(**dict(zip(_COLUMNS, row, strict=True))) for row in rows]


def last_used_by_model(path: Path) -> dict[str, float]:
    """When each model last received a request (epoch seconds), from the ledger."""
    rows = _read(
        path, "SELECT model, MAX(started_at) FROM requests WHERE model IS NOT NULL GROUP BY model", ()
    )
    return {model: float(ts) for model, ts in rows}
