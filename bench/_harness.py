"""Running one benchmark and writing its result: JSON, markdown and PNG plots under one name."""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._report import render_result
from bench._rigs import log
from bench._system import ROOT, loadavg, machine_info, versions
from bench.targets import evaluate

__all__ = ["SCHEMA", "Context", "run_benchmark"]

SCHEMA = 1


@dataclass
class Context:
    """What every benchmark is given: the run's settings and where its files go."""

    name: str
    quick: bool
    runs: int
    out_dir: Path
    stamp: str
    slots: int = 4
    litellm: str = "auto"
    """``auto`` (use it when installed, never in a quick run), ``on`` (required) or ``off``."""
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="blazar-bench-")))
    extra_versions: dict[str, str] = field(default_factory=dict)

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full

    @property
    def prefix(self) -> str:
        return f"{self.stamp}-{self.name}"

    def plot_path(self, what: str) -> Path:
        return self.out_dir / f"{self.prefix}-{what}.png"


def run_benchmark(ctx: Context, body: Callable[[Context], dict[str, Any]]) -> Path:
    """Run ``body`` and write ``<date>-<name>.json`` and ``.md`` (plots are written by ``body``)."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    log(f"{ctx.name}: start ({'quick' if ctx.quick else f'{ctx.runs} runs'}); logs in {ctx.work_dir}")
    before = loadavg()
    t0 = time.monotonic()
    partial = body(ctx)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "name": ctx.name,
        "title": partial.pop("title", ctx.name),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quick": ctx.quick,
        "runs": ctx.runs,
        "duration_s": round(time.monotonic() - t0, 1),
        "loadavg": {"before": before, "after": loadavg()},
        "machine": machine_info(),
        "versions": versions(ctx.extra_versions),
        "method": partial.pop("method", ""),
        "params": partial.pop("params", {}),
        "targets": evaluate(ctx.name, partial.get("values", {})),
        "tables": partial.pop("tables", []),
        "plots": partial.pop("plots", []),
        "notes": partial.pop("notes", []),
        "commands": {"harness": shlex.join(["python", "-m", "bench", *sys.argv[1:]])}
        | partial.pop("commands", {}),
    } | partial
    path = ctx.out_dir / f"{ctx.prefix}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    (ctx.out_dir / f"{ctx.prefix}.md").write_text(render_result(result))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    log(f"{ctx.name}: wrote {shown} in {result['duration_s']:.0f} s")
    return path
