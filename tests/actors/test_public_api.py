"""The embedding API's public names are pinned: adding or removing one is a decision."""

from __future__ import annotations

import actors

EXPECTED = {
    "ActorStopped",
    "AdmissionRejected",
    "BlazarRuntimeError",
    "Claim",
    "ClaimOptions",
    "ClaimRequest",
    "EngineCircuitOpen",
    "EngineConfig",
    "EngineCrashed",
    "EngineStartTimeout",
    "EngineUnavailable",
    "InsufficientMemory",
    "JobContext",
    "JobNotFound",
    "JobNotRunnable",
    "JobOutcome",
    "JobRecord",
    "LedgerError",
    "MaxLoadedModels",
    "ModelBusy",
    "ModelNotFound",
    "ModelOverride",
    "ModelTooLarge",
    "Runtime",
    "RuntimeConfig",
    "Runner",
    "RuntimeStatistics",
    "Tier",
    "open_runtime",
}


def test_all_is_pinned() -> None:
    assert set(actors.__all__) == EXPECTED
    assert len(actors.__all__) == len(EXPECTED)  # no duplicates


def test_every_public_name_exists() -> None:
    for name in actors.__all__:
        assert getattr(actors, name) is not None, name


def test_errors_share_one_base() -> None:
    for name in actors.__all__:
        obj = getattr(actors, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and name != "ModelNotFound":
            assert issubclass(obj, actors.BlazarRuntimeError), name


def test_config_in_home_lays_out_paths() -> None:
    config = actors.RuntimeConfig.in_home("/srv/b", slots=2)
    assert (config.home, config.run_dir, config.cache_dir, config.slots) == (
        "/srv/b",
        "/srv/b/run",
        "/srv/b/cache",
        2,
    )
    assert config.models_dir == "/srv/b/models"
