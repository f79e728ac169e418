"""Saved prompt caches of llama.cpp slots: named sessions and the automatic bank.

llama.cpp's server writes a slot's KV cache (and the tokens it holds) to a file
under its ``--slot-save-path`` (``POST /slots/{id}?action=save``) and reads it
back into a slot (``action=restore``). Each model gets its own folder,
``<home>/sessions/<model>/``; a session is ``NAME.bin`` with ``NAME.json``
beside it: the model's digest, the tokens saved and the per-slot context, so a
session is never restored into another model's weights.

Names that start with ``_auto-`` belong to the bank: on a graceful stop the
engine saves every warm slot as ``_auto-<ctx>-<slot>`` and restores them into
the same slots at its next start, at the same per-slot context only.

Blocking file work is small (a JSON per session); async callers may run the
listing in a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from actors.errors import BlazarRuntimeError, SessionError
from registry.files import atomic_write

if TYPE_CHECKING:
    import httpx

__all__ = [
    "AUTO_PREFIX",
    "SessionInfo",
    "bank_on_stop",
    "bank_slots",
    "check_name",
    "find_sessions",
    "list_sessions",
    "model_dir",
    "read_session",
    "remove_session",
    "restore_bank",
    "restore_on_start",
    "restore_slot",
    "save_slot",
    "save_warmest",
    "sessions_root",
]

log = logging.getLogger("blazar.sessions")

AUTO_PREFIX = "_auto-"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SLOT_TIMEOUT_S = 60.0
_BANK_S = 3.0
"""The most a graceful stop waits for the slot bank to be written (or a start to read it)."""


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    model: str
    digest: str
    """The model's digest (``sha256:…``) when it was saved: a restore into other weights is refused."""
    tokens: int
    """Tokens of prompt cache the file holds."""
    ctx_per_slot: int
    """The per-slot context of the engine that saved it."""
    bytes: int
    created_at: float
    slot: int
    """The slot it was saved from."""
    auto: bool = False
    """Saved by the bank on a graceful stop (restored at the next start)."""


def sessions_root(home: str | os.PathLike[str]) -> Path:
    return Path(home) / "sessions"


def model_dir(home: str | os.PathLike[str], model: str) -> Path:
    """``<home>/sessions/<model>/`` (a ``/`` in the name becomes ``_``)."""
    return sessions_root(home) / model.replace("/", "_")


def check_name(name: str) -> str:
    """``name`` when it may name a session (the ``_auto-`` names are the bank's)."""
    if not _NAME.fullmatch(name):
        raise SessionError(
            "BAD_REQUEST",
            f"invalid session name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit",
        )
    return name


def _meta_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.json"


def _write_meta(directory: Path, info: SessionInfo) -> None:
    atomic_write(_meta_path(directory, info.name), msgspec.json.encode(info))


def read_session(directory: Path, name: str) -> SessionInfo | None:
    """The session ``name`` saved in ``directory``, or None (absent, or its file is gone)."""
    try:
        info = msgspec.json.decode(_meta_path(directory, name).read_bytes(), type=SessionInfo)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return info if (directory / f"{name}.bin").is_file() else None


def list_sessions(home: str | os.PathLike[str], model: str | None = None) -> list[SessionInfo]:
    """Every saved session (of ``model`` only, when given), the bank's included, by model and name."""
    root = sessions_root(home)
    folders = [model_dir(home, model)] if model else sorted(p for p in root.glob("*") if p.is_dir())
    found: list[SessionInfo] = []
    for folder in folders:
        for meta in sorted(folder.glob("*.json")):
            info = read_session(folder, meta.stem)
            if info is not None:
                found.append(info)
    return found


def find_sessions(home: str | os.PathLike[str], name: str, model: str | None = None) -> list[SessionInfo]:
    return [s for s in list_sessions(home, model) if s.name == name]


