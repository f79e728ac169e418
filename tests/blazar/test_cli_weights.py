"""``blazar import`` of a safetensors directory, an MLX directory, a diffusion checkpoint and a
whisper.cpp file, then list, show, fit, plan and rm on them, through the CLI (no daemon)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.config import EngineConfig
from actors.engines.routing import installed
from tests.blazar.test_cli_fit import run_cli
from tests.registry.test_formats import sd15_tensors, write_safetensors
from tests.registry.test_weights import mlx_dir, sharded_dir, whisper_ggml


def test_import_list_show_fit_plan_rm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"

    def cli(*args: str) -> str:
        return run_cli(monkeypatch, capsys, home, *args)

    src = tmp_path / "src"
    src.mkdir()
    said = cli("import", str(sharded_dir(src)), "--name", "acme/tiny")
    assert said.startswith("imported acme/tiny (chat, safetensors, 7 files,")
    cli("import", str(mlx_dir(src)), "--name", "tiny-mlx")
    sd = write_safetensors(src / "sd15.safetensors", sd15_tensors())
    assert "(image, diffusion," in cli("import", str(sd), "--name", "sd15")
    assert "(stt, ggml-whisper," in cli(
        "import", str(whisper_ggml(src / "ggml-tiny.en.bin")), "--name", "wcpp"
    )

    listing = {m["name"]: m for m in json.loads(cli("list", "--json"))}
    assert {n: (m["kind"], m["format"]) for n, m in listing.items()} == {
        "acme/tiny": ("chat", "safetensors"),
        "sd15": ("image", "diffusion"),
        "tiny-mlx": ("chat", "mlx"),
        "wcpp": ("stt", "ggml-whisper"),
    }
    human = cli("list")
    assert "FORMAT" in human and "diffusion" in human and "image" in human

    shown = json.loads(cli("show", "acme/tiny", "--json"))["facts"]
    assert (shown["architecture"], shown["context_length"], shown["files"]) == ("LlamaForCausalLM", 8192, 7)
    assert shown["parameters"] > 0 and shown["hparams"]["num_hidden_layers"] == 2
    human = cli("show", "tiny-mlx")
    assert "4bit" in human and "mlx" in human and "context length" in human
    assert "sd1" in cli("show", "sd15")
    human = cli("show", "wcpp")
    assert "n audio layer" in human and "16000 Hz" in human

    fitted = json.loads(cli("fit", "acme/tiny", "--json", "--ctx", "2048", "--slots", "2"))
    weights = listing["acme/tiny"]["facts"]["weights_bytes"]
    per_token = listing["acme/tiny"]["facts"]["kv_bytes_per_token"]
    assert (fitted["weights"], fitted["kv"]) == (weights, per_token * 2048 * 2)
    assert fitted["total"] > fitted["weights"] + fitted["kv"] and fitted["verdict"] in ("fits", "no_fit")
    image = json.loads(cli("fit", "sd15", "--json"))
    assert image["kind"] == "image" and image["kv"] == 0 and image["weights"] == sd.stat().st_size
    assert "verdict" in cli("fit", "tiny-mlx")

    here = installed(EngineConfig())
    if here.get("vllm") is None and here.get("sglang") is None and here.get("mlx") is None:
        plan = json.loads(cli("plan", "acme/tiny", "--json"))
        assert plan["lane"] is None and plan["preview"]["code"] == "MODEL_UNSUPPORTED_ENGINE"
        human = cli("plan", "acme/tiny")
        assert "none installed here" in human and "MODEL_UNSUPPORTED_ENGINE" in human
        assert "install vLLM" in " ".join(human.split())

    blobs = home / "models" / "blobs"
    before = {p.name for p in blobs.iterdir()}
    for name in ("acme/tiny", "tiny-mlx", "sd15"):
        assert f"deleted {name}" in cli("rm", name)
    left = {p.name for p in blobs.iterdir()}
    assert left < before and left == {listing["wcpp"]["digest"].replace(":", "-")}
    assert [m["name"] for m in json.loads(cli("list", "--json"))] == ["wcpp"]
