"""The parts of multi-node engines this daemon runs for a head daemon: the worker's side.

    parts (actor)
    └ part[id]  → one node's engine process (vLLM ``--headless``, SGLang rank above 0)

A head daemon posts a ``NodePart`` over the peer link (``POST /admin/multinode/parts``, admin
scope). ``NodeParts.start`` finds the model in this daemon's own store (refusing one that is
missing or not safetensors), builds the node's command line with ``multinode.part_argv`` over
its own path and the lane's program configured here (``[engine] vllm`` / ``sglang``), and the
actor starts it under the watchdog: the part dies with this daemon, ``kill -9`` included (its
stdin closes), and its pid file lets the next start reap one that a crash of the machine left.

A worker part serves no HTTP, so it has no health check: it counts as running while its
process lives. One that exits is kept, with its code and stderr tail, until the head asks after
it (``GET``) or stops it (``DELETE``). The head's poll is also the part's lease
(``NodePart.lease_s``): a part the head stops asking after is stopped here, so a head that
died leaves nothing running. A new part for the same model and rank replaces the old one (the
head started its engine again).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never

import msgspec
import trio

from actors.actor import Actor, ActorStatistics
from actors.config import RuntimeConfig
from actors.engines.multinode import NodePart, PartView, part_argv
from actors.errors import EngineCrashed, PartNotFound, UnsupportedEngine
from actors.mailbox import Envelope
from actors.process import ChildProcess
from registry.store import Store

__all__ = ["ListParts", "NodeParts", "PartsStatistics", "SeePart", "StartPart", "StopPart"]

log = logging.getLogger("blazar.parts")

_TAIL_LINES = 12


class StartPart(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start ``part`` with ``argv`` (the engine's own) and ``env`` (what it adds to ours)."""

    part: NodePart
    argv: list[str]
    env: dict[str, str]


