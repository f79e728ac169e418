"""Cancellation during prefill: a client gone while the engine still reads its prompt.

Three measurements on one daemon (one slot, 8,192-token context, the CPU lane's
prompt batch) and direct engines started with its argv:

- **disconnect → slot idle**: a streamed request with a prompt of about 3,000 or
  6,000 tokens (text of its own, nothing cached) is dropped at 10, 50 and 90 % of
  the time that prompt takes to read (measured on each path just before);
  from the drop, the engine's own ``GET /slots`` is polled back to back until no
  slot is processing (an upper bound, as in the decode-time cancel benchmark).
  Trials alternate between the gateway and the direct engine (same argv, a plain
  client: what llama.cpp does on its own).
- **prefill speed**: prompt tokens per second (the engine's own ``timings``) of
  the same prompts on the daemon's engine and on one with llama.cpp's default
  batch (no ``-b``/``-ub``), alternating: what the smaller prompt step costs.
- **the trade-off**: for several prompt batches, a direct engine asked for
  progress events as the gateway asks: its prefill speed and its disconnect →
  idle time at 50 % of a 3,000-token prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench._harness import Context
from bench._http import Connection, build_request, split_url
from bench._rigs import (
    MODEL,
    DirectEngine,
    daemon_commands,
    engine_of,
    load_model,
    log,
    redact,
    running_daemon,
)
from bench._stats import percentile, ratio, summarize
from bench.cancel import SlotPoller

__all__ = ["TITLE", "run"]

TITLE = "Cancellation during prefill"
CONFIG = "slots = 1\ndefault_ctx = 8192\nkeep_alive_s = -1\nmax_queue = 4096\n"
SIZES = (3000, 6000)
FRACTIONS = (0.1, 0.5, 0.9)
CURVE_BATCHES = (64, 128, 256, 512)
_WORDS = "the river bends past seven quiet mills where grey herons wait for the evening tide".split()
_TOKENS_PER_WORD = 3.0
"""About how many tokens of the test model each filler word (a word and a number) is."""


def _prompt(tokens: int) -> str:
    # A nonce first: nothing of the prompt can come from the engine's prompt cache.
    n = int(tokens / _TOKENS_PER_WORD)
    head = f"{time.perf_counter_ns()} "
    return head + " ".join(f"{_WORDS[i % len(_WORDS)]}{i % 89}" for i in range(n))


def _body(text: str, **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}).encode()


async def _prefill(url: str, headers: dict[str, str], tokens: int) -> tuple[int, float]:
    """One prompt read through ``url``: its tokens and the engine's prompt tok/s."""
    host, port = split_url(url)
    raw = build_request(
        "POST",
        "/v1/chat/completions",
        host=f"{host}:{port}",
        body=_body(_prompt(tokens), max_tokens=1),
        headers=headers,
    )
    conn = Connection(host, port)
    try:
        reply = await conn.request(raw, keep=True)
    finally:
        await conn.aclose()
    if reply.status != 200:
        raise RuntimeError(f"prefill probe answered {reply.status}: {reply.body[:200]!r}")
    timings = reply.json()["timings"]
    return int(timings["prompt_n"]), float(timings["prompt_per_second"])


async def _drop_mid_prompt(
    url: str, headers: dict[str, str], slots: SlotPoller, tokens: int, after_s: float, *, progress: bool
) -> float | None:
    """Stream a prompt, drop the socket ``after_s`` after the slot got busy; ms to idle."""
    if await slots.wait_idle(120.0) is None:
        raise RuntimeError("the engine's slot never went idle before a trial")
    host, port = split_url(url)
    extra: dict[str, Any] = {"max_tokens": 16, "stream": True}
    if progress:
        extra["return_progress"] = True
    raw = build_request(
        "POST",
        "/v1/chat/completions",
        host=f"{host}:{port}",
        body=_body(_prompt(tokens), **extra),
        headers=headers,
    )
    _, writer = await asyncio.open_connection(host, port)
    writer.write(raw)
    deadline = time.perf_counter() + 30.0
    while not (await slots.busy())[0]:
        if time.perf_counter() > deadline:
            raise RuntimeError("the request never reached the engine")
    await asyncio.sleep(after_s)
    t_drop = time.perf_counter()
    writer.transport.abort()
    t_idle = await slots.wait_idle(120.0)
    return None if t_idle is None else (t_idle - t_drop) * 1000


