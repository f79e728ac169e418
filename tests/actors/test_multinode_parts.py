"""The worker's side of a multi-node engine (``actors/node_parts.py``) and the ``nodes`` setting.

The part runs the stand-in ``tests/fake_vllm.py`` as the configured ``[engine] vllm`` (a worker
part is ``--headless``: it serves nothing and waits), in-process with no daemon: its command
line is the plan's over this store's path, a part that exits is reported with its code, one
the head stops asking after is stopped when its lease runs out, and a stop stops it. The
refusals need no process at all. The whole path over two daemons is
``tests/e2e/test_multinode_e2e.py``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import trio

from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.engines import multinode
from actors.engines.multinode import PartView
from actors.errors import PartNotFound, UnsupportedEngine
from actors.node_parts import ListParts, NodeParts, SeePart, StopPart
from registry.errors import ModelNotFound
from registry.imports import import_path
from registry.store import Store
from tests import fake_vllm
from tests.registry.test_formats import hf_config, hf_dir, llama_tensors
from tests.registry.test_weights import mlx_dir

MODEL = "tiny-llama"
NODES = ["host=10.0.0.1,gpus=1,gpu_mem_gb=80", "host=10.0.0.2,gpus=1,gpu_mem_gb=80,name=w"]


def test_nodes_name_the_peer_of_every_worker() -> None:
    assert ModelOverride(nodes=NODES).nodes == NODES
    with pytest.raises(ValueError, match=r"nodes\[1\].*names no peer: add name=PEER"):
        ModelOverride(nodes=[NODES[0], "host=10.0.0.2,gpus=1,gpu_mem_gb=80"])
    with pytest.raises(ValueError, match="exclude each other"):
        ModelOverride(nodes=NODES, rpc=["10.0.0.3:50052"])
    with pytest.raises(ValueError, match="is not KEY=VALUE"):
        ModelOverride(nodes=[NODES[0], "10.0.0.2"])
    with pytest.raises(ValueError, match="more than once"):
        ModelOverride(nodes=[*NODES, "host=10.0.0.3,gpus=1,gpu_mem_gb=80,name=w"])
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"nodes": NODES[:1]}, ModelOverride)


def _plan(config: RuntimeConfig, store: Store) -> multinode.MultiNodePlan:
    """The head's plan, made as the runtime makes it (the model's launch spec), over its path."""
    from actors.planning import plan_resolve

    spec = plan_resolve(config, store, store.get(MODEL)).spec
    spec = msgspec.structs.replace(spec, path="/head/path", ctx_per_slot=2048, slots=2)
    facts = multinode.model_facts(hf_config(max_position_embeddings=4096), name=MODEL, weights_bytes=1 << 20)
    nodes = [multinode.parse_node(n) for n in NODES]
    return multinode.plan(facts, nodes, spec, lane="vllm", port=41234, api_key="k", pipeline_parallel=2)


def _worker(tmp_path: Path) -> tuple[RuntimeConfig, Store, Path]:
    home = tmp_path / "home"
    store = Store(home / "models")
    (tmp_path / "src").mkdir()
    folder = hf_dir(tmp_path / "src", hf_config(max_position_embeddings=4096), [llama_tensors()], name=MODEL)
    import_path(store, folder, MODEL)
    program = fake_vllm.install(tmp_path / "bin")
    config = RuntimeConfig.in_home(str(home), engine=EngineConfig(vllm=str(program), stop_grace_s=2.0))
    return config, store, program


def test_a_part_is_refused_without_its_model_or_lane(tmp_path: Path) -> None:
    config, store, _ = _worker(tmp_path)
    part = multinode.part_of(_plan(config, store), 1, [multinode.parse_node(n) for n in NODES], port=41234)
    parts = NodeParts(lambda: config, store)
    argv, env = parts.command(part)
    path = store.get(MODEL).path
    assert argv[2] == path and argv[argv.index("--port") + 1] == "41234" and "--headless" in argv
    assert env["VLLM_PP_LAYER_PARTITION"] == "1,1" and env["VLLM_HOST_IP"] == "10.0.0.2"
    with pytest.raises(ModelNotFound):
        parts.command(msgspec.structs.replace(part, model="absent"))
    import_path(store, mlx_dir(tmp_path / "src"), "tiny-mlx")
    with pytest.raises(UnsupportedEngine, match="a multi-node part runs a Hugging Face safetensors model"):
        parts.command(msgspec.structs.replace(part, model="tiny-mlx"))
    bare = NodeParts(lambda: msgspec.structs.replace(config, engine=EngineConfig(vllm=None)), store)
    if not _vllm_here():  # an installed vLLM would be found without the setting
        with pytest.raises(UnsupportedEngine, match="vllm lane is not installed on this node"):
            bare.command(part)


def _vllm_here() -> bool:
    from actors.engines import vllm

    return vllm.find_vllm(None) is not None


async def _eventually(check: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(400):
        if await check():
            return
        await trio.sleep(0.05)
    raise AssertionError("timed out")


async def _line_written(log: Path) -> bool:
    return await trio.Path(log).exists() and (await trio.Path(log).read_text()).endswith("\n")


async def _state(parts: NodeParts, part_id: str, state: str) -> bool:
    views: list[PartView] = await parts.ask(ListParts())  # a list renews no lease (SeePart does)
    return any(v.id == part_id and v.state == state for v in views)


async def test_a_part_runs_reports_its_exit_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, store, program = _worker(tmp_path)
    log = tmp_path / "starts.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    nodes = [multinode.parse_node(n) for n in NODES]
    plan = _plan(config, store)
    part = multinode.part_of(plan, 1, nodes, port=41234)
    parts = NodeParts(lambda: config, store)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(parts.run)
            view = await parts.start(part)
            assert view.state == "running" and view.pid is not None
            expected = [str(program), "serve", store.get(MODEL).path, *plan.nodes[1].argv[3:]]
            expected[expected.index("--port") + 1] = "41234"
            assert view.argv == expected
            # the stand-in creates its log, then writes its line: wait for the whole line
            await _eventually(lambda: _line_written(log))
            (started,) = [json.loads(line) for line in log.read_text().splitlines()]
            assert started["argv"] == expected and started["env"]["VLLM_PP_LAYER_PARTITION"] == "1,1"
            # the process exits: the part says so, with its code
            os.kill(started["pid"], signal.SIGKILL)
            await _eventually(lambda: _state(parts, view.id, "exited"))
            exited = await parts.ask(SeePart(id=view.id))
            assert exited.state == "exited" and "exited with code" in (exited.reason or "")
            # a new part for the same rank replaces it; one with a lease nobody renews stops
            leased = await parts.start(msgspec.structs.replace(part, lease_s=0.5))
            assert [p.id for p in await parts.ask(ListParts())] == [leased.id]
            await _eventually(lambda: _state(parts, leased.id, "stopped"))
            (gone,) = await parts.ask(ListParts())
            assert gone.state == "stopped" and "did not ask after it" in (gone.reason or "")
            # a stop ends it and forgets it
            again = await parts.start(part)
            stopped = await parts.ask(StopPart(id=again.id))
            assert stopped.state == "stopped" and stopped.pid is None
            assert await parts.ask(ListParts()) == []
            with pytest.raises(PartNotFound):
                await parts.ask(SeePart(id=again.id))
            nursery.cancel_scope.cancel()


def test_the_docs_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from blazar.config import load_config, resolve_paths

    text = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()
    (example,) = [b for b in re.findall(r"^```toml\n(.*?)^```", text, re.M | re.S) if "nodes = [" in b]
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(example)
    config = load_config(resolve_paths())
    (over,) = config.models.values()
    assert over.nodes is not None and "name=gpu2" in over.nodes[1]
    assert [r.name for r in config.remotes] == ["gpu2"]
