"""The benchmark harness works: a tiny run writes a result of the expected shape.

Nothing here asserts a speed; speed is measured by hand with `make bench`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench._rigs import InstantUpstream
from bench.loadgen import run_job
from bench.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]


def test_loadgen_against_the_instant_upstream(tmp_path: Path) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with InstantUpstream(log_dir=tmp_path) as upstream:
        job = {
            "url": upstream.url,
            "requests": [
                {"path": "/v1/chat/completions", "body": body | {"stream": False}},
                {"path": "/v1/chat/completions", "body": body | {"stream": True}},
            ],
            "concurrency": 4,
            "count": 40,
            "warmup": 4,
            "events": True,
            "timeout_s": 30,
        }
        result = asyncio.run(run_job(job))
    assert result["count"] == 40 and result["ok"] == 40 and result["errors"] == 0
    assert len(result["latency_s"]) == len(result["ttfb_s"]) == len(result["tokens"]) == 40
    # Token events: five per stream, none for a plain JSON body.
    assert sorted({len(t) for t in result["tokens"]}) == [0, 5]


@pytest.mark.slow
def test_quick_overhead_run_writes_a_result(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "bench", "run", "--quick", "--only", "overhead", "--litellm", "off"]
    proc = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    [path] = out.glob("*-overhead.json")
    doc = json.loads(path.read_text())
    assert doc["name"] == "overhead" and doc["quick"] is True and doc["schema"] == 1
    assert {"cpu_model", "cpus", "ram_gib", "gpus"} <= doc["machine"].keys()
    assert {"python", "blazar", "xllamacpp"} <= doc["versions"].keys()
    assert {"harness", "daemon", "direct upstream", "load generator"} <= doc["commands"].keys()
    assert {t["id"] for t in doc["targets"]} == {t.id for t in TARGETS if t.bench == "overhead"}
    for table in doc["tables"]:
        assert table["rows"] and all(len(row) == len(table["columns"]) for row in table["rows"])
    [run] = doc["raw_runs"]
    for case in ("non-stream C=1", "non-stream C=16", "non-stream C=64", "stream C=1", "stream C=64"):
        for who in ("direct", "blazar"):
            assert run[case][who]["requests"] > 0 and run[case][who]["errors"] == 0, (case, who)
    assert path.with_suffix(".md").read_text().startswith("# Pure gateway overhead")
    for plot in doc["plots"]:
        assert (out / plot["file"]).stat().st_size > 0

    report = tmp_path / "BENCHMARK.md"
    proc = subprocess.run(
        [sys.executable, "scripts/bench_report.py", "--results", str(out), "--out", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    text = report.read_text()
    assert "## Targets" in text and "## Pure gateway overhead" in text


@pytest.mark.slow
def test_floor_run_writes_a_result(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.floor", "--requests", "40", "--streams", "4", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = tmp_path.glob("*-floor.txt")
    rows = {line.split()[0]: line.split()[1:] for line in path.read_text().splitlines()[7:10]}
    assert set(rows) == {"pipe", "stack", "blazar"} and all(len(v) == 4 for v in rows.values())
    assert all(float(v) >= 0 for v in rows["blazar"])  # CPU ticks are 10 ms: a smoke run may read 0


def test_py_spy_report_reads_collapsed_stacks(tmp_path: Path) -> None:
    from bench.profile import _py_spy_report

    raw = tmp_path / "raw.txt"
    raw.write_text(
        "run (trio/_core/_run.py:1);GatewayMiddleware.__call__ (blazar/web/asgi/gateway.py:9);"
        "relay (blazar/serve/openai_chat.py:3) 3\n"
        "run (trio/_core/_run.py:1);H11Protocol.handle (hypercorn/protocol/h11.py:5) 1\n"
        "run (trio/_core/_run.py:1);H1Connection._read (blazar/web/asgi/h1.py:7) 1\n"
        "run (trio/_core/_run.py:1);Pump._run (blazar/web/asgi/pump.py:2) 3\n"
    )
    report = _py_spy_report(raw)
    assert "8 samples" in report
    assert (
        " 37.5%  the relay route" in report and " 12.5%  hypercorn (TLS, HTTP/2, WebSockets): read" in report
    )
    assert (
        " 12.5%  HTTP/1.1 server: read and parse" in report and " 37.5%  the pump: relayed chunks" in report
    )
    assert "blazar" in report and "hypercorn" in report


@pytest.mark.slow
def test_quick_speech_run_writes_a_result(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench", "run", "--quick", "--only", "speech", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = tmp_path.glob("*-speech.json")
    doc = json.loads(path.read_text())
    assert doc["name"] == "speech" and doc["quick"] is True
    assert {t["id"] for t in doc["targets"]} == {"stt_rtf_ratio", "tts_rtf_ratio"}
    [run] = doc["raw_runs"]
    for variant in ("gateway", "direct"):
        assert run[variant]["stt"] > 0 and run[variant]["tts"] > 0, run
    assert run["stt_ratio"] > 0 and run["tts_ratio"] > 0
    assert {"stt engine (direct)", "tts engine (direct)"} <= doc["commands"].keys()
    assert "--api-key" in doc["commands"]["stt engine (direct)"]
