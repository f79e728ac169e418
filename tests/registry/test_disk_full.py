"""What a full disk is, in the store's terms: one test for the errno (and SQLite) mapping, the
folder names a message may show, the temp-file sweep, and real writes on a full tmpfs."""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import time
from pathlib import Path

import msgspec
import pytest

from registry.errors import DiskFull, disk_full_as, find_disk_full, human_bytes, is_disk_full
from registry.files import atomic_write, remove_stale_temps, shown_folder
from registry.replica import BlobReceiver
from registry.store import ModelRecord, Store
from tests.support import fill_filesystem, small_filesystem


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (FileNotFoundError(errno.ENOENT, "No such file"), False),
        (sqlite3.OperationalError("database or disk is full"), True),
        (sqlite3.OperationalError("database is locked"), False),
        (DiskFull("the upload"), True),
        (ValueError("no"), False),
    ],
)
def test_which_errors_mean_a_full_disk(exc: BaseException, full: bool) -> None:
    assert is_disk_full(exc) is full


def test_a_full_disk_is_found_in_a_group_and_in_a_cause() -> None:
    leaf = OSError(errno.ENOSPC, "No space left on device")
    assert find_disk_full(ExceptionGroup("two", [ValueError("x"), leaf])) is leaf
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = leaf
    assert find_disk_full(wrapped) is leaf
    assert find_disk_full(ExceptionGroup("one", [ValueError("x")])) is None


def test_disk_full_as_names_the_write_and_lets_other_errors_through() -> None:
    with (
        pytest.raises(DiskFull) as caught,
        disk_full_as("the upload", where="files/ in the data dir", needed_bytes=3 << 20),
    ):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert caught.value.code == "DISK_FULL" and isinstance(caught.value.__cause__, OSError)
    assert caught.value.message == (
        "the disk is full: the upload (3.0 MiB) could not be written to files/ in the data dir — "
        "free space on the disk holding the data dir, then retry"
    )
    with pytest.raises(PermissionError), disk_full_as("the upload"):
        raise PermissionError(errno.EACCES, "Permission denied")
    inner = DiskFull("the blob", where="models/ in the data dir")
    with pytest.raises(DiskFull) as kept, disk_full_as("the upload"):
        raise inner
    assert kept.value is inner  # the write that knew itself better keeps its words


def test_sizes_read_as_people_read_them() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 << 20, 3 << 30)] == [
        "0 bytes",
        "1023 bytes",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]


def test_folders_are_named_without_the_machines_paths(tmp_path: Path) -> None:
    assert shown_folder(tmp_path / "files", tmp_path) == "files/ in the data dir"
    assert shown_folder(tmp_path / "models" / "partial", tmp_path) == "models/partial/ in the data dir"
    assert shown_folder(tmp_path, tmp_path) == "the data dir"
    assert shown_folder(Path.home() / ".cache" / "blazar", tmp_path / "elsewhere") == "~/.cache/blazar/"
    assert shown_folder("/srv/blazar/logs", tmp_path) == "the folder logs/"


def test_the_sweep_removes_temp_files_only(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    temps = [tmp_path / ".x.0123abcd.tmp", tmp_path / "a" / "b" / ".sha256-1.89abcdef.tmp"]
    kept = [tmp_path / "x", tmp_path / "a" / "notes.tmp", tmp_path / "a" / ".y.partial"]
    for path in temps + kept:
        path.write_bytes(b"1")
    young = tmp_path / ".young.00000000.tmp"
    young.write_bytes(b"1")
    old = time.time() - 7200
    for path in temps:
        os.utime(path, (old, old))
    assert sorted(remove_stale_temps(tmp_path, min_age_s=3600)) == sorted(temps)
    assert young.exists() and all(p.exists() for p in kept)
    assert remove_stale_temps(tmp_path) == [young]
    assert remove_stale_temps(tmp_path / "missing") == []


def test_real_writes_on_a_full_disk(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "home", "2m") as home:
        store = Store(home / "models")
        (home / "models" / "manifests").mkdir(parents=True)
        (home / "models" / "partial").mkdir()
        filler = fill_filesystem(home)

        # an atomic write that cannot be written leaves no temp file behind
        with pytest.raises(OSError) as plain:
            atomic_write(home / "files" / "x", b"y" * 100_000)
        assert plain.value.errno == errno.ENOSPC
        assert not list(home.rglob("*.tmp"))

        # the store names the manifest and its folder, never the machine's path
        now = time.time()
        record = ModelRecord(
            name="m", digest="sha256:" + "0" * 64, size=1, path="x", created_at=now, modified_at=now,
            source="test " + "s" * 20_000,
        )  # fmt: skip
        with pytest.raises(DiskFull) as manifest:
            store.write_manifest(record)
        assert "the manifest of 'm'" in manifest.value.message
        assert "models/manifests/ in the data dir" in manifest.value.message
        assert str(home) not in manifest.value.message and not list(home.rglob("*.tmp"))

        # an Ollama blob upload: DiskFull with the size the sender announced, no partial file
        data = b"z" * 300_000
        sha = hashlib.sha256(data).hexdigest()
        with pytest.raises(DiskFull) as blob, BlobReceiver(store, sha, expected_bytes=len(data)) as receiver:
            receiver.write(data)
            receiver.finish()
        assert f"the blob sha256:{sha[:12]}" in blob.value.message and "(293.0 KiB)" in blob.value.message
        assert "models/partial/ in the data dir" in blob.value.message
        assert not list((home / "models" / "partial").iterdir())

        filler.unlink()
        store.write_manifest(record)  # with space, the same write holds
        assert msgspec.json.decode((home / "models" / "manifests" / "m.json").read_bytes())["name"] == "m"
