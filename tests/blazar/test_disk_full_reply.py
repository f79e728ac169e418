"""A full disk is answered 507 ``DISK_FULL`` in each dialect's shape, however it reached the
gateway (named by its write, or a bare errno or SQLite error); the daemon's log file survives
a full disk and says so on stderr once."""

from __future__ import annotations

import errno
import logging
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.errors import LedgerError
from blazar.daemon.serve import LogFile
from blazar.errors import CATALOG
from blazar.errors.describe import DISK_FULL_MESSAGE, describe_error
from blazar.web.asgi.call import Call
from blazar.web.asgi.replies import exception_reply
from registry.errors import DiskFull
from tests.support import fill_filesystem, small_filesystem

NAMED = DiskFull("the upload", where="files/ in the data dir", needed_bytes=2048)


def test_disk_full_is_a_catalogued_507() -> None:
    assert CATALOG["DISK_FULL"].status == 507
    assert CATALOG["INSUFFICIENT_STORAGE"].status == 507  # the up-front refusal keeps its code


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (NAMED, NAMED.message),
        (LedgerError("the disk is full: the ledger's new records …", code="DISK_FULL"), None),
        (
            OSError(errno.ENOSPC, "No space left on device", "/home/someone/.local/share/blazar/x"),
            DISK_FULL_MESSAGE,
        ),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), DISK_FULL_MESSAGE),
        (sqlite3.OperationalError("database or disk is full"), DISK_FULL_MESSAGE),
        (ExceptionGroup("tasks", [ValueError("other"), NAMED]), NAMED.message),
    ],
)
def test_every_shape_of_a_full_disk_is_one_answer(exc: Exception, message: str | None) -> None:
    reply = describe_error(exc)
    assert reply is not None and (reply.status, reply.code) == (507, "DISK_FULL")
    assert reply.message == (message if message is not None else exc.args[0])
    assert "/home/" not in reply.message


def test_other_os_errors_stay_bugs() -> None:
    assert describe_error(OSError(errno.EACCES, "Permission denied")) is None
    assert describe_error(sqlite3.OperationalError("database is locked")) is None


def _reply(path: str, exc: Exception, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, Any]:
    call = Call({"method": "POST", "path": path, "headers": headers or []}, trace_id="t", max_body=1)
    reply = exception_reply(call, exc)
    assert isinstance(reply.body, bytes)
    return reply.status, msgspec.json.decode(reply.body)


def test_each_dialect_gets_its_own_shape() -> None:
    status, body = _reply("/v1/files", NAMED)
    assert status == 507
    assert body == {
        "error": {
            "message": NAMED.message,
            "type": "blazar_error",
            "code": "disk_full",
            "blazar_code": "DISK_FULL",
        }
    }
    status, body = _reply("/api/blobs/sha256:00", OSError(errno.ENOSPC, "No space left on device"))
    assert (status, body) == (507, {"error": DISK_FULL_MESSAGE, "blazar_code": "DISK_FULL"})
    status, body = _reply("/v1/messages", NAMED, [(b"anthropic-version", b"2023-06-01")])
    assert status == 507 and body["type"] == "error"
    assert body["error"] == {"type": "api_error", "message": NAMED.message, "blazar_code": "DISK_FULL"}


def test_the_log_file_survives_a_full_disk_and_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with small_filesystem(tmp_path / "logs", "1m") as logs:
        handler = LogFile(str(logs / "daemon.log"), max_bytes=10 << 20, backups=1, shown="the daemon log (x)")
        log = logging.getLogger("test.disk_full.log")
        log.propagate, log.level = False, logging.INFO
        log.addHandler(handler)
        try:
            log.info("before")
            filler = fill_filesystem(logs)
            for n in range(50):
                log.info("line %d %s", n, "x" * 4096)
            err = capsys.readouterr().err
            assert err.count("blazar: cannot write the daemon log (x)") == 1, err
            assert "Traceback" not in err and "Logging error" not in err
            filler.unlink()
            log.info("after")
            err = capsys.readouterr().err
            assert "blazar: writing the daemon log (x) again" in err
            handler.flush()
            text = (logs / "daemon.log").read_text()
            assert "before" in text and "after" in text
        finally:
            log.removeHandler(handler)
            handler.close()
