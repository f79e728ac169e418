"""Files, batches and batch items, in the ledger's SQLite file (bytes of files under ``<home>/files/``).

Like the response store: writes go through the ledger actor and are committed when
they return; reads use their own read-only connection in a worker thread. A batch's
status is never stored: it is worked out from its items and its few flags
(``blazar.dialects.batches.openai_status`` / ``anthropic_status``), so it cannot
disagree with them.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import msgspec
import trio

from actors.ledger import LedgerActor, Write, read_rows
from blazar.dialects.batches import ItemState, Tally, tally
from registry.errors import disk_full_as
from registry.files import atomic_write, shown_folder

__all__ = ["BatchItem", "BatchRow", "BatchStore", "FileRow", "Statement"]

Statement = tuple[str, tuple[Any, ...]]


class FileRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    filename: str
    purpose: str
    bytes: int
    path: str
    created_at: float
    expires_at: float | None = None


class BatchRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    dialect: str
    """``openai`` or ``anthropic``: which shapes the batch is shown in."""
    endpoint: str
    input_file_id: str | None
    metadata: dict[str, str] | None
    cancel_requested: bool
    created_at: float
    expires_at: float
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    cancelling_at: float | None = None
    ended_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    archived_at: float | None = None
    key: str | None = None
    """The API key the batch was made with (its name): each item runs as it. None: made
    while the daemon needed no key (or before keys were recorded); items run as ``local``."""


class BatchItem(msgspec.Struct, frozen=True, kw_only=True):
    idx: int
    custom_id: str
    url: str
    body: bytes
    state: ItemState
    status_code: int | None = None
    response: bytes | None = None
    request_id: str | None = None


_FILE_COLUMNS = "id, filename, purpose, bytes, path, created_at, expires_at"
_BATCH_COLUMNS = (
    "id, dialect, endpoint, input_file_id, metadata, cancel_requested, created_at, expires_at, "
    "in_progress_at, finalizing_at, cancelling_at, ended_at, output_file_id, error_file_id, archived_at, key"
)
_ITEM_COLUMNS = "idx, custom_id, url, body, state, status_code, response, request_id"


def _names(columns: str) -> list[str]:
    return [c.strip() for c in columns.split(",")]


def _file(row: tuple[Any, ...]) -> FileRow:
    return FileRow(**dict(zip(_names(_FILE_COLUMNS), row, strict=True)))


def _batch(row: tuple[Any, ...]) -> BatchRow:
    doc = dict(zip(_names(_BATCH_COLUMNS), row, strict=True))
    doc["metadata"] = msgspec.json.decode(doc["metadata"]) if doc["metadata"] else None
    doc["cancel_requested"] = bool(doc["cancel_requested"])
    return BatchRow(**doc)


def _item(row: tuple[Any, ...]) -> BatchItem:
    return BatchItem(
        idx=row[0],
        custom_id=row[1],
        url=row[2],
        body=bytes(row[3]),
        state=row[4],
        status_code=row[5],
        response=bytes(row[6]) if row[6] is not None else None,
        request_id=row[7],
    )


def write_blob(folder: Path, data: bytes) -> tuple[Path, bool]:
    """Store ``data`` under its SHA-256 (temp file, fsync, rename); the same bytes twice are one
    file. Also says whether the file is new (False: those bytes were stored already)."""
    path = folder / f"sha256-{hashlib.sha256(data).hexdigest()}"
    if path.exists():
        return path, False
    atomic_write(path, data)
    return path, True


class BatchStore:
    def __init__(self, ledger: LedgerActor, home: Path) -> None:
        self._ledger = ledger
        self._path = ledger.path
        self.home = Path(home)
        self.files_dir = self.home / "files"

    @property
    def ledger_name(self) -> str:
        """The ledger file's name, as an error names it (``blazar.db``)."""
        return self._path.name

    def files_place(self) -> str:
        """The files folder as an error names it (``files/ in the data dir``)."""
        return shown_folder(self.files_dir, self.home)

    async def write_file_bytes(self, what: str, data: bytes) -> tuple[Path, bool]:
        """``write_blob`` into the files folder; a full disk raises ``DiskFull`` naming ``what``."""
        with disk_full_as(what, where=self.files_place(), needed_bytes=len(data)):
            return await trio.to_thread.run_sync(write_blob, self.files_dir, data)

    async def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return await trio.to_thread.run_sync(read_rows, self._path, sql, params)

    async def write(self, *statements: Statement) -> None:
        await self._ledger.ask(Write(statements=statements))

    # -- files ------------------------------------------------------------------

    async def put_file(
        self, file_id: str, filename: str, purpose: str, data: bytes, *, expires_at: float | None
    ) -> FileRow:
        """Write the bytes, then the row: a crash between leaves an unnamed blob, never a
        row without its bytes. A full disk raises ``DiskFull`` and leaves neither: the
        bytes of a row that could not be written go again."""
        path, new = await self.write_file_bytes("the upload", data)
        row = FileRow(
            id=file_id,
            filename=filename,
            purpose=purpose,
            bytes=len(data),
            path=str(path),
            created_at=time.time(),
            expires_at=expires_at,
        )
        try:
            with disk_full_as("the upload's record", where=f"{self.ledger_name} in the data dir"):
                await self.write(self.file_statement(row))
        except BaseException:
            if new:
                with trio.CancelScope(shield=True):
                    await self._forget_bytes(path)
            raise
        return row

    async def _forget_bytes(self, path: Path) -> None:
        """Delete a files-folder blob that no row names (one the same bytes uploaded meanwhile
        names stays)."""
        if not await self._read("SELECT 1 FROM files WHERE path = ? LIMIT 1", (str(path),)):
            await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))

    @staticmethod
    def file_statement(row: FileRow) -> Statement:
        return (
            f"INSERT OR REPLACE INTO files ({_FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.id, row.filename, row.purpose, row.bytes, row.path, row.created_at, row.expires_at),
        )

    async def file(self, file_id: str) -> FileRow | None:
        rows = await self._read(f"SELECT {_FILE_COLUMNS} FROM files WHERE id = ?", (file_id,))
        return (
            FileRow(**dict(zip([c.strip() for c in _FILE_COLUMNS.split(",")], rows[0], strict=True)))
            if rows
            else None
        )

    async def files(self, *, purpose: str | None, after: str | None, limit: int, order: str) -> list[FileRow]:
        where, params = [], []
        if purpose is not None:
            where.append("purpose = ?")
            params.append(purpose)
        if after is not None:
            where.append(f"rowid {'<' if order == 'desc' else '>'} (SELECT rowid FROM files WHERE id = ?)")
            params.append(after)
        sql = f"SELECT {_FILE_COLUMNS} FROM files"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY rowid {'DESC' if order == 'desc' else 'ASC'} LIMIT ?"
        rows = await self._read(sql, (*params, limit))
        return [_file(r) for r in rows]

    async def file_bytes(self, row: FileRow) -> bytes:
        return await trio.Path(row.path).read_bytes()

    async def delete_file(self, row: FileRow) -> None:
        await self.write(("DELETE FROM files WHERE id = ?", (row.id,)))
        await self._forget_bytes(Path(row.path))

    # -- batches ----------------------------------------------------------------

    @staticmethod
    def create_statements(row: BatchRow, items: list[tuple[str, str, bytes]]) -> list[Statement]:
        """The batch and its items (custom_id, url, body), for the job's own transaction."""
        out: list[Statement] = [
            (
                f"INSERT INTO batches ({_BATCH_COLUMNS}) VALUES ({', '.join('?' * 16)})",
                (
                    row.id,
                    row.dialect,
                    row.endpoint,
                    row.input_file_id,
                    msgspec.json.encode(row.metadata) if row.metadata is not None else None,
                    int(row.cancel_requested),
                    row.created_at,
                    row.expires_at,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    row.key,
                ),
            )
        ]
        out += [
            (
                "INSERT INTO batch_items (batch_id, idx, custom_id, url, body, state)"
                " VALUES (?, ?, ?, ?, ?, 'pending')",
                (row.id, idx, custom_id, url, body),
            )
            for idx, (custom_id, url, body) in enumerate(items)
        ]
        return out

    async def batch(self, batch_id: str, *, dialect: str | None = None) -> BatchRow | None:
        rows = await self._read(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,))
        row = _batch(rows[0]) if rows else None
        return row if row is not None and (dialect is None or row.dialect == dialect) else None

    async def batches(
        self, dialect: str, *, after: str | None, before: str | None, limit: int
    ) -> list[BatchRow]:
        sql = f"SELECT {_BATCH_COLUMNS} FROM batches WHERE dialect = ? AND archived_at IS NULL"
        params: list[Any] = [dialect]
        if after is not None:
            sql += " AND rowid < (SELECT rowid FROM batches WHERE id = ?)"
            params.append(after)
        if before is not None:
            sql += " AND rowid > (SELECT rowid FROM batches WHERE id = ?)"
            params.append(before)
        sql += " ORDER BY rowid DESC LIMIT ?"
        return [_batch(r) for r in await self._read(sql, (*params, limit))]

    async def set_times(self, batch_id: str, **times: float | str | int | None) -> None:
        columns = ", ".join(f"{name} = ?" for name in times)
        await self.write((f"UPDATE batches SET {columns} WHERE id = ?", (*times.values(), batch_id)))

    async def tally(self, batch_id: str) -> Tally:
        rows = await self._read(
            "SELECT state, COUNT(*) FROM batch_items WHERE batch_id = ? GROUP BY state", (batch_id,)
        )
        return tally(state for state, n in rows for _ in range(n))

    async def items(self, batch_id: str, *, unfinished: bool = False) -> list[BatchItem]:
        sql = f"SELECT {_ITEM_COLUMNS} FROM batch_items WHERE batch_id = ?"
        if unfinished:
            sql += " AND state IN ('pending', 'running')"
        return [_item(r) for r in await self._read(sql + " ORDER BY idx", (batch_id,))]

    @staticmethod
    def item_statement(batch_id: str, item: BatchItem) -> Statement:
        return (
            "UPDATE batch_items SET state = ?, status_code = ?, response = ?, request_id = ?"
            " WHERE batch_id = ? AND idx = ?",
            (item.state, item.status_code, item.response, item.request_id, batch_id, item.idx),
        )

    @staticmethod
    def settle_statement(batch_id: str, state: ItemState) -> Statement:
        """Every request of the batch that has not run becomes ``state`` (cancelled, expired)."""
        return (
            "UPDATE batch_items SET state = ? WHERE batch_id = ? AND state IN ('pending', 'running')",
            (state, batch_id),
        )

    async def delete_batch(self, batch_id: str) -> None:
        await self.write(
            ("DELETE FROM batch_items WHERE batch_id = ?", (batch_id,)),
            ("DELETE FROM batches WHERE id = ?", (batch_id,)),
        )
