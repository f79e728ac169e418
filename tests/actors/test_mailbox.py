import pytest
import trio

from actors.errors import ActorStopped
from actors.mailbox import Mailbox


async def test_tell_then_receive() -> None:
    with trio.fail_after(1):
        box: Mailbox[str] = Mailbox("box", capacity=4)
        await box.tell("a")
        box.tell_nowait("b")
        assert (await box.receive()).message == "a"
        env = box.receive_nowait()
        assert env.message == "b"
        assert env.reply is None


async def test_ask_gets_the_answer() -> None:
    with trio.fail_after(1):
        box: Mailbox[int] = Mailbox("doubler")

        async def serve() -> None:
            env = await box.receive()
            env.answer(env.message * 2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            assert await box.ask(21) == 42


async def test_ask_reply_failure_is_raised() -> None:
    with trio.fail_after(1):
        box: Mailbox[int] = Mailbox("failer")

        async def serve() -> None:
            env = await box.receive()
            env.fail(ValueError("nope"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            with pytest.raises(ValueError, match="nope"):
                await box.ask(1)


async def test_ask_to_stopped_mailbox_fails_at_once() -> None:
    with trio.fail_after(1):
        box: Mailbox[int] = Mailbox("gone")
        box.close()
        with pytest.raises(ActorStopped):
            await box.ask(1)
        with pytest.raises(ActorStopped):
            await box.tell(1)
        with pytest.raises(ActorStopped):
            box.tell_nowait(1)


async def test_pending_ask_fails_when_mailbox_closes() -> None:
    with trio.fail_after(1):
        box: Mailbox[int] = Mailbox("closing")
        async with trio.open_nursery() as nursery:

            async def close_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert box.statistics().asks_waiting == 1
                box.close()

            nursery.start_soon(close_soon)
            with pytest.raises(ActorStopped):
                await box.ask(1)
        assert box.statistics().asks_waiting == 0


async def test_reopen_accepts_messages_again() -> None:
    box: Mailbox[int] = Mailbox("phoenix")
    box.close()
    assert box.closed
    box.reopen()
    assert not box.closed
    box.tell_nowait(1)
    assert box.receive_nowait().message == 1


async def test_tell_nowait_would_block_when_full() -> None:
    box: Mailbox[int] = Mailbox("small", capacity=2)
    box.tell_nowait(1)
    box.tell_nowait(2)
    with pytest.raises(trio.WouldBlock):
        box.tell_nowait(3)


async def test_statistics_and_repr() -> None:
    box: Mailbox[int] = Mailbox("stats", capacity=3)
    box.tell_nowait(1)
    box.tell_nowait(2)
    stats = box.statistics()
    assert stats.name == "stats"
    assert stats.queued == 2
    assert stats.capacity == 3
    assert stats.sent == 2
    assert stats.asks_waiting == 0
    assert not stats.closed
    assert repr(box) == "<Mailbox stats open queued=2>"
    assert Mailbox("inf", capacity=float("inf")).statistics().capacity == -1
    box.close()
    assert box.statistics().closed
