"""Pure gateway overhead against an upstream that answers at once.

The daemon runs ``bench/instant-upstream`` as its engine (``[engine]
llama_server``); a second instance of it is the direct baseline, and the
LiteLLM proxy (default settings, one worker) routes the same model to that
second instance. A separate load-generator process (raw HTTP/1.1, keep-alive,
closed loop, a fixed time per measurement) sends OpenAI chat requests: non-stream (a fixed body) and stream
(32 chunks, one every millisecond, then the finish chunk and ``[DONE]``: like a
very fast engine, each chunk is its own write). In every run the three targets
are measured one after the other (direct, Blazar, Blazar with its production
controls on, LiteLLM) at C = 1, 16 and 64. "Controls on" is a second daemon with
an API key (every request authenticated, counted against the key's limits and
statistics), the audit log written, and a web console open on it the whole time
(a client of its live snapshot stream, as a console tab is); metrics are recorded
by both daemons.
Added latency is a percentile through the gateway minus the same percentile
direct, in the same run. CPU is the serving process's utime+stime
(/proc/<pid>/stat) over the measured requests, divided by their number, or by
the upstream's events for streams (34 per stream: 32 tokens, finish, [DONE]).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from bench import _plots
from bench._harness import Context
from bench._rigs import (
    InstantUpstream,
    LiteLLMProxy,
    LoadGen,
    daemon_commands,
    engine_of,
    find_litellm,
    instant_config,
    litellm_version,
    log,
    redact,
    running_daemon,
)
from bench._stats import percentile, ratio, summarize
from bench._system import cpu_seconds
from bench._workloads import chat_request, job
from tests.support import DaemonProc

__all__ = ["TITLE", "run"]

TITLE = "Pure gateway overhead"
CHUNKS = 32
INTERVAL_MS = 1.0
EVENTS_PER_STREAM = CHUNKS + 2
LEVELS = (1, 16, 64)
MODES = ("non-stream", "stream")
UPSTREAM_ARGS = ("--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS))


def _litellm(ctx: Context) -> tuple[str | None, str | None]:
    """The LiteLLM command to compare with, or why there is none."""
    if ctx.litellm == "off" or (ctx.litellm == "auto" and ctx.quick):
        return None, "LiteLLM comparison skipped (--litellm off, or a quick run)"
    binary = find_litellm()
    if binary is None:
        if ctx.litellm == "on":
            raise RuntimeError(
                "--litellm on, but no litellm command (make bench-litellm, or set BENCH_LITELLM)"
            )
        return None, "LiteLLM not installed: `make bench-litellm` makes its own venv under .cache/bench"
    return binary, None


def _metrics(res: dict[str, Any], cpu_s: float | None, mode: str) -> dict[str, Any]:
    lat = res["latency_s"]
    n = max(res["count"], 1)
    out = {
        "requests": res["count"],
        "errors": res["errors"],
        "error_samples": res["error_samples"],
        "rps": res["count"] / res["wall_s"] if res["wall_s"] else None,
        "p50_ms": (percentile(lat, 50) or 0.0) * 1000,
        "p99_ms": (percentile(lat, 99) or 0.0) * 1000,
        "ttfb_p50_ms": (percentile(res["ttfb_s"], 50) or 0.0) * 1000,
        "cpu_ms_per_request": None if cpu_s is None else cpu_s * 1000 / n,
        "cpu_ms_per_chunk": None,
    }
    if cpu_s is not None and mode == "stream":
        out["cpu_ms_per_chunk"] = cpu_s * 1000 / (n * EVENTS_PER_STREAM)
    return out


CONTROLS = "audit_log = true\n"
"""The controls' config, before the instant config (whose tables end the file)."""


def _add_key(daemon: DaemonProc) -> str:
    """A key on the running daemon (the CLI prints its secret on stdout); limits high enough
    never to refuse a benchmark request, so that each request pays for being counted."""
    done = daemon.cli(
        "keys", "add", "bench", "--scope", "chat,metrics", "--rpm", "100000000", "--tpm", "1000000000"
    )
    return done.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def _console_open(daemon: DaemonProc, key: str) -> Iterator[dict[str, int]]:
    """A console tab's view of ``daemon``: its live snapshot stream, read in a thread for as
    long as the block runs; yields the count of snapshots received."""
    seen = {"snapshots": 0}
    stop = threading.Event()

    def read() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with (
            httpx.Client(timeout=httpx.Timeout(10.0, read=None)) as client,
            client.stream("GET", f"{daemon.url}/api/console/events", headers=headers) as stream,
        ):
            for line in stream.iter_lines():
                if line.startswith("event: snapshot"):
                    seen["snapshots"] += 1
                if stop.is_set():
                    return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5.0)


