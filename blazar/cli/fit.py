"""``blazar fit``: a model's memory estimate against this machine, without a daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, human_params, load_setup, open_store, out, print_json


def _bin(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


_FIT_FIELDS = ("weights", "kv", "k", "v", "recurrent", "compute", "overhead", "total")


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

    TARGET is an installed model name or a path to a .gguf file. --ctx is per slot (the engine
    gets ctx x slots); the defaults are the ones the daemon would use. Needs no daemon.
    """
    from actors.census import take_census
    from registry import fit as fitting

    paths, config = load_setup()
    path, override = Path(target).expanduser(), None
    name = path.name
    if not path.is_file():
        record = open_store(paths).get(target)
        path, name, override = Path(record.path), record.name, config.models.get(record.name)
    shape = fitting.read_shape(path)
    ctx = ctx or (override.ctx if override else None) or fitting.default_ctx(shape, config.default_ctx)
    settings = fitting.Settings(
        ctx_per_slot=ctx,
        slots=slots or (override.slots if override else None) or config.slots,
        cache_type_k=cache_type,
        cache_type_v=cache_type,
    )
    census = take_census()
    report = fitting.fit(shape, settings, census.memory())
    est = report.estimate
    notes = [*report.notes, *([census.note] if census.note else [])]
    if json_:
        doc = {
            "model": name,
            "path": str(path),
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
