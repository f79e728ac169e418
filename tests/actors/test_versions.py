"""Engine versions on disk (the active one, history, rollback, removal, a binary checked by its
SHA-256) and the regression gate, without installing anything from the package index."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from actors.config import EngineConfig
from actors.engines import llamacpp
from actors.engines.probe import gate
from actors.engines.routing import installed, lane_for
from actors.engines.spec import LaunchSpec
from actors.engines.versions import BUNDLED, VersionError, Versions
from actors.errors import UnsupportedEngine


def _binary(tmp_path: Path, name: str = "llama-server") -> tuple[Path, str]:
    file = tmp_path / name
    file.write_text("#!/bin/sh\nexit 0\n")
    return file, hashlib.sha256(file.read_bytes()).hexdigest()


def test_a_binary_is_kept_only_with_its_hash(tmp_path: Path) -> None:
    versions = Versions(tmp_path / "home")
    file, digest = _binary(tmp_path)
    with pytest.raises(VersionError, match="not installed"):
        versions.install_binary("llamacpp", "b1", str(file), "0" * 64)
    assert versions.installed() == [] and not (versions.root / "llamacpp" / "b1").exists()
    got = versions.install_binary("llamacpp", "b1", str(file), digest)
    assert got.form == "binary" and got.files == {"llama-server": digest}
    assert Path(got.path).stat().st_mode & 0o111
    with pytest.raises(VersionError, match="already installed"):
        versions.install_binary("llamacpp", "b1", str(file), digest)


def test_active_history_rollback_and_removal(tmp_path: Path) -> None:
    versions = Versions(tmp_path / "home")
    file, digest = _binary(tmp_path)
    for name in ("b1", "b2", "b3"):
        versions.install_binary("llamacpp", name, str(file), digest)
    assert versions.active_name("llamacpp") == BUNDLED and versions.active("llamacpp") is None
    versions.set_active("llamacpp", "b1")
    versions.set_active("llamacpp", "b2")
    assert versions.history("llamacpp") == [BUNDLED, "b1", "b2"]
    with pytest.raises(VersionError, match="is active"):
        versions.remove("llamacpp", "b2")
    assert versions.rollback("llamacpp") == "b1" and versions.active_name("llamacpp") == "b1"
    versions.set_active("llamacpp", "b3")
    assert versions.prune("llamacpp") == ["b2"]  # the active one and the one before it stay
    assert [v.version for v in versions.installed()] == ["b1", "b3"]
    with pytest.raises(VersionError, match="not installed"):
        versions.set_active("llamacpp", "b9")


def test_the_lanes_run_the_active_or_the_pinned_version(tmp_path: Path) -> None:
    home = tmp_path / "home"
    versions = Versions(home)
    file, digest = _binary(tmp_path)
    versions.install_binary("llamacpp", "b7", str(file), digest)
    assert installed(EngineConfig(), str(home))["llamacpp"].release is None  # type: ignore[union-attr]
    versions.set_active("llamacpp", "b7")
    lane = installed(EngineConfig(), str(home))["llamacpp"]
    assert lane is not None and lane.release == "b7" and lane.kind == "llama-server"
    spec = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=512, slots=1, engine_version="b7")
    argv = lane_for(spec, EngineConfig(), str(home)).argv(spec, 4000, "k")
    assert argv[3] == versions.get("llamacpp", "b7").path  # type: ignore[union-attr]  # under the watchdog
    missing = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=512, slots=1, engine_version="b8")
    with pytest.raises(UnsupportedEngine, match="blazar engine install llamacpp@b8"):
        lane_for(missing, EngineConfig(), str(home))
    assert llamacpp.lane(EngineConfig()).release is None


def test_the_gate_allows_a_drop_within_the_margin() -> None:
    assert gate([95.0, 96.0, 94.0], [100.0, 100.0, 100.0], 0.10)[0] is True
    ok, why = gate([80.0, 81.0, 79.0], [100.0, 100.0, 100.0], 0.10)
    assert ok is False and "runs at 80% of its speed" in why and "below the 10% margin" in why
    assert gate([], [100.0], 0.10)[0] is False
    assert gate([50.0], [], 0.10)[0] is True  # nothing to compare with


def test_one_slow_answer_does_not_decide() -> None:
    # Other work on the machine slowed one answer of each version: the medians still agree.
    ok, why = gate([100.0, 12.0, 99.0], [101.0, 100.0, 9.0], 0.10)
    assert ok is True and "medians of 3 and 3 answers" in why
    assert gate([50.0, 52.0, 100.0], [100.0, 100.0, 100.0], 0.10)[0] is False