class StopPart(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop the part and forget it; the reply is its last view."""

    id: str
    reason: str = "stopped by the head"


class SeePart(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The part's view; asking renews its lease."""

    id: str


class ListParts(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class _Exited(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    id: str
    returncode: int | None


PartsMessage = StartPart | StopPart | SeePart | ListParts | _Exited


class PartsStatistics(ActorStatistics, frozen=True, kw_only=True):
    parts: int
    parts_running: int


@dataclass(slots=True)
class _Part:
    id: str
    part: NodePart
    argv: list[str]
    child: ChildProcess
    started_at: float
    seen_at: float
    """trio time the head last asked after it."""
    state: str = "running"
    reason: str | None = None

    def view(self) -> PartView:
        tail = self.child.stderr_tail.text().splitlines()[-_TAIL_LINES:]
        return PartView(
            id=self.id, model=self.part.model, lane=self.part.lane, rank=self.part.rank,
            state=self.state,  # type: ignore[arg-type]
            pid=self.child.pid if self.child.returncode is None else None,
            returncode=self.child.returncode, reason=self.reason, argv=self.argv,
            started_at=self.started_at, stderr_tail="\n".join(tail),
        )  # fmt: skip


class NodeParts(Actor[PartsMessage]):
    def __init__(self, config: Callable[[], RuntimeConfig], store: Store) -> None:
        super().__init__("parts")
        self._config = config
        self.store = store
        self._parts: dict[str, _Part] = {}

    @property
    def config(self) -> RuntimeConfig:
        """The daemon's config as it is now (a reload changes it)."""
        return self._config()

    def __repr__(self) -> str:
        running = sum(p.state == "running" for p in self._parts.values())
        return f"<NodeParts {running}/{len(self._parts)} running>"

    # -- on the caller's task --------------------------------------------------------------

    async def start(self, part: NodePart) -> PartView:
        """Start ``part`` over this daemon's copy of its model; its view once it runs. Raises
        ``ModelNotFound`` and ``UnsupportedEngine`` (not safetensors, lane not installed)."""
        argv, env = await trio.to_thread.run_sync(self.command, part)
        view: PartView = await self.ask(StartPart(part=part, argv=argv, env=env))
        return view

    def command(self, part: NodePart) -> tuple[list[str], dict[str, str]]:
        """The part's argv and environment here (blocking: it reads the store)."""
        from actors.engines import sglang, vllm
        from actors.planning import plan_resolve

        record = self.store.get(part.model)
        if not record.format.startswith("safetensors"):
            raise UnsupportedEngine(
                f"'{record.name}' is a {record.format} model here: a multi-node part runs a Hugging Face "
                "safetensors model on vLLM or SGLang — copy the head's files with "
                f"`blazar replicate {part.model} --to THIS-PEER` on the head"
            )
        engine = self.config.engine
        program = vllm.find_vllm(engine.vllm) if part.lane == "vllm" else sglang.find_sglang(engine.sglang)
        if program is None:
            raise UnsupportedEngine(
                f"the {part.lane} lane is not installed on this node — install it and set "
                f"[engine] {part.lane} in this daemon's config.toml (docs/engines.md)"
            )
        spec = plan_resolve(self.config, self.store, record).spec
        return part_argv(part, spec, program.argv)

    # -- the actor ---------------------------------------------------------------------

    def dispatch(self, env: Envelope[PartsMessage]) -> Awaitable[None] | None:
        message = env.message
        match message:
            case StartPart():
                return self._start(env, message)
            case StopPart(id=part_id, reason=reason):
                return self._stop(env, part_id, reason)
            case SeePart(id=part_id):
                seen = self._get(part_id)
                seen.seen_at = trio.current_time()
                env.answer(seen.view())
            case ListParts():
                env.answer([p.view() for p in self._parts.values()])
            case _Exited(id=part_id, returncode=rc):
                found = self._parts.get(part_id)
                if found is not None and found.state == "running":
                    summary = found.child.stderr_tail.summary()
                    found.state, found.reason = "exited", f"exited with code {rc}: {summary or 'no output'}"
                    log.warning("part %s of '%s' (rank %d) %s", part_id, found.part.model, found.part.rank,
                                found.reason)  # fmt: skip
                env.answer(None)
            case _:
                assert_never(message)
        return None

    def _get(self, part_id: str) -> _Part:
        found = self._parts.get(part_id)
        if found is None:
            raise PartNotFound(
                f"no multi-node part '{part_id}' runs here (stopped, or this daemon restarted since) "
                "— see GET /admin/multinode/parts"
            )
        return found

    async def _start(self, env: Envelope[PartsMessage], start: StartPart) -> None:
        part = start.part
        for old in [
            p for p in self._parts.values() if (p.part.model, p.part.rank) == (part.model, part.rank)
        ]:
            await self._halt(old, "replaced by a new part from the head")
            del self._parts[old.id]
        part_id = secrets.token_hex(8)
        watched = [sys.executable, "-m", "actors.engines.watchdog", *start.argv]
        pidfile = Path(self.config.run_dir) / "engines" / f"part-{part_id}.pid"
        try:
            child = await ChildProcess.spawn(
                watched,
                name=f"part[{part.model}#{part.rank}]",
                env={**os.environ, **start.env},
                pidfile=pidfile,
            )
        except OSError as exc:
            raise EngineCrashed(
                f"the {part.lane} part of '{part.model}' could not start here: {exc}"
            ) from None
        now = trio.current_time()
        found = _Part(
            id=part_id, part=part, argv=start.argv, child=child, started_at=time.time(), seen_at=now
        )
        self._parts[part_id] = found
        self.start_soon(self._watch, part_id, child)
        log.info("part %s of '%s' (rank %d of %d) started: pid %d, %s", part_id, part.model, part.rank,
                 part.nnodes, child.pid, " ".join(start.argv))  # fmt: skip
        env.answer(found.view())

    async def _stop(self, env: Envelope[PartsMessage], part_id: str, reason: str) -> None:
        found = self._get(part_id)
        await self._halt(found, reason)
        del self._parts[part_id]
        env.answer(found.view())

    async def _halt(self, found: _Part, reason: str) -> None:
        if found.state == "running":
            found.state, found.reason = "stopped", reason
            log.info("part %s of '%s' (rank %d): stopping: %s", found.id, found.part.model, found.part.rank,
                     reason)  # fmt: skip
        await found.child.stop(self.config.engine.stop_grace_s)

    async def _watch(self, part_id: str, child: ChildProcess) -> None:
        rc = await child.serve()
        try:
            await self.tell(_Exited(id=part_id, returncode=rc))
        except Exception:  # stopping: nobody asks any more
            pass

    def next_deadline(self) -> float:
        leases = [
            p.seen_at + p.part.lease_s
            for p in self._parts.values()
            if p.state == "running" and p.part.lease_s
        ]
        return min(leases, default=math.inf)

    def on_deadline(self) -> None:
        now = trio.current_time()
        for found in self._parts.values():
            if found.state == "running" and found.part.lease_s and found.seen_at + found.part.lease_s <= now:
                found.state = "stopped"
                found.reason = f"the head did not ask after it for {found.part.lease_s:g} s (gone?)"
                log.warning("part %s of '%s': %s", found.id, found.part.model, found.reason)
                self.start_soon(found.child.stop, self.config.engine.stop_grace_s)

    async def on_stop(self) -> None:
        async with trio.open_nursery() as nursery:
            for found in self._parts.values():
                nursery.start_soon(found.child.stop, self.config.engine.stop_grace_s)

    def statistics(self) -> PartsStatistics:
        return PartsStatistics(
            **self.actor_fields(),
            parts=len(self._parts),
            parts_running=sum(p.state == "running" for p in self._parts.values()),
        )
