"""EngineActor: owns one engine child process for one model.

States: stopped → starting → ready → stopping → stopped, and failed after a
crash or a failed start. A crashed child never takes the daemon down: the
requests on it fail, and the next ``EnsureReady`` starts it again. Too many
crashes in a window open a breaker that refuses further starts for a while.

Only this actor's own task changes its state. The tasks it runs (the launch,
the pipe drain, a crash check) report back through its mailbox: the launch sends
the child it spawned, then whether it became healthy. Taking and giving back a
lease are synchronous methods, so a request's check and change of the lease
count are one step on the event loop.

Its messages, states, handle and statistics are in ``actors.engine_types`` (and are
imported from here as well).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

import msgspec
import trio

from actors.actor import Actor
from actors.config import EngineConfig
from actors.engine_types import (
    ConfirmCrash,
    CrashReport,
    EngineHandle,
    EngineState,
    EngineStatistics,
    EnsureReady,
    Reconfigure,
    StopEngine,
    WaitSpawned,
)
from actors.engines.degrades import Degrade, parse
from actors.engines.lane import Lane
from actors.engines.routing import lane_for
from actors.engines.spec import LaunchSpec
from actors.errors import (
    ActorStopped,
    EngineCircuitOpen,
    EngineCrashed,
    EngineStartTimeout,
    EngineUnavailable,
)
from actors.mailbox import Envelope
from actors.process import ChildProcess
from actors.sessions import bank_on_stop, restore_on_start
from actors.upstream import UpstreamPool

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("blazar.engine")

# llama.cpp's HTTP server drops idle keep-alive connections after 5 s; expiring
# ours first avoids reusing a socket it is closing.
_KEEPALIVE_EXPIRY_S = 4.0
# A small model is healthy within a second of its spawn: the first seconds are
# polled often, so its readiness is seen within a poll of it (a probe costs the
# child one refused connection or one short reply); a slow load is polled less.
_HEALTH_POLL_S = 0.02
_HEALTH_POLL_FAST_FOR_S = 3.0
_HEALTH_POLL_MAX_S = 0.25
_STDERR_TAIL_LINES = 20


def _plain_http() -> ssl.SSLContext:
    """The TLS settings of a client of the child, which speaks plain HTTP on loopback:
    verifying, with no CA loaded. httpx's default reads the whole CA bundle, which
    holds the event loop for tens of milliseconds per client during a start."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


__all__ = [
    "ConfirmCrash",
    "CrashReport",
    "EngineActor",
    "EngineHandle",
    "EngineMessage",
    "EngineState",
    "EngineStatistics",
    "EnsureReady",
    "Lease",
    "Reconfigure",
    "StopEngine",
    "WaitSpawned",
]


class _Spawned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The launch of ``generation`` started its child, listening (soon) on ``port``.

    Private to this process: it carries the child itself."""

    generation: int
    child: ChildProcess
    port: int


class _Launched(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The child of ``generation`` is healthy; ``handle`` reaches it."""

    generation: int
    handle: EngineHandle


class _LaunchFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    generation: int
    code: str
    message: str


