"""Shared fixtures: the real test model, temporary homes, a real daemon."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import responses_schema
from tests.instant import prepare_models
from tests.support import DaemonProc, cached_model, ensure_model, make_home, start_daemon

# One CPU thread per llama.cpp engine (llama-server's own variable, which the xllamacpp host reads
# too): tests run several engines at once (a probe beside the served model, peers, two xdist
# workers), and llama.cpp's threads spin at their barriers, so two engines of two threads each on
# two cores ran at 4 % of their speed. Tests that are about threads pass -t, which wins.
os.environ.setdefault("LLAMA_ARG_THREADS", "1")
# The same for the other lanes: mistral.rs (rayon, candle), CTranslate2's OpenMP pool (whisper)
# and onnxruntime (piper, whose host reads OMP_NUM_THREADS too). With two xdist workers they ran
# 4-5 times slower than alone, for the same reason.
for _var in ("RAYON_NUM_THREADS", "CANDLE_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# An xdist worker is started with COLUMNS=80 and LINES=24 for a terminal it does not have: the
# CLI would then lay its tables out for 80 columns where a serial run prints whole rows to a pipe.
if "PYTEST_XDIST_WORKER" in os.environ:
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)

# The registry tests read the real model from this variable.
if "BLAZAR_TEST_MODEL" not in os.environ and (_p := cached_model()) is not None:
    os.environ["BLAZAR_TEST_MODEL"] = str(_p)


@pytest.fixture(scope="session", autouse=True)
def responses_held_to_schema() -> Iterator[None]:
    """Every answer of a ``/v1/responses`` route that a test's httpx client reads (the openai
    SDK's included) is checked against the published schemas as it arrives: a Response object,
    or each streamed event (``tests/responses_schema.py``)."""
    with responses_schema.installed():
        yield


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


# The modules that took longest in the last measured run (docs/development.md), longest first.
# xdist hands out whole modules (--dist loadfile) in collection order, so these start first and
# no worker is left running one of them alone at the end.
LONGEST_FIRST = (
    "tests/e2e/test_mistralrs_e2e.py",
    "tests/e2e/test_mcp_loop_e2e.py",
    "tests/e2e/test_client_replays.py",
    "tests/e2e/test_rpc_split.py",
    "tests/e2e/test_mcp_compact_e2e.py",
    "tests/e2e/test_durability_crash.py",
    "tests/e2e/test_sessions_e2e.py",
    "tests/e2e/test_resumable_streams.py",
    "tests/actors/test_speech_hosts.py",
    "tests/e2e/test_prompt_limits_e2e.py",
    "tests/e2e/test_lifecycle_e2e.py",
    "tests/e2e/test_dialects_sdk.py",
    "tests/e2e/test_responses_sdk.py",
    "tests/e2e/test_cli.py",
    "tests/e2e/test_speech_jobs.py",
    "tests/bench/test_bench_smoke.py",
    "tests/e2e/test_engine_versions.py",
    "tests/blazar/test_cli_quantize.py",
    "tests/e2e/test_tools_e2e.py",
    "tests/e2e/test_tune_e2e.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first, then the other modules with slow tests, then the fast ones;
    the order within a module is kept."""
    root = Path(str(config.rootpath))
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        return (1 if item.path in slow_modules else 2), 0

    items.sort(key=rank)
