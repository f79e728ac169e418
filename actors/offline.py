"""The daemon's plan, coresidence and explain routes worked out without a daemon: what the
CLI runs here when none answers (``blazar fit``, ``coreside``, ``explain``). Nothing is
loaded, so every budget is a first load's; tuned profiles are read from the ledger, as the
daemon reads them when it starts."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio

from actors.config import RuntimeConfig
from actors.coreside import Coresidence, budget_source, resident_rows, verdict
from actors.engines.spec import LaunchSpec
from actors.lifecycle import LoadPreview
from actors.memory import MemoryPlanner
from actors.planning import (
    LoadPlan,
    launch_spec_for,
    make_plan,
    plan_resolve,
    resolve_for,
    unsupported_preview,
)
from actors.profiles import read_profiles
from actors.settings import Explanation
from registry.store import Store

__all__ = ["coreside_offline", "explain_offline", "plan_offline"]


async def _with_profiles(config: RuntimeConfig) -> RuntimeConfig:
    stored = await trio.to_thread.run_sync(read_profiles, Path(config.home) / "blazar.db")
    return msgspec.structs.replace(config, profiles={**stored, **config.profiles}) if stored else config


async def plan_offline(config: RuntimeConfig, model: str) -> LoadPlan:
    """The plan without a running daemon: nothing else is loaded."""
    config = await _with_profiles(config)
    store = Store(Path(config.models_dir))
    record = await trio.to_thread.run_sync(store.get, model)
    resolved = await trio.to_thread.run_sync(plan_resolve, config, store, record)
    spec = resolved.spec
    memory = MemoryPlanner(config.memory_budget_mb)
    need = await memory.need(spec)
    budget = memory.budget(0) if need is not None else None
    refused = code = None
    if need is not None and budget is not None and need > budget:
        code = "MODEL_TOO_LARGE"
        refused = f"needs about {need / 2**20:,.0f} MiB; the budget is {budget / 2**20:,.0f} MiB"
    preview = LoadPreview(model=spec.model, need_bytes=need, budget_bytes=budget, refused=refused, code=code)
    preview = unsupported_preview(preview, resolved)
    runnable = resolved.refusal is None
    return make_plan(
        spec,
        config,
        memory,
        preview,
        loaded=False,
        route=resolved.route,
        runnable=runnable,
        rpc=resolved.rpc_split,
    )


async def coreside_offline(config: RuntimeConfig, models: list[str]) -> Coresidence:
    """``blazar coreside`` without a daemon: nothing is loaded, so the budget is a first load's."""
    config = await _with_profiles(config)
    store = Store(Path(config.models_dir))

    def specs() -> list[tuple[LaunchSpec, bool]]:
        return [(launch_spec_for(config, store, store.get(name)), False) for name in models]

    memory = MemoryPlanner(config.memory_budget_mb)
    rows = await resident_rows(memory, await trio.to_thread.run_sync(specs))
    return verdict(rows, memory.budget(0), budget_source(config))


async def explain_offline(config: RuntimeConfig, model: str) -> Explanation:
    """``blazar explain`` without a running daemon: the settings a load now would use."""
    config = await _with_profiles(config)
    store = Store(Path(config.models_dir))
    record = await trio.to_thread.run_sync(store.get, model)
    resolved = await trio.to_thread.run_sync(resolve_for, config, store, record)
    return Explanation(model=record.name, path=record.path, loaded=False, settings=resolved.settings)
