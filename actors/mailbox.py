"""Typed mailboxes: the only way to talk to an actor.

A mailbox is a bounded trio memory channel of envelopes. ``tell`` sends and
forgets; ``ask`` sends and waits for the one reply. The reply slot travels in
the envelope beside the message, never inside it, so every message stays a plain
encodable struct.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec
import outcome
import trio

from actors.errors import ActorStopped

__all__ = ["Envelope", "Mailbox", "MailboxStatistics", "Reply"]

M = TypeVar("M")


class MailboxStatistics(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    queued: int
    capacity: float
    sent: int
    asks_waiting: int
    closed: bool


class Reply:
    """A one-shot reply slot. The actor resolves it once; the asker waits on it."""

    __slots__ = ("_event", "_result")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._result: outcome.Outcome[Any] | None = None

    @property
    def done(self) -> bool:
        return self._result is not None

    def send(self, value: object) -> None:
        if self._result is None:
            self._result = outcome.Value(value)
            self._event.set()

    def fail(self, exc: BaseException) -> None:
        if self._result is None:
            self._result = outcome.Error(exc)
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        assert self._result is not None
        return self._result.unwrap()


@dataclass(slots=True)
class Envelope(Generic[M]):
    message: M
    reply: Reply | None = field(default=None)

    def answer(self, value: object) -> None:
        if self.reply is not None:
            self.reply.send(value)

    def fail(self, exc: BaseException) -> None:
        if self.reply is not None:
            self.reply.fail(exc)


class Mailbox(Generic[M]):
    """A bounded, typed inbox owned by exactly one actor."""

    def __init__(self, name: str, capacity: float = 256) -> None:
        self.name = name
        self._capacity = capacity
        self._send, self._recv = trio.open_memory_channel[Envelope[M]](capacity)
        self._closed = False
        self._sent = 0
        self._received = 0
        self._asks_waiting = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Mailbox {self.name} {state} queued={self._queued()}>"

    def _queued(self) -> int:
        return self._send.statistics().current_buffer_used

    def backlog(self) -> bool:
        """Whether a message was sent that the actor has not received yet: one in the
        buffer, or one handed to the actor's waiting ``receive`` before it ran again."""
        return self._sent > self._received

    def _check_open(self) -> None:
        if self._closed:
            raise ActorStopped(f"actor '{self.name}' is not running")

    async def tell(self, message: M) -> None:
        """Send and forget; waits while the mailbox is full."""
        self._check_open()
        await self._send_envelope(Envelope(message))

    def tell_nowait(self, message: M) -> None:
        """Send and forget without waiting; raises ``trio.WouldBlock`` when full."""
        self._check_open()
        try:
            self._send.send_nowait(Envelope(message))
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise ActorStopped(f"actor '{self.name}' is not running") from exc
        self._sent += 1

    async def ask(self, message: M) -> Any:
        """Send and wait for the reply. Fails at once when the actor is stopped,
        and with ``ActorStopped`` when it stops before answering."""
        self._check_open()
        reply = Reply()
        await self._send_envelope(Envelope(message, reply))
        self._asks_waiting += 1
        try:
            return await reply.wait()
        finally:
            self._asks_waiting -= 1

    async def _send_envelope(self, env: Envelope[M]) -> None:
        # Counted before the send: the value may be handed to a waiting receiver
        # before the send's final checkpoint returns.
        self._sent += 1
        try:
            await self._send.send(env)
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            self._sent -= 1
            raise ActorStopped(f"actor '{self.name}' is not running") from exc
        except BaseException:
            self._sent -= 1  # cancelled before anything was sent
            raise

    async def receive(self) -> Envelope[M]:
        env = await self._recv.receive()
        self._received += 1
        return env

    def receive_nowait(self) -> Envelope[M]:
        env = self._recv.receive_nowait()
        self._received += 1
        return env

    def close(self) -> None:
        """Refuse new messages and fail every queued ask."""
        if self._closed:
            return
        self._closed = True
        self._send.close()
        while True:
            try:
                env = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            env.fail(ActorStopped(f"actor '{self.name}' stopped before answering"))
        self._received = self._sent

    def reopen(self) -> None:
        """Used by a supervisor restarting the owner: a fresh channel, same address."""
        self._send, self._recv = trio.open_memory_channel[Envelope[M]](self._capacity)
        self._closed = False
        self._received = self._sent  # what the old channel held is gone

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> MailboxStatistics:
        cap = self._capacity
        return MailboxStatistics(
            name=self.name,
            queued=self._queued(),
            capacity=cap if not math.isinf(cap) else -1,
            sent=self._sent,
            asks_waiting=self._asks_waiting,
            closed=self._closed,
        )
