"""The actor base: one task, one mailbox, the same loop for every actor.

The loop, once per wake:

1. wait for a message, but no later than ``next_deadline()``;
2. dispatch that message and every message already queued behind it, without
   waiting in between (a burst is one batch);
3. call ``on_deadline()`` when the deadline has passed;
4. call ``settle()``: the step that acts on the whole batch at once (the ledger
   commits its burst, admission assigns its free slots).

Hooks that never block are plain ``def`` and run without a checkpoint, so what
they check still holds when they change it. ``dispatch`` and ``settle`` may
instead be ``async def`` when they must wait; the loop awaits whatever they
return, and the mailbox waits with them.

An actor's own tasks (a launch, a stop) run in its nursery (``start_soon``) and
report back through its mailbox: only the actor's task writes the actor's state.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypedDict, TypeVar

import msgspec
import trio

from actors.errors import ActorStopped, BlazarRuntimeError
from actors.mailbox import Envelope, Mailbox

__all__ = ["Actor", "ActorFields", "ActorStatistics"]

M = TypeVar("M")


class ActorStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What every actor reports; each actor's statistics extend it."""

    name: str
    running: bool
    handled: int
    queued: int


class ActorFields(TypedDict):
    """The base fields, to spread into a subclass of ``ActorStatistics``."""

    name: str
    running: bool
    handled: int
    queued: int


class Actor(Generic[M]):
    """Subclasses implement ``dispatch`` (or ``handle`` for plain request/reply);
    ``run`` is what a nursery or supervisor starts.

    Errors from the runtime's own tree (``BlazarRuntimeError``) are answers: they
    go back to the asker and the actor carries on. Any other exception is a bug:
    the asker gets it too, and the actor crashes so its supervisor can restart it.
    """

    def __init__(self, name: str, *, capacity: float = 256) -> None:
        self.name = name
        self.mailbox: Mailbox[M] = Mailbox(name, capacity)
        self.mailbox.close()  # not running until run() starts
        self._running = False
        self._handled = 0
        self._nursery: trio.Nursery | None = None

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<{type(self).__name__} {self.name} {state} handled={self._handled}>"

    async def tell(self, message: M) -> None:
        await self.mailbox.tell(message)

    def tell_nowait(self, message: M) -> None:
        self.mailbox.tell_nowait(message)

    async def ask(self, message: M) -> Any:
        return await self.mailbox.ask(message)

    # -- hooks ----------------------------------------------------------------

    async def on_start(self) -> None:
        """Runs before the actor takes messages or reports itself started."""

    async def on_stop(self) -> None:
        """Runs (shielded) after the loop ends, whatever ended it, while the mailbox still
        holds what was queued; it is closed (its asks failed) right after."""

    async def handle(self, message: M) -> Any:
        """For a plain request/reply actor: the answer to one message."""
        raise NotImplementedError

    def dispatch(self, env: Envelope[M]) -> Awaitable[None] | None:
        """Handle one envelope: answer it now, or keep it and answer once the work is done.

        The default answers with what ``handle`` returns."""
        return self._answer_with_handle(env)

    def next_deadline(self) -> float:
        """The trio time at which the loop wakes without a message (inf: never)."""
        return math.inf

    def on_deadline(self) -> None:
        """Called once the deadline of the last wait has passed."""

    def settle(self) -> Awaitable[None] | None:
        """Called after every wake, once the batch of messages has been dispatched."""
        return None

    # -- the loop -------------------------------------------------------------

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run a task owned by this actor; it is cancelled when the actor stops."""
        if self._nursery is None:
            raise ActorStopped(f"actor '{self.name}' is not running")
        self._nursery.start_soon(fn, *args)

    def cancel_tasks(self) -> None:
        """Cancel the tasks started with ``start_soon``: for an ``on_stop`` that closes what
        they use (it runs before they are cancelled)."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _answer_with_handle(self, env: Envelope[M]) -> None:
        env.answer(await self.handle(env.message))

    async def run(self, *, task_status: trio.TaskStatus[Actor[M]] = trio.TASK_STATUS_IGNORED) -> None:
        self.mailbox.reopen()
        crashed: Exception | None = None
        try:
            await self.on_start()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._running = True
                try:
                    task_status.started(self)
                    await self._loop()
                except Exception as exc:
                    # Raised bare below, once the actor's tasks are gone: a supervisor
                    # sees the bug itself, not a group around it.
                    crashed = exc
                finally:
                    self._running = False
                    with trio.CancelScope(shield=True):
                        await self.on_stop()
                    nursery.cancel_scope.cancel()
        finally:
            self._running = False
            self._nursery = None
            self.mailbox.close()
        if crashed is not None:
            raise crashed

    async def _loop(self) -> None:
        mailbox = self.mailbox
        while True:
            deadline = self.next_deadline()
            env: Envelope[M] | None = None
            if deadline == math.inf:
                env = await mailbox.receive()
            else:
                with trio.move_on_at(deadline):
                    env = await mailbox.receive()
            while env is not None:
                try:
                    pending = self.dispatch(env)
                    if pending is not None:
                        await pending
                except BlazarRuntimeError as exc:
                    env.fail(exc)
                except Exception as exc:
                    env.fail(exc)
                    raise
                except BaseException:
                    # cancelled mid-message: the asker must not wait forever
                    env.fail(ActorStopped(f"actor '{self.name}' stopped before answering"))
                    raise
                finally:
                    self._handled += 1
                try:
                    env = mailbox.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    env = None
            if trio.current_time() >= deadline:
                self.on_deadline()
            pending = self.settle()
            if pending is not None:
                await pending

    # -- statistics -------------------------------------------------------------

    def actor_fields(self) -> ActorFields:
        return ActorFields(
            name=self.name,
            running=self._running,
            handled=self._handled,
            queued=self.mailbox.statistics().queued,
        )

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(**self.actor_fields())
