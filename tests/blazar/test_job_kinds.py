"""The job kinds the gateway adds to the runtime are all in one table and all registered."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from actors import pulls
from blazar.serve.jobs import JOB_KINDS, register_all
from blazar.serve.jobs.self_link import SelfLink


async def _app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("no request is sent while runners are registered")


def test_register_all_registers_each_kind_of_the_table_once() -> None:
    registered: dict[str, Any] = {}
    runtime = SimpleNamespace(jobs=SimpleNamespace(register=registered.__setitem__))
    register_all(runtime, app=_app, headers={"authorization": "Bearer x"}, link=SelfLink({}))  # type: ignore[arg-type]
    kinds = [k.kind for k in JOB_KINDS]
    assert len(set(kinds)) == len(kinds)
    assert list(registered) == kinds
    assert set(kinds) == {"response", "batch", "transcription", "video", "model-doctor", "bench", "tune"}
    assert all(callable(run) for run in registered.values())


def test_the_pull_kind_is_the_runtimes_own() -> None:
    """``open_runtime`` registers pulls (actors/pulls.py): an embedder has them without the gateway."""
    assert pulls.KIND not in {k.kind for k in JOB_KINDS}
