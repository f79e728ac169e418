"""The resumable streams' store on its own: how bytes become numbered events, what a reader
gets from a number on, the size and count limits, the grace, and the refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.lowlevel

from blazar.config import StreamsConfig
from blazar.dialects.openai import encode_stream_error
from blazar.errors import BlazarError
from blazar.serve.stores.streams import StreamReader, StreamState, StreamStore, event_number


class Source:
    """An SSE byte source: ``chunks``, then (``hold``) nothing until closed."""

    def __init__(self, chunks: list[bytes], *, hold: bool = False) -> None:
        self.chunks, self.hold = list(chunks), hold
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._run()

    async def _run(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await trio.lowlevel.checkpoint()
            yield chunk
        if self.hold:
            await trio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


async def _drain(reader: StreamReader) -> bytes:
    return b"".join([chunk async for chunk in reader])


def _ids(data: bytes) -> list[int]:
    return [int(line[4:]) for line in data.split(b"\n") if line.startswith(b"id: ")]


async def test_events_are_numbered_across_chunk_boundaries(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(), nursery.start_soon)
    source = Source([b"data: a\n", b"\ndata: b\n\n: keep-alive\n\nda", b"ta: c\n\nevent: ping\ndata: {}\n\n"])
    stream_id, reader = store.adopt(source, owner="k", model="m", ender=encode_stream_error)
    whole = await _drain(reader)
    assert whole == (
        b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n: keep-alive\n\nid: 3\ndata: c\n\nevent: ping\ndata: {}\n\n"
    )
    await trio.testing.wait_all_tasks_blocked()
    assert source.closed
    [info] = store.lookup("k")
    assert (info.state, info.last_event_id, info.readers) == (StreamState.DONE, 3, 0)
    # after 2: the keep-alive that followed 2 is skipped, 3 and what follows it come
    assert await _drain(store.read(stream_id, "k", 2)) == b"id: 3\ndata: c\n\nevent: ping\ndata: {}\n\n"
    assert await _drain(store.read(stream_id, "k", 3)) == b""  # nothing but a keep-alive after 3


async def test_another_owner_sees_nothing(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(), nursery.start_soon)
    source = Source([b"data: a\n\n"])
    stream_id, reader = store.adopt(source, owner="alice", model=None, ender=encode_stream_error)
    await _drain(reader)
    for who in ("bob", None):
        with pytest.raises(BlazarError) as caught:
            store.read(stream_id, who, 0)
        assert caught.value.code == "STREAM_NOT_FOUND"
        with pytest.raises(BlazarError):
            store.delete(stream_id, who)
        assert store.lookup(who) == []
    assert [s.id for s in store.lookup("alice", ids=[stream_id, "strm_x"])] == [stream_id]


async def test_past_the_newest_event_is_refused_naming_the_header(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(), nursery.start_soon)
    source = Source([b"data: a\n\n"])
    stream_id, reader = store.adopt(source, owner=None, model=None, ender=encode_stream_error)
    await _drain(reader)
    with pytest.raises(BlazarError) as caught:
        store.read(stream_id, None, 2)
    assert (caught.value.code, caught.value.param) == ("BAD_REQUEST", "Last-Event-ID")


def test_event_numbers_and_the_opt_in_header() -> None:
    assert event_number(" 12 ", "Last-Event-ID") == 12
    for bad in ("", "x", "-1", "1.0", "\u0661", "9" * 19):
        with pytest.raises(BlazarError) as caught:
            event_number(bad, "Last-Event-ID")
        assert caught.value.param == "Last-Event-ID" and "Last-Event-ID" in str(caught.value)
    store = StreamStore(StreamsConfig(), lambda fn: None)
    assert store.wants("on") and store.wants("TRUE") and not store.wants("off") and not store.wants(None)
    assert StreamStore(StreamsConfig(resumable=True), lambda fn: None).wants(None)
    with pytest.raises(BlazarError) as caught:
        store.wants("maybe")
    assert caught.value.param == "X-Blazar-Resumable"


async def test_oldest_events_go_past_the_size_limit(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(max_stream_kb=1), nursery.start_soon)
    events = [b"data: %s\n\n" % (b"%03d" % i + b"x" * 90) for i in range(40)]
    stream_id, reader = store.adopt(Source(events), owner=None, model=None, ender=encode_stream_error)
    await reader.aclose()  # nobody reads while it runs
    await trio.testing.wait_all_tasks_blocked()
    [info] = store.lookup(None)
    assert info.state is StreamState.DONE and info.last_event_id == 40
    assert info.bytes <= 1024 and info.first_event_id > 1
    with pytest.raises(BlazarError) as caught:
        store.read(stream_id, None, 0)
    assert caught.value.code == "STREAM_EVENTS_GONE"
    kept = await _drain(store.read(stream_id, None, info.first_event_id - 1))
    assert _ids(kept) == list(range(info.first_event_id, 41))


async def test_a_full_store_drops_the_oldest_finished_then_refuses(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(max_streams=2), nursery.start_soon)
    first, reader = store.adopt(Source([b"data: a\n\n"]), owner=None, model=None, ender=encode_stream_error)
    await _drain(reader)
    held = Source([b"data: b\n\n"], hold=True)
    store.adopt(held, owner=None, model=None, ender=encode_stream_error)
    store.adopt(Source([b"data: c\n\n"], hold=True), owner=None, model=None, ender=encode_stream_error)
    assert first not in {s.id for s in store.lookup(None)} and len(store) == 2
    with pytest.raises(BlazarError) as caught:
        store.adopt(Source([]), owner=None, model=None, ender=encode_stream_error)
    assert caught.value.code == "STREAM_STORE_FULL" and caught.value.retry_after_s == 30.0


async def test_unread_stream_is_cancelled_after_its_grace(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(grace_s=0.2, keep_s=1.0), nursery.start_soon)
    source = Source([b"data: a\n\n"], hold=True)
    ran: list[str] = []

    async def cleanup() -> None:
        ran.append("lease released")

    stream_id, reader = store.adopt(
        source, owner=None, model=None, ender=encode_stream_error, cleanups=[cleanup]
    )
    assert await reader.__anext__() == b"id: 1\ndata: a\n\n"
    await reader.aclose()  # the client is gone
    await trio.sleep(0.1)
    assert store.lookup(None)[0].state is StreamState.LIVE  # within its grace
    again = store.read(stream_id, None, 1)  # a resume stops the clock…
    await trio.sleep(0.3)
    assert store.lookup(None)[0].state is StreamState.LIVE
    await again.aclose()  # …and leaving starts it again
    await trio.sleep(0.5)
    [info] = store.lookup(None)
    assert info.state is StreamState.CANCELLED and source.closed and ran == ["lease released"]
    tail = await _drain(store.read(stream_id, None, 1))
    assert b'"blazar_code":"STREAM_CANCELLED"' in tail and b"nobody read it for 0.2 s" in tail
    assert tail.startswith(b"id: 2\n")
    await trio.sleep(1.0)
    assert store.lookup(None) == []  # dropped keep_s after its end


async def test_delete_cancels_a_live_stream_and_wakes_its_reader(nursery: trio.Nursery) -> None:
    store = StreamStore(StreamsConfig(), nursery.start_soon)
    source = Source([b"data: a\n\n"], hold=True)
    stream_id, reader = store.adopt(source, owner="k", model=None, ender=encode_stream_error)
    assert await reader.__anext__() == b"id: 1\ndata: a\n\n"
    info = store.delete(stream_id, "k")
    assert info.state is StreamState.LIVE
    with trio.fail_after(5):
        tail = await _drain(reader)
    assert b"was cancelled: it was deleted" in tail and source.closed
    with pytest.raises(BlazarError):
        store.read(stream_id, "k", 0)
