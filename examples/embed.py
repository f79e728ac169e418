"""Embedding the runtime in a Trio program, with no HTTP layer.

Opens the runtime on a home and shows, one step after the other, what an embedding
program gets from it exactly as the daemon's gateway does:

1. A pull is a job. ``rt.pull(model)`` installs the model: from its catalog sources,
   or without downloading when another tool's store on this machine (the Hugging Face
   cache, Ollama's) holds the same bytes, or at once when the home holds it already.
   ``rt.jobs.follow(job.id)`` gives the job's progress until it ends.
2. A prompt that cannot fit is refused before anything starts. A claim given a lower
   bound on the prompt's tokens (``prompt=``) raises ``PromptTooLong`` when the bound is
   over one slot's context: before admission, with no engine started.
3. A failover chain is claimed by name. Its first target (``--damaged``) cannot start:
   the test installs under that name a copy of the model's file cut short after its
   header, which llama.cpp refuses to load. The claim walks on to the model, which
   answers; ``claim.walk`` says which target served and which were passed over, and why.
4. Admission. The model has one slot and two requests run at once: the second waits for
   the slot (the admission statistics show it queued), the first is cancelled
   mid-stream, which frees its slot at once for the second, and the program exits
   leaving no engine process.

    python examples/embed.py --home ~/.local/share/blazar --model smollm2-135m

In a home without a model named ``--damaged`` the chain still runs: that target is then
passed over as MODEL_NOT_FOUND rather than as an engine that could not start.

Each step is printed as one JSON line, so a test (tests/e2e/test_embed_example.py)
can check what happened.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import trio

from actors import ModelOverride, Runtime, RuntimeConfig, open_runtime
from actors.config import FailoverChain
from actors.jobs import read_job
from actors.preflight import PromptTooLong

CHAIN = "chat"
"""The failover chain's name: a claim names it as it would a model."""


def report(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def queue_of(rt: Runtime, model: str) -> dict[str, int]:
    for q in rt.admission.statistics().queues:
        if q.model == model:
            return {"running": q.running, "queued": q.queued}
    return {"running": 0, "queued": 0}


# -- 1. a pull, run as a job -------------------------------------------------------------


async def pull(rt: Runtime, model: str) -> bool:
    """Pull ``model`` and follow the job to its end; True once it is installed."""
    job = await rt.pull(model)
    downloaded = None
    async for event in rt.jobs.follow(job.id):
        if event.kind == "progress":  # a registry.pull.PullProgress, as a dict
            fields = {k: event.data[k] for k in ("status", "source", "message") if event.data.get(k)}
            report("pull-progress", **fields)
            downloaded = event.data.get("downloaded")
        else:  # "error": its code and message
            report(f"pull-{event.kind}", **event.data)
    # The job has ended: its record says how, and its result is the installed model's name.
    done = await trio.to_thread.run_sync(read_job, rt.jobs.path, job.id)
    assert done is not None
    installed = done.result.decode() if done.result else None
    report("pulled", state=done.state, model=installed, downloaded=downloaded, error=done.error)
    return done.state == "completed"


# -- 2. a prompt too long, refused before any engine starts ------------------------------


@dataclass(frozen=True)
class TextPrompt:
    """What a claim needs to know of a prompt (``actors.preflight.PromptBound``): a lower
    bound on its tokens. No token holds more bytes than the vocabulary's longest one, so
    the text's bytes over that length is such a bound, known without a tokenizer."""

    text: str
    turns: int = 1

    def token_floor(self, *, token_bytes_max: int | None, message_tokens: int = 0) -> int:
        if not token_bytes_max:
            return 0  # the vocabulary is not known: nothing is sure
        size = len(self.text.encode())
        return -(-size // token_bytes_max) + self.turns * message_tokens


async def refuse_long_prompt(rt: Runtime, model: str) -> None:
    book = "All work and no play makes Jack a dull boy.\n" * 20_000  # about 880 kB
    try:
        async with rt.claim(model, client="reader", prompt=TextPrompt(book)):
            report("prompt-admitted")  # not expected: it cannot fit
    except PromptTooLong as exc:
        # The engine actor exists (the claim sized the prompt against its context), but its
        # child was never started and the request never queued.
        engine = await rt.engine_for(model)
        stats = engine.statistics()
        report(
            "prompt-refused",
            code=exc.code,
            floor=exc.floor,
            ctx=exc.ctx,
            message=exc.message,
            engine=engine.state,
            pid=stats.pid,
            starts=stats.starts,
            slot=queue_of(rt, model),
        )


# -- 3. a failover chain, claimed by name -------------------------------------------------


async def ask_chain(rt: Runtime, chain: str) -> None:
    async with rt.claim(chain, client="chain") as claim:
        assert claim.walk is not None  # a chain's name is walked
        resp = await claim.handle.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16},
            timeout=60,
        )
        text = resp.json()["choices"][0]["message"]["content"]
    walk = claim.walk
    passed = [{"target": target, "code": code, "why": why[:160]} for target, code, why in walk.passed]
    report(
        "failover", chain=chain, served=walk.target, passed=passed, status=resp.status_code, chars=len(text)
    )


# -- 4. admission: one slot, a queued request, a cancel that frees the slot ---------------


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


async def main(home: Path, model: str, damaged: str) -> None:
    config = RuntimeConfig.in_home(
        str(home),
        models={model: ModelOverride(slots=1)},
        failover=[FailoverChain(name=CHAIN, targets=[damaged, model])],
    )
    async with open_runtime(config) as rt:
        if not await pull(rt, model):
            return
        await refuse_long_prompt(rt, model)  # first: no engine has started yet
        await ask_chain(rt, CHAIN)

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
    parser.add_argument("--home", type=Path, required=True, help="the data root (BLAZAR_HOME)")
    parser.add_argument("--model", default="smollm2-135m", help="a catalog name: pulled if not installed")
    parser.add_argument(
        "--damaged",
        default="smollm2-135m-damaged",
        help="the failover chain's first target: a model whose engine cannot start",
    )
    args = parser.parse_args()
    trio.run(main, args.home, args.model, args.damaged)
