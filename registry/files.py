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

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_replace", "atomic_write", "atomic_writer", "fsync_dir"]


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
