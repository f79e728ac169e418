"""Shared fixtures: the real test model, temporary homes, a real daemon."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.instant import prepare_models
from tests.support import DaemonProc, cached_model, ensure_model, make_home, start_daemon

# The registry tests read the real model from this variable.
if "BLAZAR_TEST_MODEL" not in os.environ and (_p := cached_model()) is not None:
    os.environ["BLAZAR_TEST_MODEL"] = str(_p)


@pytest.fixture(scope="session")
def model_path() -> Path:
    return ensure_model()


@pytest.fixture
def home(tmp_path: Path, model_path: Path) -> Path:
    return make_home(tmp_path / "home", model_path)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("daemon") / "home", model_path)
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="session")
def instant_models(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    """One models directory for the session: an import hashes the whole file, once is enough."""
    return prepare_models(tmp_path_factory.mktemp("instant") / "home", model_path)


@pytest.fixture
def instant_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instant_models: Path) -> Path:
    """A fresh BLAZAR_HOME (ledger, run dir) sharing the session's models, for a gateway whose
    engines are the instant upstream (``tests.instant``)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(instant_models)
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    monkeypatch.setenv("BENCH_PYTHON", sys.executable)  # the shim's interpreter: ours, not PATH's
    return home
