"""A multi-node engine's head: the lane of a vLLM or SGLang model configured with ``nodes``.

The model has the engine actor every model has; only its lane differs (``head_lane``), from
the vLLM or SGLang lane it runs on:

- its command line is node 0's of the plan over the configured nodes
  (``actors.engines.multinode.plan``, every node used: one pipeline stage each), and its
  environment adds node 0's;
- its ``spawn`` first has each worker node's daemon start that node's part: the ``NodePart``
  goes over the authenticated peer link of the ``[[remotes]]`` entry the node names
  (``PeerActor.start_part``, ``POST /admin/multinode/parts`` there; ``actors/node_parts.py``
  runs it); then it starts the head's own process. A part that cannot start fails the start
  with the node and the reason, which the request that asked for the model gets;
- the child it returns (``HeadChild``) watches the parts while it runs: it asks after each
  every ``poll_s`` of its peer (which renews the part's lease there). A part that exited, or a
  worker daemon that cannot be reached twice running, ends the head's process with the reason
  (``ChildProcess.ended_by``), so the engine actor records the crash naming the node, and the
  next request starts everything again (or says why it cannot). Stopping the child (an unload,
  a shutdown, an idle keep-alive) stops the parts too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import trio

from actors.config import RuntimeConfig
from actors.engines import multinode, sglang, vllm
from actors.engines.lane import Lane
from actors.engines.multinode import GpuNode, MultiNodePlan, PartView, PlanRefused
from actors.engines.spec import LaunchSpec
from actors.errors import PeerRefused, PeerUnavailable, UnsupportedEngine
from actors.peer import PeerActor
from actors.peers import Peers
from actors.process import ChildProcess
from registry.store import Store

__all__ = ["HeadChild", "head_lane"]

log = logging.getLogger("blazar.engine")

_MISSES = 2
"""Polls in a row a worker's daemon may miss before its part counts as lost."""
_LEASE_POLLS = 20
_MIN_LEASE_S = 30.0


class HeadChild(ChildProcess):
    """The head's process, with the parts the worker daemons run for it."""

    def __init__(self, proc: trio.Process, *, name: str, pidfile: Path | None) -> None:
        super().__init__(proc, name=name, pidfile=pidfile)
        self.parts: list[tuple[PeerActor, PartView]] = []
        self.poll_s = 2.0

    async def serve(self, *, task_status: trio.TaskStatus[ChildProcess] = trio.TASK_STATUS_IGNORED) -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_parts)
            code = await super().serve(task_status=task_status)
            nursery.cancel_scope.cancel()
        return code

    async def stop(self, grace_s: float) -> None:
        await super().stop(grace_s)
        parts, self.parts = self.parts, []
        await stop_parts(parts, grace_s)

    async def _watch_parts(self) -> None:
        misses: dict[str, int] = {}
        while True:
            await trio.sleep(self.poll_s)
            for peer, started in list(self.parts):
                where = f"its worker node {started.rank} (peer '{peer.peer}')"
                try:
                    now = await peer.part(started.id)
                except (PeerUnavailable, PeerRefused) as exc:
                    misses[started.id] = misses.get(started.id, 0) + 1
                    if misses[started.id] >= _MISSES:
                        return self._lost(f"{where} is lost: {exc.message}")
                    continue
                misses[started.id] = 0
                if now is None:
                    return self._lost(f"{where} no longer runs its part (its daemon restarted?)")
                if now.state != "running":
                    return self._lost(f"{where} {now.state}: {now.reason or 'no reason given'}")

    def _lost(self, what: str) -> None:
        self.ended_by = f"stopped: {what}"
        self.stderr_tail.write(f"error: {what}\n".encode())
        log.warning("%s: %s; stopping the head", self.name, what)
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


async def stop_parts(parts: Sequence[tuple[PeerActor, PartView]], grace_s: float) -> None:
    """Stop each part on its worker daemon, side by side; bounded, never raises."""

    async def one(peer: PeerActor, view: PartView) -> None:
        try:
            await peer.stop_part(view.id)
        except (PeerUnavailable, PeerRefused) as exc:
            log.warning("could not stop part %s on peer '%s': %s", view.id, peer.peer, exc.message)

    with trio.CancelScope(shield=True), trio.move_on_after(grace_s + 10):
        async with trio.open_nursery() as nursery:
            for peer, view in parts:
                nursery.start_soon(one, peer, view)


