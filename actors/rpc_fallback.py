"""Before a split model's engine starts: which of its RPC workers answer, and what it
starts with when one does not (``[models."NAME"] rpc_fallback``).

A worker's ``rpc-server`` that dies takes the engine with it (llama.cpp aborts when a
device stops answering); the next request starts the engine again. Started over a worker
that is still down it would fail at load, so the workers are asked first: one that does
not answer within ``WAIT_S`` (``blazar rpc-worker`` restarts a crashed ``rpc-server`` after
a second) is either waited for by refusing the request (the default), or, with
``rpc_fallback = "remaining"``, left out: the split is planned again over this machine and
the workers that answer, when this machine can hold the rest. Once the worker answers again
the next start takes it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import trio

from actors.engine import EngineState, Reconfigure
from actors.errors import RpcWorkerUnavailable
from actors.rpc import answering, without_workers

if TYPE_CHECKING:
    from actors.engine import EngineActor
    from actors.runtime import Runtime

__all__ = ["WAIT_S", "workers_ready"]

WAIT_S = 5.0
"""How long a worker that refuses connections is given to come back before a start goes on
without it (or is refused)."""


async def workers_ready(runtime: Runtime, engine: EngineActor) -> None:
    """Make ``engine``'s spec name the workers of its model that answer now, or raise
    ``RpcWorkerUnavailable`` naming those that do not, when the model may not (or cannot)
    run without them. Nothing to do for a model without workers."""
    name = engine.spec.model  # a side engine (NAME@lane) has no table of its own
    over = runtime.config.models.get(name)
    if over is None or not over.rpc or engine.spec.lane != "llamacpp":
        return
    workers = list(over.rpc)
    up = await trio.to_thread.run_sync(lambda: answering(workers, wait_s=WAIT_S))
    missing = [w for w in workers if w not in up]
    if not missing and engine.spec.rpc == workers:
        return
    if missing and over.rpc_fallback != "remaining":
        raise RpcWorkerUnavailable(
            f"model '{name}' is split over RPC workers, and {_named(missing)} — start "
            "`blazar rpc-worker` there (or check the address in config.toml), then retry; with "
            f'[models."{name}"] rpc_fallback = "remaining" it would run without it'
        )
    config = without_workers(runtime.config, name, missing) if missing else runtime.config
    record = await trio.to_thread.run_sync(runtime.store.get, name)
    fresh = await trio.to_thread.run_sync(
        lambda: runtime.launch_spec(record, frozenset({engine.spec.kind}), config=config)
    )
    # The spec as planned for these workers (the prompt batch, slots and -ngl follow where the
    # layers are), with what the runtime set on the engine beyond the plan kept.
    spec = engine.spec
    changed = msgspec.structs.replace(
        fresh, digest=spec.digest, slot_save_path=spec.slot_save_path, ctx_per_slot=spec.ctx_per_slot
    )
    if missing:
        need = await runtime.memory.would_need(changed)
        held = sum(
            runtime.memory.footprint(e.spec.model) or 0
            for e in runtime.loaded()
            if e is not engine and e.state in (EngineState.READY, EngineState.STARTING)
        )
        budget = runtime.memory.budget(held)
        if need is not None and budget is not None and need > budget:
            raise RpcWorkerUnavailable(
                f"model '{name}' is split over RPC workers, and {_named(missing)}; "
                f"without it this machine would hold {need / 2**20:.0f} MiB of it, over its "
                f"{budget / 2**20:.0f} MiB budget — start `blazar rpc-worker` there, then retry"
            )
    await engine.ask(Reconfigure(spec=changed))


def _named(missing: list[str]) -> str:
    if len(missing) > 1:
        return f"the workers {', '.join(missing)} do not answer"
    return f"the worker {missing[0]} does not answer"
