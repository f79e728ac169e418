"""The SDK's tests run against a real ``blazar serve`` with the real test model.

They reuse the daemon helpers of the repository's own tests (``tests/support.py``): the SDK
package itself never imports the daemon, the tests only start it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.responses_schema import installed as held_to_schema  # noqa: E402
from tests.support import DaemonProc, ensure_model, make_home, pull_env, start_daemon  # noqa: E402

# A chain whose first target is not installed: the request moves on to the test model.
CONFIG = """
[[failover]]
name = "tiny"
targets = ["not-installed-model", "smollm2-135m"]
"""


@pytest.fixture(scope="session", autouse=True)
def responses_held_to_schema() -> Iterator[None]:
    """The SDK's Responses calls are checked against the published schemas as the repository's
    own tests' are (``tests/responses_schema.py``)."""
    with held_to_schema():
        yield


@pytest.fixture(scope="session")
def sdk_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """One daemon for the SDK's tests (pulls work offline from the test models' wheel cache)."""
    home = make_home(tmp_path_factory.mktemp("sdk") / "home", ensure_model(), config=CONFIG)
    d = start_daemon(home, env=pull_env(home))
    try:
        yield d
    finally:
        d.stop()
