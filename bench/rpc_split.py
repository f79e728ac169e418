"""A model split over two RPC workers against the same model on one machine: decode speed.

Two local ``blazar rpc-worker`` (llama.cpp's ``rpc-server``, built by ``make rpc-server``)
on loopback, and two daemons, each with the test model warm on the same engine (the
xllamacpp wheel's host): *split*, whose model lists both workers (``rpc``, with
``memory_budget_mb = 200`` so that the fit plan puts most layers on them, as
tests/e2e/test_rpc_split.py does), and *single*, the model on this machine alone. Each run
sends the same streamed request to both in pairs of neighbouring requests, the first of a
pair alternating; a run's ratio is the median over its pairs. Output is fixed (temperature
0, a fixed ``max_tokens`` and ``ignore_eos``), so both decode the same number of tokens.
One stream at a time.

What it measures on loopback is the RPC backend's own cost: each token's activations cross
to each worker and back (a round trip per device boundary per token), and each worker
computes its layers in its own process. On this 2-core machine the engine and both workers
share the same cores, so a split cannot gain speed here: it is the price of the split,
before any network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.rpc import find_rpc_server
from bench._harness import Context
from bench._rigs import LoadGen, daemon_commands, engine_config, free_port, load_model, log, running_daemon
from bench._stats import ratio, summarize
from bench._workloads import chat_request, job, token_metrics
from tests.support import MODEL, descendants, home_env, wait_gone

__all__ = ["TITLE", "run"]

TITLE = "RPC split: a model over two local rpc-server workers vs one machine"


@contextlib.contextmanager
def _workers(count: int) -> Iterator[list[int]]:
    """``count`` ``blazar rpc-worker`` on loopback, each on a free port, until the block ends."""
    binary = find_rpc_server(None)
    if binary is None:
        raise RuntimeError("no rpc-server: run `make rpc-server` first")
    tmp = Path(tempfile.mkdtemp(prefix="blazar-bench-rpc-worker-"))
    (tmp / "config.toml").write_text(f'[engine]\nrpc_server = "{binary}"\n')
    procs: list[subprocess.Popen[bytes]] = []
    ports = [free_port() for _ in range(count)]
    try:
        for port in ports:
            argv = [sys.executable, "-m", "blazar", "rpc-worker", "--port", str(port)]
            procs.append(
                subprocess.Popen(argv, env=home_env(tmp), stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + 60
        for port in ports:
            while not _listening(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rpc-server on port {port} did not start")
                time.sleep(0.1)
        yield ports
    finally:
        tree = [p for proc in procs for p in descendants(proc.pid)]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        wait_gone(tree, timeout_s=15.0)
        shutil.rmtree(tmp, ignore_errors=True)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _split_config(ports: list[int]) -> str:
    rpc = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
    mem = ", ".join("4096" for _ in ports)
    table = f'[models."{MODEL}"]\nrpc = [{rpc}]\nrpc_memory_mb = [{mem}]\n'
    return "memory_budget_mb = 200\n" + engine_config(1) + table


def _one_run(lg: LoadGen, targets: dict[str, str], max_tokens: int, count: int) -> dict[str, Any]:
    """``count`` pairs of neighbouring requests, split and single, the first alternating."""
    req = chat_request("openai", max_tokens=max_tokens, ignore_eos=True)
    tokens: dict[str, list[list[float]]] = {v: [] for v in targets}
    errors = dict.fromkeys(targets, 0)
    pairs: list[dict[str, dict[str, Any]]] = []
    order = list(targets)
    for i in range(count):
        pair: dict[str, dict[str, Any]] = {}
        for variant in order if i % 2 == 0 else order[::-1]:
            res = lg.run(job(targets[variant], [req], concurrency=1, count=1, events=True))
            tokens[variant] += res.get("tokens") or []
            errors[variant] += res.get("errors", 0)
            pair[variant] = token_metrics(res)
        pairs.append(pair)
    one: dict[str, Any] = {v: token_metrics({"tokens": tokens[v], "errors": errors[v]}) for v in targets}
    one["pair_decode_ratio"] = summarize(
        ratio(p["split"]["decode_tps"], p["single"]["decode_tps"]) for p in pairs
    )["median"]
    return one


def _placement(url: str) -> dict[str, Any] | None:
    import httpx

    models = httpx.get(f"{url}/api/capacity", timeout=30.0).json()["models"]
    return next((m.get("rpc") for m in models if m["model"] == MODEL), None)


def run(ctx: Context) -> dict[str, Any]:
    max_tokens = ctx.pick(64, 8)
    count = ctx.pick(6, 2)
    runs: list[dict[str, Any]] = []
    single_config = engine_config(1)
    with _workers(2) as ports:
        split_config = _split_config(ports)
        with (
            running_daemon(split_config, tag="rpc-split") as split,
            running_daemon(single_config, tag="rpc-single") as single,
            LoadGen() as lg,
        ):
            load_model(split.url)
            load_model(single.url)
            placement = _placement(split.url)
            if not placement or len(placement["workers"]) != len(ports):
                raise RuntimeError(f"the split daemon's model is not split over both workers: {placement}")
            targets = {"split": split.url, "single": single.url}
            for url in targets.values():
                lg.run(job(url, [chat_request("openai", max_tokens=4)], concurrency=1, count=2))
            for r in range(ctx.runs):
                log(f"rpc_split: run {r + 1}/{ctx.runs}")
                runs.append(_one_run(lg, targets, max_tokens, count))
                log(f"rpc_split: split ÷ single {runs[-1]['pair_decode_ratio']:.3f}")
    commands = {
        "workers": f"{sys.executable} -m blazar rpc-worker --port PORT (x2, loopback)",
        "split daemon": daemon_commands(split_config)["daemon"],
        "split daemon config.toml": split_config,
        "single daemon": daemon_commands(single_config)["daemon"],
        "single daemon config.toml": single_config,
        "load generator": " ".join(LoadGen.command),
    }

    def get(variant: str, key: str) -> dict[str, Any]:
        return summarize(r[variant][key] for r in runs)

    figures = [
        ("decode tok/s", "decode_tps"),
        ("TTFT p50 (ms)", "ttft_p50_ms"),
        ("inter-token p50 (ms)", "itl_p50_ms"),
        ("inter-token p99 (ms)", "itl_p99_ms"),
        ("tokens per request", "tokens_per_request"),
    ]
    errors = {v: r[v]["errors"] for r in runs for v in ("split", "single") if r[v]["errors"]}
    notes = [
        f"this machine has {os.cpu_count()} cores, shared by the engine and both workers "
        "(loopback: no network between them)",
        "placement (from /api/capacity): "
        + ", ".join(f"{w['address']} {w['layers']} layers" for w in placement["workers"])
        + f", this machine {placement['local_layers']} layers; workers' share {placement['share']:.2f}",
    ]
    if errors:
        notes.append(f"requests that failed: {errors}")
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "model": MODEL,
            "max_tokens": max_tokens,
            "requests_per_run": count,
            "slots": 1,
            "workers": 2,
        },
        "values": {"rpc_split_decode_ratio_c1": summarize(r["pair_decode_ratio"] for r in runs)},
        "tables": [
            {
                "title": f"One stream at a time (median [min, max] over {len(runs)} runs)",
                "columns": ["figure", "split over 2 workers", "one machine"],
                "rows": [[label, get("split", key), get("single", key)] for label, key in figures],
            }
        ],
        "plots": [],
        "notes": notes,
        "commands": commands,
        "raw_runs": runs,
    }
