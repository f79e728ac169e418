"""`blazar fit`: weights, KV cache and total for an installed model or a .gguf path, no daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from blazar.cli import main
from tests.support import MODEL, home_env

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; K and V in f16.
KV_PER_CELL = 30 * 3 * 64 * 2 * 2


def run_fit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, *args: str
) -> str:
    for key, value in home_env(home).items():
        monkeypatch.setenv(key, value)
    try:
        main(["fit", *args])
    except SystemExit as done:  # cyclopts exits 0 after a command; keep anything else
        if done.code not in (0, None):
            raise
    return capsys.readouterr().out


def test_acceptance_line(home: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "blazar", "fit", MODEL, "--ctx", "4096", "--slots", "1", "--json"],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["model"] == MODEL
    assert doc["kv"] == KV_PER_CELL * 4096 == 94_371_840  # 90 MiB, as llama.cpp allocates
    assert doc["k"] == doc["v"] == doc["kv"] // 2
    assert doc["weights"] == 96_576_768  # the engine's CPU_Mapped model buffer, 92.10 MiB
    assert doc["total"] == doc["weights"] + doc["kv"] + doc["recurrent"] + doc["compute"] + doc["overhead"]
    assert doc["settings"]["ctx_per_slot"] == 4096 and doc["settings"]["slots"] == 1
    assert doc["verdict"] in {"fits", "offload", "no_fit"}
    assert doc["weights_by_type"] == {"Q4_1": 66_355_200, "Q8_0": 30_081_024, "F32": 140_544}


def test_defaults_are_the_daemons(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, model_path: Path
) -> None:
    # A path works too; per-slot ctx defaults to min(training 8192, 4096) and slots to 4.
    doc = json.loads(run_fit(monkeypatch, capsys, home, str(model_path), "--json"))
    assert doc["settings"]["ctx_per_slot"] == 4096 and doc["settings"]["slots"] == 4
    assert doc["kv"] == KV_PER_CELL * 4096 * 4
    assert doc["model"] == model_path.name


def test_quantized_cache_and_levers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    doc = json.loads(
        run_fit(
            monkeypatch,
            capsys,
            home,
            MODEL,
            "--ctx",
            "2048",
            "--slots",
            "2",
            "--cache-type",
            "q8_0",
            "--json",
        )
    )
    assert doc["kv"] == 30 * 3 * 64 // 32 * 34 * 2 * 2048 * 2
    levers = {lever["change"]: lever for lever in doc["levers"]}
    assert levers["--cache-type q4_0"]["kv"] == 30 * 3 * 64 // 32 * 18 * 2 * 2048 * 2
    assert levers["--ctx 1024"]["kv"] == doc["kv"] // 2
    assert "--cache-type q8_0" not in levers


def test_table_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    out = run_fit(monkeypatch, capsys, home, MODEL, "--ctx", "4096", "--slots", "1")
    assert "KV cache  90.0 MiB" in out
    assert "weights   92.1 MiB" in out
    assert "verdict" in out and "LEVER" in out


def test_unknown_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    with pytest.raises(SystemExit) as exc:
        run_fit(monkeypatch, capsys, home, "no-such-model")
    assert exc.value.code == 1
    assert "not installed" in capsys.readouterr().err
