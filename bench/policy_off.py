"""What the policy hooks cost a request when none is configured.

    python -m bench run --only policy_off      (or: python -m bench.policy_off [--calls N] [--runs N])

With no ``[[hooks]]``, the OpenAI chat service (``blazar.serve.openai_chat.answer_chat``) is
``blazar.serve.policy.hooks.guarded`` around the rest: one check of a module flag, then the
call, with no coroutine of its own; the other guarded routes (Anthropic, Ollama, Responses,
legacy completions) go through ``hooks.through``, the same check in a coroutine. Each run times,
in one trio run, an ``await`` of a trivial answer function bare (B) and through each wrapper
(A), one after the other, ``calls`` times each; the cost is A - B per call. The daemon's own
per-request work is tens of microseconds (see the overhead benchmark), so a cost in
nanoseconds is what "zero when off" means here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio

from bench._harness import Context
from bench._rigs import log
from bench._stats import summarize
from blazar.errors import Dialect
from blazar.serve.policy.hooks import guarded, through
from blazar.serve.reply import Reply

__all__ = ["TITLE", "run"]

TITLE = "Policy hooks off: what the check costs a request"

_REPLY = Reply(b"{}")


class _Runtime:
    """Stands for the daemon's runtime: only looked up (weakly) in the hooks' table."""


async def _answer(runtime: Any, call: Any, ask: Any, req: Any) -> Reply:
    return _REPLY


async def _run(call: Any, req: Any) -> Reply:
    return _REPLY


async def _through(runtime: Any, call: Any, ask: Any, req: Any) -> Reply:
    return await through(runtime, call, req, Dialect.OPENAI, _run)


async def _time(fn: Any, calls: int) -> float:
    runtime = _Runtime()
    t0 = time.perf_counter()
    for _ in range(calls):
        await fn(runtime, None, None, None)
    return (time.perf_counter() - t0) / calls * 1e9


async def _one_run(calls: int) -> dict[str, float]:
    bare = await _time(_answer, calls)
    wrapped = await _time(guarded(_answer), calls)
    routed = await _time(_through, calls)
    bare_again = await _time(_answer, calls)  # the machine's drift over the run, both ways
    base = (bare + bare_again) / 2
    return {"bare_ns": base, "guarded_ns": wrapped, "through_ns": routed}


def _measure(calls: int, runs: int) -> list[dict[str, float]]:
    out = []
    for i in range(runs):
        out.append(trio.run(_one_run, calls))
        log(f"policy_off: run {i + 1}/{runs}: guarded +{out[-1]['guarded_ns'] - out[-1]['bare_ns']:.0f} ns")
    return out


def run(ctx: Context) -> dict[str, Any]:
    calls = ctx.pick(200_000, 2_000)
    runs = _measure(calls, ctx.runs)

    def cost(key: str) -> dict[str, Any]:
        return summarize(r[key] - r["bare_ns"] for r in runs)

    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"calls_per_side": calls},
        "values": {"policy_off_guarded_ns": cost("guarded_ns"), "policy_off_through_ns": cost("through_ns")},
        "tables": [
            {
                "title": f"ns per call, {calls:,} calls a side per run",
                "columns": ["path", "ns per call", "added by the hooks' check"],
                "rows": [
                    ["bare answer (B)", summarize(r["bare_ns"] for r in runs), "-"],
                    *(
                        [label, summarize(r[key] for r in runs), cost(key)]
                        for label, key in (
                            ("OpenAI chat: `guarded` (A)", "guarded_ns"),
                            ("other routes: `through` (A)", "through_ns"),
                        )
                    ),
                ],
            }
        ],
        "runs_raw": runs,
        "commands": {"harness": f"python -m bench run --only policy_off --runs {ctx.runs}"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = _measure(args.calls, args.runs)
    for key in ("guarded_ns", "through_ns"):
        print(f"{key[:-3]:>8}: +{statistics.median(r[key] - r['bare_ns'] for r in runs):.1f} ns per request")


if __name__ == "__main__":
    main()