def _without_batch(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-b", "-ub"):
            skip = True
        else:
            out.append(a)
    return out


def _with_batch(argv: list[str], batch: int) -> list[str]:
    return [*_without_batch(argv), "-b", str(batch), "-ub", str(batch)]


async def _cancel_trials(
    paths: dict[str, tuple[str, dict[str, str], SlotPoller]], sizes: tuple[int, ...], reps: int
) -> dict[str, dict[str, list[float | None]]]:
    """The gateway ``reps`` times per size and fraction; the direct engine, which reads every
    prompt to its end whenever its client left (the floor), once."""
    out: dict[str, dict[str, list[float | None]]] = {f"{p} {n}": {} for p in paths for n in sizes}
    for size in sizes:
        read_s = {}
        for name, (url, headers, _) in paths.items():
            n, tps = await _prefill(url, headers, size)
            read_s[name] = n / tps
            log(f"prefill: {name} reads {n} tokens in {read_s[name]:.1f} s")
        for rep in range(reps):
            for name, (url, headers, slots) in paths.items():
                if name == "direct" and rep:
                    continue
                for frac in FRACTIONS:
                    after = frac * read_s[name]
                    ms = await _drop_mid_prompt(url, headers, slots, size, after, progress=False)
                    out[f"{name} {size}"].setdefault(f"{frac:.0%}", []).append(ms)
            log(f"prefill: cancel rep {rep + 1}/{reps}, {size} tokens done")
    return out


async def _speed_trials(
    engines: dict[str, str], headers: dict[str, dict[str, str]], reps: int, sizes: tuple[int, ...]
) -> dict[str, dict[int, list[float]]]:
    """Prompt tok/s of each engine at each size, alternating: a small step may cost more
    deep in a long prompt than near its start."""
    speeds: dict[str, dict[int, list[float]]] = {name: {n: [] for n in sizes} for name in engines}
    for _ in range(reps):
        for size in sizes:
            for name, url in engines.items():
                speeds[name][size].append((await _prefill(url, headers[name], size))[1])
    return speeds


async def _curve_point(eng: DirectEngine, reps: int, size: int) -> tuple[list[float], list[float | None]]:
    headers = {"Authorization": f"Bearer {eng.api_key}"}
    slots = SlotPoller(eng.url, eng.api_key)
    await _prefill(eng.url, headers, 200)
    probes = [await _prefill(eng.url, headers, size) for _ in range(reps)]
    tps = [p[1] for p in probes]
    read_s = probes[0][0] / (sum(tps) / len(tps))
    idle = [
        await _drop_mid_prompt(eng.url, headers, slots, size, 0.5 * read_s, progress=True)
        for _ in range(reps)
    ]
    await slots.conn.aclose()
    return tps, idle


def _curve(ctx: Context, argv: list[str], reps: int, size: int) -> list[list[Any]]:
    rows = []
    for batch in (*CURVE_BATCHES, None):
        engine_argv = _with_batch(argv, batch) if batch else _without_batch(argv)
        with DirectEngine(engine_argv, log_dir=ctx.work_dir) as eng:
            tps, idle = asyncio.run(_curve_point(eng, reps, size))
        ms = [x for x in idle if x is not None]
        label = str(batch) if batch else "2048 / 512 (llama.cpp's default)"
        rows.append([label, summarize(tps)["median"], percentile(ms, 50), max(ms) if ms else None])
        log(f"prefill: curve batch {label} done")
    return rows


def run(ctx: Context) -> dict[str, Any]:
    reps = ctx.pick(ctx.runs, 1)
    sizes = ctx.pick(SIZES, (600,))
    with running_daemon(CONFIG, tag="prefill") as daemon:
        load_model(daemon.url)
        info = engine_of(daemon.url)
        default_argv = _without_batch(info.argv)
        with (
            DirectEngine(info.argv, log_dir=ctx.work_dir) as direct,
            DirectEngine(default_argv, log_dir=ctx.work_dir) as default,
        ):
            direct_headers = {"Authorization": f"Bearer {direct.api_key}"}
            paths = {
                "gateway": (daemon.url, {}, SlotPoller(info.url, info.api_key)),
                "direct": (direct.url, direct_headers, SlotPoller(direct.url, direct.api_key)),
            }
            trials = asyncio.run(_cancel_trials(paths, sizes, reps))
            speeds = asyncio.run(
                _speed_trials(
                    {"daemon's engine": info.url, "default batch": default.url},
                    {
                        "daemon's engine": {"Authorization": f"Bearer {info.api_key}"},
                        "default batch": {"Authorization": f"Bearer {default.api_key}"},
                    },
                    reps,
                    sizes,
                )
            )
        curve = _curve(ctx, info.argv, ctx.pick(2, 1), sizes[0])
        commands = daemon_commands(CONFIG) | {
            "engine (the daemon's)": redact(info.argv),
            "engine (llama.cpp's default batch)": redact(default_argv),
        }
    values: dict[str, Any] = {}
    rows = []
    for key, by_frac in trials.items():
        path, size = key.split()
        every = [x for xs in by_frac.values() for x in xs if x is not None]
        never = sum(1 for xs in by_frac.values() for x in xs if x is None)
        cells = [percentile([x for x in by_frac[f"{f:.0%}"] if x is not None], 50) for f in FRACTIONS]
        rows.append([path, int(size), *cells, percentile(every, 99), max(every) if every else None, never])
        if path == "gateway":
            p99 = percentile(every, 99)
            values[f"prefill_cancel_p99_ms_{size}"] = {"median": p99, "min": p99, "max": p99, "n": 1}
    ours, theirs = speeds["daemon's engine"], speeds["default batch"]
    values["prefill_speed_ratio"] = summarize(
        ratio(a, b) for a, b in zip(ours[sizes[0]], theirs[sizes[0]], strict=True)
    )
    speed_rows = [
        [
            n,
            summarize(ours[n]),
            summarize(theirs[n]),
            summarize(ratio(a, b) for a, b in zip(ours[n], theirs[n], strict=True)),
        ]
        for n in sizes
    ]
    batch = next((info.argv[i + 1] for i, a in enumerate(info.argv) if a == "-b"), "default")
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"reps": reps, "sizes": list(sizes), "fractions": list(FRACTIONS), "prompt_batch": batch},
        "values": values,
        "tables": [
            {
                "title": f"Disconnect mid-prompt → slot idle (ms), {reps} trials per cell, alternating",
                "columns": [
                    "path",
                    "prompt tokens",
                    "p50 at 10 %",
                    "p50 at 50 %",
                    "p50 at 90 %",
                    "p99 (all)",
                    "max",
                    "never idle",
                ],
                "rows": rows,
            },
            {
                "title": f"Prefill speed (prompt tok/s, median [min, max] of {reps}, alternating)",
                "columns": ["prompt tokens", f"prompt batch {batch}", "llama.cpp's default batch", "ratio"],
                "rows": speed_rows,
            },
            {
                "title": "Trade-off: prompt batch, prefill speed, disconnect → idle (direct, progress on)",
                "columns": ["prompt batch", "prefill tok/s", "idle p50 (ms)", "idle max (ms)"],
                "rows": curve,
            },
        ],
        "plots": [],
        "notes": [],
        "commands": commands,
        "trials": trials,
        "speeds": speeds,
    }
