"""Embedding the runtime in a Trio program, with no HTTP layer.

Opens the runtime on a home that holds a model, gives that model one slot and
runs two requests at once: the second waits for the slot (the admission
statistics show it queued), the first is cancelled mid-stream, which frees its
slot at once for the second, and the program exits leaving no engine process.

    python examples/embed.py --home ~/.local/share/blazar --model smollm2-135m

Each step is printed as one JSON line, so a test (tests/e2e/test_embed_example.py)
can check what happened.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import trio

from actors import ModelOverride, Runtime, RuntimeConfig, open_runtime


def report(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def queue_of(rt: Runtime, model: str) -> dict[str, int]:
    for q in rt.admission.statistics().queues:
        if q.model == model:
            return {"running": q.running, "queued": q.queued}
    return {"running": 0, "queued": 0}


async def stream_until_cancelled(rt: Runtime, model: str, started: trio.Event, cancel: trio.Event) -> None:
    """Stream a long answer; stop reading when ``cancel`` is set, as a client that goes away."""
    with trio.CancelScope() as scope:
        async with rt.claim(model, client="first") as claim:
            report("first-granted", queued_s=round(claim.queued_s, 3))
            body = {
                "messages": [{"role": "user", "content": "Count from one to one thousand, in words."}],
                "max_tokens": 2000,
                "stream": True,
            }
            async with claim.handle.client.stream("POST", "/v1/chat/completions", json=body) as resp:
                chunks = 0
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        chunks += 1
                        if chunks == 3:
                            started.set()
                            # Cancelled from outside, like a disconnect: the whole scope ends.
                            await cancel.wait()
                            scope.cancel()
    report("first-cancelled", slot=queue_of(rt, model))


async def ask_once(rt: Runtime, model: str, done: trio.Event) -> None:
    async with rt.claim(model, client="second") as claim:
        report("second-granted", queued_s=round(claim.queued_s, 3), slot=queue_of(rt, model))
        resp = await claim.handle.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16},
            timeout=60,
        )
        text = resp.json()["choices"][0]["message"]["content"]
        report("second-answered", status=resp.status_code, chars=len(text))
    done.set()


async def main(home: Path, model: str) -> None:
    config = RuntimeConfig.in_home(str(home), models={model: ModelOverride(slots=1)})
    async with open_runtime(config) as rt:
        started, cancel, done = trio.Event(), trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream_until_cancelled, rt, model, started, cancel)
            await started.wait()
            nursery.start_soon(ask_once, rt, model, done)
            # The second request waits for the only slot while the first streams; watched
            # from outside through the statistics, as an operator would.
            while queue_of(rt, model)["queued"] == 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
            report("second-queued", slot=queue_of(rt, model))
            cancel.set()
            await done.wait()
        engine = rt.engine_if_loaded(model)
        pid = engine.statistics().pid if engine else None
        report("engine", pid=pid)
    report("exited", pid=pid, alive=pid is not None and _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a data root that holds the model")
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    trio.run(main, args.home, args.model)
