"""``blazar/ops/snapshot.py`` on real files: SQLite copies, manifests, refusals (no daemon, no engine)."""

from __future__ import annotations

import io
import sqlite3
import tarfile
from pathlib import Path

import pytest

from blazar.auth.keys import KeyStore, keys_path
from blazar.config import resolve_paths
from blazar.ops.snapshot import SnapshotError, home_in_use, make_snapshot, restore_snapshot
from registry.store import Store
from tests.support import MODEL, make_home


def _paths(home: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    return resolve_paths()


def test_snapshot_round_trip_reuses_the_blobs(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = make_home(tmp_path / "old", model_path, config="slots = 2\n")
    _, secret = KeyStore(keys_path(old)).add("ci")
    ledger = sqlite3.connect(old / "blazar.db")
    ledger.execute("PRAGMA journal_mode=WAL")
    ledger.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT)")
    ledger.execute("INSERT INTO jobs VALUES ('job_1', 'completed')")
    ledger.commit()  # left open: the row may still be only in the WAL
    (old / "jobs" / "job_1").mkdir(parents=True)
    (old / "jobs" / "job_1" / "result.json").write_text('{"ok": true}')
    archive = tmp_path / "snap.tar.gz"
    info = make_snapshot(_paths(old, monkeypatch), archive)
    ledger.close()
    assert [m.name for m in info.models] == [MODEL] and info.databases == ["blazar.db", "keys.db"]

    fresh = tmp_path / "fresh"
    paths = _paths(fresh, monkeypatch)
    pulled: list[str] = []
    _, outcomes = restore_snapshot(paths, archive, pull=pulled.append)
    assert [(o.name, o.how) for o in outcomes] == [(MODEL, "reused")] and pulled == []
    record = Store(fresh / "models").get(MODEL)
    assert Path(record.path).is_relative_to(fresh) and Path(record.path).stat().st_size > 0
    assert (fresh / "config.toml").read_text() == "slots = 2\n"
    rows = sqlite3.connect(fresh / "blazar.db").execute("SELECT id, state FROM jobs").fetchall()
    assert rows == [("job_1", "completed")]
    assert (fresh / "jobs" / "job_1" / "result.json").read_text() == '{"ok": true}'
    assert [k.name for k in KeyStore(keys_path(fresh)).list()] == ["ci"] and secret

    assert home_in_use(paths) == ["blazar.db", "keys.db", "config.toml", "models"]
    with pytest.raises(SnapshotError, match="not empty"):
        restore_snapshot(paths, archive)
    restore_snapshot(paths, archive, force=True)


def test_a_model_whose_files_are_gone_is_pulled_or_reported(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = make_home(tmp_path / "old", model_path)
    archive = tmp_path / "snap.tar.gz"
    make_snapshot(_paths(old, monkeypatch), archive)
    for blob in (old / "models" / "blobs").iterdir():
        blob.unlink()
    pulled: list[str] = []
    _, outcomes = restore_snapshot(_paths(tmp_path / "a", monkeypatch), archive, pull=pulled.append)
    assert pulled == [MODEL] and outcomes[0].how == "pulled"
    _, outcomes = restore_snapshot(_paths(tmp_path / "b", monkeypatch), archive, pull=None)
    assert outcomes[0].how == "failed" and "not on disk" in outcomes[0].detail


def test_not_a_snapshot_and_unsafe_paths_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _paths(tmp_path / "home", monkeypatch)
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        data = b"{}"
        member = tarfile.TarInfo("other.txt")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(SnapshotError, match="not a blazar snapshot"):
        restore_snapshot(paths, plain)
    with pytest.raises(SnapshotError, match="cannot open"):
        restore_snapshot(paths, tmp_path / "missing.tar.gz")

    evil = tmp_path / "evil.tar.gz"
    doc = (
        b'{"format":1,"version":"0","created_at":0,"models_dir":"/nowhere","models":[],'
        b'"databases":[],"config":false,"jobs":1}'
    )
    with tarfile.open(evil, "w:gz") as tar:
        for name, data in (("snapshot.json", doc), ("jobs/../../escaped.txt", b"x")):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(SnapshotError, match="unsafe path"):
        restore_snapshot(paths, evil)
    assert not (tmp_path / "escaped.txt").exists()
