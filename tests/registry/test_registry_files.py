from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import registry.files as files_mod
from registry.files import atomic_replace, atomic_write, atomic_writer, fsync_dir


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Every fsync as ``(inode, is a directory)``, the real one still done."""
    calls: list[tuple[int, bool]] = []
    real = os.fsync

    def record(fd: int) -> None:
        st = os.fstat(fd)
        calls.append((st.st_ino, stat.S_ISDIR(st.st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_writes_bytes_and_text_creating_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "data.bin"
    atomic_write(target, b"\x00\x01bytes")
    assert target.read_bytes() == b"\x00\x01bytes"
    atomic_write(target, "texte accentué")
    assert target.read_bytes() == "texte accentué".encode()
    assert _listing(target.parent) == ["data.bin"]


def test_the_target_is_replaced_never_written_in_place(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    before = target.stat().st_ino
    with open(target, "rb") as reader:
        with atomic_writer(target) as f:
            f.write(b"new")
            f.flush()
            assert target.read_bytes() == b"old"  # nothing visible before the block ends
        assert reader.read() == b"old"  # a reader of the old file keeps reading it whole
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != before  # a new file renamed over the old one
    assert _listing(tmp_path) == ["state.json"]


def test_the_file_and_its_folder_are_fsynced(tmp_path: Path, synced: list[tuple[int, bool]]) -> None:
    target = tmp_path / "durable.json"
    atomic_write(target, b"{}")
    assert (target.stat().st_ino, False) in synced
    assert (tmp_path.stat().st_ino, True) in synced
    # The file before the rename, the folder after it.
    assert synced.index((target.stat().st_ino, False)) < synced.index((tmp_path.stat().st_ino, True))


def test_durable_false_skips_the_fsyncs(tmp_path: Path, synced: list[tuple[int, bool]]) -> None:
    atomic_write(tmp_path / "run.pid", "123\n", durable=False)
    assert (tmp_path / "run.pid").read_text() == "123\n"
    assert synced == []


def test_a_failing_block_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("original")
    with pytest.raises(RuntimeError, match="midway"), atomic_writer(target) as f:
        f.write(b"half of the new")
        raise RuntimeError("midway")
    assert target.read_text() == "original"
    assert _listing(tmp_path) == ["keep.txt"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failing_fsync_or_rename_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("original")

    def refuse(*args: object) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, failing, refuse)
    with pytest.raises(OSError, match="I/O error"):
        atomic_write(target, b"new")
    assert target.read_text() == "original"
    assert _listing(tmp_path) == ["keep.txt"]


def test_a_new_file_without_a_mode_gets_what_open_gives(tmp_path: Path, umask_022: None) -> None:
    atomic_write(tmp_path / "plain", b"x")
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o644


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_the_mode_is_honoured_whatever_the_umask(tmp_path: Path, mode: int) -> None:
    old = os.umask(0o077)
    try:
        atomic_write(tmp_path / "secret", b"key", mode=mode)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == mode


def test_a_secret_is_never_readable_by_others(tmp_path: Path, umask_022: None) -> None:
    target = tmp_path / "token"
    target.write_text("old")
    target.chmod(0o644)
    with atomic_writer(target, mode=0o600) as f:
        (temp,) = [p for p in tmp_path.iterdir() if p.name != "token"]
        assert stat.S_IMODE(temp.stat().st_mode) == 0o600  # before a byte is written
        f.write(b"new")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_replace_renames_a_finished_file_durably(
    tmp_path: Path, synced: list[tuple[int, bool]]
) -> None:
    work = tmp_path / "download.partial"
    work.write_bytes(b"all of it")
    inode = work.stat().st_ino
    target = tmp_path / "blob"
    target.write_bytes(b"older")
    atomic_replace(work, target)
    assert target.read_bytes() == b"all of it" and not work.exists()
    assert synced.index((inode, False)) < synced.index((tmp_path.stat().st_ino, True))


def test_fsync_dir_ignores_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refuse)
    fsync_dir(tmp_path)  # no error
    fsync_dir(tmp_path / "missing")


def test_temp_names_are_hidden_and_do_not_collide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "x.json"
    names = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(files_mod.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".x.json.aaaa.tmp").write_bytes(b"someone else's")
    with atomic_writer(target) as f:
        assert (tmp_path / ".x.json.bbbb.tmp").exists()
        f.write(b"mine")
    assert (tmp_path / ".x.json.aaaa.tmp").read_bytes() == b"someone else's"
    assert target.read_bytes() == b"mine"
