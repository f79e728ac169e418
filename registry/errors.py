"""The registry's exception tree; each error carries the stable ``code`` the gateway serves."""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from collections.abc import Iterator

__all__ = [
    "AdapterMismatch",
    "AdapterNotFound",
    "AlreadyQuantized",
    "ChecksumMismatch",
    "ControlVectorMismatch",
    "ControlVectorNotFound",
    "DiskFull",
    "InsufficientStorage",
    "InvalidAdapter",
    "InvalidControlVector",
    "InvalidModelFile",
    "InvalidModelName",
    "ModelExists",
    "ModelFileIncomplete",
    "ModelKindMismatch",
    "ModelNotFound",
    "PullFailed",
    "QuantizeFailed",
    "QuantizeToolMissing",
    "RegistryError",
    "disk_full_as",
    "find_disk_full",
    "human_bytes",
    "is_disk_full",
]


class RegistryError(Exception):
    """Base of every error the model store raises on purpose: a ``code`` (``blazar_code``),
    a ``message`` that says what to do next and, where waiting helps, ``retry_after_s``."""

    code: str = "BAD_REQUEST"
    retry_after_s: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFound(RegistryError):
    code = "MODEL_NOT_FOUND"

    def __init__(self, name: str, message: str | None = None) -> None:
        self.name = name
        super().__init__(
            message or f"model '{name}' is not installed — run `blazar pull {name}` or see `blazar list`"
        )


class ModelKindMismatch(RegistryError):
    """A model sent to a route of another kind: a speech model to chat, a chat model to speech."""

    code = "MODEL_KIND_MISMATCH"

    def __init__(self, name: str, kind: str, message: str) -> None:
        self.name = name
        self.kind = kind
        super().__init__(message)


class ModelExists(RegistryError):
    code = "MODEL_EXISTS"

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"a model called '{name}' already exists — pick another name or `blazar rm {name}` first"
        )


class InvalidModelName(RegistryError):
    code = "BAD_REQUEST"


class InvalidModelFile(RegistryError):
    code = "BAD_REQUEST"


class ModelFileIncomplete(InvalidModelFile):
    """A GGUF file shorter than its own header says: a download or copy that stopped early."""

    code = "MODEL_FILE_INCOMPLETE"

    def __init__(self, what: str, *, expected: int, found: int, advice: str = "re-download it") -> None:
        self.expected = expected
        self.found = found
        super().__init__(f"{what} is incomplete (expected {expected} bytes, found {found}) — {advice}")


class PullFailed(RegistryError):
    code = "BAD_GATEWAY"


class ChecksumMismatch(PullFailed):
    pass


class QuantizeToolMissing(RegistryError):
    """``blazar quantize`` was asked for what only llama.cpp's quantizer writes (a type the
    ``gguf`` package cannot write, an importance matrix), and it is not installed."""

    code = "QUANTIZE_TOOL_MISSING"


class AlreadyQuantized(RegistryError):
    """``blazar quantize`` of a model whose weights are quantized already, without
    ``--allow-requantize``: a second rounding on top of the first."""

    code = "ALREADY_QUANTIZED"


class QuantizeFailed(RegistryError):
    """llama.cpp's quantizer ran and failed; the message holds its last words."""

    code = "QUANTIZE_FAILED"


class InsufficientStorage(RegistryError):
    """Refused up front: what is to be written needs more than the disk has free."""

    code = "INSUFFICIENT_STORAGE"


class DiskFull(InsufficientStorage):
    """A write that found the disk full (``ENOSPC``, a quota's ``EDQUOT``, SQLite's
    ``SQLITE_FULL``): the message says what was being written, about how much, where (a
    folder named from the data dir, never an absolute path) and what to do.

    Every layer raises it (the model store, the runtime's ledger and jobs, the gateway's
    stores), so it lives in the lowest one; ``disk_full_as`` makes one from an ``OSError``
    or a ``sqlite3`` error, and ``blazar.errors.describe`` answers it 507 ``DISK_FULL``."""

    code = "DISK_FULL"

    def __init__(
        self,
        what: str,
        *,
        where: str = "the data dir",
        needed_bytes: int | None = None,
        holder: str = "the data dir",
    ) -> None:
        self.what = what
        self.where = where
        self.needed_bytes = needed_bytes
        self.holder = holder
        size = f" ({human_bytes(needed_bytes)})" if needed_bytes else ""
        self.fact = f"the disk is full: {what}{size} could not be written to {where}"
        """What happened, without the advice: for a caller that gives its own."""
        super().__init__(f"{self.fact} — free space on the disk holding {holder}, then retry")


class InvalidAdapter(RegistryError):
    """A file given as a LoRA adapter that is not one (not GGUF, or not ``adapter.type = lora``)."""

    code = "LORA_INVALID"


class AdapterMismatch(RegistryError):
    """A LoRA adapter made for another base model: its architecture or its tensors' shapes differ."""

    code = "LORA_MISMATCH"


class AdapterNotFound(RegistryError):
    """A model has no adapter of that name (or number)."""

    code = "LORA_NOT_FOUND"


class InvalidControlVector(RegistryError):
    """A file given as a control vector that is not one (not GGUF, not ``controlvector``, or
    its ``direction.N`` tensors are not flat 32-bit floats of one width)."""

    code = "CONTROL_VECTOR_INVALID"


class ControlVectorMismatch(RegistryError):
    """A control vector that does not fit a model: another width, or layers it lacks."""

    code = "CONTROL_VECTOR_MISMATCH"


class ControlVectorNotFound(RegistryError):
    """A model has no control vector of that name."""

    code = "CONTROL_VECTOR_NOT_FOUND"


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def human_bytes(n: int) -> str:
    """``n`` bytes for a message: ``512 bytes``, ``1.5 KiB``, ``3.2 MiB``, ``4.0 GiB``."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full: an ``OSError`` with
    ``ENOSPC`` or ``EDQUOT``, a ``sqlite3`` error with ``SQLITE_FULL`` ("database or disk is
    full"), or an error that already carries the code ``DISK_FULL``."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return getattr(exc, "code", None) == "DISK_FULL"


def find_disk_full(exc: BaseException) -> BaseException | None:
    """The disk-full error in ``exc``: itself, a leaf of an exception group, or a cause."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        elif is_disk_full(e):
            return e
        if e.__cause__ is not None:
            todo.append(e.__cause__)
    return None


@contextlib.contextmanager
def disk_full_as(
    what: str, *, where: str = "the data dir", needed_bytes: int | None = None, holder: str = "the data dir"
) -> Iterator[None]:
    """Raise ``DiskFull`` (naming ``what``, ``where`` and ``needed_bytes``) for a write in the
    block that finds the disk full; any other error goes through unchanged, and so does a
    ``DiskFull`` raised inside, which knows its write better."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise DiskFull(what, where=where, needed_bytes=needed_bytes, holder=holder) from exc
