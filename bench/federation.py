"""The federated path: a request relayed A → C against the same request sent to C directly.

Two daemons on loopback: C holds the test model (warm, its engine started before the runs);
A has no model and C as its one ``[[remotes]]`` peer, so A's routing decision sends every
request for the model to C and relays C's bytes back (docs/federation.md). Each run sends the
same streamed request through A (relayed) and straight to C (direct) in pairs of
neighbouring requests, the first of a pair alternating (relayed-direct, direct-relayed, …);
a run's ratio and added TTFT are the medians over its pairs, so a slow drift of the shared
machine's speed falls on both halves of a pair alike. Output is fixed (temperature 0, a
fixed ``max_tokens`` and ``ignore_eos``), so every request decodes the same number of
tokens. One stream at a time: what is measured is the hop A adds (its decision, its relay
of each chunk), not C's own gateway, which both paths cross.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import LoadGen, daemon_commands, engine_config, load_model, log, running_daemon
from bench._stats import ratio, summarize
from bench._system import cpu_seconds
from bench._workloads import chat_request, job, token_metrics
from tests.support import MODEL, DaemonProc, descendants, start_daemon, wait_gone

__all__ = ["TITLE", "run"]

TITLE = "Federated path: relayed A → C vs C directly"


def _a_config(c_url: str) -> str:
    return f'[[remotes]]\nname = "c"\nurl = "{c_url}"\npoll_s = 5.0\n'


@contextlib.contextmanager
def _relaying_daemon(config: str) -> Iterator[DaemonProc]:
    """Daemon A: no model of its own, the peer in its config."""
    tmp = Path(tempfile.mkdtemp(prefix="blazar-bench-federation-a-"))
    home = tmp / "home"
    home.mkdir()
    (home / "config.toml").write_text(config)
    daemon = start_daemon(home, timeout_s=120.0)
    try:
        yield daemon
    finally:
        engines = descendants(daemon.proc.pid)
        daemon.stop()
        wait_gone(engines, timeout_s=15.0)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_peer_up(a_url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        peers = httpx.get(f"{a_url}/api/peers", timeout=30.0).json()["peers"]
        snap = peers[0]["snapshot"] if peers and peers[0]["state"] == "up" else None
        if snap and any(m["model"] == MODEL for m in snap.get("loaded", [])):
            return
        time.sleep(0.2)
    raise RuntimeError("daemon A never saw peer C up with the model warm")


def _one_run(lg: LoadGen, targets: dict[str, str], a_pid: int, max_tokens: int, count: int) -> dict[str, Any]:
    """``count`` pairs of neighbouring requests, one relayed and one direct, the first of a
    pair alternating; each path's figures over its requests, and the pairs' own ratios."""
    req = chat_request("openai", max_tokens=max_tokens, ignore_eos=True)
    tokens: dict[str, list[list[float]]] = {v: [] for v in targets}
    errors = dict.fromkeys(targets, 0)
    cpu_s = dict.fromkeys(targets, 0.0)
    pairs: list[dict[str, dict[str, Any]]] = []
    order = list(targets)
    for i in range(count):
        pair: dict[str, dict[str, Any]] = {}
        for variant in order if i % 2 == 0 else order[::-1]:
            cpu0 = cpu_seconds([a_pid])
            res = lg.run(job(targets[variant], [req], concurrency=1, count=1, events=True))
            cpu_s[variant] += cpu_seconds([a_pid]) - cpu0
            tokens[variant] += res.get("tokens") or []
            errors[variant] += res.get("errors", 0)
            pair[variant] = token_metrics(res)
        pairs.append(pair)
    one: dict[str, Any] = {}
    for variant in targets:
        metrics = token_metrics({"tokens": tokens[variant], "errors": errors[variant]})
        n = metrics["tokens_per_request"] * metrics["requests"]
        metrics["a_cpu_us_per_token"] = cpu_s[variant] * 1e6 / n if n else None
        one[variant] = metrics
    one["pair_decode_ratio"] = summarize(
        ratio(p["relayed"]["decode_tps"], p["direct"]["decode_tps"]) for p in pairs
    )["median"]
    ttft = [
        p["relayed"]["ttft_p50_ms"] - p["direct"]["ttft_p50_ms"]
        for p in pairs
        if p["relayed"]["ttft_p50_ms"] is not None and p["direct"]["ttft_p50_ms"] is not None
    ]
    one["pair_ttft_added_ms"] = summarize(ttft)["median"]
    return one


def run(ctx: Context) -> dict[str, Any]:
    max_tokens = ctx.pick(48, 8)
    count = ctx.pick(8, 2)
    runs: list[dict[str, Any]] = []
    c_config = engine_config(1)
    with running_daemon(c_config, tag="federation-c") as c:
        load_model(c.url)
        a_config = _a_config(c.url)
        with _relaying_daemon(a_config) as a, LoadGen() as lg:
            _wait_peer_up(a.url)
            targets = {"relayed": a.url, "direct": c.url}
            check = httpx.post(
                f"{a.url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                timeout=120.0,
            )
            if check.headers.get("x-blazar-peer") != "c":
                raise RuntimeError(f"daemon A did not relay to C: {check.status_code} {check.text[:200]}")
            for url in targets.values():
                lg.run(job(url, [chat_request("openai", max_tokens=4)], concurrency=1, count=2))
            for r in range(ctx.runs):
                log(f"federation: run {r + 1}/{ctx.runs}")
                runs.append(_one_run(lg, targets, a.proc.pid, max_tokens, count))
            commands = {
                "daemon C": daemon_commands(c_config)["daemon"],
                "daemon C config.toml": c_config,
                "daemon A": daemon_commands(a_config)["daemon"] + " (a home with no model)",
                "daemon A config.toml": a_config,
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
        ("daemon A's CPU per token (µs)", "a_cpu_us_per_token"),
    ]
    errors = {v: r[v]["errors"] for r in runs for v in ("relayed", "direct") if r[v]["errors"]}
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"model": MODEL, "max_tokens": max_tokens, "requests_per_run": count, "slots on C": 1},
        "values": {
            "federation_decode_ratio_c1": summarize(r["pair_decode_ratio"] for r in runs),
            "federation_ttft_added_p50_ms": summarize(r["pair_ttft_added_ms"] for r in runs),
        },
        "tables": [
            {
                "title": f"One stream at a time (median [min, max] over {len(runs)} runs)",
                "columns": ["figure", "relayed A → C", "C directly"],
                "rows": [[label, get("relayed", key), get("direct", key)] for label, key in figures],
            }
        ],
        "plots": [],
        "notes": [f"requests that failed: {errors}"] if errors else [],
        "commands": commands,
        "raw_runs": runs,
    }
