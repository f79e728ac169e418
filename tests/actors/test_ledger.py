import sqlite3
from pathlib import Path

import pytest
import trio

from actors.errors import ActorStopped, LedgerError
from actors.ledger import (
    MIGRATIONS,
    Flush,
    LedgerActor,
    RequestRecord,
    Write,
    last_used_by_model,
    read_requests,
    read_rows,
)
from actors.supervisor import ChildSpec, Supervisor


def make_record(i: int, *, trace_id: str | None = None) -> RequestRecord:
    return RequestRecord(
        trace_id=trace_id or f"trace-{i}",
        started_at=1_700_000_000.0 + i,
        method="POST",
        path="/v1/chat/completions",
        model="qwen3:0.6b" if i % 2 else None,
        status=200 if i % 3 else 503,
        duration_ms=12.5 + i,
        ttft_ms=3.25 if i % 2 else None,
        blazar_code=None if i % 3 else "UNAVAILABLE",
        bytes_out=1000 + i,
        client="127.0.0.1" if i % 2 else None,
        **(_STORY if i % 2 else {}),
    )


# A request's story (migration 5): odd records carry it, even ones read back as NULLs.
_STORY: dict[str, object] = {
    "dialect": "openai",
    "key": "ci",
    "engine": "llamacpp-host",
    "queue_ms": 1.5,
    "load_ms": 250.0,
    "prompt_tokens": 31,
    "completion_tokens": 8,
    "prefill_ms": 96.1,
    "decode_ms": 31.6,
    "error": "engine for 'x' crashed",
}


