"""Tuned profiles: the launch settings ``blazar tune`` measured fastest for a model here.

One ledger row per model: the profile (``actors.config.Profile``), the engine it was
measured on, the workload it was measured with and every trial's figures, so that
``blazar tune --show`` can say what was tried. The runtime reads the profiles once at
start (``RuntimeConfig.profiles``); a new one replaces the old when its tune ends.
Pure data and SQL: the trials themselves run above the runtime (blazar/serve/jobs/tune.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from actors.config import Profile
from actors.ledger import read_rows

__all__ = ["TunedProfile", "delete_statement", "profile_statement", "read_profile", "read_profiles"]


class TunedProfile(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    engine: str
    """The engine and version the trials ran on (``actors.certificates.engine_tag``)."""
    created_at: float
    profile: Profile
    """What differs from the settings the model would run with without a profile."""
    trials: list[dict[str, Any]]
    workload: dict[str, Any]


_SELECT = "SELECT model, engine, created_at, profile, trials, workload FROM profiles"


def _tuned(row: tuple[Any, ...]) -> TunedProfile:
    model, engine, created_at, profile, trials, workload = row
    return TunedProfile(
        model=model,
        engine=engine,
        created_at=created_at,
        profile=msgspec.json.decode(profile, type=Profile),
        trials=msgspec.json.decode(trials),
        workload=msgspec.json.decode(workload),
    )


def read_profiles(path: Path) -> dict[str, Profile]:
    """Every model's profile. Synchronous (a worker thread in async code)."""
    return {t.model: t.profile for t in map(_tuned, read_rows(path, _SELECT))}


def read_profile(path: Path, model: str) -> TunedProfile | None:
    rows = read_rows(path, f"{_SELECT} WHERE model = ?", (model,))
    return _tuned(rows[0]) if rows else None


def profile_statement(tuned: TunedProfile) -> tuple[str, tuple[Any, ...]]:
    return (
        "INSERT OR REPLACE INTO profiles (model, engine, created_at, profile, trials, workload) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            tuned.model,
            tuned.engine,
            tuned.created_at,
            msgspec.json.encode(tuned.profile),
            msgspec.json.encode(tuned.trials),
            msgspec.json.encode(tuned.workload),
        ),
    )


def delete_statement(model: str) -> tuple[str, tuple[Any, ...]]:
    return ("DELETE FROM profiles WHERE model = ?", (model,))
