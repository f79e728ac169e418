"""The actor base: one task, one mailbox, messages handled one at a time."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
import trio

from actors.errors import ActorStopped, BlazarRuntimeError
from actors.mailbox import Envelope, Mailbox

__all__ = ["Actor", "ActorStatistics"]

M = TypeVar("M")


class ActorStatistics(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    running: bool
    handled: int
    queued: int


class Actor(Generic[M]):
    """Subclasses implement ``handle``; ``run`` is what a nursery or supervisor starts.

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

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<{type(self).__name__} {self.name} {state} handled={self._handled}>"

    async def tell(self, message: M) -> None:
        await self.mailbox.tell(message)

    def tell_nowait(self, message: M) -> None:
        self.mailbox.tell_nowait(message)

    async def ask(self, message: M) -> Any:
        return await self.mailbox.ask(message)

    async def on_start(self) -> None:
        """Runs before the actor reports itself started."""

    async def on_stop(self) -> None:
        """Runs (shielded) after the loop ends, whatever ended it."""

    async def handle(self, message: M) -> Any:
        raise NotImplementedError

    async def dispatch(self, env: Envelope[M]) -> None:
        """Handle one envelope. Override to answer later (keep the envelope and
        call ``env.answer`` once the work is done) without blocking the mailbox."""
        try:
            result = await self.handle(env.message)
        except BlazarRuntimeError as exc:
            env.fail(exc)
        except Exception as exc:
            env.fail(exc)
            raise
        except BaseException:
            # cancelled mid-message: the asker must not wait forever
            env.fail(ActorStopped(f"actor '{self.name}' stopped before answering"))
            raise
        else:
            env.answer(result)

    async def run(self, *, task_status: trio.TaskStatus[Actor[M]] = trio.TASK_STATUS_IGNORED) -> None:
        self.mailbox.reopen()
        self._running = True
        try:
            await self.on_start()
            task_status.started(self)
            while True:
                env = await self.mailbox.receive()
                try:
                    await self.dispatch(env)
                finally:
                    self._handled += 1
        finally:
            self._running = False
            self.mailbox.close()
            with trio.CancelScope(shield=True):
                await self.on_stop()

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(
            name=self.name,
            running=self._running,
            handled=self._handled,
            queued=self.mailbox.statistics().queued,
        )
