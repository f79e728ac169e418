"""``blazar plan MODEL --nodes …``: a multi-node vLLM or SGLang launch, planned here.

It reads the model's config.json (and the size of its weight files when they are there) and
prints ``actors.engines.multinode.plan``'s answer; it needs no daemon, no GPU and no engine
installed. The same nodes in the model's ``nodes`` setting run it (``actors/multinode_head.py``
on the head, ``actors/node_parts.py`` on each worker's daemon).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import msgspec
from rich.markup import escape
from rich.table import Table

from blazar.cli._common import load_setup, open_store, out, print_json
from blazar.config import Paths
from blazar.daemon.client import CliError

__all__ = ["plan_nodes", "read_facts"]

KEY_PLACEHOLDER = "ENGINE_KEY"
"""Stands for the key the head's daemon makes when it starts the engine."""


def _weights_bytes(folder: Path) -> int | None:
    """The weight shards' bytes: those the index names, else every top-level safetensors file;
    None when there are none (a config.json alone: the plan estimates them)."""
    index = folder / "model.safetensors.index.json"
    names: set[str] = set()
    if index.is_file():
        try:
            names = set((json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}).values())
        except (OSError, ValueError, AttributeError):
            names = set()
    files = [folder / n for n in names] if names else sorted(folder.glob("*.safetensors"))
    sizes = [f.stat().st_size for f in files if f.is_file()]
    return sum(sizes) if sizes and len(sizes) == len(files) else None


def read_facts(target: str, paths: Paths) -> tuple[Any, str, str]:
    """``(ModelFacts, model name, directory)`` of a model directory (or its config.json) or an
    installed safetensors model."""
    from actors.engines.multinode import PlanRefused, model_facts

    path = Path(target).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    weights: int | None = None
    if path.is_dir():
        folder, name = path, path.name
        weights = _weights_bytes(folder)
    else:
        record = open_store(paths).find(target)
        if record is None:
            raise CliError(
                f"no model '{target}' is installed, and it is not a directory with a config.json — "
                "give an installed safetensors model or a model directory"
            )
        if record.format != "safetensors":
            raise CliError(
                f"'{record.name}' is a {record.format} model: multi-node plans are for safetensors "
                "models on vLLM or SGLang (a GGUF model splits over llama.cpp RPC workers: "
                "docs/federation.md)"
            )
        folder, name = Path(record.path), record.name
        weights = record.facts.weights_bytes if record.facts else None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(f"{folder}: no readable config.json ({exc})") from None
    if not isinstance(config, dict):
        raise CliError(f"{folder}/config.json is not a JSON object")
    try:
        return model_facts(config, name=name, weights_bytes=weights), name, str(folder)
    except PlanRefused as exc:
        raise CliError(str(exc)) from None


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def plan_nodes(
    target: str,
    *,
    nodes: list[str],
    node: list[str],
    engine: str,
    ctx: int | None,
    slots: int | None,
    tp: int | None,
    pp: int | None,
    port: int,
    json_: bool,
    master_port: int | None = None,
) -> None:
    from actors.engines import multinode
    from actors.engines.spec import LaunchSpec

    paths, config = load_setup()
    try:
        machines = [m for spec in nodes for m in multinode.parse_nodes(spec)]
        machines += [multinode.parse_node(spec) for spec in node]
    except multinode.PlanRefused as exc:
        raise CliError(str(exc)) from None
    facts, name, folder = read_facts(target, paths)
    installed = _installed_spec(paths, config, target)
    if installed is not None:  # as the daemon would start it: its settings, context and slots
        spec = msgspec.structs.replace(
            installed, ctx_per_slot=ctx or installed.ctx_per_slot, slots=slots or installed.slots
        )
        ctx, slots = spec.ctx_per_slot, spec.slots
    else:
        override = config.models.get(name)
        trained = _trained(Path(folder))
        ctx = (
            ctx
            or (override.ctx if override else None)
            or min(trained or config.default_ctx, config.default_ctx)
        )
        slots = slots or (override.slots if override else None) or config.slots
        spec = LaunchSpec(
            model=name, path=folder, ctx_per_slot=ctx, slots=slots, architecture=facts.architecture
        )
    lane: Literal["vllm", "sglang"] = "sglang" if engine == "sglang" else "vllm"
    try:
        plan = multinode.plan(
            facts, machines, spec, lane=lane, port=port, api_key=KEY_PLACEHOLDER,
            tensor_parallel=tp, pipeline_parallel=pp, master_port=master_port or multinode.RENDEZVOUS_PORT,
        )  # fmt: skip
    except multinode.PlanRefused as exc:
        if json_:
            print_json({"model": name, "lane": lane, "verdict": "no_fit", "reason": str(exc)})
            raise SystemExit(1) from None
        raise CliError(str(exc)) from None
    if json_:
        print_json({"verdict": "fits", **msgspec.to_builtins(plan)})
        return
    out.print(f"[bold]{escape(name)}[/]  {lane} over {plan.pipeline_parallel} node(s)  [dim](plan)[/]")
    table = Table(box=None, show_header=False)
    gpus = plan.tensor_parallel * plan.pipeline_parallel
    table.add_row(
        "[bold]parallel[/]",
        f"tensor {plan.tensor_parallel} x pipeline {plan.pipeline_parallel} = {gpus} GPUs",
    )
    table.add_row("[bold]context[/]", f"{ctx} per slot x {slots} slot(s)")
    table.add_row(
        "[bold]weights[/]", f"{_gib(facts.weights_bytes)}, {facts.layers} layers split {plan.layer_split}"
    )
    for n in plan.nodes:
        table.add_row(
            f"[bold]node {n.rank}[/]",
            f"{escape(n.host)} ({n.role}): {_gib(n.need_per_gpu)} per GPU "
            f"(weights {_gib(n.weights_per_gpu)}, KV {_gib(n.kv_per_gpu)}) of {_gib(n.gpu_memory)}, "
            f"fraction {n.memory_fraction:.2f}",
        )
    if plan.unused:
        table.add_row("[bold]unused[/]", escape(", ".join(plan.unused)))
    out.print(table)
    out.print(multinode.render(plan), markup=False, highlight=False)
    for note in [
        *plan.notes,
        f"{KEY_PLACEHOLDER} stands for the key the head's daemon makes when it starts the engine",
    ]:
        out.print(f"[dim]note: {escape(note)}[/]")


def _installed_spec(paths: Paths, config: Any, target: str) -> Any:
    """The launch spec the daemon would start an installed model with (its settings, context,
    slots and flags), so that the plan prints what a head with ``nodes`` runs; None for a
    directory, or a model the runtime cannot resolve (the plan then uses the basics)."""
    from actors.errors import BlazarRuntimeError
    from actors.planning import plan_resolve
    from registry.errors import RegistryError

    if Path(target).expanduser().exists():
        return None
    store = open_store(paths)
    record = store.find(target)
    if record is None:
        return None
    try:
        return plan_resolve(config.runtime(paths), store, record).spec
    except (BlazarRuntimeError, RegistryError):
        return None


def _trained(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None
