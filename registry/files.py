"""Atomic file writes: a reader sees the old file or the new one, never a mix, and once the
call returns the new one survives a crash of the machine.

Every write goes to a temp file in the target's directory (a hidden ``.NAME.XXXX.tmp``, on the
same filesystem, so the rename is atomic), which is flushed and fsynced, renamed over the
target with ``os.replace``, and then the directory is fsynced so that the rename itself is on
disk. The temp file is removed when anything fails, the caller's exception included.

``mode``: the new file's permission bits, set before a byte is written (a secret is never
readable by others, even for a moment); None: what ``open(path, "w")`` would give a new file
(0o666 less the umask). ``durable=False`` skips both fsyncs, for files that describe this
boot only (a pid file, the daemon's address): after a crash of the machine they are stale
anyway, and the rename alone keeps them whole.

A temp file outlives its write only when the process dies in the middle of it, or when the
unlink itself fails (some copy-on-write filesystems refuse even that once full):
``remove_stale_temps`` sweeps a store's folder of them when the daemon starts.

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "atomic_replace",
    "atomic_write",
    "atomic_writer",
    "fsync_dir",
    "remove_stale_temps",
    "shown_folder",
]

_TEMP = re.compile(r"\..+\.[0-9a-f]{8}\.tmp")
"""The name ``_open_temp`` gives a temp file: ``.NAME.XXXXXXXX.tmp``."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames and unlinks done in the directory ``path`` durable. Some filesystems
    (and some systems) refuse a directory's fd: that is harmless, and ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _open_temp(path: Path, mode: int | None) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666 if mode is None else 0o600)
        except FileExistsError:
            continue
        break
    if mode is not None:
        try:
            os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
    return fd, tmp


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str], *, mode: int | None = None, durable: bool = True
) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` when the
    ``with`` block ends without an exception, and is removed when it raises. The parent
    directory is created when missing."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _open_temp(target, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(target.parent)


def atomic_write(
    path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` (a ``str`` is written as UTF-8), atomically."""
    with atomic_writer(path, mode=mode, durable=durable) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def atomic_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename the finished file ``src`` (a download, a file an engine wrote) over ``dst`` in the
    same filesystem, durably: ``src``'s bytes are fsynced first, the directory after. ``src`` is
    left in place when the rename fails (``OSError`` with ``EXDEV`` across filesystems)."""
    with open(src, "rb") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def remove_stale_temps(folder: str | os.PathLike[str], *, min_age_s: float = 0.0) -> list[Path]:
    """Delete the temp files ``atomic_writer`` left under ``folder`` (at any depth) that were
    last written at least ``min_age_s`` ago (a folder another process may be writing into
    keeps its recent ones); returns what was removed. A missing folder has none."""
    removed: list[Path] = []
    cutoff = time.time() - min_age_s
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            if not _TEMP.fullmatch(name):
                continue
            path = Path(dirpath) / name
            with contextlib.suppress(OSError):
                if min_age_s <= 0 or path.lstat().st_mtime <= cutoff:
                    path.unlink()
                    removed.append(path)
    return removed


def shown_folder(folder: str | os.PathLike[str], data_dir: str | os.PathLike[str]) -> str:
    """``folder`` as a message names it without the machine's own paths: ``files/ in the data
    dir`` below the data dir, ``~/…`` below the home directory, else its last part."""
    path, root = Path(folder), Path(data_dir)
    with contextlib.suppress(ValueError):
        rel = path.relative_to(root)
        return "the data dir" if rel == Path() else f"{rel.as_posix()}/ in the data dir"
    with contextlib.suppress(ValueError, RuntimeError):
        return f"~/{path.relative_to(Path.home()).as_posix()}/"
    return f"the folder {path.name}/"
