"""Stored chat completions (OpenAI ``store: true``), in the ledger's SQLite file.

As with stored responses (``blazar.serve.stores.responses``), writes go through the ledger actor
and are committed before they return; reads use their own read-only connection in a
worker thread. Each row names the key that made it: a key lists and reads only its own
completions, an admin key (and the daemon's local token, or a daemon without keys) all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec
import trio

from actors.ledger import LedgerActor, Write, read_rows
from actors.runtime import Runtime
from blazar.auth.keys import ADMIN, Key
from blazar.dialects.neutral import DecodeError
from blazar.errors import BlazarError

__all__ = ["CompletionStore", "StoredCompletion", "Viewer", "completions_of", "not_found"]

_json = msgspec.json.encode


class Viewer(msgspec.Struct, frozen=True):
    """Who asks: ``owner`` is the key's name; ``everything`` for an admin (or no key at all)."""

    owner: str | None
    everything: bool

    @classmethod
    def of(cls, key_name: str | None, grant: Key | None) -> Viewer:
        return cls(key_name, grant is None or grant.allows_family(ADMIN))

    def sees(self, owner: str | None) -> bool:
        return self.everything or owner == self.owner


class StoredCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    created_at: float
    model: str
    owner: str | None
    metadata: dict[str, str]
    messages: list[dict[str, Any]]
    completion: dict[str, Any]

    def view(self) -> dict[str, Any]:
        """The completion object as the stored-completion routes serve it."""
        return {**self.completion, "metadata": self.metadata}


_COLUMNS = "id, created_at, model, owner, metadata, messages, completion"


def _row(row: tuple[Any, ...]) -> StoredCompletion:
    return StoredCompletion(
        id=row[0],
        created_at=row[1],
        model=row[2],
        owner=row[3],
        metadata=msgspec.json.decode(row[4]),
        messages=msgspec.json.decode(row[5]),
        completion=msgspec.json.decode(row[6]),
    )


class CompletionStore:
    def __init__(self, ledger: LedgerActor) -> None:
        self._ledger = ledger
        self._path: Path = ledger.path

    async def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return await trio.to_thread.run_sync(read_rows, self._path, sql, params)

    async def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        await self._ledger.ask(Write(statements=((sql, params),)))

    async def put(self, row: StoredCompletion) -> None:
        await self._write(
            f"INSERT OR REPLACE INTO chat_completions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                row.created_at,
                row.model,
                row.owner,
                _json(row.metadata),
                _json(row.messages),
                _json(row.completion),
            ),
        )

    async def get(self, completion_id: str, viewer: Viewer) -> StoredCompletion | None:
        rows = await self._read(f"SELECT {_COLUMNS} FROM chat_completions WHERE id = ?", (completion_id,))
        if not rows:
            return None
        row = _row(rows[0])
        return row if viewer.sees(row.owner) else None  # another key's: as if it did not exist

    async def update_metadata(self, completion_id: str, metadata: dict[str, str]) -> None:
        await self._write(
            "UPDATE chat_completions SET metadata = ? WHERE id = ?", (_json(metadata), completion_id)
        )

    async def delete(self, completion_id: str) -> None:
        await self._write("DELETE FROM chat_completions WHERE id = ?", (completion_id,))

    async def page(
        self,
        viewer: Viewer,
        *,
        model: str | None,
        metadata: dict[str, str],
        after: str | None,
        limit: int,
        order: Literal["asc", "desc"],
    ) -> tuple[list[StoredCompletion], bool]:
        """One page of the completions ``viewer`` sees, oldest first for ``asc``, and
        whether more follow."""
        where: list[str] = ["1 = 1"]
        params: list[str | None] = []
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if not viewer.everything:
            where.append("owner IS ?")
            params.append(viewer.owner)
        direction = "ASC" if order == "asc" else "DESC"
        keys = await self._read(
            f"SELECT seq, id, metadata FROM chat_completions WHERE {' AND '.join(where)} "
            f"ORDER BY seq {direction}",
            tuple(params),
        )
        if metadata:
            keys = [k for k in keys if _matches(msgspec.json.decode(k[2]), metadata)]
        ids = [k[1] for k in keys]
        if after is not None:
            if after not in ids:
                raise DecodeError(
                    f"invalid query `after`: no stored chat completion {after!r} in this list", param="after"
                )
            ids = ids[ids.index(after) + 1 :]
        page, more = ids[:limit], len(ids) > limit
        if not page:
            return [], more
        marks = ", ".join("?" * len(page))
        rows = await self._read(f"SELECT {_COLUMNS} FROM chat_completions WHERE id IN ({marks})", tuple(page))
        found = {r[0]: _row(r) for r in rows}
        return [found[i] for i in page if i in found], more


def _matches(have: dict[str, str], want: dict[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def completions_of(runtime: Runtime) -> CompletionStore:
    return CompletionStore(runtime.ledger)


def not_found(completion_id: str) -> BlazarError:
    return BlazarError(
        "NOT_FOUND",
        f"no stored chat completion '{completion_id}' — only completions created with `store: true` "
        "are kept, each visible to the key that made it; a deleted one is gone",
    )