class _ChildExited(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    generation: int
    returncode: int | None


class _Drained(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The last lease was released while a reconfiguration waited for it."""


class _Version(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """What runs the lane, with its version, found after the first start."""

    version: str | None


EngineMessage = (
    EnsureReady
    | WaitSpawned
    | StopEngine
    | Reconfigure
    | ConfirmCrash
    | _Spawned
    | _Launched
    | _LaunchFailed
    | _ChildExited
    | _Drained
    | _Version
)


class Lease:
    """One request's claim on an engine, released exactly once (in a ``finally``).

    Made by ``EngineActor.lease`` and given back through ``EngineActor.end_lease``:
    synchronous bookkeeping on the engine's own counter, so the per-request path
    stays cheap; the actor is told only when a pending reconfiguration waits for
    the last one.
    """

    __slots__ = ("_engine", "_released")

    def __init__(self, engine: EngineActor) -> None:
        self._engine = engine
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._engine.end_lease()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _redact(argv: list[str]) -> list[str]:
    return ["***" if i and argv[i - 1] == "--api-key" else a for i, a in enumerate(argv)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineActor(Actor[EngineMessage]):
    def __init__(
        self,
        spec: LaunchSpec,
        config: EngineConfig,
        *,
        run_dir: Path,
        lane: Lane | None = None,
        bank: bool = False,
    ) -> None:
        super().__init__(f"engine[{spec.model}]")
        self.spec = spec
        self.config = config
        self.run_dir = run_dir
        self.lane = lane or lane_for(spec, config)
        """How this engine's child is started and read (the same actor for every lane)."""
        self.state = EngineState.STOPPED
        self.generation = 0
        self.restarts = 0
        self.starts = 0
        self.in_flight = 0
        self.last_error: str | None = None
        self.crash_count = 0
        """Crashes and failed starts since the actor was made (failover chains compare it)."""
        self._crash_times: deque[float] = deque()  # trio times of the crashes still in the window
        self._waiters: list[Envelope[EngineMessage]] = []
        self._spawn_waiters: list[Envelope[EngineMessage]] = []
        self._child: ChildProcess | None = None
        self._handle: EngineHandle | None = None
        self._port: int | None = None
        self._started_at: float | None = None
        self._last_exit: tuple[int | None, str] = (None, "")
        self._stopped_for: tuple[int, str] = (-1, "")
        """The generation the daemon itself last stopped (unload, reload, shutdown), and why."""
        self._pending_spec: LaunchSpec | None = None
        self._pending_lane: Lane | None = None
        self.version: str | None = None
        self.bank = bank
        """Save warm slots on a graceful stop and restore them at the next start (``session_bank``)."""
        self.banked_tokens: int | None = None
        """Tokens of prompt cache the last start restored from the bank (None: none tried)."""
        self._last_stderr = ""
        """The stderr tail of the last child, kept once it is gone."""
        self.degrades: tuple[Degrade, ...] = ()
        """What the last child to start said it does less than asked, from its startup log."""

    def __repr__(self) -> str:
        pid = self._child.pid if self._child else "-"
        return (
            f"<EngineActor {self.spec.model} {self.state} pid={pid} gen={self.generation} "
            f"in_flight={self.in_flight} restarts={self.restarts}>"
        )

    # -- the synchronous fast paths -----------------------------------------
    #
    # Each runs on the caller's task without a checkpoint, so nothing can happen
    # between what it checks and what it changes.

    def ready_handle(self) -> EngineHandle | None:
        """The child's handle when it is ready and not draining for a restart: what
        ``EnsureReady`` would answer at once, without the trip through the mailbox
        (None: ask)."""
        if self.state is EngineState.READY and self._pending_spec is None and not self.exited_unnoticed():
            return self._handle
        return None

    def exited_unnoticed(self) -> bool:
        """Whether the child has exited while the actor still holds it ready: its exit is on
        its way to the mailbox (the child's watcher runs at the next checkpoint). A request
        must not be handed the dead child then: it would reach no engine, and its client
        would be told of a crash it did not meet. Costs one ``waitpid`` (trio's
        ``Process.returncode``), which reaps the child if it has ended."""
        child = self._child
        return self.state is EngineState.READY and child is not None and child.returncode is not None

    def lease(self) -> Lease:
        """Count one more request on the child; give it back with ``Lease.release``."""
        self.in_flight += 1
        return Lease(self)

    def end_lease(self) -> None:
        """One request fewer on the child (called by ``Lease.release``, once per lease)."""
        self.in_flight -= 1
        if self.in_flight == 0 and self._pending_spec is not None:
            try:
                self.mailbox.tell_nowait(_Drained())
            except (ActorStopped, trio.WouldBlock):
                pass

    @property
    def served_ctx(self) -> int | None:
        """The per-slot context the ready child serves, as it reported it."""
        handle = self._handle if self.state is EngineState.READY else None
        return handle.served_ctx if handle is not None else None

    @property
    def engine_kind(self) -> str:
        return self.lane.kind

    def statistics(self) -> EngineStatistics:
        retry_after_s = self._breaker_open()
        return EngineStatistics(
            **self.actor_fields(),
            model=self.spec.model,
            state=str(self.state),
            engine=self.engine_kind,
            pid=self._child.pid if self._child and self._child.returncode is None else None,
            port=self._port if self.state is EngineState.READY else None,
            slots=self.spec.slots,
            ctx_per_slot=self.spec.ctx_per_slot,
            ctx_served=self.served_ctx,
            in_flight=self.in_flight,
            starts=self.starts,
            restarts=self.restarts,
            crashes=len(self._crash_times),
            generation=self.generation,
            started_at=self._started_at,
            last_error=self.last_error,
            lane=self.lane.name,
            version=self.version,
            breaker="closed" if retry_after_s is None else "open",
            breaker_retry_after_s=retry_after_s,
            stderr_tail=self.stderr_tail(),
            banked_tokens=self.banked_tokens,
            degrades=[d.name for d in self.degrades],
        )

    def stderr_tail(self, lines: int = _STDERR_TAIL_LINES) -> str:
        """The last ``lines`` lines of the running child's stderr, or of the last child's."""
        if self._child is None:
            return self._last_stderr
        raw = self._child.stderr_tail.last(160 * lines)
        return "\n".join(raw.decode("utf-8", "replace").splitlines()[-lines:])

    async def on_stop(self) -> None:
        await self._stop_child("engine actor stopped")

    # -- messages ---------------------------------------------------------

    def dispatch(self, env: Envelope[EngineMessage]) -> Awaitable[None] | None:
        match env.message:
            case EnsureReady():
                if self.exited_unnoticed():
                    return self._take_exit_then_ready(env)
                self._ensure_ready(env)
            case WaitSpawned():
                if self.state is EngineState.STARTING and self._child is None:
                    self._spawn_waiters.append(env)
                else:
                    env.answer(None)
            case StopEngine(reason=reason):
                return self._stop_and_answer(env, reason)
            case Reconfigure():
                return self._reconfigure(env, env.message)
            case _Version(version=version):
                self.version = version
            case _Drained():
                if self._pending_spec is not None and self.in_flight == 0:
                    return self._apply_pending()
            case ConfirmCrash(generation=gen):
                self.start_soon(self._confirm_crash, env, gen, self._child)
            case _Spawned(generation=gen, child=child, port=port):
                if gen == self.generation and self.state is EngineState.STARTING:
                    self._child, self._port = child, port
                    self._answer_spawn_waiters()
                else:  # stopped while it was spawning
                    self.start_soon(child.stop, self.config.stop_grace_s)
            case _Launched(generation=gen, handle=handle):
                if gen == self.generation and self.state is EngineState.STARTING:
                    self._handle = handle
                    self.state = EngineState.READY
                    self.degrades = parse(self._child.stderr_tail.text()) if self._child else ()
                    self._started_at = time.time()
                    log.info(
                        "%s ready: pid %d on %s (generation %d)", self.name, handle.pid, handle.base_url, gen
                    )
                    self._answer_waiters()
                    if self.version is None:
                        self.start_soon(self._find_version)
                else:
                    self.start_soon(handle.aclose)
            case _LaunchFailed(generation=gen, code=code, message=message):
                if gen == self.generation:
                    return self._launch_failed(code, message)
            case _ChildExited(generation=gen, returncode=rc):
                if gen == self.generation and self.state in (EngineState.READY, EngineState.STARTING):
                    return self._child_exited(rc)
            case _:
                assert_never(env.message)
        return None

    async def _stop_and_answer(self, env: Envelope[EngineMessage], reason: str) -> None:
        await self._stop_child(reason)
        env.answer(None)

    async def _reconfigure(self, env: Envelope[EngineMessage], change: Reconfigure) -> None:
        base = change.spec or self._pending_spec or self.spec
        ctx, embeddings, lane = change.ctx_per_slot, change.embeddings, change.lane
        if lane is not None:
            self._pending_lane = lane
        tokens = change.token_embeddings
        speculation = base.speculation
        if change.speculation is not None:
            speculation = None if change.speculation == "off" else change.speculation
        spec = msgspec.structs.replace(
            base,
            speculation=speculation,
            loras=change.loras if change.loras is not None else base.loras,
            ctx_per_slot=ctx if ctx is not None else base.ctx_per_slot,
            embeddings=embeddings if embeddings is not None else base.embeddings,
            token_embeddings=tokens if tokens is not None else base.token_embeddings,
            engine_version=lane.release if lane is not None else base.engine_version,
        )
        if spec != self.spec:
            self._pending_spec = spec
            if self.in_flight == 0:
                await self._apply_pending()
        elif self._pending_spec is not None:
            self._pending_spec = None  # asked back to what runs now
        env.answer(None)

    async def _launch_failed(self, code: str, message: str) -> None:
        log.warning("%s failed to start: %s", self.name, message)
        await self._stop_child(message, state=EngineState.FAILED)
        self._record_crash(message)
        exc_type = EngineStartTimeout if code == "MODEL_LOAD_TIMEOUT" else EngineCrashed
        self._fail_waiters(exc_type(message))

    async def _child_exited(self, rc: int | None) -> None:
        summary = self._child.stderr_tail.summary() if self._child else ""
        self._last_exit = (rc, summary)
        tail = self._child.stderr_tail.text()[-4000:] if self._child else ""
        log.warning("%s: engine exited with code %s; stderr tail:\n%s", self.name, rc, tail)
        # A client is told the model and what to do; the child's lines stay in the log (admin).
        ended = (self._child.ended_by if self._child else None) or f"exited with code {rc}"
        message = (
            f"engine for '{self.spec.model}' {ended} — the next request starts it again; "
            "`blazar logs` shows why"
        )
        waiters, self._waiters = self._waiters, []
        await self._stop_child(message, state=EngineState.FAILED)
        self._record_crash(message)
        # Answer only once the state is final, so the asker sees it.
        for waiter in waiters:
            waiter.fail(EngineCrashed(message, stderr_tail=summary))

    async def _take_exit_then_ready(self, env: Envelope[EngineMessage]) -> None:
        """Take in the exit of a child that died before its message came (as that message
        will, which then finds the generation gone), then answer ``env`` as for any ended
        engine: start it again, the crash counted for the breaker."""
        assert self._child is not None
        await self._child_exited(self._child.returncode)
        self._ensure_ready(env)

    async def _apply_pending(self) -> None:
        """Swap in the pending spec: the child restarts with it on the next request."""
        spec, self._pending_spec = self._pending_spec, None
        assert spec is not None
        if self._pending_lane is not None:
            self.lane, self._pending_lane, self.version = self._pending_lane, None, None
        waiters, self._waiters = self._waiters, []
        await self._stop_child("reconfigured")
        self.spec = spec
        for env in waiters:
            self._ensure_ready(env)

    def _ensure_ready(self, env: Envelope[EngineMessage]) -> None:
        if self._pending_spec is not None and self.state is EngineState.READY:
            # Draining for a restart: new requests wait for the new child.
            self._waiters.append(env)
            return
        if self.state is EngineState.READY and self._handle is not None:
            env.answer(self._handle)
            return
        self._waiters.append(env)
        if self.state is EngineState.STARTING:
            return
        if (retry_after_s := self._breaker_open()) is not None:
            self._fail_waiters(
                EngineCircuitOpen(
                    f"engine for '{self.spec.model}' crashed {len(self._crash_times)} times in "
                    f"{self.config.breaker_window_s:.0f} s; last error: {self.last_error} — "
                    "check `blazar logs` and the model file, then retry later",
                    retry_after_s=retry_after_s,
                )
            )
            return
        if self.state is EngineState.FAILED:
            self.restarts += 1
        self.generation += 1
        self.starts += 1
        self.state = EngineState.STARTING
        self.start_soon(self._launch, self.generation)

    def _breaker_open(self) -> float | None:
        """None while starts are allowed; else the seconds until the oldest crash leaves the window."""
        now = trio.current_time()
        window_s = self.config.breaker_window_s
        while self._crash_times and now - self._crash_times[0] > window_s:
            self._crash_times.popleft()
        if len(self._crash_times) < self.config.breaker_crashes:
            return None
        return max(0.0, self._crash_times[0] + window_s - now)

    def _record_crash(self, message: str) -> None:
        self.last_error = message
        self.crash_count += 1
        self._crash_times.append(trio.current_time())

    def _answer_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for env in waiters:
            env.answer(self._handle)

    def _answer_spawn_waiters(self) -> None:
        waiters, self._spawn_waiters = self._spawn_waiters, []
        for env in waiters:
            env.answer(None)

    def _fail_waiters(self, exc: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for env in waiters:
            env.fail(exc)

    # -- the child --------------------------------------------------------

    async def _launch(self, generation: int) -> None:
        """Start a child and wait for it to be healthy, reporting both to the actor.

        Until the actor has the child, this task is its only owner: cancelled (the
        actor stops) it stops the child itself. A second stop of an adopted child
        is harmless."""
        port = _free_port()
        api_key = secrets.token_hex(24)  # hex: a leading "-" would read as a flag
        argv = self.lane.argv(self.spec, port, api_key)
        pidfile = self.run_dir / "engines" / f"{self.spec.model.replace('/', '_')}.pid"
        try:
            env = {**os.environ, **self.lane.env(self.spec)}
            child = await self.lane.spawn(self.spec, argv, port, name=self.name, env=env, pidfile=pidfile)
        except OSError as exc:
            await self._tell_self(
                _LaunchFailed(generation=generation, code="ENGINE_CRASHED", message=str(exc))
            )
            return
        try:
            log.info("%s starting: pid %d, %s", self.name, child.pid, " ".join(_redact(argv)))
            await self._tell_self(_Spawned(generation=generation, child=child, port=port))
            self.start_soon(self._watch_child, child, generation)
            import httpx  # here, not at the top: the child's start need not wait for it

            base_url = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {api_key}"}
            async with httpx.AsyncClient(base_url=base_url, headers=auth, verify=_plain_http()) as probe:
                error = await self._wait_healthy(child, probe)
                served = await self.lane.served_context(probe) if error is None else None
                if error is None:
                    await self._restore_bank(probe, served)
        except BaseException:
            await child.stop(self.config.stop_grace_s)
            raise
        if error is not None:
            await self._tell_self(_LaunchFailed(generation=generation, code=error[0], message=error[1]))
            return
        if served is not None and self.spec.embeddings:
            # An embeddings engine shares one KV cache among its slots (``--kv-unified``), and
            # then reports all of it per slot: a slot is still given its own share.
            served = min(served, self.spec.ctx_per_slot)
        if served is not None and served < self.spec.ctx_per_slot:
            log.warning(
                "%s serves %d tokens per slot, not the %d it was started with", self.name, served,
                self.spec.ctx_per_slot,
            )  # fmt: skip
        # Made after the health checks, so a handle the actor drops holds no connection.
        handle = EngineHandle(
            model=self.spec.model,
            base_url=base_url,
            generation=generation,
            pid=child.pid,
            client=httpx.AsyncClient(
                base_url=base_url,
                headers=auth,
                verify=_plain_http(),
                timeout=httpx.Timeout(10.0, read=None, pool=None),
                limits=httpx.Limits(
                    max_connections=None,
                    max_keepalive_connections=self.spec.slots * 4,
                    keepalive_expiry=_KEEPALIVE_EXPIRY_S,
                ),
            ),
            upstream=UpstreamPool(
                "127.0.0.1",
                port,
                headers=auth,
                max_idle=self.spec.slots * 4,
                idle_expiry_s=_KEEPALIVE_EXPIRY_S,
            ),
            served_ctx=served,
            request_model=self.lane.request_model,
        )
        await self._tell_self(_Launched(generation=generation, handle=handle))

    async def _wait_healthy(self, child: ChildProcess, client: httpx.AsyncClient) -> tuple[str, str] | None:
        import httpx

        delay_s = _HEALTH_POLL_S
        slow_after = trio.current_time() + _HEALTH_POLL_FAST_FOR_S
        timeout_s = self.lane.start_timeout_s or self.config.start_timeout_s
        with trio.move_on_after(timeout_s):
            while not child.exited.is_set():
                try:
                    resp = await client.get(self.lane.health, timeout=2.0)
                    if resp.status_code == 200:
                        return None
                except httpx.TransportError:
                    pass
                with trio.move_on_after(delay_s):
                    await child.exited.wait()
                if trio.current_time() > slow_after:
                    delay_s = min(delay_s * 1.5, _HEALTH_POLL_MAX_S)
            why = child.ended_by or f"code {child.returncode}"
            log.warning("%s: exited during start (%s): %s", self.name, why, child.stderr_tail.summary())
            return (
                "ENGINE_CRASHED",
                f"engine for '{self.spec.model}' exited during start ({why}) — "
                "`blazar logs` shows why; check the model file (`blazar doctor`) and its settings",
            )
        return (
            "MODEL_LOAD_TIMEOUT",
            f"engine for '{self.spec.model}' was not healthy within {timeout_s:.0f} s"
            " — check `blazar logs` or raise engine.start_timeout_s",
        )

    async def _find_version(self) -> None:
        """Ask the lane what runs it, once, off the start's path (a binary's ``--version``)."""
        version = await trio.to_thread.run_sync(self.lane.version)
        await self._tell_self(_Version(version=version))

    async def _watch_child(self, child: ChildProcess, generation: int) -> None:
        rc = await child.serve()
        await self._tell_self(_ChildExited(generation=generation, returncode=rc))

    async def _tell_self(self, message: EngineMessage) -> None:
        try:
            await self.mailbox.tell(message)
        except ActorStopped:
            pass

    def _bank_folder(self) -> Path | None:
        spec = self.spec
        if not self.bank or not spec.slot_save_path or not spec.digest:
            return None
        return Path(spec.slot_save_path)

    async def _restore_bank(self, client: httpx.AsyncClient, served: int | None) -> None:
        if (folder := self._bank_folder()) is not None:
            assert self.spec.digest is not None
            self.banked_tokens = await restore_on_start(
                client, folder, who=self.name, slots=self.spec.slots, digest=self.spec.digest,
                ctx_per_slot=served or self.spec.ctx_per_slot,
            )  # fmt: skip

    async def _save_bank(self, handle: EngineHandle) -> None:
        if (folder := self._bank_folder()) is not None and not self.in_flight:
            assert self.spec.digest is not None
            await bank_on_stop(
                handle.client, folder, who=self.name, slots=self.spec.slots, model=self.spec.model,
                digest=self.spec.digest, ctx_per_slot=handle.served_ctx or self.spec.ctx_per_slot,
            )  # fmt: skip

    async def _stop_child(self, reason: str, *, state: EngineState = EngineState.STOPPED) -> None:
        child, handle = self._child, self._handle
        graceful = state is EngineState.STOPPED and reason != "reconfigured"
        if graceful and handle is not None and self.state is EngineState.READY:
            if child is not None and child.returncode is None:
                await self._save_bank(handle)
        if child is not None:
            self._last_stderr = self.stderr_tail()
            if state is EngineState.STOPPED and child.returncode is None:
                self._stopped_for = (self.generation, reason)
        self._child, self._handle = None, None
        self._answer_spawn_waiters()  # whatever start was in progress is over
        if self.state is EngineState.STARTING:
            self.generation += 1  # the launch in progress is now stale and cleans up after itself
        if child is not None or self.state is not EngineState.STOPPED:
            self.state = EngineState.STOPPING
        if state is EngineState.STOPPED:
            self._fail_waiters(EngineUnavailable(f"engine for '{self.spec.model}' stopped: {reason}"))
        if child is not None and child.returncode is None:
            log.info("%s stopping pid %d: %s", self.name, child.pid, reason)
        with trio.CancelScope(shield=True):
            if child is not None:
                await child.stop(self.config.stop_grace_s)
            if handle is not None:
                with trio.move_on_after(1.0):
                    await handle.aclose()
        self.state = state
        self._port = None if state is EngineState.STOPPED else self._port
        self._started_at = None

    async def _confirm_crash(
        self, env: Envelope[EngineMessage], generation: int, child: ChildProcess | None
    ) -> None:
        if child is None or generation != self.generation:
            if self._stopped_for[0] == generation:
                env.answer(
                    CrashReport(
                        crashed=False, returncode=None, stderr_summary="", stopped=self._stopped_for[1]
                    )
                )
                return
            rc, summary = self._last_exit
            env.answer(CrashReport(crashed=True, returncode=rc, stderr_summary=summary))
            return
        with trio.move_on_after(1.0):
            await child.exited.wait()
        env.answer(
            CrashReport(
                crashed=child.exited.is_set(),
                returncode=child.returncode,
                stderr_summary=child.stderr_tail.summary(),
            )
        )
