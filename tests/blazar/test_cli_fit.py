"""`blazar fit`: weights, KV cache and total for an installed model or a .gguf path, no daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actors.engines.rpc_backend import missing_module, wheel_version
from blazar.cli import main
from tests.support import MODEL, home_env

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; K and V in f16.
KV_PER_CELL = 30 * 3 * 64 * 2 * 2


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, *args: str
) -> str:
    for key, value in home_env(home).items():
        monkeypatch.setenv(key, value)
    try:
        main(list(args))
    except SystemExit as done:  # cyclopts exits 0 after a command; keep anything else
        if done.code not in (0, None):
            raise
    return capsys.readouterr().out


def run_fit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, *args: str
) -> str:
    return run_cli(monkeypatch, capsys, home, "fit", *args)


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


def test_plan_without_a_daemon(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    (home / "config.toml").write_text("slots = 2\ndefault_ctx = 1024\nmemory_budget_mb = 4096\n")
    doc = json.loads(run_cli(monkeypatch, capsys, home, "plan", MODEL, "--json"))
    assert (doc["lane"], doc["ctx_per_slot"], doc["slots"], doc["ctx_total"]) == (
        "llamacpp-host",
        1024,
        2,
        2048,
    )
    assert doc["preview"]["budget_bytes"] == 4096 << 20 and doc["preview"]["refused"] is None
    assert doc["estimate"]["kv"] >= 2048 * KV_PER_CELL and not doc["loaded"]
    lanes = {c["lane"]: c for c in doc["lanes"]}
    assert lanes["llamacpp"]["taken"] and lanes["llamacpp"]["why"] == "the first lane that runs gguf models"
    assert not lanes["mistralrs"]["taken"]
    text = run_cli(monkeypatch, capsys, home, "plan", MODEL)
    assert "1024 per slot x 2 slot(s)" in text and "loads, nothing to evict" in text
    assert "llamacpp (llamacpp-host): taken, the first lane that runs gguf models" in " ".join(text.split())


def test_coreside_adds_models_at_their_launch_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path, model_path: Path
) -> None:
    from registry.store import Store

    Store(home / "models").import_file(model_path, "second")
    (home / "config.toml").write_text('memory_budget_mb = 700\n[models."second"]\nctx = 512\nslots = 1\n')
    doc = json.loads(run_cli(monkeypatch, capsys, home, "coreside", MODEL, "second", "--json"))
    first, second = doc["models"]
    assert (first["ctx_per_slot"], first["slots"], second["ctx_per_slot"], second["slots"]) == (
        4096,
        4,
        512,
        1,
    )
    assert doc["total"] == first["bytes"] + second["bytes"] and first["bytes"] > second["bytes"]
    assert doc["budget"] == 700 << 20 and doc["fits"] is (doc["total"] <= 700 << 20)
    assert "together" in run_cli(monkeypatch, capsys, home, "coreside", MODEL, "second")


def test_plan_and_fit_clamp_a_context_above_the_training_length(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    (home / "config.toml").write_text(f'slots = 1\n[models."{MODEL}"]\nctx = 32768\n')
    doc = json.loads(run_cli(monkeypatch, capsys, home, "plan", MODEL, "--json"))
    assert (doc["ctx_per_slot"], doc["ctx_asked"], doc["ctx_train"]) == (8192, 32768, 8192)
    assert doc["estimate"]["kv"] < 9000 * KV_PER_CELL  # memory for what llama.cpp will serve
    text = " ".join(run_cli(monkeypatch, capsys, home, "plan", MODEL).split())
    assert "clamped from 32768 to 8192 (training length); set rope_scaling to extend" in text
    fitted = json.loads(run_fit(monkeypatch, capsys, home, MODEL, "--json"))
    assert fitted["settings"]["ctx_per_slot"] == 8192 and any("clamped" in n for n in fitted["notes"])
    asked = json.loads(run_fit(monkeypatch, capsys, home, MODEL, "--ctx", "20000", "--json"))
    assert asked["settings"]["ctx_per_slot"] == 20000  # asked on the command line: estimated as asked
    assert any("at most 8192 tokens" in n for n in asked["notes"])

    (home / "config.toml").write_text(f'strict = true\n[models."{MODEL}"]\nctx = 32768\n')
    with pytest.raises(SystemExit) as exc:
        run_cli(monkeypatch, capsys, home, "plan", MODEL)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ctx 32768 exceeds the 8192-token context") and len(err.splitlines()) == 1


def test_fit_and_plan_show_the_split_of_a_model_with_rpc_workers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    # no RPC backend built for the wheel (`make rpc-server` keeps it in the cache): refused
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "no-cache"))
    (home / "config.toml").write_text(
        f'memory_budget_mb = 200\n[models."{MODEL}"]\nctx = 2048\nslots = 1\n'
        'rpc = ["10.0.0.2:50052"]\nrpc_memory_mb = [4096]\n'
    )
    doc = json.loads(run_fit(monkeypatch, capsys, home, MODEL, "--json"))
    split = doc["rpc"]
    local, worker = split["parts"]
    assert worker["name"] == "10.0.0.2:50052" and worker["output"] and worker["available"] == 4096 << 20
    assert local["available"] == 200 << 20  # this machine's share is capped by the budget
    assert split["gpu_layers"] == 31 - local["layers"] == sum(split["tensor_split"])
    assert split["verdict"] == "fits" and local["bytes"] < doc["total"]
    text = " ".join(run_fit(monkeypatch, capsys, home, MODEL).split())
    assert (
        "RPC split" in text
        and f"-ngl {split['gpu_layers']} --tensor-split {split['tensor_split'][0]}" in text
    )
    plan = json.loads(run_cli(monkeypatch, capsys, home, "plan", MODEL, "--json"))
    assert plan["rpc"] == split
    if shutil.which("llama-server") is None:  # the xllamacpp wheel's lane: the module make rpc-server builds
        missing = missing_module(wheel_version())
        if missing is None:
            assert plan["preview"]["refused"] is None
        else:
            assert plan["preview"]["code"] == "MODEL_UNSUPPORTED_ENGINE"
            assert "make rpc-server" in plan["preview"]["refused"]
            assert str(Path.home()) not in plan["preview"]["refused"]  # no local path in an answer
