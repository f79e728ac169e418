"""MemoryPlanner: footprints from the GGUF header at launch settings, and the budget."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import trio

from actors.engines.llamacpp import LaunchSpec
from actors.memory import MemoryPlanner
from registry import fit
from registry.shape import read_shape
from registry.split import local_share

MIB = 1 << 20


def _spec(path: Path, model: str = "smol", ctx: int = 4096, slots: int = 4) -> LaunchSpec:
    return LaunchSpec(model=model, path=str(path), ctx_per_slot=ctx, slots=slots)


async def test_need_is_the_fit_estimate_at_the_launch_settings(model_path: Path) -> None:
    planner = MemoryPlanner(None, available=lambda: 8 << 30)
    need = await planner.need(_spec(model_path, ctx=2048, slots=2))
    shape = read_shape(model_path)
    assert need == fit.estimate(shape, fit.Settings(ctx_per_slot=2048, slots=2)).total
    assert planner.footprint("smol") == need and planner.footprint("other") is None
    bigger = await planner.need(_spec(model_path, ctx=8192, slots=2))
    assert bigger is not None and bigger > need  # more context, more KV cache


async def test_a_split_model_needs_only_this_machines_share(model_path: Path) -> None:
    """A model split over RPC workers holds here only what the devices do not take: the
    footprint admission checks against the budget is the split's local share."""
    planner = MemoryPlanner(None, available=lambda: 8 << 30)
    whole = await planner.need(_spec(model_path, ctx=2048, slots=1))
    split = msgspec.structs.replace(
        _spec(model_path, ctx=2048, slots=1), rpc=["10.0.0.2:50052"], gpu_layers=29
    )
    local = await planner.need(split)
    shape = read_shape(model_path)
    assert local == local_share(shape, fit.Settings(ctx_per_slot=2048, slots=1), 29)
    assert whole is not None and local is not None and local < whole
    assert planner.footprint("smol") == local


async def test_budget_configured_automatic_or_off(model_path: Path) -> None:
    assert MemoryPlanner(512).budget(held=100 * MIB) == 512 * MIB
    auto = MemoryPlanner(None, available=lambda: 300 * MIB)
    assert auto.budget(held=100 * MIB) == 400 * MIB  # what is free plus what our models would free
    assert MemoryPlanner(None, available=lambda: None).budget(held=0) is None
    off = MemoryPlanner(0)
    assert off.budget(held=0) is None and await off.need(_spec(model_path)) is None


async def test_unreadable_models_are_loaded_unchecked(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    planner = MemoryPlanner(512)
    assert await planner.need(_spec(junk)) is None and planner.footprint("smol") is None


async def test_advice_names_levers_with_numbers(model_path: Path) -> None:
    planner = MemoryPlanner(None, available=lambda: 1 << 30)
    need = await planner.need(_spec(model_path, ctx=8192, slots=4))
    assert need is not None
    advice = planner.advice("smol", int(need * 0.6))
    assert "levers that fit" in advice and "MiB" in advice and "blazar fit smol" in advice
    assert "no setting makes it fit" in planner.advice("smol", 10 * MIB)  # not even the weights


async def test_a_speech_model_is_sized_from_its_tree(tmp_path: Path) -> None:
    from registry.store import ModelFile, ModelRecord, Store

    store = Store(tmp_path / "models")
    onnx, config = tmp_path / "v.onnx", tmp_path / "v.onnx.json"
    onnx.write_bytes(b"x" * 5000)
    config.write_bytes(b"{}")
    files = []
    for path in (onnx, config):
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        store.adopt_blob(path, sha)
        files.append(ModelFile(name=path.name, digest=f"sha256:{sha}", size=path.stat().st_size))
    record = ModelRecord(
        name="voice", digest=files[0].digest, size=5002, path="", format="onnx", kind="tts", source="test",
        created_at=0.0, modified_at=0.0, blobs=[files[1].digest], files=files, entry="v.onnx",
    )  # fmt: skip
    path = await trio.to_thread.run_sync(store.materialize, record)
    planner = MemoryPlanner(None, available=lambda: 8 << 30)
    need = await planner.need(LaunchSpec(model="voice", path=str(path), ctx_per_slot=0, slots=2))
    assert need == fit.estimate_files("tts", 5002, slots=2).total
    assert planner.footprint("voice") == need
    assert "speech model" in planner.advice("voice", 1)
