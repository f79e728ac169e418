"""``blazar doctor``'s verdicts: pure functions of gathered facts."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.census import Census, Gpu
from blazar.diagnose import judge
from blazar.diagnose.facts import (
    BlobFact,
    DaemonFact,
    DiskFact,
    EngineFact,
    Facts,
    LedgerFact,
    PidFact,
    PortFact,
    ProcFact,
)
from blazar.diagnose.judge import DISK_ERROR_BYTES, DISK_WARN_BYTES, report

GIB = 2**30


def facts(**changes: Any) -> Facts:
    base = Facts(
        deep=False,
        census=Census(source="system", cpu_name="cpu", cpu_count=2, ram_total=8 * GIB, ram_available=4 * GIB),
        config_file="/h/config.toml",
        config_error=None,
        unknown_models=[],
        engine=EngineFact(configured=None, binary=None, xllamacpp="1.0"),
        models=["m"],
        bad_manifests=[],
        blobs=[BlobFact(digest="sha256:" + "a" * 64, path="/b", models=["m"], expected_size=10, size=10)],
        orphan_files=0,
        orphan_bytes=0,
        partials=[],
        pidfiles=[],
        engine_procs=[],
        daemon=DaemonFact(path="/h/run/daemon.json", exists=False),
        port=PortFact(host="127.0.0.1", port=11435, free=True),
        ledger=LedgerFact(path="/h/blazar.db", exists=True, result=["ok"], schema_version=4),
        disk=DiskFact(path="/h", free=100 * GIB, total=200 * GIB),
    )
    return msgspec.structs.replace(base, **changes)


def by_code(f: Facts) -> dict[str, Any]:
    return {x.code: x for x in judge(f)}


def test_healthy_facts_are_all_ok() -> None:
    found = judge(facts())
    assert {f.severity for f in found} == {"ok"}
    assert report(found).ok


def test_gpus_are_listed() -> None:
    gpu = Gpu(index=0, name="H200", total=140 * GIB, used=GIB, free=139 * GIB)
    census = Census(source="nvml", gpus=[gpu], driver="555", cpu_count=16, ram_total=GIB * 128,
                    ram_available=GIB * 100)  # fmt: skip
    found = by_code(facts(census=census))
    assert "H200" in found["GPU"].message and "NO_GPU" not in found


def test_engines() -> None:
    found = by_code(facts(engine=EngineFact(configured="/nope", binary="/nope", xllamacpp="1.0")))
    assert found["ENGINE_BINARY_MISSING"].severity == "error"
    found = by_code(facts(engine=EngineFact(configured=None, binary=None, xllamacpp=None)))
    assert found["NO_ENGINE"].severity == "error"
    lane = EngineFact(
        configured=None, binary="/bin/llama-server", runnable=True, version="b5000", gpu_backend="CUDA"
    )
    found = by_code(facts(engine=lane))
    assert "b5000" in found["ENGINE_LLAMA_SERVER"].message and "CUDA" in found["ENGINE_LLAMA_SERVER"].message
    switched = EngineFact(
        configured=None,
        binary=None,
        xllamacpp="1.0",
        active={"llamacpp": "2026.9.1", "mistralrs": "bundled"},
        stale_receipts={"tiny": "llamacpp@bundled"},
    )
    found = by_code(facts(engine=switched))
    assert found["ENGINE_VERSION"].message == "llamacpp@2026.9.1 is active"
    stale = found["RECEIPTS_PREDATE_ENGINE"]
    assert stale.severity == "warn" and "tiny (llamacpp@bundled)" in stale.message


def test_blob_verdicts_in_order_of_gravity() -> None:
    blob = BlobFact(digest="sha256:" + "a" * 64, path="/b", models=["m", "n"], expected_size=10, size=10)
    cases = {
        "BLOB_MISSING": msgspec.structs.replace(blob, size=None, link_target="/elsewhere/x.gguf"),
        "BLOB_SIZE_MISMATCH": msgspec.structs.replace(blob, size=5),
        "BLOB_INCOMPLETE": msgspec.structs.replace(blob, expected_size=None, incomplete="short"),
        "BLOB_HEADER_INVALID": msgspec.structs.replace(blob, invalid="not a GGUF file"),
        "BLOB_CHECKSUM_MISMATCH": msgspec.structs.replace(blob, sha256="b" * 64),
    }
    for code, fact in cases.items():
        found = by_code(facts(blobs=[fact]))
        assert found[code].severity == "error" and not found[code].fixable, code
        assert "MODELS_OK" not in found
    assert "/elsewhere/x.gguf" in by_code(facts(blobs=[cases["BLOB_MISSING"]]))["BLOB_MISSING"].message
    # One finding per file: the gravest.
    both = msgspec.structs.replace(blob, size=5, incomplete="short", invalid="bad")
    assert [f.code for f in judge(facts(blobs=[both])) if f.severity == "error"] == ["BLOB_SIZE_MISMATCH"]
    assert by_code(facts(blobs=[msgspec.structs.replace(blob, sha256="a" * 64)]))["MODELS_OK"]


def test_a_blob_finding_names_the_model_and_its_file() -> None:
    blob = BlobFact(
        digest="sha256:" + "a" * 64, path="/s/blobs/sha256-aaa", models=["whisper-tiny.en"],
        expected_size=75537502, size=100, names=["model.bin"], check="ctranslate2",
    )  # fmt: skip
    found = by_code(facts(blobs=[blob]))["BLOB_SIZE_MISMATCH"]
    assert found.message == (
        "whisper-tiny.en: model.bin (/s/blobs/sha256-aaa) has 100 bytes, the manifest says 75537502"
    )
    assert found.path == "/s/blobs/sha256-aaa"
    assert "pull or import whisper-tiny.en again" in (found.hint or "")


def test_pid_files_engines_and_orphans() -> None:
    running = PidFact(path="/r/a.pid", pid=10, parent=9, argv="x", child_runs=True, parent_alive=True)
    orphan = PidFact(path="/r/b.pid", pid=11, parent=8, argv="y", child_runs=True, parent_alive=False)
    stale = PidFact(path="/r/c.pid", pid=12, parent=8, argv="z", child_runs=False, parent_alive=False)
    unreadable = PidFact(
        path="/r/d.pid", pid=None, parent=None, argv="", child_runs=False, parent_alive=False
    )
    loose = ProcFact(pid=13, ppid=1, argv="w", parent_is_daemon=False)
    owned = ProcFact(pid=10, ppid=9, argv="x", parent_is_daemon=True)
    also_11 = ProcFact(pid=11, ppid=1, argv="y", parent_is_daemon=False)
    found = judge(facts(pidfiles=[running, orphan, stale, unreadable], engine_procs=[loose, owned, also_11]))
    orphans = [f for f in found if f.code == "ORPHAN_ENGINE"]
    assert sorted(f.pid for f in orphans if f.pid) == [11, 13]  # 11 once, from its pid file
    assert next(f for f in orphans if f.pid == 11).path == "/r/b.pid"
    assert all(f.fixable and f.severity == "error" and f.argv for f in orphans)
    assert sorted(f.path for f in found if f.code == "STALE_PID_FILE" if f.path) == ["/r/c.pid", "/r/d.pid"]
    assert [f.pid for f in found if f.code == "ENGINE_RUNNING"] == [10]


def test_daemon_file_and_port() -> None:
    found = by_code(facts(daemon=DaemonFact(path="/d", exists=True, pid=5, alive=False)))
    assert found["STALE_DAEMON_FILE"].fixable
    alive = DaemonFact(path="/d", exists=True, pid=5, alive=True, url="http://x", port=1, answers=False)
    assert by_code(facts(daemon=alive))["DAEMON_NOT_ANSWERING"].severity == "warn"
    taken = PortFact(
        host="127.0.0.1", port=11435, free=False, error="address already in use", blazar_version="0.9"
    )
    found = by_code(facts(port=taken))
    assert found["PORT_IN_USE"].severity == "error" and "another home" in found["PORT_IN_USE"].message


def test_ledger_and_disk() -> None:
    bad = LedgerFact(path="/l", exists=True, result=["*** in database main ***", "Page 3 is never used"])
    assert "Page 3" in by_code(facts(ledger=bad))["LEDGER_CORRUPT"].message
    assert by_code(facts(ledger=LedgerFact(path="/l", exists=True, error="file is not a database")))[
        "LEDGER_CORRUPT"
    ]
    assert by_code(facts(disk=DiskFact(path="/h", free=DISK_WARN_BYTES - 1, total=GIB * 10)))["DISK_LOW"]
    assert (
        by_code(facts(disk=DiskFact(path="/h", free=DISK_ERROR_BYTES - 1, total=GIB * 10)))[
            "DISK_FULL"
        ].severity
        == "error"
    )


def test_config_findings() -> None:
    found = by_code(facts(config_error="bad", unknown_models=["x"]))
    assert found["CONFIG_INVALID"].severity == "error" and found["CONFIG_UNKNOWN_MODEL"].severity == "warn"
    assert not report(judge(facts(config_error="bad"))).ok
    assert by_code(facts(models=[], blobs=[]))["NO_MODELS"].severity == "warn"


def test_every_finding_code_is_documented() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    source = (root / "blazar" / "diagnose" / "judge.py").read_text()
    made = set(re.findall(r'code="([A-Z_]+)"', source)) | set(re.findall(r'"([A-Z_]{4,})" if', source))
    made |= set(re.findall(r'else "([A-Z_]{4,})"', source))
    ops = (root / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", ops, flags=re.M))
    assert made == documented
