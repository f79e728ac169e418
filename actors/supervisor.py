"""One-for-one supervision: restart policies, restart budget per window, backoff.

Each child runs in a keeper task inside the supervisor's nursery. The keeper owns
the child's cancel scope (so stopping it also cuts a pending backoff short), starts
it, waits for it to end, and applies the policy. The backoff doubles with each
restart still inside the window, so a child that crashes rarely always comes back
after ``backoff_initial_s``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import msgspec
import trio

from actors.errors import ActorStopped, SupervisorEscalation

__all__ = ["ChildSpec", "ChildStatistics", "Restart", "Supervisor", "SupervisorStatistics"]

ChildState = Literal["running", "restarting", "stopped", "failed"]


class Restart(enum.StrEnum):
    PERMANENT = "permanent"  # always restarted
    TRANSIENT = "transient"  # restarted only when it ends with an exception
    TEMPORARY = "temporary"  # never restarted


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str
    start: Callable[..., Awaitable[None]]
    restart: Restart = Restart.PERMANENT
    shutdown_s: float = 5.0


class ChildStatistics(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    restart: str
    state: str
    restarts: int
    last_error: str | None


class SupervisorStatistics(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    children: list[ChildStatistics]
    escalated: bool


class _Status:
    """The ``task_status`` a child gets: ``started`` may be called once per start."""

    def __init__(self, on_started: Callable[[object], None]) -> None:
        self._on_started = on_started
        self.called = False

    def started(self, value: object = None) -> None:
        if self.called:
            raise RuntimeError("called 'started' twice on the same task status")
        self.called = True
        self._on_started(value)


class _Child:
    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.state: ChildState = "restarting"
        self.value: object = None
        self.restarts = 0
        self.last_error: str | None = None
        self.recent: list[float] = []  # times of the restarts still inside the window

    @property
    def alive(self) -> bool:
        return not self.done.is_set()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Supervisor:
    def __init__(
        self,
        name: str,
        *,
        max_restarts: int = 3,
        window_s: float = 5.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
    ) -> None:
        self.name = name
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._children: dict[str, _Child] = {}
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._escalation: SupervisorEscalation | None = None
        self._escalate = trio.Event()

    def __repr__(self) -> str:
        if self._escalation is not None:
            state = "escalated"
        elif self._nursery is not None and not self._closing:
            state = "running"
        else:
            state = "stopped"
        live = sum(c.state == "running" for c in self._children.values())
        restarts = sum(c.restarts for c in self._children.values())
        return f"<Supervisor {self.name} {state} running={live}/{len(self._children)} restarts={restarts}>"

    async def run(self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise until cancelled; raises ``SupervisorEscalation`` when a child
        exhausts its restart budget (after stopping the others)."""
        if self._nursery is not None:
            raise RuntimeError(f"supervisor '{self.name}' is already running")
        self._closing = False
        self._escalation = None
        self._escalate = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                try:
                    await self._escalate.wait()
                finally:
                    self._closing = True
                    with trio.CancelScope(shield=True):
                        for child in reversed(list(self._children.values())):
                            await self._stop(child)
        finally:
            self._nursery = None
            self._closing = True
        if self._escalation is not None:
            raise self._escalation

    async def start_child(self, spec: ChildSpec) -> object:
        """Start ``spec`` under this supervisor; returns what it passed to ``started``.
        A failure before ``started`` is raised here and the child is not kept."""
        if self._nursery is None or self._closing:
            raise ActorStopped(f"supervisor '{self.name}' is not running")
        old = self._children.get(spec.name)
        if old is not None and old.alive:
            raise ValueError(f"supervisor '{self.name}' already has a child '{spec.name}'")
        self._children.pop(spec.name, None)  # re-adding moves it to the end of the stop order
        child = _Child(spec)
        self._children[spec.name] = child
        try:
            return await self._nursery.start(self._keep, child)
        except BaseException as exc:
            if self._children.get(spec.name) is child:
                del self._children[spec.name]
            if isinstance(exc, RuntimeError) and child.state == "stopped":
                raise ActorStopped(f"supervisor '{self.name}' stopped while starting") from exc
            raise

    async def stop_child(self, name: str) -> None:
        """Stop a child without restarting it (no-op if it already ended)."""
        await self._stop(self._children[name])

    def children(self) -> list[str]:
        """Names of the live children (running or restarting), in start order."""
        return [name for name, c in self._children.items() if c.alive]

    def child(self, name: str) -> object:
        """What the named child passed to ``started`` in its current run."""
        c = self._children[name]
        if c.state != "running":
            raise ActorStopped(f"child '{name}' of supervisor '{self.name}' is {c.state}")
        return c.value

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            name=self.name,
            children=[
                ChildStatistics(
                    name=c.spec.name,
                    restart=str(c.spec.restart),
                    state=c.state,
                    restarts=c.restarts,
                    last_error=c.last_error,
                )
                for c in self._children.values()
            ],
            escalated=self._escalation is not None,
        )

    async def _stop(self, child: _Child) -> None:
        child.scope.cancel()
        with trio.move_on_after(child.spec.shutdown_s):
            await child.done.wait()

    def _backoff_or_escalate(self, child: _Child) -> float | None:
        """Record one more restart and return its delay, or ``None`` to escalate."""
        now = trio.current_time()
        child.recent = [t for t in child.recent if now - t < self.window_s]
        if len(child.recent) >= self.max_restarts:
            return None
        delay = self.backoff_initial_s * math.pow(2, len(child.recent))
        child.recent.append(now)
        child.restarts += 1
        return min(delay, self.backoff_max_s)

    async def _keep(self, child: _Child, *, task_status: trio.TaskStatus[object]) -> None:
        spec = child.spec
        first = True

        def on_started(value: object) -> None:
            nonlocal first
            child.value = value
            child.state = "running"
            if first:
                first = False
                # from now on only this supervisor stops it, in its own order
                child.scope.shield = True
                task_status.started(value)

        try:
            with child.scope:
                while True:
                    status = _Status(on_started)
                    error: Exception | None = None
                    try:
                        await spec.start(task_status=status)
                        if not status.called:
                            raise RuntimeError(f"child '{spec.name}' ended before it started")
                    except Exception as exc:
                        child.last_error = _describe(exc)
                        if first:
                            child.state = "failed"
                            raise
                        error = exc
                    if spec.restart is Restart.TEMPORARY or (
                        spec.restart is Restart.TRANSIENT and error is None
                    ):
                        child.state = "stopped" if error is None else "failed"
                        return
                    delay = self._backoff_or_escalate(child)
                    if delay is None:
                        child.state = "failed"
                        self._raise_escalation(child, error)
                        return
                    child.state = "restarting"
                    await trio.sleep(delay)
        finally:
            if child.state in ("running", "restarting"):
                child.state = "stopped"
            child.done.set()

    def _raise_escalation(self, child: _Child, error: Exception | None) -> None:
        if self._escalation is not None:
            return
        exc = SupervisorEscalation(
            f"supervisor '{self.name}': child '{child.spec.name}' needed more than "
            f"{self.max_restarts} restarts in {self.window_s} s"
        )
        exc.__cause__ = error
        self._escalation = exc
        self._escalate.set()
