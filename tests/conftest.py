"""Shared fixtures: the real test model, temporary homes, a real daemon."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
