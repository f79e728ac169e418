"""Memory for model loads: each model's footprint at its launch settings, and the budget.

A footprint is the estimate of ``registry.fit`` (weights + KV cache + compute
buffer + overhead, from the GGUF header) for the context and slots the engine
would start with (a multi-file model's from its files' sizes: ``fit.estimate_files``,
``fit.estimate_weights``);
it is computed once per file and settings, in a worker
thread, before the load is planned. The budget is ``memory_budget_mb`` from
the config, or, when unset, the memory the system has available now plus what
the resident models hold (they would give it back when evicted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
import trio

from actors.census import ram_available
from actors.engines.llamacpp import LaunchSpec
from registry import fit
from registry.errors import RegistryError
from registry.multifile import estimate_path
from registry.shape import ModelShape, read_shape
from registry.split import local_share

__all__ = ["MemoryPlanner"]

log = logging.getLogger("blazar.memory")

_MIB = 1 << 20


def _mib(n: int) -> str:
    return f"{n / _MIB:,.0f} MiB"


class MemoryPlanner:
    def __init__(
        self, budget_mb: float | None = None, available: Callable[[], int | None] = ram_available
    ) -> None:
        self.budget_mb = budget_mb
        """None: what the system has available; 0 or less: no memory check."""
        self._available = available
        self._shapes: dict[str, ModelShape] = {}
        self._estimates: dict[str, tuple[ModelShape | None, fit.Estimate]] = {}
        """Model name → its shape (None: a multi-file model) and estimate at the
        settings it was last planned with."""

    def _settings(self, spec: LaunchSpec) -> fit.Settings:
        ubatch = spec.micro_step or fit.DEFAULT_UBATCH
        kv = spec.kv_cache or "f16"
        return fit.Settings(
            ctx_per_slot=spec.ctx_per_slot,
            slots=spec.slots,
            n_ubatch=ubatch,
            cache_type_k=kv,
            cache_type_v=kv,
            flash_attn=spec.flash_attn != "off",
        )

    def _estimate(self, spec: LaunchSpec) -> tuple[ModelShape | None, fit.Estimate] | None:
        # A multi-file model's tree (registry.store.Store.materialize) says its own size.
        files = estimate_path(spec.path, slots=spec.slots, ctx_per_slot=spec.ctx_per_slot)
        if files is not None:
            return None, files
        shape = self._shapes.get(spec.path)
        if shape is None:
            try:
                shape = self._shapes[spec.path] = read_shape(spec.path)
            except (RegistryError, OSError, ValueError) as exc:
                log.warning("no memory estimate for '%s' (%s): loading it unchecked", spec.model, exc)
                return None
        settings = self._settings(spec)
        est = fit.estimate(shape, settings)
        if spec.rpc and spec.gpu_layers is not None:
            # Split over RPC workers: this machine holds only its own share.
            est = msgspec.structs.replace(est, total=local_share(shape, settings, spec.gpu_layers))
        return shape, est

    async def need(self, spec: LaunchSpec) -> int | None:
        """Estimated bytes ``spec``'s engine will hold; None when unknown or unchecked. The
        estimate becomes the model's footprint: call it for the spec that will run."""
        if self.budget_mb is not None and self.budget_mb <= 0:
            return None
        found = await trio.to_thread.run_sync(self._estimate, spec)
        if found is None:
            self._estimates.pop(spec.model, None)
            return None
        self._estimates[spec.model] = found
        return found[1].total

    async def would_need(self, spec: LaunchSpec) -> int | None:
        """``need`` for a spec that may never run: the model's footprint stays as it is."""
        if self.budget_mb is not None and self.budget_mb <= 0:
            return None
        found = await trio.to_thread.run_sync(self._estimate, spec)
        return found[1].total if found is not None else None

    def estimate_of(self, model: str) -> fit.Estimate | None:
        found = self._estimates.get(model)
        return found[1] if found else None

    def footprint(self, model: str) -> int | None:
        found = self._estimates.get(model)
        return found[1].total if found else None

    def budget(self, held: int) -> int | None:
        """Bytes all models may use together, given ``held`` bytes the resident ones hold now."""
        if self.budget_mb is not None:
            return int(self.budget_mb * _MIB) if self.budget_mb > 0 else None
        available = self._available()
        return None if available is None else available + held

    def advice(self, model: str, budget: int) -> str:
        """The levers that would make ``model`` fit in ``budget`` bytes, with their numbers."""
        found = self._estimates.get(model)
        if found is None:
            return "lower its context (ctx) or slots in config.toml, or raise memory_budget_mb"
        shape, est = found
        if shape is None and not est.kv:
            return (
                "a speech model or an image model: lower its slots in config.toml, or raise memory_budget_mb"
            )
        if shape is None:
            return "lower its ctx or slots in config.toml, or raise memory_budget_mb (see `blazar fit NAME`)"
        memory = fit.Memory(ram_available=budget)
        levers = [lv for lv in fit.levers(shape, est.settings, memory, "no_fit") if lv.verdict == "fits"]
        if not levers:
            return (
                "no setting makes it fit: pick a smaller model or quant (`blazar fit NAME` shows the numbers)"
            )
        shown = "; ".join(f"{lv.change} → {_mib(lv.total)}" for lv in levers[:3])
        return f"levers that fit: {shown} (see `blazar fit {model}`)"
