"""Fixtures for tests/blazar: edit scenarios run on each tomlkit version the project allows."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tomlkit_versions import Scenario, install_oldest, oldest_version, run_oldest


@pytest.fixture(scope="session")
def oldest_tomlkit() -> Path:
    """The oldest tomlkit pyproject.toml allows, installed once into .cache/tomlkit/."""
    return install_oldest()


@pytest.fixture(params=["installed", "oldest"], ids=["tomlkit-installed", f"tomlkit-{oldest_version()}"])
def on_tomlkit(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[Scenario], Any]:
    """Runs a scenario (``tests.tomlkit_versions``) on the installed tomlkit, here, or on the
    oldest, in a child interpreter; either way in a fresh home that is ``$BLAZAR_HOME``."""

    def run(scenario: Scenario) -> Any:
        home = Path(tempfile.mkdtemp(prefix="home-", dir=tmp_path))
        if request.param == "oldest":
            return run_oldest(scenario, home, request.getfixturevalue("oldest_tomlkit"))
        monkeypatch.setenv("BLAZAR_HOME", str(home))
        monkeypatch.delenv("EDITOR", raising=False)
        monkeypatch.delenv("VISUAL", raising=False)
        return json.loads(json.dumps(scenario(home)))  # what the child's answer goes through

    return run
