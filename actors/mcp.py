"""MCP servers: one actor per ``[[mcp]]`` entry, on the official ``mcp`` SDK's client side.

    mcp (supervisor)
    └ mcp[name]   → a stdio child process, or a Streamable HTTP session

A server starts on its first use (``list_tools`` or ``call_tool``), never before, at the
newest protocol revision it shares with us (``actors.mcp_protocol``). Its
actor owns the session's life: it starts it, caches the tool list (listed again when the
server sends ``notifications/tools/list_changed``), notices when the server goes away
and starts it again on the next use, waiting out a backoff that doubles with each failed
start in a row. Calls do not go through the actor's loop: a caller asks for the live
session (``Connect``) and calls the tool on its own task, so calls run in parallel and a
cancelled request cancels its own calls.

Failure is an answer: a server that cannot start, a tool that raises, hangs past
``timeout_s`` or returns too much becomes an ``McpCallResult`` with ``is_error`` set and
a text saying what happened — never an exception for the gateway to catch.

Stopping (the runtime stops, or ``StopServer``) leaves the session's context; the SDK then
closes a stdio server's stdin, waits 2 s for it to exit, sends SIGTERM to its process
group, and SIGKILL 2 s later (all shielded and bounded); an HTTP session (2025 revisions)
is ended with a DELETE.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, assert_never

import msgspec
import trio

if TYPE_CHECKING:
    # The SDK (and anyio under it) is imported where a server is first opened: a daemon with no
    # MCP server configured, which is most, never pays the 0.4 s it adds to every start.
    import anyio.abc
    import mcp.types as mt
    from mcp import ClientSession
    from mcp.shared.message import SessionMessage

from actors.actor import Actor, ActorStatistics
from actors.config import McpCatalog, McpSelection, McpServer
from actors.errors import ActorStopped, BlazarRuntimeError
from actors.mailbox import Envelope
from actors.mcp_protocol import MODERN_VERSION, negotiate
from actors.mcp_results import (
    McpCallResult,
    McpServerStatus,
    McpTool,
    McpToolList,
    cap_text,
    error_result,
    qualified_name,
    result_text,
    split_qualified,
    tools_of,
)
from actors.process import TailBuffer
from actors.supervisor import ChildSpec, Supervisor

__all__ = [
    "Connect",
    "Dropped",
    "ListTools",
    "McpDown",
    "McpServerActor",
    "McpServerUnknown",
    "McpServers",
    "McpSession",
    "McpStatistics",
    "StopServer",
]

log = logging.getLogger("blazar.mcp")

_BACKOFF_INITIAL_S = 0.5
_BACKOFF_MAX_S = 30.0
_STDERR_TAIL_BYTES = 8 * 1024
# The largest message read from an HTTP server (the SDK's default is 1 MiB, which a tool
# returning a megabyte of text already exceeds); what reaches the model is cut far lower.
_MAX_HTTP_MESSAGE_BYTES = 16 * 1024 * 1024


class McpServerUnknown(BlazarRuntimeError):
    """A request named an MCP server that config.toml does not define."""

    code = "MCP_SERVER_NOT_FOUND"


class McpState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"


# -- messages -------------------------------------------------------------------


class Connect(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start the server if need be; the reply is an ``McpSession`` once it is ready, or
    an ``McpDown`` saying why it is not."""


