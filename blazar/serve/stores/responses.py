"""Stored responses and conversations, in the ledger's SQLite file.

Writes go through the ledger actor and are committed before they return, so a
response the client was told about survives a ``kill -9``; reads open their own
read-only connection in a worker thread (WAL lets them run beside the writer).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import trio

from actors.ledger import LedgerActor, Write, read_rows
from actors.runtime import Runtime
from blazar.dialects.responses import ResponsesRequest
from blazar.errors import BlazarError

__all__ = [
    "ConversationRow",
    "ResponseRow",
    "ResponseStore",
    "history_of",
    "not_found",
    "row_for",
    "store_of",
]

_json = msgspec.json.encode
Statement = tuple[str, tuple[Any, ...]]
_IN_CONVERSATION = "FROM conversation_items WHERE conversation_id = ? AND id = ?"


class ResponseRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    created_at: float
    status: str
    model: str
    previous_response_id: str | None
    conversation_id: str | None
    background: bool
    request: bytes
    """The create body as the client sent it (a background job runs it again after a crash)."""
    input_items: list[dict[str, Any]]
    response: dict[str, Any]


class ConversationRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    created_at: float
    metadata: dict[str, str]


_RESPONSE_COLUMNS = (
    "id, created_at, status, model, previous_response_id, conversation_id, background, "
    "request, input_items, response"
)


def _response(row: tuple[Any, ...]) -> ResponseRow:
    return ResponseRow(
        id=row[0],
        created_at=row[1],
        status=row[2],
        model=row[3],
        previous_response_id=row[4],
        conversation_id=row[5],
        background=bool(row[6]),
        request=bytes(row[7]),
        input_items=msgspec.json.decode(row[8]),
        response=msgspec.json.decode(row[9]),
    )


class ResponseStore:
    def __init__(self, ledger: LedgerActor) -> None:
        self._ledger = ledger
        self._path: Path = ledger.path

    async def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return await trio.to_thread.run_sync(read_rows, self._path, sql, params)

    async def _write(self, *statements: tuple[str, tuple[Any, ...]]) -> None:
        await self._ledger.ask(Write(statements=statements))

    # -- responses --------------------------------------------------------------

    @staticmethod
    def put_statement(row: ResponseRow) -> tuple[str, tuple[Any, ...]]:
        return (
            f"INSERT OR REPLACE INTO responses ({_RESPONSE_COLUMNS}, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                row.created_at,
                row.status,
                row.model,
                row.previous_response_id,
                row.conversation_id,
                int(row.background),
                row.request,
                _json(row.input_items),
                _json(row.response),
                time.time(),
            ),
        )

    async def put(self, row: ResponseRow, *, conversation_items: list[dict[str, Any]] | None = None) -> None:
        """Store (or replace) a response; with ``conversation_items``, append them to its
        conversation in the same transaction."""
        statements = [self.put_statement(row)]
        if conversation_items and row.conversation_id is not None:
            statements += self._append_statements(row.conversation_id, conversation_items)
        await self._write(*statements)

    async def update(self, response_id: str, status: str, response: dict[str, Any]) -> None:
        await self._write(
            (
                "UPDATE responses SET status = ?, response = ?, updated_at = ? WHERE id = ?",
                (status, _json(response), time.time(), response_id),
            )
        )

    async def get(self, response_id: str) -> ResponseRow | None:
        rows = await self._read(f"SELECT {_RESPONSE_COLUMNS} FROM responses WHERE id = ?", (response_id,))
        return _response(rows[0]) if rows else None

    async def by_status(self, statuses: tuple[str, ...]) -> list[ResponseRow]:
        marks = ", ".join("?" * len(statuses))
        rows = await self._read(
            f"SELECT {_RESPONSE_COLUMNS} FROM responses WHERE status IN ({marks}) ORDER BY created_at",
            statuses,
        )
        return [_response(r) for r in rows]

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """The items of a chain ending at ``response_id``, oldest first: each response's
        input items, then its output. None when the response is not stored."""
        rows = await self._read(
            """
            WITH RECURSIVE chain(id, previous, depth) AS (
                SELECT id, previous_response_id, 0 FROM responses WHERE id = ?
                UNION ALL
                SELECT r.id, r.previous_response_id, chain.depth + 1
                FROM responses r JOIN chain ON r.id = chain.previous
            )
            SELECT r.input_items, r.response FROM chain JOIN responses r ON r.id = chain.id
            ORDER BY chain.depth DESC
            """,
            (response_id,),
        )
        if not rows:
            return None
        items: list[dict[str, Any]] = []
        for input_items, response in rows:
            items += msgspec.json.decode(input_items)
            items += msgspec.json.decode(response).get("output") or []
        return items

    async def delete(self, response_id: str) -> bool:
        if await self.get(response_id) is None:
            return False
        await self._write(("DELETE FROM responses WHERE id = ?", (response_id,)))
        return True

    # -- conversations ----------------------------------------------------------

    @staticmethod
    def _append_statements(conversation_id: str, items: list[dict[str, Any]]) -> list[Statement]:
        return [
            (
                "INSERT INTO conversation_items (conversation_id, seq, id, item) VALUES (?, "
                "(SELECT COALESCE(MAX(seq), 0) + 1 FROM conversation_items WHERE conversation_id = ?), ?, ?)",
                (conversation_id, conversation_id, item["id"], _json(item)),
            )
            for item in items
        ]

    async def create_conversation(self, row: ConversationRow, items: list[dict[str, Any]]) -> None:
        await self._write(
            (
                "INSERT INTO conversations (id, created_at, metadata) VALUES (?, ?, ?)",
                (row.id, row.created_at, _json(row.metadata)),
            ),
            *self._append_statements(row.id, items),
        )

    async def conversation(self, conversation_id: str) -> ConversationRow | None:
        rows = await self._read(
            "SELECT id, created_at, metadata FROM conversations WHERE id = ?", (conversation_id,)
        )
        if not rows:
            return None
        return ConversationRow(id=rows[0][0], created_at=rows[0][1], metadata=msgspec.json.decode(rows[0][2]))

    async def update_conversation(self, conversation_id: str, metadata: dict[str, str]) -> None:
        await self._write(
            ("UPDATE conversations SET metadata = ? WHERE id = ?", (_json(metadata), conversation_id))
        )

    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        rows = await self._read(
            "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
        )
        return [msgspec.json.decode(r[0]) for r in rows]

    async def append_items(self, conversation_id: str, items: list[dict[str, Any]]) -> None:
        await self._write(*self._append_statements(conversation_id, items))

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        rows = await self._read(f"SELECT 1 {_IN_CONVERSATION}", (conversation_id, item_id))
        if not rows:
            return False
        await self._write((f"DELETE {_IN_CONVERSATION}", (conversation_id, item_id)))
        return True

    async def delete_conversation(self, conversation_id: str) -> bool:
        if await self.conversation(conversation_id) is None:
            return False
        await self._write(
            ("DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,)),
            ("DELETE FROM conversations WHERE id = ?", (conversation_id,)),
        )
        return True


def store_of(runtime: Runtime) -> ResponseStore:
    return ResponseStore(runtime.ledger)


def not_found(response_id: str) -> BlazarError:
    return BlazarError(
        "NOT_FOUND",
        f"no stored response '{response_id}' — responses created with `store: false` are not kept, "
        "and a deleted one is gone",
    )


async def history_of(store: ResponseStore, req: ResponsesRequest) -> list[dict[str, Any]]:
    """The items a request continues: its ``previous_response_id`` chain or its conversation."""
    if req.previous_response_id is not None:
        items = await store.history(req.previous_response_id)
        if items is None:
            raise BlazarError(
                "NOT_FOUND",
                f"previous response '{req.previous_response_id}' is not stored — send the whole "
                "conversation as `input` instead",
            )
        return items
    if req.conversation is not None:
        if await store.conversation(req.conversation) is None:
            raise BlazarError(
                "NOT_FOUND", f"no conversation '{req.conversation}' — create it with POST /v1/conversations"
            )
        return await store.conversation_items(req.conversation)
    return []


def row_for(req: ResponsesRequest, body: bytes, doc: dict[str, Any]) -> ResponseRow:
    """The stored row of a response: the create body as sent, this turn's items, the Response."""
    return ResponseRow(
        id=doc["id"],
        created_at=float(doc["created_at"]),
        status=doc["status"],
        model=req.model,
        previous_response_id=req.previous_response_id,
        conversation_id=req.conversation,
        background=req.background,
        request=body,
        input_items=req.items,
        response=doc,
    )
