"""A changed configuration applied to a running runtime, as far as it can be live.

Three kinds of key (``key_class``):

- ``live``: read on each decision, applied at once — ``strict``, ``max_queue``,
  ``queue_timeout_s``, ``keep_alive_s``, ``max_loaded_models``, ``memory_budget_mb`` and
  a model's ``keep_alive_s``;
- ``engines``: how an engine starts — ``slots``, ``default_ctx``, ``max_output_tokens``,
  ``late_chunking_max_tokens`` and the other ``[models."NAME"]`` keys. Each engine whose
  launch settings change finishes the requests it runs, then starts again with the new
  ones on its next request; an engine not made yet simply starts with them;
- ``restart``: everything else (the listener, ``[engine]``, MCP servers, failover chains,
  peers, jobs, the ledger, ``preload``). These keep their running values until the daemon
  restarts.
"""

from __future__ import annotations

import logging

import msgspec
import trio

from actors.admission import Retune as AdmissionRetune
from actors.config import Profile, RuntimeConfig, Tunables
from actors.config_keys import changed_keys, key_class
from actors.engine import EngineActor, Reconfigure
from actors.engines.spec import LaunchSpec
from actors.lifecycle import Retune as LifecycleRetune
from actors.planning import launch_spec_for, side_spec_for
from actors.runtime import Runtime

__all__ = ["Reloaded", "apply_config", "apply_profile"]

log = logging.getLogger("blazar.reload")


class Reloaded(msgspec.Struct, frozen=True, kw_only=True):
    applied: list[str]
    """Keys applied at once."""
    engines: list[str]
    """Models whose engines start again with new settings (after their running requests)."""
    engine_keys: list[str]
    """Keys that reach engines when they next start."""
    restart: list[str]
    """Keys that changed in the file but keep their running values until the daemon restarts."""


async def apply_config(runtime: Runtime, new: RuntimeConfig) -> Reloaded:
    """Make ``runtime`` run with ``new`` as far as it can while running; see the module docstring."""
    old = runtime.config
    fields = Tunables.__struct_fields__
    changed = changed_keys(old, new, fields)
    restart = [k for k in changed if key_class(k) == "restart"]
    kept = {k.split(".", 1)[0] for k in restart}
    config = msgspec.structs.replace(
        new,
        home=old.home,
        run_dir=old.run_dir,
        cache_dir=old.cache_dir,
        profiles=old.profiles,  # from the ledger, not the file
        **{name: getattr(old, name) for name in kept},
    )
    runtime.config = config
    runtime.memory.budget_mb = config.memory_budget_mb
    await runtime.admission.ask(
        AdmissionRetune(
            max_queue=config.max_queue, queue_timeout_s=config.queue_timeout_s, classes=config.admission
        )
    )
    await runtime.lifecycle.ask(
        LifecycleRetune(
            keep_alive_s=config.keep_alive_s,
            max_loaded_models=config.max_loaded_models,
            load_wait_s=config.queue_timeout_s,
            model_keep_alive={
                m: o.keep_alive_s for m, o in config.models.items() if o.keep_alive_s is not None
            },
        )
    )
    moved = []
    if any(key_class(k) == "engines" for k in changed):
        for engine in runtime.loaded():
            if await _respec(runtime, engine, old, config):
                moved.append(engine.spec.model)
    engine_keys = [k for k in changed if key_class(k) == "engines"]
    applied = [k for k in changed if key_class(k) == "live"]
    if changed:
        log.info(
            "config reloaded: applied %s; engines to restart %s; kept until a restart %s",
            applied or "nothing",
            moved or "none",
            restart or "nothing",
        )
    return Reloaded(applied=applied, engines=moved, engine_keys=engine_keys, restart=restart)


async def apply_profile(runtime: Runtime, model: str, profile: Profile | None) -> bool:
    """Make ``profile`` the tuned profile of ``model`` (None: drop it), as ``engines`` keys
    apply: its engines start again with it once their running requests end. True when an
    engine of the model was running and its launch settings change."""
    old = runtime.config
    profiles = {k: v for k, v in old.profiles.items() if k != model}
    if profile is not None and profile != Profile():
        profiles[model] = profile
    new = msgspec.structs.replace(old, profiles=profiles)
    runtime.config = new
    moved = False
    for engine in runtime.loaded():
        if (engine.spec.alias or engine.spec.model) == model:
            moved = await _respec(runtime, engine, old, new) or moved
    return moved


async def _respec(runtime: Runtime, engine: EngineActor, old: RuntimeConfig, new: RuntimeConfig) -> bool:
    """Give ``engine`` the launch spec ``new`` makes for it, when that differs from the one
    ``old`` made; True when it does (the engine restarts once its requests end)."""
    running = engine.spec

    def specs() -> tuple[LaunchSpec, LaunchSpec] | None:
        name = running.alias or running.model
        record = runtime.store.find(name)
        if record is None:
            return None
        if "@" in running.model:
            lane = running.model.rsplit("@", 1)[1]
            return side_spec_for(old, runtime.store, record, lane), side_spec_for(
                new, runtime.store, record, lane
            )
        kinds = frozenset({running.kind})
        return launch_spec_for(old, runtime.store, record, kinds), launch_spec_for(
            new, runtime.store, record, kinds
        )

    try:
        pair = await trio.to_thread.run_sync(specs)
    except Exception as exc:  # a model that no longer resolves keeps what it runs
        log.warning("'%s' keeps its settings: %s", running.model, getattr(exc, "message", None) or exc)
        return False
    if pair is None or pair[0] == pair[1]:
        return False
    spec = msgspec.structs.replace(
        pair[1],
        embeddings=running.embeddings or pair[1].embeddings,
        token_embeddings=running.token_embeddings or pair[1].token_embeddings,
        engine_version=running.engine_version,
        lane=running.lane,
    )
    await engine.ask(Reconfigure(spec=spec))
    return True