def _facts(spec: LaunchSpec, weights_bytes: int | None) -> multinode.ModelFacts:
    try:
        config = json.loads((Path(spec.path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedEngine(
            f"'{spec.model}' has no readable config.json ({exc}): nodes need one"
        ) from None
    if not isinstance(config, dict):
        raise UnsupportedEngine(f"'{spec.model}': config.json is not a JSON object")
    try:
        return multinode.model_facts(config, name=spec.alias or spec.model, weights_bytes=weights_bytes)
    except PlanRefused as exc:
        raise UnsupportedEngine(str(exc)) from None


def head_lane(lane: Lane, spec: LaunchSpec, config: RuntimeConfig, store: Store, peers: Peers) -> Lane:
    """``lane`` (vLLM or SGLang) as the head of ``spec``'s model over its configured ``nodes``
    (the module doc says how). Blocking (it reads config.json). Raises ``UnsupportedEngine``
    for a model that cannot run so (another lane, no config.json)."""
    name = spec.alias or spec.model
    over = config.models[name]
    assert over.nodes is not None
    if spec.lane not in ("vllm", "sglang"):
        raise UnsupportedEngine(
            f"model '{name}' has nodes, which split a safetensors model over machines on vLLM or SGLang; "
            f"it runs on {spec.lane} (a GGUF model splits over llama.cpp RPC workers: rpc = [...])"
        )
    kind: multinode.Lane = "vllm" if spec.lane == "vllm" else "sglang"
    nodes = [multinode.parse_node(text) for text in over.nodes]
    record = store.find(name)
    facts = _facts(spec, record.facts.weights_bytes if record is not None and record.facts else None)
    found = vllm.find_vllm(config.engine.vllm) if kind == "vllm" else sglang.find_sglang(config.engine.sglang)
    if found is None:
        raise UnsupportedEngine(
            f"the {kind} lane is not installed here: set [engine] {kind} (docs/engines.md)"
        )
    program = found.argv

    def plan(spec: LaunchSpec, port: int, api_key: str) -> MultiNodePlan:
        return multinode.plan(
            facts, nodes, spec, lane=kind, port=port, api_key=api_key, program=program,
            tensor_parallel=over.tensor_parallel, pipeline_parallel=len(nodes),
            master_port=over.rendezvous_port or multinode.RENDEZVOUS_PORT,
        )  # fmt: skip

    def argv(spec: LaunchSpec, port: int, api_key: str) -> list[str]:
        try:
            head = plan(spec, port, api_key).nodes[0]
        except PlanRefused:
            return lane.argv(spec, port, api_key)  # never run: spawn refuses with the reason first
        return [sys.executable, "-m", "actors.engines.watchdog", *head.argv]

    def env(spec: LaunchSpec) -> dict[str, str]:
        try:
            head = plan(spec, 0, "").nodes[0]
        except PlanRefused:
            return lane.env(spec)
        return {**lane.env(spec), **head.env}

    async def spawn(
        spec: LaunchSpec, argv: list[str], port: int, *, name: str, env: dict[str, str], pidfile: Path | None
    ) -> ChildProcess:
        try:
            planned = plan(spec, port, "")
        except PlanRefused as exc:
            raise OSError(f"'{spec.alias or spec.model}' cannot run over its nodes: {exc}") from None
        started = await start_parts(planned, nodes, peers, port=port)
        try:
            child = await HeadChild.spawn(argv, name=name, env=env, pidfile=pidfile)
        except BaseException:
            await stop_parts(started, 5.0)
            raise
        assert isinstance(child, HeadChild)
        child.parts = started
        child.poll_s = min((peer.remote.poll_s for peer, _ in started), default=2.0)
        return child

    return dataclasses.replace(lane, argv=argv, env=env, spawn=spawn)


async def start_parts(
    planned: MultiNodePlan, nodes: Sequence[GpuNode], peers: Peers, *, port: int
) -> list[tuple[PeerActor, PartView]]:
    """Have each worker node's daemon start its part of ``planned``; raises ``OSError`` naming
    the node that could not (the parts already started are stopped again)."""
    started: list[tuple[PeerActor, PartView]] = []
    try:
        for rank in range(1, len(planned.nodes)):
            peer_name = nodes[rank].name
            assert peer_name is not None  # the config requires it
            where = f"worker node {rank} (peer '{peer_name}')"
            peer = peers.get(peer_name)
            if peer is None:
                raise OSError(f"{where}: {peers.not_found(peer_name).message}")
            lease_s = max(_MIN_LEASE_S, _LEASE_POLLS * peer.remote.poll_s)
            part = msgspec.structs.replace(
                multinode.part_of(planned, rank, nodes, port=port), lease_s=lease_s
            )
            try:
                view = await peer.start_part(part)
            except (PeerUnavailable, PeerRefused) as exc:
                raise OSError(f"{where} did not start its part of '{planned.model}': {exc.message}") from None
            log.info("'%s': %s runs its part (pid %s there)", planned.model, where, view.pid)
            started.append((peer, view))
    except BaseException:
        await stop_parts(started, 5.0)
        raise
    return started
