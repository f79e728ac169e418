"""The benchmark harness: gateway overhead, engine speed through the gateway, cancellation, memory.

    python -m bench run [--quick] [--only NAME …] [--runs N] [--out DIR]
    python -m bench list

Each benchmark writes ``<date>-<name>.json``, ``.md`` and its PNG plots under
``bench/results/`` (a ``--quick`` run under ``bench/results/tmp/``, which git
ignores: quick runs are smoke tests, not measurements). ``scripts/bench_report.py``
turns the committed results into BENCHMARK.md. ``python -m bench.soak`` is the
separate soak test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    attribution,
    batch,
    cancel,
    console,
    dialects,
    engine,
    federation,
    idleflood,
    mcp,
    mcp_catalog,
    memory,
    mistralrs,
    overhead,
    policy_off,
    prefill,
    realtime,
    rpc_split,
    scale,
    sessions,
    sleep,
    speculation,
    speech,
    startup,
    workers,
)
from bench._harness import Context, run_benchmark
from bench._rigs import log
from bench._system import ROOT

BENCHMARKS: dict[str, tuple[str, Callable[[Context], dict[str, Any]]]] = {
    "overhead": (overhead.TITLE, overhead.run),
    "memory": (memory.TITLE, memory.run),
    "engine": (engine.TITLE, engine.run),
    "cancel": (cancel.TITLE, cancel.run),
    "prefill": (prefill.TITLE, prefill.run),
    "scale": (scale.TITLE, scale.run),
    "dialects": (dialects.TITLE, dialects.run),
    "workers": (workers.TITLE, workers.run),
    "startup": (startup.TITLE, startup.run),
    "batch": (batch.TITLE, batch.run),
    "console": (console.TITLE, console.run),
    "mistralrs": (mistralrs.TITLE, mistralrs.run),
    "mcp": (mcp.TITLE, mcp.run),
    "mcp_catalog": (mcp_catalog.TITLE, mcp_catalog.run),
    "realtime": (realtime.TITLE, realtime.run),
    "speech": (speech.TITLE, speech.run),
    "federation": (federation.TITLE, federation.run),
    "speculation": (speculation.TITLE, speculation.run),
    "sessions": (sessions.TITLE, sessions.run),
    "attribution": (attribution.TITLE, attribution.run),
    "idleflood": (idleflood.TITLE, idleflood.run),
    "policy_off": (policy_off.TITLE, policy_off.run),
    "rpc_split": (rpc_split.TITLE, rpc_split.run),
    "sleep": (sleep.TITLE, sleep.run),
}


def _keep_bytecode(compile_now: bool) -> None:
    """Measure Python processes as an install runs them, from compiled bytecode. With
    PYTHONDONTWRITEBYTECODE set (some shells set it) nothing is cached, and each process the
    benchmarks start compiles every module it imports: a cold `blazar run` measured 2.17x
    the engine's start that way against 1.43x from bytecode. A measuring run compiles what
    is not compiled yet before its first measurement (a few seconds once written)."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        log("PYTHONDONTWRITEBYTECODE unset for the benchmarks: they measure Python from bytecode")
    if not compile_now:
        return
    folders = [str(ROOT / name) for name in ("blazar", "actors", "registry", "bench")]
    folders += [p for p in sys.path if p.endswith("site-packages")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the benchmarks")
    run = sub.add_parser("run", help="run benchmarks")
    run.add_argument(
        "--quick", action="store_true", help="tiny counts: proves the harness works, measures nothing"
    )
    run.add_argument(
        "--only", action="append", choices=sorted(BENCHMARKS), help="run only this one (repeatable)"
    )
    run.add_argument("--runs", type=int, default=None, help="A/B runs per benchmark (default 5, quick 1)")
    run.add_argument("--slots", type=int, default=4, help="engine slots (daemon and direct engine alike)")
    run.add_argument("--out", type=Path, default=None, help="result directory (default bench/results)")
    run.add_argument(
        "--litellm",
        choices=("auto", "on", "off"),
        default="auto",
        help="compare with the LiteLLM proxy: auto = when installed, and not in a quick run",
    )
    ns = parser.parse_args(argv)
    if ns.command == "list":
        for name, (title, _) in BENCHMARKS.items():
            print(f"{name:10} {title}")
        return 0
    out = ns.out or (ROOT / "bench" / "results" / ("tmp" if ns.quick else ""))
    runs = ns.runs if ns.runs is not None else (1 if ns.quick else 5)
    if not ns.quick and runs < 5:
        log(f"warning: {runs} runs; the targets are judged on medians of at least 5")
    # The instant upstream's shim runs under this interpreter when the daemon starts it.
    os.environ.setdefault("BENCH_PYTHON", sys.executable)
    _keep_bytecode(compile_now=not ns.quick)
    stamp = time.strftime("%Y-%m-%d")
    failed = []
    for name in ns.only or list(BENCHMARKS):
        ctx = Context(
            name=name, quick=ns.quick, runs=runs, out_dir=out, stamp=stamp, slots=ns.slots, litellm=ns.litellm
        )
        try:
            run_benchmark(ctx, BENCHMARKS[name][1])
        except Exception as exc:
            log(f"{name}: FAILED: {type(exc).__name__}: {exc} (logs in {ctx.work_dir})")
            traceback.print_exc()
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