def remove_session(home: str | os.PathLike[str], name: str, model: str | None = None) -> SessionInfo:
    """Delete the session ``name`` (of ``model``; any model's when only one has that name)."""
    matches = find_sessions(home, name, model)
    if not matches:
        where = f" of model '{model}'" if model else ""
        raise SessionError("SESSION_NOT_FOUND", f"no session '{name}'{where} — see `blazar session list`")
    if len(matches) > 1:
        models = ", ".join(s.model for s in matches)
        raise SessionError(
            "BAD_REQUEST", f"several models have a session '{name}' ({models}): name the model with --model"
        )
    info = matches[0]
    _unlink(model_dir(home, info.model), name)
    return info


async def _slot_action(client: httpx.AsyncClient, slot: int, action: str, filename: str) -> dict[str, object]:
    import httpx

    try:
        resp = await client.post(
            f"/slots/{slot}", params={"action": action}, json={"filename": filename}, timeout=_SLOT_TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        raise SessionError("SESSION_FAILED", f"the engine did not answer the slot {action}: {exc}") from exc
    if resp.status_code != 200:
        try:
            detail = resp.json().get("error", {}).get("message") or resp.text
        except ValueError:
            detail = resp.text
        raise SessionError(
            "SESSION_FAILED", f"the engine refused to {action} slot {slot}: {str(detail)[:300]}"
        )
    doc = resp.json()
    return doc if isinstance(doc, dict) else {}


async def save_slot(
    client: httpx.AsyncClient,
    directory: Path,
    *,
    slot: int,
    name: str,
    model: str,
    digest: str,
    ctx_per_slot: int,
    auto: bool = False,
) -> SessionInfo | None:
    """Save ``slot``'s cache as ``name`` in ``directory`` (the engine's save path); None (and no
    file left) when the slot holds nothing."""
    doc = await _slot_action(client, slot, "save", f"{name}.bin")
    tokens = int(doc.get("n_saved") or 0)  # type: ignore[call-overload]
    info = SessionInfo(
        name=name,
        model=model,
        digest=digest,
        tokens=tokens,
        ctx_per_slot=ctx_per_slot,
        bytes=int(doc.get("n_written") or 0),  # type: ignore[call-overload]
        created_at=time.time(),
        slot=slot,
        auto=auto,
    )
    return await trio.to_thread.run_sync(_keep_saved, directory, info)


def _keep_saved(directory: Path, info: SessionInfo) -> SessionInfo | None:
    binary = directory / f"{info.name}.bin"
    if info.tokens <= 0:
        _unlink(directory, info.name)
        return None
    if binary.is_file():
        info = msgspec.structs.replace(info, bytes=binary.stat().st_size)
    _write_meta(directory, info)
    return info


def _unlink(directory: Path, name: str, suffixes: tuple[str, ...] = (".bin", ".json")) -> None:
    for suffix in suffixes:
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{name}{suffix}").unlink()


async def restore_slot(client: httpx.AsyncClient, *, slot: int, name: str) -> int:
    """Read the session file ``name`` into ``slot``; the tokens restored."""
    doc = await _slot_action(client, slot, "restore", f"{name}.bin")
    return int(doc.get("n_restored") or 0)  # type: ignore[call-overload]


def _clear_bank(directory: Path) -> None:
    for old in directory.glob(f"{AUTO_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):
            old.unlink()


def _bank_name(ctx_per_slot: int, slot: int) -> str:
    return f"{AUTO_PREFIX}{ctx_per_slot}-{slot}"


async def bank_slots(
    client: httpx.AsyncClient, directory: Path, *, slots: int, model: str, digest: str, ctx_per_slot: int
) -> list[SessionInfo]:
    """Save every warm slot as the bank (``_auto-<ctx>-<slot>``), replacing the previous bank."""
    await trio.to_thread.run_sync(_clear_bank, directory)
    banked = []
    for slot in range(slots):
        info = await save_slot(
            client,
            directory,
            slot=slot,
            name=_bank_name(ctx_per_slot, slot),
            model=model,
            digest=digest,
            ctx_per_slot=ctx_per_slot,
            auto=True,
        )
        if info is not None:
            banked.append(info)
    return banked


async def restore_bank(
    client: httpx.AsyncClient, directory: Path, *, slots: int, digest: str, ctx_per_slot: int
) -> int:
    """Restore the bank saved at ``ctx_per_slot`` into the slots it came from; the tokens restored.

    A bank of other weights (the model was pulled again) is deleted, not restored."""
    restored = 0
    for slot in range(slots):
        name = _bank_name(ctx_per_slot, slot)
        info = await trio.to_thread.run_sync(read_session, directory, name)
        if info is None:
            continue
        if info.digest != digest:
            log.info("dropping the bank %s/%s: saved from other weights", directory.name, name)
            await trio.to_thread.run_sync(_unlink, directory, name)
            continue
        restored += await restore_slot(client, slot=slot, name=name)
    return restored


async def bank_on_stop(
    client: httpx.AsyncClient,
    directory: Path,
    *,
    who: str,
    slots: int,
    model: str,
    digest: str,
    ctx_per_slot: int,
) -> None:
    """An engine's graceful stop: bank its warm slots, shielded and bounded; a failure is logged."""
    with trio.move_on_after(_BANK_S, shield=True):
        try:
            banked = await bank_slots(
                client, directory, slots=slots, model=model, digest=digest, ctx_per_slot=ctx_per_slot
            )
        except (BlazarRuntimeError, OSError) as exc:
            log.warning("%s: the slot bank was not saved: %s", who, exc)
            return
        if banked:
            tokens = sum(b.tokens for b in banked)
            log.info("%s: banked %d slots (%d tokens) of prompt cache", who, len(banked), tokens)


async def restore_on_start(
    client: httpx.AsyncClient, directory: Path, *, who: str, slots: int, digest: str, ctx_per_slot: int
) -> int | None:
    """An engine's start: read back the bank saved at the same per-slot context, bounded; the
    tokens restored (None: the bank could not be read)."""
    with trio.move_on_after(_BANK_S):
        try:
            restored = await restore_bank(
                client, directory, slots=slots, digest=digest, ctx_per_slot=ctx_per_slot
            )
        except BlazarRuntimeError as exc:
            log.warning("%s: the slot bank was not restored: %s", who, exc)
            return None
        if restored:
            log.info("%s: restored %d tokens of prompt cache from the bank", who, restored)
        return restored
    return None


async def save_warmest(
    client: httpx.AsyncClient,
    directory: Path,
    *,
    slots: int,
    name: str,
    model: str,
    digest: str,
    ctx_per_slot: int,
) -> SessionInfo:
    """Save the slot holding the longest prompt cache as ``name`` (llama.cpp's ``/slots`` does not
    say how much each holds: every slot is saved, the largest kept)."""
    stem = f"pick-{secrets.token_hex(4)}"
    saved: list[SessionInfo] = []
    try:
        for slot in range(slots):
            info = await save_slot(
                client, directory, slot=slot, name=f"{stem}-{slot}", model=model, digest=digest,
                ctx_per_slot=ctx_per_slot,
            )  # fmt: skip
            if info is not None:
                saved.append(info)
        if not saved:
            raise SessionError(
                "SESSION_EMPTY",
                f"no slot of '{model}' holds a prompt cache yet — send it a request, then save",
            )
        best = max(saved, key=lambda s: s.tokens)
        final = msgspec.structs.replace(best, name=name, created_at=time.time())
        await trio.to_thread.run_sync(_rename, directory, best.name, final)
        return final
    finally:
        with trio.CancelScope(shield=True):
            for info in saved:
                await trio.to_thread.run_sync(_unlink, directory, info.name)


def _rename(directory: Path, temporary: str, final: SessionInfo) -> None:
    os.replace(directory / f"{temporary}.bin", directory / f"{final.name}.bin")
    _write_meta(directory, final)
