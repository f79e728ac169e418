"""``blazar fit``, ``plan``, ``coreside`` and ``drafts``: what a model needs and what pairs
with it, without a daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from rich.markup import escape
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import (
    Json,
    daemon_or_here,
    human_params,
    human_size,
    load_setup,
    open_store,
    out,
    print_json,
    run_offline,
)
from blazar.config import Paths
from blazar.daemon.client import CliError


def _bin(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


_FIT_FIELDS = ("weights", "kv", "k", "v", "recurrent", "compute", "overhead", "total")


def _shape_of(target: str, paths: Paths) -> tuple[Any, str, str]:
    """(shape, model name, where it was read) of a file, an installed model, or a remote one."""
    import trio

    from registry.catalog import Catalog
    from registry.errors import ModelNotFound
    from registry.remote import remote_shape
    from registry.shape import read_shape

    path = Path(target).expanduser()
    if path.is_file():
        return read_shape(path), path.name, str(path)
    try:
        record = open_store(paths).get(target)
    except ModelNotFound:
        catalog = Catalog.load()
        if "/" not in target and catalog.get(target) is None:
            raise  # neither a file, nor installed, nor something to fetch a header of
        shape, source = trio.run(remote_shape, target, catalog)
        return shape, target, source
    return read_shape(record.path), record.name, record.path


def _fit_files(
    target: str, paths: Paths, config: Any, ctx: int | None, slots: int | None, *, json_: bool
) -> bool:
    """``blazar fit`` of an installed model that is not one GGUF (a speech model, a safetensors
    or MLX directory, a diffusion checkpoint: its files' sizes and header facts); False when
    ``target`` is not one."""
    from actors.census import take_census
    from registry import fit as fitting
    from registry import weights
    from registry.errors import RegistryError

    try:
        record = open_store(paths).find(target)
    except RegistryError:
        return False
    if record is None or not record.files:
        return False
    override = config.models.get(record.name)
    text = record.kind in ("chat", "embedding")
    slots = slots or (override.slots if override else None) or (config.slots if text else 1)
    census = take_census()
    facts = record.facts
    if record.format in weights.FORMATS:
        trained = facts.context_length if facts else None
        asked = ctx or (override.ctx if override else None) or min(trained or 4096, config.default_ctx)
        est = weights.estimate(record.kind, record.format, record.size, facts,
                               ctx_per_slot=asked if text else 0, slots=slots)  # fmt: skip
        report = (
            fitting.fit_files(est, census.memory())
            if record.format == "ggml-whisper"
            else fitting.fit_weights(est, census.memory())
        )
    else:
        est = fitting.estimate_files(record.kind, record.size, slots=slots)
        report = fitting.fit_files(est, census.memory())
    notes = [*report.notes, *([census.note] if census.note else [])]
    if json_:
        fields = {k: getattr(est, k) for k in ("weights", "kv", "compute", "overhead", "total")}
        doc = {"model": record.name, "kind": record.kind, "format": record.format, "path": record.path}
        doc |= {"ctx_per_slot": est.settings.ctx_per_slot, "slots": est.settings.slots}
        doc |= fields | {"verdict": report.verdict, "device": report.device, "available": report.available}
        print_json(doc | {"headroom": report.headroom, "tight": report.tight, "notes": notes})
        return True
    out.print(f"[bold]{record.name}[/]  {record.kind} · {record.format} · {len(record.files)} file(s)")
    weights_bytes = (facts.weights_bytes if facts else None) or record.size
    kv_row = []
    if est.kv:
        per = f"{est.settings.ctx_per_slot} per slot x {est.settings.slots} slot(s), 16-bit"
        kv_row = [("KV cache", est.kv, per)]
    table = Table(box=None, show_header=False)
    for key, value, detail in (
        ("weights", est.weights, f"{human_size(weights_bytes)} of weight files, resident"),
        *kv_row,
        ("working", est.compute, f"{est.settings.slots} slot(s): activations, caches (allowance)"),
        ("overhead", est.overhead, "engine process (allowance)"),
        ("total", est.total, ""),
    ):
        table.add_row(f"[bold]{key}[/]", _bin(value), f"[dim]{detail}[/]")
    out.print(table)
    verdict = "fits" if report.verdict == "fits" else "does not fit"
    where = "free VRAM on one GPU" if report.device == "gpu" else "available RAM"
    room = f"{_bin(report.available)} {where}, headroom {_bin(report.headroom)}"
    out.print(f"[bold]verdict[/]  {verdict} ({room})")
    for note in notes:
        out.print(f"[dim]note: {note}[/]")
    return True


@app.command
def fit(
    target: str,
    *,
    ctx: int | None = None,
    slots: int | None = None,
    cache_type: Literal["f16", "q8_0", "q4_0"] = "f16",
    json_: Json = False,
) -> None:
    """Estimate a model's memory (weights, KV cache, compute) and whether it fits on this machine.

    TARGET is an installed model, a path to a .gguf file, or a model not downloaded yet (a catalog
    name or ORG/REPO:QUANT: only its header is fetched). --ctx is per slot (the engine gets
    ctx x slots); the defaults are the ones the daemon would use. Needs no daemon.
    """
    from actors.census import take_census
    from actors.context import context_limit, describe_clamp, rope_factor
    from registry import fit as fitting

    paths, config = load_setup()
    if _fit_files(target, paths, config, ctx, slots, json_=json_):
        return
    shape, name, path = _shape_of(target, paths)
    override = config.models.get(name)
    asked = ctx or (override.ctx if override else None) or fitting.default_ctx(shape, config.default_ctx)
    scaling = override.rope_scaling if override else None
    factor = rope_factor(shape.context_length, scaling, override.rope_scale if override else None, asked)
    limit = context_limit(shape.context_length, factor)
    context_notes = []
    if limit is not None and asked > limit:
        if ctx:  # asked for on the command line: estimate it, but say what an engine would serve
            context_notes.append(
                f"llama.cpp gives each slot at most {limit} tokens; the daemon would clamp --ctx {ctx} to it"
                + ("" if factor else " unless rope_scaling extends the model")
            )
        else:
            clamp = describe_clamp(asked, limit, trained=shape.context_length, extended=bool(factor))
            context_notes.append(f"ctx {clamp}")
            asked = limit
    ctx = asked
    settings = fitting.Settings(
        ctx_per_slot=ctx,
        slots=slots or (override.slots if override else None) or config.slots,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
    )
    census = take_census()
    report = fitting.fit(shape, settings, census.memory())
    est = report.estimate
    notes = [*context_notes, *report.notes, *([census.note] if census.note else [])]
    rpc_split = None
    if override is not None and override.rpc:
        from actors.rpc import within_budget, workers_of
        from registry.split import split

        here = within_budget(census.memory(), config.memory_budget_mb)
        rpc_split = split(shape, settings, here, workers_of(override, census.memory()))
    if json_:
        doc = {
            "model": name,
            "path": path,
            "architecture": shape.architecture,
            "quantization": shape.file_type,
            "parameters": shape.parameter_count,
            "layers": shape.n_layer,
            **{k: getattr(est, k) for k in _FIT_FIELDS},
            "weights_by_type": est.weights_by_type,
            "cells_per_slot": est.cells_per_slot,
            "swa_cells_per_slot": est.swa_cells_per_slot,
            "settings": settings,
            "verdict": report.verdict,
            "device": report.device,
            "available": report.available,
            "ram_available": report.ram_available,
            "gpu_layers": report.gpu_layers,
            "n_layers": report.n_layers,
            "headroom": report.headroom,
            "tight": report.tight,
            "levers": report.levers,
            "census": census,
            "notes": notes,
            "rpc": rpc_split,
        }
        print_json(doc)
        return
    quant, params = shape.file_type or "?", human_params(shape.parameter_count)
    out.print(f"[bold]{name}[/]  {shape.architecture} · {quant} · {params} params · {shape.n_layer} layers")
    out.print(
        f"ctx {settings.ctx_per_slot} per slot x {settings.slots} slot(s), "
        f"KV cache {cache_type}, flash attention on"
    )
    by_type = sorted(est.weights_by_type.items(), key=lambda kv: -kv[1])
    cells = f"{est.cells_per_slot} cells per slot"
    if est.swa_cells_per_slot is not None:
        cells += f", {est.swa_cells_per_slot} on sliding-window layers"
    rows = [
        ("weights", _bin(est.weights), ", ".join(f"{t} {_bin(b)}" for t, b in by_type)),
        ("KV cache", _bin(est.kv), f"K {_bin(est.k)} + V {_bin(est.v)}; {cells}"),
        *([("recurrent", _bin(est.recurrent), "fixed state per slot")] if est.recurrent else []),
        ("compute", _bin(est.compute), "graph and output buffers (estimate)"),
        ("overhead", _bin(est.overhead), "engine process"),
        ("total", _bin(est.total), ""),
    ]  # fmt: skip
    table = Table(box=None, show_header=False)
    for key, value, detail in rows:
        table.add_row(f"[bold]{key}[/]", value, f"[dim]{detail}[/]")
    out.print(table)
    where = "free VRAM" if report.device == "gpu" else "available RAM"
    verdict = {
        "fits": "fits",
        "offload": f"fits with {report.gpu_layers} of {report.n_layers} layers on the GPU, the rest in RAM"
        if report.gpu_layers
        else "fits in RAM only: no layer fits on the GPU",
        "no_fit": "does not fit",
    }[report.verdict]
    room = f"{_bin(report.available)} {where}, headroom {_bin(report.headroom)}"
    out.print(f"[bold]verdict[/]  {verdict} ({room})")
    if report.levers:
        table = Table("LEVER", "WEIGHTS", "KV", "TOTAL", "VERDICT", box=None)
        for lever in report.levers:
            result: str = lever.verdict
            if lever.verdict == "offload":
                result = f"offload, {lever.gpu_layers} GPU layers"
            table.add_row(lever.change, _bin(lever.weights), _bin(lever.kv), _bin(lever.total), result)
        out.print(table)
    for note in notes:
        out.print(f"[dim]note: {note}[/]")
    if rpc_split is not None:
        import msgspec

        from blazar.cli.rpc import print_split

        out.print("[bold]RPC split[/] (rpc workers in config.toml)")
        print_split(msgspec.to_builtins(rpc_split))


@app.command
def plan(
    model: str,
    *,
    nodes: list[str] | None = None,
    node: list[str] | None = None,
    engine: Literal["vllm", "sglang"] = "vllm",
    ctx: int | None = None,
    slots: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    port: int = 8000,
    json_: Json = False,
) -> None:
    """Preview how MODEL would run: engine, context, slots, memory, and what loading it would evict.

    With a daemon running, the answer is the daemon's own decision for a load now (the same code
    as a real load); without one, nothing else is loaded.

    With --nodes or --node, a multi-node vLLM or SGLang launch of a safetensors MODEL (installed,
    or a directory with its config.json) is planned instead: the tensor and pipeline parallel
    sizes, the memory per GPU and each node's command line. --nodes NxGxMEM[@HOST,…] gives N
    alike nodes (2x8x80G, 2x8xH100-80G@10.0.0.1,10.0.0.2; GiB); --node
    host=H,gpus=G,gpu_mem_gb=M[,name=PEER][,ifname=IF] one node, repeatable; the first is the
    head. --engine picks the lane, --ctx (per slot) and --slots the load, --tp and --pp force a
    size, --port the head's HTTP port. Needs no daemon, GPU or engine (docs/engines.md). A model
    with `nodes` in its settings is planned over them, as its head runs it."""
    paths, config = load_setup()
    over = config.models.get(model)
    master_port = None
    if not (nodes or node) and over is not None and over.nodes:
        node, pp, tp = list(over.nodes), pp or len(over.nodes), tp or over.tensor_parallel
        engine, master_port = "sglang" if over.engine == "sglang" else engine, over.rendezvous_port
    if nodes or node:
        from blazar.cli._multinode import plan_nodes

        plan_nodes(
            model, nodes=nodes or [], node=node or [], engine=engine, ctx=ctx, slots=slots,
            tp=tp, pp=pp, port=port, json_=json_, master_port=master_port,
        )  # fmt: skip
        return
    doc, daemon = daemon_or_here(
        paths, f"/api/plan/{model}", lambda: run_offline("plan_offline", config.runtime(paths), model)
    )
    if json_:
        print_json(doc)
        return
    est, preview = doc["estimate"], doc["preview"]
    if doc["lane"] is None:
        lane = "none installed here (see the lanes below)"
    else:
        lane = doc["lane"] + (f" ({doc['binary']})" if doc["binary"] else "")
    context = f"{doc['ctx_per_slot']} per slot x {doc['slots']} slot(s) = {doc['ctx_total']}"
    if doc.get("ctx_served") is not None:
        context += f"; the engine serves {doc['ctx_served']} per slot"
    if doc.get("context_note"):
        context += f" — {doc['context_note']}"
    considered = [
        f"{c['lane']} ({c['kind'] or 'not installed'}): {'taken, ' if c['taken'] else ''}{c['why']}"
        for c in doc.get("lanes") or []
    ]
    rows = [
        ("engine", lane),
        *[("lanes" if i == 0 else "", line) for i, line in enumerate(considered)],
        ("context", context),
        ("KV cache", doc["cache_type"]),
        ("GPU layers", str(doc["gpu_layers"])),
        (
            "prompt batch",
            f"{doc.get('prompt_batch') or 512} tokens per step"
            " (a cancelled prompt holds its slot up to one step)",
        ),
    ]
    if est:
        rows.append(
            (
                "memory",
                f"{_bin(est['total'])}{' here, its share of the split' if doc.get('rpc') else ''} "
                f"({'the whole model: ' if doc.get('rpc') else ''}weights {_bin(est['weights'])}, "
                f"KV {_bin(est['kv'])}, compute {_bin(est['compute'])})",
            )
        )
    if preview.get("budget_bytes") is not None:
        rows.append(("budget", _bin(preview["budget_bytes"])))
    if doc["loaded"]:
        decision = "already loaded"
    elif preview["refused"]:
        decision = f"refused ({preview['code']}): {preview['refused']}"
    elif preview["evict"]:
        decision = "loads after evicting " + ", ".join(preview["evict"])
    else:
        decision = "loads, nothing to evict"
    rows.append(("decision", decision))
    table = Table(box=None, show_header=False)
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", escape(value))  # install hints hold [engine]
    out.print(f"[bold]{doc['model']}[/]" + ("" if daemon else "  [dim](no daemon running)[/]"))
    out.print(table)
    if doc.get("rpc"):
        from blazar.cli.rpc import print_split

        out.print("[bold]RPC split[/] (rpc workers in config.toml)")
        print_split(doc["rpc"])


@app.command
def coreside(models: list[str], *, json_: Json = False) -> None:
    """Check whether MODELS fit in memory together, each at the context and slots it runs or would
    start with, against the budget a load is checked against now."""
    paths, config = load_setup()
    query = "&".join(f"model={quote(m, safe='')}" for m in models)
    doc, daemon = daemon_or_here(
        paths,
        f"/api/coreside?{query}",
        lambda: run_offline("coreside_offline", config.runtime(paths), models),
    )
    if json_:
        print_json(doc)
        return
    table = Table("MODEL", "CONTEXT", "MEMORY", "", box=None)
    for r in doc["models"]:
        size = _bin(r["bytes"]) if r["bytes"] is not None else "unknown"
        table.add_row(
            r["model"], f"{r['ctx_per_slot']} x {r['slots']}", size, "loaded" if r["loaded"] else ""
        )
    table.add_row("[bold]together[/]", "", f"[bold]{_bin(doc['total'])}[/]", "")
    out.print(table)
    fits, budget, where = doc["fits"], doc["budget"], doc["budget_from"]
    if budget is None:
        out.print(f"[bold]no memory check[/] ({where})")
        return
    verdict = "fit together" if fits else "do not fit together"
    suffix = "" if daemon else "; no daemon running"
    out.print(f"[bold]{verdict}[/] in {_bin(budget)} ({where}{suffix}; headroom {_bin(doc['headroom'])})")
    if not fits:
        out.print("[dim]levers: lower ctx or slots per model in config.toml, or see `blazar fit NAME`[/]")


@app.command
def drafts(model: str, *, json_: Json = False) -> None:
    """The installed models that can draft for MODEL (speculative decoding), and why the others cannot."""
    from actors.speculation import candidate, draft_options

    paths, config = load_setup()
    store = open_store(paths)
    runtime = config.runtime(paths)
    target = candidate(runtime, store, model, None)
    if target is None:
        raise CliError(f"no model '{model}' is installed — `blazar list` shows the installed ones")
    others = [c for r in store.list() if (c := candidate(runtime, store, r.name, None)) is not None]
    options = draft_options(target, others)
    if json_:
        print_json(
            {"model": target.name, "drafts": [{"name": c.name, "size": c.size, "pairs": why is None,
              "why": why} for c, why in options]}
        )  # fmt: skip
        return
    table = Table("DRAFT", "SIZE", "PAIRS", "WHY NOT", box=None)
    for c, why in options:
        table.add_row(escape(c.name), human_size(c.size), "yes" if why is None else "no", escape(why or ""))
    out.print(table)
    best = next((c for c, why in options if why is None), None)
    if best is None:
        out.print(f"\nno installed model can draft for {target.name}: a draft must share its vocabulary")
        return
    out.print(
        f'\nto use {best.name}: in config.toml, [models."{target.name}"] spec = {{draft = "{best.name}"}}'
        f" — `blazar explain {target.name}` then shows it",
        markup=False,
    )