def run(ctx: Context) -> dict[str, Any]:
    duration_s = ctx.pick(4.0, 0.1)
    litellm_bin, skipped = _litellm(ctx)
    notes = [skipped] if skipped else []
    runs: list[dict[str, Any]] = []
    with (
        running_daemon(instant_config(*UPSTREAM_ARGS), tag="overhead") as daemon,
        running_daemon(CONTROLS + instant_config(*UPSTREAM_ARGS), tag="overhead-controls") as guarded,
        InstantUpstream(*UPSTREAM_ARGS, log_dir=ctx.work_dir) as upstream,
        LoadGen() as lg,
        contextlib.ExitStack() as stack,
    ):
        targets: dict[str, tuple[str, list[int]]] = {
            "direct": (upstream.url, [upstream.proc.pid] if upstream.proc else []),
            "blazar": (daemon.url, [daemon.proc.pid]),
            "blazar+controls": (guarded.url, [guarded.proc.pid]),
        }
        key = _add_key(guarded)
        auth = {"blazar+controls": {"Authorization": f"Bearer {key}"}}
        console = stack.enter_context(_console_open(guarded, key))
        lite = None
        if litellm_bin is not None:
            lite = stack.enter_context(LiteLLMProxy(litellm_bin, upstream.url, log_dir=ctx.work_dir))
            ctx.extra_versions["litellm"] = litellm_version(litellm_bin)
            notes.append(f"LiteLLM proxy started in {lite.start_s:.1f} s")
            targets["litellm"] = (lite.url, lite.pids())
        requests = {
            (name, m): chat_request("openai", max_tokens=CHUNKS, stream=m == "stream", headers=auth.get(name))
            for name in targets
            for m in MODES
        }
        for name, (url, _) in targets.items():  # the daemon starts its engine on the first request
            lg.run(job(url, [requests[name, "non-stream"]], concurrency=4, count=ctx.pick(200, 20)))
        for r in range(ctx.runs):
            log(f"overhead: run {r + 1}/{ctx.runs}")
            one: dict[str, Any] = {}
            for mode in MODES:
                for c in LEVELS:
                    case = one.setdefault(f"{mode} C={c}", {})
                    for name, (url, pids) in targets.items():
                        request = requests[name, mode]
                        if not ctx.quick:  # a quick run measures nothing: no warm-up for it
                            lg.run(job(url, [request], concurrency=c, count=c * 4))
                        cpu0 = cpu_seconds(pids)
                        res = lg.run(job(url, [request], concurrency=c, duration_s=duration_s))
                        case[name] = _metrics(res, cpu_seconds(pids) - cpu0, mode)
            runs.append(one)
        commands = daemon_commands(instant_config(*UPSTREAM_ARGS)) | {
            "daemon with controls config.toml": CONTROLS + instant_config(*UPSTREAM_ARGS),
            "daemon with controls key": "blazar keys add bench --scope chat,metrics "
            "--rpm 100000000 --tpm 1000000000",
            "daemon with controls console": "GET /api/console/events, read for the whole run",
            "daemon's engine": redact(engine_of(daemon.url).argv),
            "direct upstream": upstream.argv,
            "load generator": " ".join(LoadGen.command),
        }
        if lite is not None:
            commands["litellm"] = lite.argv
            commands["litellm config"] = lite.config_file.read_text()
    notes.append(f"the console open on the daemon with controls received {console['snapshots']} snapshots")
    return _summarize(ctx, runs, duration_s, notes, commands)


