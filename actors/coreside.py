"""Would these models fit in memory together? (``blazar coreside``, ``GET /api/coreside``)

Each model counts at the context and slots its engine runs with (a loaded one) or
would start with (one that is not), estimated by the same planner admission
uses; together they are set against the budget a load would be checked against
now. ``verdict`` is the pure decision; ``Runtime.coreside`` and ``coreside_offline``
(in ``actors.runtime``) gather its inputs inside and outside a running daemon.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from actors.config import RuntimeConfig
from actors.engines.llamacpp import LaunchSpec
from actors.memory import MemoryPlanner

__all__ = ["Coresidence", "CoresidentModel", "budget_source", "resident_rows", "verdict"]


class CoresidentModel(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    ctx_per_slot: int
    slots: int
    bytes: int | None
    """The planner's estimate; None when the file gives none (then it is loaded unchecked)."""
    loaded: bool


class Coresidence(msgspec.Struct, frozen=True, kw_only=True):
    models: list[CoresidentModel]
    total: int
    """The estimates added up (models without one count 0)."""
    budget: int | None
    """What all models may use together; None: no memory check (``memory_budget_mb <= 0``)."""
    budget_from: str
    fits: bool
    headroom: int | None
    """``budget - total``: negative when they do not fit."""


def budget_source(config: RuntimeConfig) -> str:
    if config.memory_budget_mb is None:
        return "available RAM plus what the loaded models hold"
    return "memory_budget_mb" if config.memory_budget_mb > 0 else "no memory check (memory_budget_mb <= 0)"


def verdict(models: Sequence[CoresidentModel], budget: int | None, budget_from: str) -> Coresidence:
    total = sum(m.bytes or 0 for m in models)
    return Coresidence(
        models=list(models),
        total=total,
        budget=budget,
        budget_from=budget_from,
        fits=budget is None or total <= budget,
        headroom=None if budget is None else budget - total,
    )


async def resident_rows(
    memory: MemoryPlanner, specs: Sequence[tuple[LaunchSpec, bool]]
) -> list[CoresidentModel]:
    """One row per ``(spec, loaded)``, estimated at the spec's own settings."""
    rows = []
    for spec, loaded in specs:
        need = await memory.need(spec)
        rows.append(
            CoresidentModel(
                model=spec.model, ctx_per_slot=spec.ctx_per_slot, slots=spec.slots, bytes=need, loaded=loaded
            )
        )
    return rows
