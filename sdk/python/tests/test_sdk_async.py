"""The asyncio client against a real daemon: the same answers, and a cancelled task ends its
request on the daemon (its connection closes, the slot is released)."""

from __future__ import annotations

import asyncio

import pytest
from tests.support import MODEL, DaemonProc

from blazar_sdk import AsyncClient, BlazarError, PullProgress

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello in one short sentence."}]


def run(coro):  # type: ignore[no-untyped-def]
    """Each test runs its own asyncio loop (the repository's tests run on trio)."""
    return asyncio.run(coro)


def test_async_chat_whole_and_streamed(sdk_daemon: DaemonProc) -> None:
    async def main() -> None:
        client = AsyncClient(base_url=sdk_daemon.url)
        whole = await client.chat(MODEL, HI, max_tokens=12, temperature=0)
        assert whole.text.strip() and whole.meta.trace_id
        stream = await client.chat(MODEL, HI, stream=True, max_tokens=12, temperature=0)
        async with stream:
            text = "".join([chunk.text async for chunk in stream])
        assert text.strip()
        models, running = await asyncio.gather(client.models(), client.ps())
        assert MODEL in [m.id for m in models] and running
        story = await client.why(whole.meta.trace_id)
        assert story.trace_id == whole.meta.trace_id

    run(main())


def test_async_errors_are_blazar_errors(sdk_daemon: DaemonProc) -> None:
    async def main() -> None:
        client = AsyncClient(base_url=sdk_daemon.url)
        with pytest.raises(BlazarError) as missing:
            await client.chat("no-such-model", HI)
        assert (missing.value.status, missing.value.blazar_code) == (404, "MODEL_NOT_FOUND")
        with pytest.raises(BlazarError) as gone:
            await AsyncClient(base_url="http://127.0.0.1:9", timeout=5).models()
        assert gone.value.blazar_code == "SDK_CONNECTION"

    run(main())


def test_cancelled_task_disconnects_and_frees_the_slot(sdk_daemon: DaemonProc) -> None:
    async def main() -> None:
        client = AsyncClient(base_url=sdk_daemon.url)
        started = asyncio.Event()
        trace: list[str] = []

        async def consume() -> None:
            stream = await client.chat(
                MODEL,
                [{"role": "user", "content": "Count from one to one thousand, in words."}],
                stream=True,
                max_tokens=2000,
            )
            trace.append(stream.meta.trace_id or "")
            async for _ in stream:
                started.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(started.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            cards = [c for c in await client.requests() if c.id == trace[0]]
            if cards and cards[0].state == "disconnected":
                break
            await asyncio.sleep(0.1)
        assert cards and cards[0].state == "disconnected"

    run(main())


def test_async_pull_and_jobs(sdk_daemon: DaemonProc) -> None:
    async def main() -> None:
        client = AsyncClient(base_url=sdk_daemon.url)
        seen: list[PullProgress] = []

        async def note(p: PullProgress) -> None:
            seen.append(p)

        last = await client.pull(MODEL, progress=note)
        assert last.status == "success" and seen[-1] is last
        page = await client.jobs.list(kind="pull", limit=1)
        assert page.data and (await client.jobs.get(page.data[0].id)).kind == "pull"
        events = await client.jobs.events(page.data[0].id)
        assert events
        follow = await client.jobs.follow(page.data[0].id)
        async with follow:
            followed = [e async for e in follow]
        assert [e["seq"] for e in followed] == [e["seq"] for e in events]

    run(main())