class ListTools(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start the server if need be; the reply is an ``McpToolList`` (after the refresh a
    list-changed notification asked for, when one is under way)."""


class StopServer(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop the session (the next use starts it again); replies once it has stopped."""

    reason: str = "requested"


class Dropped(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A caller found the session of ``generation`` broken (the server went away)."""

    generation: int
    reason: str


class _Connected(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The session of ``generation`` is initialized and its tools are listed.
    Private to this process: it carries the session itself."""

    generation: int
    session: Any
    tools: list[McpTool]
    info: str | None
    protocol: str


class _Ended(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The session task of ``generation`` has ended (a failed start, or a server gone)."""

    generation: int
    reason: str
    code: str | None = None


class _ToolsChanged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    generation: int


class _Tools(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    generation: int
    tools: list[McpTool] | None
    error: str | None = None


McpMessage = Connect | ListTools | StopServer | Dropped | _Connected | _Ended | _ToolsChanged | _Tools


@dataclass(frozen=True, slots=True)
class McpSession:
    """A ready server's live session; calls run on the caller's task."""

    server: str
    generation: int
    session: ClientSession


@dataclass(frozen=True, slots=True)
class McpDown:
    """Why a server is not ready, and when to try again (None: on the next use)."""

    reason: str
    retry_after_s: float | None = None
    code: str | None = None


class McpStatistics(ActorStatistics, frozen=True, kw_only=True):
    server: str
    transport: str
    state: str
    generation: int
    starts: int
    failures: int
    tools: int
    last_error: str | None
    protocol_version: str | None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    if isinstance(exc, BlazarRuntimeError):
        return exc.message
    if isinstance(exc, FileNotFoundError):
        return f"the program {exc.filename or ''!s} was not found".replace("  ", " ")
    from mcp.shared.exceptions import MCPError

    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, MCPError) else text


def _code(exc: BaseException) -> str | None:
    """The ``blazar_code`` of a failed start, where the runtime raised it on purpose."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _code(exc.exceptions[0])
    return exc.code if isinstance(exc, BlazarRuntimeError) else None


async def _list_all(session: ClientSession) -> list[mt.Tool]:
    import mcp.types as mt

    listed = await session.list_tools()
    tools = list(listed.tools)
    while listed.next_cursor:
        listed = await session.list_tools(params=mt.PaginatedRequestParams(cursor=listed.next_cursor))
        tools.extend(listed.tools)
    return tools


def _announces_tool_changes(session: ClientSession) -> bool:
    caps = session.server_capabilities
    return caps is not None and caps.tools is not None and bool(caps.tools.list_changed)


async def _drain(fd: int, tail: TailBuffer) -> None:
    """Keep the last bytes a stdio server writes to stderr (for its status and errors)."""
    stream = trio.lowlevel.FdStream(fd)
    async with stream:
        while data := await stream.receive_some(4096):
            tail.write(data)


class McpServerActor(Actor[McpMessage]):
    def __init__(self, config: McpServer) -> None:
        super().__init__(f"mcp[{config.name}]")
        self.config = config
        self.state = McpState.STOPPED
        self.generation = 0
        self.starts = 0
        self.failures = 0
        self.last_error: str | None = None
        self.last_error_code: str | None = None
        self.tools: list[McpTool] = []
        self.info: str | None = None
        self.protocol_version: str | None = None
        self._session: ClientSession | None = None
        self._stale = False
        self._retry_at = 0.0
        self._waiters: list[Envelope[McpMessage]] = []
        self._list_waiters: list[Envelope[McpMessage]] = []
        self._tasks: dict[int, tuple[trio.CancelScope, trio.Event]] = {}
        self._tail = TailBuffer(_STDERR_TAIL_BYTES)

    def __repr__(self) -> str:
        name, gen = self.config.name, self.generation
        return f"<McpServerActor {name} {self.state} gen={gen} tools={len(self.tools)}>"

    # -- what others read without a message -------------------------------------

    def retry_after_s(self) -> float | None:
        if self.state is not McpState.FAILED:
            return None
        left = self._retry_at - trio.current_time()
        return round(left, 3) if left > 0 else None

    def status(self) -> McpServerStatus:
        c = self.config
        ready = self.state is McpState.READY
        return McpServerStatus(
            name=c.name,
            transport=c.transport,
            target=" ".join(c.command) if c.command is not None else str(c.url),
            state=str(self.state),
            started=ready,
            tools=list(self.tools) if ready else None,
            starts=self.starts,
            failures=self.failures,
            retry_after_s=self.retry_after_s(),
            last_error=self.last_error,
            last_error_code=self.last_error_code,
            server_info=self.info,
            protocol_version=self.protocol_version,
            stderr_tail="\n".join(self._tail.text().splitlines()[-20:]),
        )

    def statistics(self) -> McpStatistics:
        return McpStatistics(
            **self.actor_fields(),
            server=self.config.name,
            transport=self.config.transport,
            state=str(self.state),
            generation=self.generation,
            starts=self.starts,
            failures=self.failures,
            tools=len(self.tools),
            last_error=self.last_error,
            protocol_version=self.protocol_version,
        )

    def drop_nowait(self, generation: int, reason: str) -> None:
        """A caller's report that the session of ``generation`` broke."""
        self._tell(Dropped(generation=generation, reason=reason))

    def _tell(self, message: McpMessage) -> None:
        try:
            self.mailbox.tell_nowait(message)
        except (ActorStopped, trio.WouldBlock):
            pass

    # -- messages --------------------------------------------------------------

    def dispatch(self, env: Envelope[McpMessage]) -> Awaitable[None] | None:
        match env.message:
            case Connect():
                self._connect(env)
            case ListTools():
                if self.state is McpState.READY and self._stale:
                    self._list_waiters.append(env)
                elif self.state is McpState.READY:
                    env.answer(McpToolList(server=self.config.name, tools=list(self.tools)))
                else:
                    self._connect(env)
            case StopServer(reason=reason):
                return self._stop_and_answer(env, reason)
            case Dropped(generation=gen, reason=reason):
                if gen == self.generation and self.state is McpState.READY:
                    log.warning("%s: %s; it starts again on its next use", self.name, reason)
                    self._end_session(reason)
            case _Connected(generation=gen, session=session, tools=tools, info=info, protocol=protocol):
                if gen == self.generation and self.state is McpState.STARTING:
                    self.protocol_version = protocol
                    self._ready(session, tools, info)
            case _Ended(generation=gen, reason=reason, code=code):
                self._tasks.pop(gen, None)
                if gen == self.generation:
                    self._ended(reason, code=code)
            case _ToolsChanged(generation=gen):
                if gen == self.generation and self.state is McpState.READY and self._session is not None:
                    self._stale = True
                    self.start_soon(self._relist, gen, self._session)
            case _Tools(generation=gen, tools=tools, error=error):
                if gen == self.generation and self.state is McpState.READY:
                    self._refreshed(tools, error)
            case _:
                assert_never(env.message)
        return None

    def _connect(self, env: Envelope[McpMessage]) -> None:
        if self.state is McpState.READY:
            self._answer_ready(env)
            return
        if self.state is McpState.FAILED and (wait := self.retry_after_s()) is not None:
            text = self._failed_text(f"the next try is in {wait:.1f} s")
            self._answer_down(env, McpDown(text, wait, self.last_error_code))
            return
        self._waiters.append(env)
        if self.state is not McpState.STARTING:
            self._begin()

    def _failed_text(self, next_try: str) -> str:
        return f"MCP server '{self.config.name}' could not start: {self.last_error} ({next_try})"

    def _begin(self) -> None:
        self.generation += 1
        self.starts += 1
        self.state = McpState.STARTING
        self._tail = TailBuffer(_STDERR_TAIL_BYTES)
        scope, done = trio.CancelScope(), trio.Event()
        self._tasks[self.generation] = (scope, done)
        self.start_soon(self._serve, self.generation, scope, done)

    def _ready(self, session: ClientSession, tools: list[McpTool], info: str | None) -> None:
        self.state = McpState.READY
        self._session, self.tools, self.info = session, tools, info
        self.failures = 0
        self._stale = False
        log.info("%s ready: %d tools", self.name, len(tools))
        waiters, self._waiters = self._waiters, []
        for env in waiters:
            self._answer_ready(env)

    def _ended(self, reason: str, *, deliberate: bool = False, code: str | None = None) -> None:
        was = self.state
        self._session, self.tools, self._stale = None, [], False
        self.last_error, self.last_error_code = reason, code
        if was is McpState.STARTING:
            self.failures += 1
            delay = min(_BACKOFF_INITIAL_S * 2 ** (self.failures - 1), _BACKOFF_MAX_S)
            self._retry_at = trio.current_time() + delay
            self.state = McpState.FAILED
            log.warning("%s could not start: %s", self.name, reason)
            down = McpDown(self._failed_text(f"it is tried again on a use after {delay:.1f} s"), delay, code)
        else:
            self.state = McpState.STOPPED
            if was is McpState.READY and not deliberate:
                log.warning("%s stopped: %s; it starts again on its next use", self.name, reason)
            down = McpDown(f"MCP server '{self.config.name}' stopped: {reason}")
        waiters, self._waiters = self._waiters, []
        for env in waiters:
            self._answer_down(env, down)
        listing, self._list_waiters = self._list_waiters, []
        for env in listing:
            self._answer_down(env, down)

    def _refreshed(self, tools: list[McpTool] | None, error: str | None) -> None:
        if tools is not None:
            self.tools = tools
        self._stale = False
        listing, self._list_waiters = self._list_waiters, []
        for env in listing:
            env.answer(McpToolList(server=self.config.name, tools=list(self.tools), error=error))

    def _answer_ready(self, env: Envelope[McpMessage]) -> None:
        assert self._session is not None
        if isinstance(env.message, ListTools):
            if self._stale:
                self._list_waiters.append(env)
            else:
                env.answer(McpToolList(server=self.config.name, tools=list(self.tools)))
        else:
            env.answer(McpSession(server=self.config.name, generation=self.generation, session=self._session))

    def _answer_down(self, env: Envelope[McpMessage], down: McpDown) -> None:
        if isinstance(env.message, ListTools):
            env.answer(McpToolList(server=self.config.name, error=down.reason, blazar_code=down.code))
        else:
            env.answer(down)

    def _end_session(self, reason: str, *, deliberate: bool = False) -> None:
        """Leave the current session (its task stops it, shielded) and forget it."""
        task = self._tasks.get(self.generation)
        if task is not None:
            task[0].cancel()
        self.generation += 1  # whatever the old session's task still reports is stale
        self._ended(reason, deliberate=deliberate)

    async def _stop_and_answer(self, env: Envelope[McpMessage], reason: str) -> None:
        if self.state in (McpState.READY, McpState.STARTING):
            self._end_session(f"stopped ({reason})", deliberate=True)
            self.last_error = self.last_error_code = None
        await self._wait_tasks()
        env.answer(None)

    async def _wait_tasks(self) -> None:
        for scope, done in list(self._tasks.values()):
            scope.cancel()
            await done.wait()
        self._tasks.clear()

    async def on_stop(self) -> None:
        if self.state in (McpState.READY, McpState.STARTING):
            self._end_session("the runtime is stopping", deliberate=True)
        await self._wait_tasks()

    # -- the session task -----------------------------------------------------------

    async def _serve(self, generation: int, scope: trio.CancelScope, done: trio.Event) -> None:
        reason, code = "the server closed the connection", None
        try:
            with scope:
                try:
                    await self._hold(generation)
                except Exception as exc:
                    reason, code = _describe(exc), _code(exc)
                    if self.config.transport == "stdio" and (said := self._tail.summary(3)):
                        reason = f"{reason} (stderr: {said})"
            if scope.cancelled_caught:
                reason = "stopped"
        finally:
            done.set()
            self._tell(_Ended(generation=generation, reason=reason, code=code))

    async def _hold(self, generation: int) -> None:
        """Open the transport and the session, report it ready, hold it until it ends."""
        import anyio
        from mcp import ClientSession
        from mcp.shared.message import SessionMessage

        c = self.config
        async with trio.open_nursery() as nursery:
            try:
                async with self._transport(nursery) as (read, write):
                    to_session, from_relay = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                    ended = trio.Event()
                    nursery.start_soon(self._relay, generation, read, to_session, ended)
                    async with (
                        from_relay,
                        ClientSession(from_relay, write) as session,
                        trio.open_nursery() as watchers,
                    ):
                        with trio.move_on_after(c.start_timeout_s) as timer:
                            protocol = await negotiate(session)
                            listed = await _list_all(session)
                            if protocol == MODERN_VERSION and _announces_tool_changes(session):
                                await watchers.start(self._listen, session)
                        if timer.cancelled_caught:
                            raise TimeoutError(
                                f"its start took over {c.start_timeout_s:g} s (start_timeout_s)"
                            )
                        known = session.server_info
                        info = f"{known.name} {known.version or ''}".strip() if known is not None else None
                        tools = tools_of(c.name, listed)
                        ready = _Connected(
                            generation=generation,
                            session=session,
                            tools=tools,
                            info=info,
                            protocol=protocol,
                        )
                        self._tell(ready)
                        await ended.wait()
                        watchers.cancel_scope.cancel()
            finally:
                nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def _transport(self, nursery: trio.Nursery) -> AsyncIterator[Any]:
        from mcp import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        c = self.config
        if c.command is not None:
            read_fd, write_fd = os.pipe()
            nursery.start_soon(_drain, read_fd, self._tail)
            errlog = os.fdopen(write_fd, "w")
            params = StdioServerParameters(
                command=c.command[0], args=list(c.command[1:]), env=dict(c.env) or None, cwd=c.cwd
            )
            try:
                async with stdio_client(params, errlog=errlog) as streams:
                    errlog.close()  # the child holds its own copy; EOF comes when it exits
                    yield streams
            finally:
                errlog.close()
        else:
            assert c.url is not None
            async with (
                create_mcp_http_client(headers=dict(c.headers)) as http,
                streamable_http_client(
                    c.url, http_client=http, max_sse_event_size=_MAX_HTTP_MESSAGE_BYTES
                ) as streams,
            ):
                yield streams

    async def _relay(
        self,
        generation: int,
        source: anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
        sink: anyio.abc.ObjectSendStream[SessionMessage | Exception],
        ended: trio.Event,
    ) -> None:
        """Pass the server's messages to the session, noting a list-changed notification
        before the messages behind it (a call's result) reach anyone, and the end."""
        import anyio
        import mcp.types as mt
        from mcp.shared.message import SessionMessage

        try:
            async with sink:
                async for item in source:
                    if (
                        isinstance(item, SessionMessage)
                        and isinstance(item.message, mt.JSONRPCNotification)
                        and item.message.method == "notifications/tools/list_changed"
                    ):
                        self._tell(_ToolsChanged(generation=generation))
                    await sink.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass
        finally:
            ended.set()

    async def _listen(
        self, session: ClientSession, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """At 2026-07-28 a server sends ``notifications/tools/list_changed`` only on a
        ``subscriptions/listen`` stream the client opened: hold one open. ``_relay`` notes each
        notification as it passes; the events read here are only drained. A server that will
        not hold one still serves its tools, listed once."""
        from mcp.client.subscriptions import listen

        started = False
        try:
            # A server that never acknowledges costs one call's timeout, not the whole start.
            with trio.move_on_after(self.config.timeout_s) as ack:
                async with listen(session, tools_list_changed=True) as subscription:
                    task_status.started()
                    started, ack.deadline = True, float("inf")
                    async for _ in subscription:
                        pass
            if ack.cancelled_caught:
                log.warning("%s: subscriptions/listen was not acknowledged", self.name)
        except Exception as exc:
            log.warning("%s: no tools list_changed subscription: %s", self.name, _describe(exc))
        if not started:
            task_status.started()

    async def _relist(self, generation: int, session: ClientSession) -> None:
        try:
            with trio.fail_after(self.config.timeout_s):
                tools = tools_of(self.config.name, await _list_all(session))
        except Exception as exc:
            error = f"listing tools failed: {_describe(exc)}"
            self._tell(_Tools(generation=generation, tools=None, error=error))
        else:
            self._tell(_Tools(generation=generation, tools=tools))


class McpServers:
    """The runtime's handle to its MCP servers (``runtime.mcp``)."""

    def __init__(
        self, servers: list[McpServer], default: McpSelection = "none", catalog: McpCatalog = "full"
    ) -> None:
        self.configs = {s.name: s for s in servers}
        self.default = default
        self.catalog_default = catalog
        self.actors = {s.name: McpServerActor(s) for s in servers}
        self.supervisor = Supervisor("mcp")

    def __repr__(self) -> str:
        ready = sum(a.state is McpState.READY for a in self.actors.values())
        return f"<McpServers ready={ready}/{len(self.actors)}>"

    async def run(self, *, task_status: trio.TaskStatus[McpServers] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise one actor per server (none is started until used) until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.supervisor.run)
            for name, actor in self.actors.items():
                await self.supervisor.start_child(ChildSpec(name=name, start=actor.run, shutdown_s=10.0))
            task_status.started(self)

    def names(self) -> list[str]:
        return list(self.configs)

    def servers(self) -> list[McpServerStatus]:
        """Every configured server as it is now; starts nothing."""
        return [actor.status() for actor in self.actors.values()]

    def select(self, selection: McpSelection | None) -> list[str]:
        """The servers a request's ``mcp`` choice names (None: ``mcp_default``); raises
        ``McpServerUnknown`` for a name config.toml does not define."""
        chosen = self.default if selection is None else selection
        if chosen == "none":
            return []
        if chosen == "all":
            return self.names()
        names = [chosen] if isinstance(chosen, str) else list(dict.fromkeys(chosen))
        unknown = [n for n in names if n not in self.configs]
        if unknown:
            known = ", ".join(self.configs) or "none is configured"
            raise McpServerUnknown(
                f"no MCP server named {', '.join(map(repr, unknown))} (configured: {known}) — "
                'add an [[mcp]] entry to config.toml, or ask for "all" or "none"'
            )
        return names

    def needs_approval(self, server: str, tool: str) -> bool:
        """Does ``tool`` of ``server`` run only when the request approves it (``approve``)?"""
        c = self.configs.get(server)
        return c is not None and any(fnmatchcase(tool, p) for p in c.approve)

    def catalog(self, name: str) -> McpCatalog:
        """How ``name``'s tools are offered: its own ``catalog``, else ``mcp_catalog``."""
        c = self.configs.get(name)
        return (c.catalog if c is not None else None) or self.catalog_default

    def max_rounds(self, names: list[str]) -> int:
        """The tool rounds a request with ``names``' tools may run: the smallest of theirs."""
        return min((self.configs[n].max_rounds for n in names), default=0)

    async def list_tools(self, name: str) -> McpToolList:
        """``name``'s tools, starting it if need be (bounded by its ``timeout_s``)."""
        actor = self.actors.get(name)
        if actor is None:
            return McpToolList(server=name, error=f"no MCP server named '{name}'")
        c = self.configs[name]
        try:
            with trio.fail_after(c.start_timeout_s + c.timeout_s + 1):  # a start, then a refresh
                reply = await actor.ask(ListTools())
        except trio.TooSlowError:
            return McpToolList(server=name, error=f"MCP server '{name}' did not list its tools in time")
        except ActorStopped as exc:
            return McpToolList(server=name, error=exc.message)
        assert isinstance(reply, McpToolList)
        return reply

    async def tools(self, names: list[str]) -> list[McpToolList]:
        """The tools of each of ``names`` (started at once, side by side), in that order."""
        lists: dict[str, McpToolList] = {}

        async def one(name: str) -> None:
            lists[name] = await self.list_tools(name)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, name)
        return [lists[n] for n in names]

    async def call(self, qualified: str, arguments: dict[str, Any] | None) -> McpCallResult:
        """Call the tool offered as ``mcp__<server>__<tool>``."""
        parts = split_qualified(qualified)
        if parts is None:
            return McpCallResult(
                server="",
                tool=qualified,
                qualified=qualified,
                text=f"'{qualified}' is not an MCP tool name (mcp__SERVER__TOOL)",
                is_error=True,
                why="unknown_tool",
            )
        return await self.call_tool(*parts, arguments)

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any] | None) -> McpCallResult:
        """Call ``tool`` on ``server``, started if need be (bounded by its ``start_timeout_s``);
        the call itself is bounded by its ``timeout_s`` and its text cut to its
        ``max_output_bytes``. Never raises for a server or tool that fails: the result says so."""
        actor = self.actors.get(server)
        if actor is None:
            return error_result(server, tool, "unknown_server", f"no MCP server named '{server}'")
        c = self.configs[server]
        begun = trio.current_time()
        try:
            with trio.fail_after(c.start_timeout_s + 1):  # the start bounds itself; this, a stuck actor
                got = await actor.ask(Connect())
        except (ActorStopped, trio.TooSlowError) as exc:
            text = getattr(exc, "message", None) or f"MCP server '{server}' did not start in time"
            return error_result(server, tool, "unavailable", text)
        if isinstance(got, McpDown):
            elapsed_s = trio.current_time() - begun
            return error_result(server, tool, "unavailable", got.reason, elapsed_s=elapsed_s)
        assert isinstance(got, McpSession)
        result: McpCallResult | None = None
        with trio.move_on_after(c.timeout_s) as timer:
            result = await self._call(actor, got, tool, arguments or {}, begun)
        if timer.cancelled_caught or result is None:
            return error_result(
                server,
                tool,
                "timeout",
                f"the tool '{tool}' of MCP server '{server}' did not answer within {c.timeout_s:g} s "
                "(timeout_s); the call was cancelled",
                elapsed_s=trio.current_time() - begun,
            )
        return result

    async def _call(
        self, actor: McpServerActor, got: McpSession, tool: str, arguments: dict[str, Any], begun: float
    ) -> McpCallResult:
        import mcp.types as mt
        from mcp.shared.exceptions import MCPError

        server = actor.config.name
        try:
            answer = await got.session.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == mt.CONNECTION_CLOSED:
                actor.drop_nowait(got.generation, "the server closed the connection")
                text = f"MCP server '{server}' went away during the call (it starts again on its next use)"
                return error_result(server, tool, "disconnected", text, elapsed_s=trio.current_time() - begun)
            text = f"MCP server '{server}' refused the call of '{tool}': {exc.message}"
            return error_result(server, tool, "protocol", text, elapsed_s=trio.current_time() - begun)
        except Exception as exc:
            actor.drop_nowait(got.generation, _describe(exc))
            text = f"the call of '{tool}' on MCP server '{server}' failed: {_describe(exc)}"
            return error_result(server, tool, "disconnected", text, elapsed_s=trio.current_time() - begun)
        text, cut = cap_text(result_text(answer), actor.config.max_output_bytes)
        return McpCallResult(
            server=server,
            tool=tool,
            qualified=qualified_name(server, tool),
            text=text,
            is_error=bool(answer.is_error),
            truncated_bytes=cut,
            elapsed_s=trio.current_time() - begun,
        )

    async def stop(self, name: str) -> None:
        """Stop ``name``'s session now (its next use starts it again)."""
        await self.actors[name].ask(StopServer())
