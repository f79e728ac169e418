"""What the policy hooks cost a chat request when none is configured.

    python -m bench.policy_off [--calls 200000] [--runs 5]

With no ``[[hooks]]`` the OpenAI chat service (``blazar.serve.openai_chat.answer_chat``) is
``blazar.serve.policy.hooks.guarded`` around the rest: one lookup of the runtime's hooks,
found absent, then the call. This times, in one trio run, an ``await`` of a trivial answer
function bare and through ``guarded`` (no hooks registered for the runtime), and prints the
median of each over ``--runs`` and the difference per call. Nothing is written: the figure is
quoted in docs/security.md#policy-hooks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio

from blazar.serve.policy.hooks import guarded
from blazar.serve.reply import Reply

_REPLY = Reply(b"{}")


class _Runtime:
    """Stands for the daemon's runtime: only looked up (weakly) in the hooks' table."""


async def _answer(runtime: Any, call: Any, ask: Any, req: Any) -> Reply:
    return _REPLY


async def _time(fn: Any, calls: int) -> float:
    runtime = _Runtime()
    t0 = time.perf_counter()
    for _ in range(calls):
        await fn(runtime, None, None, None)
    return (time.perf_counter() - t0) / calls * 1e9


async def _main(calls: int, runs: int) -> None:
    wrapped = guarded(_answer)
    bare, through = [], []
    for _ in range(runs):
        bare.append(await _time(_answer, calls))
        through.append(await _time(wrapped, calls))
    b, g = statistics.median(bare), statistics.median(through)
    print(f"bare answer:      {b:7.1f} ns per call (median of {runs} runs of {calls})")
    print(f"through guarded:  {g:7.1f} ns per call")
    print(f"hooks off cost:   {g - b:7.1f} ns per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    trio.run(_main, args.calls, args.runs)


if __name__ == "__main__":
    main()
