"""One mapping from an exception to what the caller is told: status, code, message, Retry-After.

Every error Blazar raises on purpose carries a ``code``, a ``message`` and an
optional ``retry_after_s``: the gateway's own (``BlazarError``, a dialect's
``DecodeError``), the runtime's (``actors.errors``) and the model store's
(``registry.errors``). The gateway's error replies, the pull stream's error line
and the CLI's one-line failures all come from ``describe_error``, so an error
reads the same wherever it surfaces.

A full disk is an answer, not a bug, wherever it was hit: a write that knew what it
wrote raises ``registry.errors.DiskFull``; a bare ``OSError`` (``ENOSPC``, ``EDQUOT``) or
SQLite's "database or disk is full" that reaches here unnamed is answered 507
``DISK_FULL`` all the same.

Kept apart from ``blazar.errors``, which the sans-io dialects import: this module
knows the runtime's and the store's exception trees.
"""

from __future__ import annotations

import msgspec

from actors.errors import BlazarRuntimeError
from blazar.dialects.neutral import DecodeError
from blazar.errors import CATALOG, BlazarError, Dialect
from registry.errors import RegistryError, find_disk_full

__all__ = ["DISK_FULL_MESSAGE", "ErrorReply", "describe_error"]

DISK_FULL_MESSAGE = (
    "the disk is full: a write to the data dir could not be completed — free space on the disk "
    "holding the data dir, then retry"
)
"""What a full disk hit by a write that did not name itself answers."""


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    code: str
    message: str
    retry_after_s: float | None = None
    param: str | None = None
    """The request field to blame, where one is."""

    @property
    def retry_after(self) -> str | None:
        """The ``Retry-After`` header's value: whole seconds, at least one."""
        if self.retry_after_s is None:
            return None
        return str(max(1, round(self.retry_after_s)))


def describe_error(exc: BaseException, dialect: Dialect | None = None) -> ErrorReply | None:
    """The reply for an error raised on purpose; None for anything else (a bug).

    With ``dialect``, a ``BlazarError`` answers in the words that dialect's own API
    uses for the same refusal. A code missing from the catalog is a bug too, answered
    as ``INTERNAL`` with the error's own message."""
    param: str | None = None
    message = getattr(exc, "message", "")
    if isinstance(exc, BlazarError):
        code, retry_after_s, param = exc.code, exc.retry_after_s, exc.param
        if dialect is not None:
            message = exc.message_for(dialect)
    elif isinstance(exc, (BlazarRuntimeError, RegistryError)):
        # a runtime error about one field of the request names it (``actors.control.ControlRefused``)
        code, retry_after_s, param = exc.code, exc.retry_after_s, getattr(exc, "param", None)
    elif isinstance(exc, DecodeError):
        code, retry_after_s, param = exc.code, None, exc.param
    elif (full := find_disk_full(exc)) is not None:
        # a bare OSError or sqlite3 error, or a named one inside an exception group
        code, retry_after_s = "DISK_FULL", None
        named = getattr(full, "message", None) if getattr(full, "code", None) == "DISK_FULL" else None
        message = named or DISK_FULL_MESSAGE
    else:
        return None
    info = CATALOG.get(code) or CATALOG["INTERNAL"]
    return ErrorReply(
        status=info.status, code=info.code, message=message, retry_after_s=retry_after_s, param=param
    )
