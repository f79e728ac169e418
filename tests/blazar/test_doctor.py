"""``blazar doctor`` on real homes: real files, a real orphan process, the real CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from registry.store import ModelRecord, Store
from tests.support import MODEL, home_env, pid_alive


def doctor(home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "blazar", "doctor", "--json", *args],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout)


# Free space is the host's, not the home's: a busy disk (CI's, mid-suite) may read low at
# any moment, so the findings a test compares leave it out; `disk` checks it alone.
DISK = {"DISK_OK", "DISK_LOW", "DISK_FULL"}


def codes(doc: dict[str, Any], severity: str | None = None) -> list[str]:
    return [
        f["code"]
        for f in doc["findings"]
        if (severity is None or f["severity"] == severity) and f["code"] not in DISK
    ]


def disk(doc: dict[str, Any]) -> list[str]:
    return [f["code"] for f in doc["findings"] if f["code"] in DISK]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_healthy_home_has_no_warning_and_exits_0(home: Path) -> None:
    rc, doc = doctor(home)
    assert rc == 0 and doc["ok"] is True and doc["errors"] == 0
    assert codes(doc, "warn") == [] and codes(doc, "error") == []
    for code in ("MACHINE", "CONFIG_OK", "MODELS_OK", "DAEMON_STOPPED", "LEDGER_ABSENT"):
        assert code in codes(doc), code
    assert len(disk(doc)) == 1 and disk(doc) != ["DISK_FULL"]
    assert "ENGINE_HOST" in codes(doc) or "ENGINE_LLAMA_SERVER" in codes(doc)


def test_deep_hashes_every_file(home: Path) -> None:
    blob = Path(Store(home / "models").get(MODEL).path)
    rc, doc = doctor(home, "--deep")
    assert rc == 0 and "sha256" in next(f["message"] for f in doc["findings"] if f["code"] == "MODELS_OK")
    # Same size, one byte changed: only the hash can tell (a copy: the blob is a link to the cache).
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    tmp = blob.with_name("rewritten")
    tmp.write_bytes(data)
    os.replace(tmp, blob)
    rc, doc = doctor(home)
    assert rc == 0
    rc, doc = doctor(home, "--deep")
    assert rc == 1 and codes(doc, "error") == ["BLOB_CHECKSUM_MISMATCH"]


def _break(home: Path) -> dict[str, Any]:
    """A home with every kind of damage; returns what was made."""
    store = Store(home / "models")
    record = store.get(MODEL)
    blob = Path(record.path)
    half = blob.with_name("half")
    with open(blob, "rb") as f:
        half.write_bytes(f.read(record.size // 2))
    os.replace(half, blob)  # truncated, without touching the cached file it was linked to
    ghost_sha = "ab" * 32
    ghost = ModelRecord(
        name="ghost", digest=f"sha256:{ghost_sha}", size=1234, path=str(store.blob_path(ghost_sha)),
        source="test", created_at=0, modified_at=0,
    )  # fmt: skip
    store.write_manifest(ghost)
    (home / "config.toml").write_text('slots = "many"\n')
    run = home / "run"
    (run / "engines").mkdir(parents=True)
    (run / "daemon.json").write_text(json.dumps({"pid": dead_pid(), "port": 1, "url": "http://127.0.0.1:1"}))
    stale = run / "engines" / "stale.pid"
    stale.write_text(f"{dead_pid()}\n{dead_pid()}\npython -m actors.engines.llamacpp_host -m x\n")
    argv = [
        sys.executable,
        "-c",
        "import time; time.sleep(600)",
        "actors.engines.llamacpp_host",
        "-m",
        str(blob),
    ]
    orphan = subprocess.Popen(argv, start_new_session=True)
    (run / "engines" / "smollm2-135m.pid").write_text(f"{orphan.pid}\n{dead_pid()}\n{' '.join(argv)}\n")
    partial = store.partial_path("cd" * 32)
    partial.write_bytes(b"x" * 4096)
    return {"blob": blob, "stale": stale, "orphan": orphan, "partial": partial}


def test_a_broken_home_before_and_after_fix(home: Path) -> None:
    made = _break(home)
    orphan: subprocess.Popen[bytes] = made["orphan"]
    try:
        rc, doc = doctor(home)
        assert rc == 1 and doc["ok"] is False
        errors, warns = codes(doc, "error"), codes(doc, "warn")
        for code in ("BLOB_SIZE_MISMATCH", "BLOB_MISSING", "CONFIG_INVALID", "ORPHAN_ENGINE"):
            assert code in errors, code
        for code in ("STALE_DAEMON_FILE", "STALE_PID_FILE", "PARTIAL_DOWNLOAD"):
            assert code in warns, code
        assert "MODELS_OK" not in codes(doc)
        by_code = {f["code"]: f for f in doc["findings"]}
        assert by_code["ORPHAN_ENGINE"]["pid"] == orphan.pid and by_code["ORPHAN_ENGINE"]["fixable"]
        assert not by_code["BLOB_MISSING"]["fixable"] and "ghost" in by_code["BLOB_MISSING"]["message"]
        assert all(f["hint"] for f in doc["findings"] if f["severity"] != "ok")
        assert pid_alive(orphan.pid) and made["partial"].exists()  # a plain run changes nothing

        rc, doc = doctor(home, "--fix")
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        fixed = {f["code"] for f in doc["fixed"] if f["ok"]}
        assert fixed == {"STALE_DAEMON_FILE", "STALE_PID_FILE", "ORPHAN_ENGINE", "PARTIAL_DOWNLOAD"}
        assert not made["stale"].exists() and not made["partial"].exists()
        assert not (home / "run" / "daemon.json").exists()
        # What is left cannot be repaired safely: the exit status still says so.
        assert rc == 1
        assert sorted(codes(doc, "error")) == ["BLOB_MISSING", "BLOB_SIZE_MISMATCH", "CONFIG_INVALID"]
        assert codes(doc, "warn") == []
        assert made["blob"].exists() and (home / "models" / "manifests" / "ghost.json").exists()
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_fix_leaves_a_download_a_pull_is_writing(home: Path) -> None:
    import fcntl

    partial = Store(home / "models").partial_path("ef" * 32)
    partial.write_bytes(b"y" * 10)
    fd = os.open(partial.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rc, doc = doctor(home, "--fix")
        assert rc == 0 and "DOWNLOAD_IN_PROGRESS" in codes(doc, "ok") and doc["fixed"] == []
        assert partial.exists()
    finally:
        os.close(fd)


def test_a_port_held_by_another_program_is_an_error(home: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        (home / "config.toml").write_text(f"port = {port}\n")
        rc, doc = doctor(home)
    assert rc == 1 and codes(doc, "error") == ["PORT_IN_USE"]
    assert "another program" in next(f["message"] for f in doc["findings"] if f["code"] == "PORT_IN_USE")


def test_the_ledger_is_checked_read_only(home: Path) -> None:
    db = home / "blazar.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    rc, doc = doctor(home, "--deep")
    assert rc == 0 and "LEDGER_OK" in codes(doc) and db.read_bytes() == before
    db.write_bytes(b"this is not a database" * 100)
    rc, doc = doctor(home, "--fix")
    assert rc == 1 and codes(doc, "error") == ["LEDGER_CORRUPT"] and db.exists()


def test_unknown_models_in_the_config_are_named(home: Path) -> None:
    (home / "config.toml").write_text('preload = ["nope"]\n[models."missing-one"]\nctx = 1024\n')
    rc, doc = doctor(home)
    assert rc == 0
    messages = [f["message"] for f in doc["findings"] if f["code"] == "CONFIG_UNKNOWN_MODEL"]
    assert len(messages) == 2 and any("missing-one" in m for m in messages)


def test_the_table_output_names_each_finding(home: Path) -> None:
    (home / "config.toml").write_text("nonsense_key = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "blazar", "doctor"], env=home_env(home), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "CONFIG_INVALID" in done.stdout and "1 error(s)" in done.stdout


def test_findings_encode_as_the_documented_json() -> None:
    from blazar.diagnose.facts import Finding

    doc = msgspec.to_builtins(Finding(severity="ok", code="X", message="m"))
    assert set(doc) == {"severity", "code", "message", "hint", "fixable", "path", "pid", "argv"}