def _summarize(
    ctx: Context,
    runs: list[dict[str, Any]],
    duration_s: float,
    notes: list[str],
    commands: dict[str, Any],
) -> dict[str, Any]:
    names = [
        n
        for n in ("direct", "blazar", "blazar+controls", "litellm")
        if runs and n in runs[0][f"{MODES[0]} C=1"]
    ]
    cases = [f"{m} C={c}" for m in MODES for c in LEVELS]

    def get(case: str, who: str, key: str) -> dict[str, Any]:
        return summarize(r[case][who][key] for r in runs)

    def added(case: str, who: str, key: str) -> dict[str, Any]:
        return summarize(r[case][who][key] - r[case]["direct"][key] for r in runs)

    def rps_ratio(case: str) -> dict[str, Any]:
        return summarize(ratio(r[case]["blazar"]["rps"], r[case]["litellm"]["rps"]) for r in runs)

    has_lite = "litellm" in names
    values = {
        "overhead_p50_ms": added("non-stream C=1", "blazar", "p50_ms"),
        "overhead_p99_ms": added("non-stream C=1", "blazar", "p99_ms"),
        "cpu_per_request_ms": get("non-stream C=16", "blazar", "cpu_ms_per_request"),
        "cpu_per_chunk_ms": get("stream C=16", "blazar", "cpu_ms_per_chunk"),
    }
    if "blazar+controls" in names:
        values |= {
            "controls_overhead_p50_ms": added("non-stream C=1", "blazar+controls", "p50_ms"),
            "controls_cpu_per_request_ms": get("non-stream C=16", "blazar+controls", "cpu_ms_per_request"),
            "controls_cpu_per_chunk_ms": get("stream C=16", "blazar+controls", "cpu_ms_per_chunk"),
        }
    if has_lite:
        values["litellm_rps_ratio_c16"] = rps_ratio("non-stream C=16")
    rps_rows = [
        [case, *(get(case, n, "rps") for n in names)] + ([rps_ratio(case)] if has_lite else [])
        for case in cases
    ]
    lat_rows = []
    for case in cases:
        row: list[Any] = [case, get(case, "direct", "p50_ms"), get(case, "direct", "p99_ms")]
        for n in names[1:]:
            row += [added(case, n, "p50_ms"), added(case, n, "p99_ms")]
        lat_rows.append(row)
    cpu_rows = []
    for case in cases:
        row = [case]
        for n in names:
            row.append(get(case, n, "cpu_ms_per_request"))
        if case.startswith("stream"):
            row.append(get(case, "blazar", "cpu_ms_per_chunk"))
            nonstream = case.replace("stream", "non-stream", 1)
            row.append(
                summarize(
                    (r[case]["blazar"]["cpu_ms_per_request"] - r[nonstream]["blazar"]["cpu_ms_per_request"])
                    / EVENTS_PER_STREAM
                    for r in runs
                )
            )
        else:
            row += ["", ""]
        cpu_rows.append(row)
    errors = {
        f"{case} {n}": r[case][n]["errors"]
        for r in runs
        for case in cases
        for n in names
        if r[case][n]["errors"]
    }
    if errors:
        notes.append(f"requests that failed (status ≠ 200 or transport error): {errors}")
    tables = [
        {
            "title": f"Requests/s (median [min, max] over {len(runs)} runs)",
            "columns": ["case", *names, *(["Blazar ÷ LiteLLM"] if has_lite else [])],
            "rows": rps_rows,
        },
        {
            "title": "Latency (ms): direct, and added by each proxy (its percentile minus direct's)",
            "columns": [
                "case",
                "direct p50",
                "direct p99",
                *[f"{n} {p} added" for n in names[1:] for p in ("p50", "p99")],
            ],
            "rows": lat_rows,
        },
        {
            "title": "CPU (ms) per request of each serving process; gateway per relayed stream chunk",
            "columns": [
                "case",
                *[f"{n}/request" for n in names],
                "blazar/chunk",
                "blazar marginal/chunk",
            ],
            "rows": cpu_rows,
        },
    ]
    plots = []
    groups = [f"{m}\nC={c}" for m in MODES for c in LEVELS]
    if _plots.bars(
        ctx.plot_path("rps"),
        title="Requests/s against an instant upstream (log scale)",
        ylabel="requests/s",
        groups=groups,
        series={n: [get(case, n, "rps") for case in cases] for n in names},
        log=True,
    ):
        plots.append({"file": ctx.plot_path("rps").name, "title": "Requests/s by case"})
    if _plots.lines(
        ctx.plot_path("added-latency"),
        title="Added latency p50, non-stream",
        xlabel="concurrent clients",
        ylabel="ms",
        xs=list(LEVELS),
        series={n: [added(f"non-stream C={c}", n, "p50_ms") for c in LEVELS] for n in names[1:]},
    ):
        plots.append(
            {"file": ctx.plot_path("added-latency").name, "title": "Added p50 latency vs concurrency"}
        )
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "chunks_per_stream": CHUNKS,
            "chunk_interval_ms": INTERVAL_MS,
            "levels": list(LEVELS),
            "seconds_per_measurement": duration_s,
            "daemon_slots": 64,
        },
        "values": values,
        "tables": tables,
        "plots": plots,
        "notes": notes,
        "commands": commands,
        "raw_runs": runs,
    }
