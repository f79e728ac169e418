"""The Batch API vs the same requests sent interactively, on the real engine.

The daemon (test model, ``slots`` engine slots) runs a batch's requests through its
own gateway in-process, at the low admission tier and at most ``slots - 1`` at a
time, recording each answer in the ledger before it counts. Each run sends the same
N short chat completions (temperature 0, a fixed ``max_tokens``, ``ignore_eos``, so
every request decodes exactly ``max_tokens`` tokens) both ways, one after the other,
in alternating order (A B, then B A, so that a drift in the engine's speed cancels out):

- interactive: ``POST /v1/chat/completions`` (not streamed) from C = ``slots - 1``
  closed-loop client connections, timed from the first send to the last answer;
- batch: the same N requests as one JSONL file, ``POST /v1/files`` (multipart),
  ``POST /v1/batches``, then ``GET /v1/batches/{id}`` every 50 ms until ``completed``,
  timed from the start of the upload to the poll that saw ``completed``. The output
  file must have N lines, all status 200, with N x ``max_tokens`` completion tokens, so
  both paths did the same work. The poll also splits the batch's time: upload and
  create, create → first answer counted, first → last answer counted, last answer →
  ``completed`` (writing the output file).

Tokens/s is completion tokens ÷ wall time. Daemon and engine CPU are read from /proc
around each path, with the CPU every other process on the machine spent meanwhile (the
noise); after each batch, 100 polls of the finished batch price one poll. Both paths are
warmed up first."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from bench._harness import Context
from bench._http import Connection, build_request, split_url
from bench._rigs import MODEL, daemon_commands, engine_config, engine_of, load_model, log, running_daemon
from bench._stats import percentile, ratio, summarize
from bench._system import cpu_seconds

__all__ = ["TITLE", "run"]

TITLE = "Batch API vs interactive"
POLL_S = 0.05
BATCH_TIMEOUT_S = 1800.0
PATH = "/v1/chat/completions"
CALIBRATION_POLLS = 100
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _bodies(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Note {i}: write two sentences about the number {i}."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": 1,
            "ignore_eos": True,
        }
        for i in range(n)
    ]


def _tokens(answer: Any) -> int:
    return int(((answer or {}).get("usage") or {}).get("completion_tokens") or 0)


async def _interactive(url: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    host, port = split_url(url)
    raws = [build_request("POST", PATH, host=f"{host}:{port}", body=json.dumps(b).encode()) for b in bodies]
    conns = [Connection(host, port) for _ in range(concurrency)]
    todo = iter(range(len(raws)))
    latencies: list[float] = []
    bad = 0
    tokens = 0

    async def worker(conn: Connection) -> None:
        nonlocal bad, tokens
        for i in todo:
            reply = await conn.request(raws[i], keep=True)
            latencies.append(reply.t_end - reply.t_start)
            if reply.status != 200:
                bad += 1
                continue
            tokens += _tokens(reply.json())

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    wall = time.perf_counter() - t0
    for conn in conns:
        await conn.aclose()
    return {
        "wall_s": wall,
        "requests": len(latencies),
        "not_200": bad,
        "completion_tokens": tokens,
        "latency_p50_ms": (percentile(latencies, 50) or 0) * 1000,
        "latency_p99_ms": (percentile(latencies, 99) or 0) * 1000,
    }


async def _batch(url: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": PATH, "body": b} for i, b in enumerate(bodies)]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    n = len(bodies)
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        t0 = time.perf_counter()
        up = await client.post(
            "/v1/files", files={"file": ("bench.jsonl", data, "application/jsonl")}, data={"purpose": "batch"}
        )
        up.raise_for_status()
        t_upload = time.perf_counter()
        create = {"input_file_id": up.json()["id"], "endpoint": PATH, "completion_window": "24h"}
        created = await client.post("/v1/batches", json=create)
        created.raise_for_status()
        t_created = time.perf_counter()
        batch_id = created.json()["id"]
        t_first = t_all = None
        polls = 0
        while True:
            resp = await client.get(f"/v1/batches/{batch_id}")
            now = time.perf_counter()
            polls += 1
            resp.raise_for_status()
            batch = resp.json()
            counts = batch.get("request_counts") or {}
            counted = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
            if counted and t_first is None:
                t_first = now
            if counted >= n and t_all is None:
                t_all = now
            if batch["status"] == "completed":
                break
            if batch["status"] in ("failed", "cancelled", "cancelling", "expired"):
                raise RuntimeError(f"batch {batch_id} ended {batch['status']}: {batch}")
            if now - t0 > BATCH_TIMEOUT_S:
                raise RuntimeError(f"batch {batch_id} still {batch['status']} after {BATCH_TIMEOUT_S:.0f} s")
            await asyncio.sleep(POLL_S)
        t_first = t_first or now
        t_all = t_all or now
        out = await client.get(f"/v1/files/{batch['output_file_id']}/content")
        out.raise_for_status()
        answers = [json.loads(line) for line in out.text.splitlines() if line.strip()]
        ok = [a for a in answers if (a.get("response") or {}).get("status_code") == 200]
        return {
            "wall_s": now - t0,
            "requests": len(answers),
            "not_200": n - len(ok),
            "completion_tokens": sum(_tokens(a["response"].get("body")) for a in ok),
            "error_file_id": batch.get("error_file_id"),
            "upload_ms": (t_upload - t0) * 1000,
            "create_ms": (t_created - t_upload) * 1000,
            "to_first_answer_s": t_first - t_created,
            "answers_s": t_all - t_first,
            "finalize_ms": (now - t_all) * 1000,
            "polls": polls,
            "batch_id": batch_id,
        }


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores; /proc/stat, less idle and iowait)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLK_TCK


def _measured(pids: list[int], fn: Any) -> dict[str, Any]:
    """Run one path; add the CPU seconds the daemon and the engine (``pids``) spent meanwhile,
    and what every other process on the machine spent (the noise: other work on the machine)."""
    cpu0, machine0, own0 = [cpu_seconds([p]) for p in pids], _machine_busy_s(), time.process_time()
    out: dict[str, Any] = fn()
    daemon_s, engine_s = (cpu_seconds([p]) - c for p, c in zip(pids, cpu0, strict=True))
    other_s = _machine_busy_s() - machine0 - daemon_s - engine_s - (time.process_time() - own0)
    return out | {"daemon_cpu_s": daemon_s, "engine_cpu_s": engine_s, "other_cpu_s": max(0.0, other_s)}


async def _poll_cost(url: str, batch_id: str, polls: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        for _ in range(polls):
            (await client.get(f"/v1/batches/{batch_id}")).raise_for_status()


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.pick(200, 40)
    max_tokens = 32
    concurrency = max(1, ctx.slots - 1)
    bodies = _bodies(n, max_tokens)
    expected = n * max_tokens
    config = engine_config(ctx.slots)
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    with running_daemon(config, tag="batch") as daemon:
        load_model(daemon.url)
        pids = [daemon.proc.pid, engine_of(daemon.url).pid]
        warm = _bodies(ctx.slots * 2, 8)
        asyncio.run(_interactive(daemon.url, warm, concurrency))
        asyncio.run(_batch(daemon.url, warm))
        for r in range(ctx.runs):
            log(f"batch: run {r + 1}/{ctx.runs} ({n} requests x {max_tokens} tokens, C={concurrency})")
            paths = {
                "interactive": lambda: asyncio.run(_interactive(daemon.url, bodies, concurrency)),
                "batch": lambda: asyncio.run(_batch(daemon.url, bodies)),
            }
            order = list(paths)[:: 1 if r % 2 == 0 else -1]  # A B, then B A, …: a drift cancels out
            one: dict[str, Any] = {path: _measured(pids, paths[path]) for path in order}
            batch = one["batch"]
            # the daemon's CPU for one poll, on the finished batch with nothing else running
            cpu0 = cpu_seconds(pids[:1])
            asyncio.run(_poll_cost(daemon.url, batch["batch_id"], CALIBRATION_POLLS))
            per_poll = (cpu_seconds(pids[:1]) - cpu0) / CALIBRATION_POLLS
            batch["daemon_cpu_ms_per_poll"] = per_poll * 1000
            batch["daemon_cpu_s_polls"] = per_poll * batch["polls"]
            extra_s = batch["daemon_cpu_s"] - one["interactive"]["daemon_cpu_s"]
            batch["extra_daemon_cpu_ms_per_poll"] = extra_s * 1000 / batch["polls"]
            for path in paths:
                res = one[path]
                res["tokens_per_s"] = res["completion_tokens"] / res["wall_s"]
                res["daemon_cpu_ms_per_request"] = res["daemon_cpu_s"] * 1000 / n
                if res["other_cpu_s"] > 0.1 * res["wall_s"]:  # others held a tenth of a core or more
                    notes.append(
                        f"run {r + 1}, {path}: other processes took {res['other_cpu_s']:.1f} s of CPU"
                    )
                if res["requests"] != n or res["not_200"] or res["completion_tokens"] != expected:
                    notes.append(
                        f"run {r + 1}, {path}: {res['requests']} answers, {res['not_200']} not 200, "
                        f"{res['completion_tokens']} completion tokens (expected {n} and {expected})"
                    )
            wall_i, wall_b = one["interactive"]["wall_s"], batch["wall_s"]
            one |= {"order": order, "ratio": wall_b / wall_i}
            log(f"batch: interactive {wall_i:.2f} s, batch {wall_b:.2f} s, ratio {wall_b / wall_i:.3f}")
            runs.append(one)
    return _summarize(runs, notes) | {
        "params": {
            "model": "smollm2-135m (SmolLM2-135M-Instruct GGUF, tests/support.ensure_model)",
            "slots": ctx.slots,
            "concurrency": concurrency,
            "requests": n,
            "max_tokens": max_tokens,
            "poll_interval_ms": int(POLL_S * 1000),
        },
        "commands": daemon_commands(config),
    }


def _summarize(runs: list[dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    def of(path: str, key: str) -> dict[str, Any]:
        return summarize(r[path][key] for r in runs)

    def both(key: str) -> dict[str, Any]:
        return summarize(ratio(r["batch"][key], r["interactive"][key]) for r in runs)

    rows: list[list[Any]] = [
        [label, of("interactive", key), of("batch", key), both(key)]
        for key, label in (
            ("wall_s", "wall time (s)"),
            ("tokens_per_s", "completion tokens/s"),
            ("daemon_cpu_s", "daemon CPU (s)"),
            ("daemon_cpu_ms_per_request", "daemon CPU per request (ms)"),
            ("engine_cpu_s", "engine CPU (s)"),
            ("other_cpu_s", "CPU of other processes on the machine (s)"),
        )
    ]
    rows.append(["request latency p50 (ms)", of("interactive", "latency_p50_ms"), None, None])
    phases = [
        ["upload (ms)", of("batch", "upload_ms")],
        ["create (ms)", of("batch", "create_ms")],
        ["create → first answer counted (s)", of("batch", "to_first_answer_s")],
        ["first → last answer counted (s)", of("batch", "answers_s")],
        ["last answer → completed (ms)", of("batch", "finalize_ms")],
        ["polls", of("batch", "polls")],
        ["daemon CPU per poll (ms, measured after the batch)", of("batch", "daemon_cpu_ms_per_poll")],
        ["daemon CPU spent answering the polls (s)", of("batch", "daemon_cpu_s_polls")],
        ["daemon CPU above interactive ÷ polls (ms)", of("batch", "extra_daemon_cpu_ms_per_poll")],
    ]
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "values": {
            "batch_overhead_ratio": summarize(r["ratio"] for r in runs),
            "interactive_tokens_per_s": of("interactive", "tokens_per_s"),
            "batch_tokens_per_s": of("batch", "tokens_per_s"),
        },
        "tables": [
            {
                "title": f"Same prompts both ways (median [min, max] over {len(runs)} runs)",
                "columns": ["metric", "interactive", "batch", "batch ÷ interactive"],
                "rows": rows,
            },
            {
                "title": "Where the batch's time goes (as seen by the 50 ms poll)",
                "columns": ["phase", "median [min, max]"],
                "rows": phases,
            },
        ],
        "notes": notes,
        "raw_runs": runs,
    }