async def test_records_round_trip_newest_first(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "dir" / "blazar.db"
    records = [make_record(i) for i in range(10)]
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            assert await nursery.start(ledger.run) is ledger
            for record in records:
                await ledger.tell(record)
            assert await ledger.ask(Flush()) is None
            back = read_requests(db)
            assert back == list(reversed(records))
            assert read_requests(db, limit=3) == list(reversed(records))[:3]
            stats = ledger.statistics()
            assert stats.written == 10 and stats.dropped == 0 and stats.running
            assert stats.path == str(db) and stats.queued == 0
            assert "running" in repr(ledger) and "\n" not in repr(ledger)
            nursery.cancel_scope.cancel()
        assert not ledger.statistics().running
        assert "stopped" in repr(ledger)


async def test_keeps_only_the_newest_records_and_knows_last_use(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db, keep_records=5, batch_max=3)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for i in range(12):
                await ledger.tell(make_record(i))
            await ledger.ask(Flush())
            assert [r.trace_id for r in read_requests(db)] == [f"trace-{i}" for i in range(11, 6, -1)]
            # odd records name the model; the newest of them is record 11
            assert last_used_by_model(db) == {"qwen3:0.6b": 1_700_000_011.0}
            nursery.cancel_scope.cancel()
    assert last_used_by_model(tmp_path / "missing.db") == {}


async def test_flush_waits_for_prior_writes(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for i in range(5):
                assert ledger.record_nowait(make_record(i))
            # nothing has run yet: the writer has not been scheduled since the tells
            await ledger.ask(Flush())
            assert len(read_requests(db)) == 5
            nursery.cancel_scope.cancel()


async def test_batches_many_records_per_commit(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db, batch_max=256)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for i in range(1000):
                await ledger.tell(make_record(i))
            await ledger.ask(Flush())
            stats = ledger.statistics()
            assert stats.written == 1000
            assert stats.batches < 1000
            assert len(read_requests(db, limit=5000)) == 1000
            nursery.cancel_scope.cancel()


async def test_record_nowait_drops_when_full(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db, capacity=4)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            # no checkpoint inside this loop, so the writer cannot drain meanwhile
            results = [ledger.record_nowait(make_record(i)) for i in range(20)]
            accepted = results.count(True)
            assert 0 < accepted < 20
            assert ledger.statistics().dropped == results.count(False)
            await ledger.ask(Flush())
            assert ledger.statistics().written == accepted
            assert len(read_requests(db)) == accepted
            nursery.cancel_scope.cancel()


async def test_record_nowait_on_stopped_ledger_counts_a_drop(tmp_path: Path) -> None:
    ledger = LedgerActor(tmp_path / "blazar.db")
    assert not ledger.record_nowait(make_record(1))
    assert ledger.statistics().dropped == 1
    with pytest.raises(ActorStopped):
        await ledger.ask(Flush())


async def test_stop_writes_queued_records(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for i in range(50):
                assert ledger.record_nowait(make_record(i))
            nursery.cancel_scope.cancel()
        assert ledger.statistics().written == 50
        assert len(read_requests(db)) == 50
        assert not ledger.record_nowait(make_record(99))
        assert ledger.statistics().dropped == 1


async def test_wal_mode_and_synchronous_normal(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            await ledger.tell(make_record(1))
            await ledger.ask(Flush())
            # the writer is idle after the flush, so peeking at its connection is safe
            assert ledger._conn is not None
            assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
            nursery.cancel_scope.cancel()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    finally:
        conn.close()


async def test_migrations_idempotent_on_reopen(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        for round_ in range(3):
            ledger = LedgerActor(db)
            async with trio.open_nursery() as nursery:
                await nursery.start(ledger.run)
                await ledger.tell(make_record(round_))
                await ledger.ask(Flush())
                assert len(read_requests(db)) == round_ + 1
                nursery.cancel_scope.cancel()
        assert [r.trace_id for r in read_requests(db)] == ["trace-2", "trace-1", "trace-0"]


async def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            with pytest.raises(LedgerError, match="newer"):
                await nursery.start(ledger.run)
        assert not ledger.statistics().running
        assert not ledger.record_nowait(make_record(1))


async def test_restart_under_supervisor_keeps_rows(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        sup = Supervisor("root")
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert await sup.start_child(ChildSpec(name="ledger", start=ledger.run)) is ledger
            await ledger.tell(make_record(1))
            await sup.stop_child("ledger")
            assert len(read_requests(db)) == 1
            # the same actor (same address) comes back on the same file
            assert await sup.start_child(ChildSpec(name="ledger", start=ledger.run)) is ledger
            await ledger.tell(make_record(2))
            await ledger.ask(Flush())
            assert [r.trace_id for r in read_requests(db)] == ["trace-2", "trace-1"]
            nursery.cancel_scope.cancel()


def test_read_requests_missing_file(tmp_path: Path) -> None:
    assert read_requests(tmp_path / "nope" / "blazar.db") == []
    assert not (tmp_path / "nope").exists()


def test_read_requests_unmigrated_file(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    sqlite3.connect(db).close()
    assert read_requests(db) == []


async def test_trace_id_filter(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            for i in range(6):
                await ledger.tell(make_record(i, trace_id="a" if i % 2 else "b"))
            await ledger.ask(Flush())
            nursery.cancel_scope.cancel()
    only_a = read_requests(db, trace_id="a")
    assert [r.started_at for r in only_a] == [1_700_000_005.0, 1_700_000_003.0, 1_700_000_001.0]
    assert read_requests(db, trace_id="a", limit=1) == only_a[:1]
    assert read_requests(db, trace_id="zzz") == []


async def test_reader_beside_running_writer(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            await ledger.tell(make_record(1))
            await ledger.ask(Flush())
            # readers use worker threads in async code; WAL lets them run beside the writer
            back = await trio.to_thread.run_sync(read_requests, db)
            assert back == [make_record(1)]
            nursery.cancel_scope.cancel()


async def test_messages_are_encodable() -> None:
    import msgspec

    record = make_record(3)
    raw = msgspec.json.encode(record)
    assert b'"type":"RequestRecord"' in raw
    assert msgspec.json.decode(raw, type=RequestRecord | Flush) == record
    assert msgspec.json.decode(msgspec.json.encode(Flush()), type=RequestRecord | Flush) == Flush()


async def test_a_burst_lingers_then_commits_once_without_a_flush(tmp_path: Path) -> None:
    with trio.fail_after(20):
        ledger = LedgerActor(tmp_path / "blazar.db", linger_s=1.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            t0 = trio.current_time()
            for i in range(3):
                assert ledger.record_nowait(make_record(i))
            await trio.sleep(0.1)
            assert ledger.statistics().written == 0  # the batch waits for more
            assert ledger.record_nowait(make_record(3))
            while ledger.statistics().written < 4:  # noqa: ASYNC110 - the writer's own counter
                await trio.sleep(0.05)
            assert trio.current_time() - t0 >= 1.0 and ledger.statistics().batches == 1
            nursery.cancel_scope.cancel()


def _put(i: int) -> Write:
    return Write(
        statements=(
            (
                "INSERT INTO conversations (id, created_at, metadata) VALUES (?, ?, ?)",
                (f"conv_{i}", float(i), b"{}"),
            ),
        )
    )


async def test_a_write_is_committed_when_its_ask_returns(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db, linger_s=60.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            await ledger.tell(make_record(1))
            # no flush and a long linger: the write alone makes the batch commit
            await ledger.ask(_put(1))
            assert read_rows(db, "SELECT id FROM conversations") == [("conv_1",)]
            assert len(read_requests(db)) == 1
            nursery.cancel_scope.cancel()


async def test_a_failed_write_is_undone_alone(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            await ledger.ask(_put(1))
            bad = Write(statements=(*_put(2).statements, *_put(1).statements))  # duplicate key
            results: dict[str, object] = {}

            async def ask(name: str, write: Write) -> None:
                try:
                    results[name] = await ledger.ask(write)
                except LedgerError as exc:
                    results[name] = exc

            async with trio.open_nursery() as inner:
                inner.start_soon(ask, "bad", bad)
                inner.start_soon(ask, "good", _put(3))
            assert isinstance(results["bad"], LedgerError) and "UNIQUE" in str(results["bad"])
            assert results["good"] is None
            # the bad write's first statement was rolled back with it
            ids = [r[0] for r in read_rows(db, "SELECT id FROM conversations ORDER BY id")]
            assert ids == ["conv_1", "conv_3"]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("start", range(len(MIGRATIONS)))
async def test_migrates_forward_from_every_earlier_version(tmp_path: Path, start: int) -> None:
    db = tmp_path / "blazar.db"
    conn = sqlite3.connect(db, isolation_level=None)
    for statements in MIGRATIONS[:start]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {start}")
    if start >= 1:
        conn.execute(
            "INSERT INTO requests (trace_id, started_at, method, path, status, duration_ms, bytes_out)"
            " VALUES ('old', 1.0, 'GET', '/', 200, 1.0, 0)"
        )
    conn.close()
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            await ledger.ask(_put(1))
            nursery.cancel_scope.cancel()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert [r.trace_id for r in read_requests(db)] == (["old"] if start >= 1 else [])
