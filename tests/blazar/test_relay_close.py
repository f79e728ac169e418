"""A request whose client is gone is closed upstream once the engine can notice it."""

from __future__ import annotations

import json

import trio
import trio.testing

from blazar.dialects.llamacpp import ProgressFilter, ask_progress
from blazar.serve.relay import OutputWatch, UpstreamStream

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
PROGRESS = b'data: {"choices":[],"prompt_progress":{"total":900,"cache":0,"processed":512}}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'


class _Response:
    """The engine's stream: a role event and progress at once, the first token later."""

    def __init__(self) -> None:
        self.first_token = trio.Event()
        self.closed = False
        self._events = [ROLE, PROGRESS]

    async def receive_some(self) -> bytes:
        if self._events:
            return self._events.pop(0)
        await self.first_token.wait()
        return TOKEN

    async def aclose(self) -> None:
        self.closed = True


class _Lease:
    released = False

    def release(self) -> None:
        self.released = True


async def _on_error(exc: Exception) -> bytes:
    return b""


async def test_gone_while_the_prompt_is_read_it_is_closed_at_the_first_token() -> None:
    response, lease = _Response(), _Lease()
    async with trio.open_nursery() as nursery:
        stream = UpstreamStream(response, lease, _on_error, background=nursery.start_soon)  # type: ignore[arg-type]
        assert await stream.__anext__() == ROLE  # relayed, then the client goes away
        await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        # The engine is still reading the prompt: closing now would go unnoticed, and
        # the request still occupies the engine.
        assert not response.closed and not lease.released
        response.first_token.set()
    assert response.closed and lease.released


async def test_gone_after_the_first_token_it_is_closed_at_once() -> None:
    response, lease = _Response(), _Lease()
    response.first_token.set()
    async with trio.open_nursery() as nursery:
        stream = UpstreamStream(response, lease, _on_error, background=nursery.start_soon)  # type: ignore[arg-type]
        assert [await stream.__anext__() for _ in range(3)] == [ROLE, PROGRESS, TOKEN]
        await stream.aclose()
        assert response.closed and lease.released


def test_the_first_token_is_seen_when_split_between_chunks() -> None:
    watch = OutputWatch()
    assert not watch.feed(ROLE) and not watch.feed(PROGRESS)
    cut = TOKEN.index(b'"content"') + 5
    assert not watch.feed(TOKEN[:cut]) and watch.feed(TOKEN[cut:])


async def test_with_progress_asked_it_is_closed_at_once_and_progress_is_filtered() -> None:
    response, lease = _Response(), _Lease()
    async with trio.open_nursery() as nursery:
        stream = UpstreamStream(
            response,  # type: ignore[arg-type]
            lease,
            _on_error,
            background=nursery.start_soon,
            progress=ProgressFilter(),
        )
        assert await stream.__anext__() == ROLE  # the progress event after it never reaches the client
        await stream.aclose()
        # The engine writes a progress event after each batch of the prompt: it notices
        # the closed connection there, so there is nothing to wait for.
        assert response.closed and lease.released


def test_progress_events_are_dropped_wherever_the_bytes_split() -> None:
    stream = ROLE + PROGRESS + PROGRESS + TOKEN + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):
        f = ProgressFilter()
        out = f.feed(stream[:cut]) + f.feed(stream[cut:]) + f.flush()
        assert out == ROLE + TOKEN + b"data: [DONE]\n\n", cut


def test_progress_text_inside_a_string_is_not_an_event() -> None:
    quoted = b'data: {"choices":[{"delta":{"content":"say \\"prompt_progress\\":{ now"}}]}\n\n'
    assert ProgressFilter().feed(quoted) == quoted


def test_progress_is_asked_unless_the_client_chose() -> None:
    body, ours = ask_progress(b'{"model":"m","stream":true}')
    assert ours and json.loads(body) == {"return_progress": True, "model": "m", "stream": True}
    assert ask_progress(b" {}") == (b' {"return_progress":true}', True)
    theirs = b'{"model":"m","return_progress":false}'
    assert ask_progress(theirs) == (theirs, False)


class _Scripted:
    """An engine stream that sends ``events`` and then ends."""

    def __init__(self, events: list[bytes]) -> None:
        self._events = list(events)

    async def receive_some(self) -> bytes:
        return self._events.pop(0) if self._events else b""

    async def aclose(self) -> None:
        pass


FINAL = (
    b'data: {"choices":[],"timings":{"prompt_n":3,"prompt_ms":4.0,"predicted_n":1,"predicted_ms":2.0}}\n\n'
)
DONE = b"data: [DONE]\n\n"


async def test_the_stream_tail_is_handed_over_once_at_the_end() -> None:
    tails: list[bytes] = []
    stream = UpstreamStream(
        _Scripted([ROLE, TOKEN, FINAL, DONE]),  # type: ignore[arg-type]
        _Lease(),
        _on_error,
        on_end=tails.append,
    )
    assert [chunk async for chunk in stream] == [ROLE, TOKEN, FINAL, DONE]
    await stream.aclose()
    assert tails == [FINAL + DONE]


async def test_a_client_that_closes_at_done_still_hands_the_tail_over() -> None:
    # The OpenAI SDK closes the connection as soon as it reads `[DONE]`, before the
    # engine's end of body arrives: the stream is closed, not exhausted.
    tails: list[bytes] = []
    stream = UpstreamStream(
        _Scripted([ROLE, TOKEN, FINAL, DONE]),  # type: ignore[arg-type]
        _Lease(),
        _on_error,
        on_end=tails.append,
    )
    for _ in range(4):
        await stream.__anext__()
    await stream.aclose()
    await stream.aclose()
    assert tails == [FINAL + DONE]
