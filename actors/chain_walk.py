"""One request's walk along a failover chain: the one walker every route and embedder uses.

The runtime decides the order (``FailoverChains.plan``); ``ChainWalk`` follows it for one
request. Each attempt runs up to the point where the caller would get its first byte (for
``Runtime.claim``: a ready engine and a lease). A failure there that is the target's (a
crash, an open breaker, a load that failed or timed out, a lost engine or peer, the chain's
``timeout_s``) benches the target and moves on; a failure that is the request's own (a bad
parameter, a prompt too long) is raised as it is, as it would be from any target. Once the
caller has sent bytes nothing is tried again.

Two ways to use it:

* ``await walk.run(attempt)``: ``attempt(step, engine)`` once per target until one returns;
  ``engine`` is the local target's engine (made, not started), None for a remote target.
* the steps by hand, for a caller whose attempt has two phases (prepare, then open):
  ``engine = await walk.next()``, then ``failed(exc)``, ``timed_out()`` or ``succeeded()``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import trio

from actors.config import FailoverChain
from actors.engine import EngineActor, EngineState
from actors.errors import BlazarRuntimeError
from actors.failover import Step
from registry.errors import RegistryError

if TYPE_CHECKING:
    from actors.runtime import Runtime

__all__ = ["FAILOVER_CODES", "ChainWalk", "FailoverExhausted", "failover_code"]

T = TypeVar("T")

FAILOVER_CODES = frozenset(
    {
        "ENGINE_CRASHED",
        "ENGINE_STOPPED",
        "ENGINE_CIRCUIT_OPEN",
        "MODEL_LOAD_TIMEOUT",
        "UNAVAILABLE",
        "BAD_GATEWAY",
        "GATEWAY_TIMEOUT",
        "MODEL_TOO_LARGE",
        "INSUFFICIENT_MEMORY",
        "MAX_LOADED_MODELS",
        "MODEL_NOT_FOUND",
        "MODEL_FILE_INCOMPLETE",
        "MODEL_UNSUPPORTED_ENGINE",
        "PEER_UNAVAILABLE",
        "PEER_NOT_FOUND",
        "PEER_FAILED",
    }
)
"""The failures that are a target's, not the request's: they move a request to the next target."""


def failover_code(exc: BaseException) -> str | None:
    """The ``blazar_code`` of a failure that should move a request on; None for any other.
    Every error tree of the project (runtime, store, gateway) carries its code as ``code``."""
    code = getattr(exc, "code", None) if isinstance(exc, Exception) else None
    return code if isinstance(code, str) and code in FAILOVER_CODES else None


class FailoverExhausted(BlazarRuntimeError):
    """No target of a failover chain could serve the request."""

    code = "FAILOVER_EXHAUSTED"


class ChainWalk:
    """One request's walk along ``chain`` (see the module doc).

    ``check``: raises (with a ``message``) for a target model the caller may not use (a key's
    scope); that target is skipped. ``note``: told each step, for the request's card.
    ``remote``: remote targets are attempted (the federation relays them); otherwise they
    are passed over.
    """

    def __init__(
        self,
        runtime: Runtime,
        chain: FailoverChain,
        *,
        check: Callable[[str], None] | None = None,
        note: Callable[[str], None] | None = None,
        remote: bool = False,
    ) -> None:
        self.runtime = runtime
        self.chain = chain
        self._check = check
        self._note = note
        self._remote = remote
        self.steps = runtime.failover.plan(chain.name, trio.current_time())
        self._next = 0
        self.step: Step | None = None
        self.engine: EngineActor | None = None
        self.deadline = math.inf
        """The current attempt's ``trio.current_time()`` deadline (the chain's ``timeout_s``)."""
        self.passed: list[tuple[str, str, str]] = []
        """(target, code or ``skipped``, why) of each target passed over so far."""

    @property
    def target(self) -> str | None:
        """The target being tried, or the one that served."""
        return self.step.target.text if self.step is not None else None

    async def next(self) -> EngineActor | None:
        """The next target to try: its engine made (not started), None for a remote target
        (``self.step`` says which); ``FailoverExhausted`` when none is left."""
        failover = self.runtime.failover
        name = self.chain.name
        while self._next < len(self.steps):
            step = self.steps[self._next]
            self._next += 1
            target = step.target
            if step.action == "skip":
                self._pass(target.text, "skipped", step.reason or "")
                continue
            if target.peer is not None and not self._remote:
                self._pass(target.text, "skipped", "a remote target is not served on this route")
                continue
            if self._check is not None:
                try:
                    self._check(target.model)
                except Exception as exc:
                    self._pass(target.text, "skipped", getattr(exc, "message", None) or str(exc))
                    continue
            self.step, self.engine = step, None
            timeout_s = self.chain.timeout_s
            self.deadline = trio.current_time() + timeout_s if timeout_s is not None else math.inf
            if target.peer is not None:
                return None
            try:
                engine = await self.runtime.engine_for(target.model, target.lane)
            except RegistryError as exc:
                # The target's files or its record (a header cut short, a kind this route does
                # not serve): the target's failure whatever its code, never the request's.
                self._charge(exc.code, exc.message)
                continue
            except Exception as exc:
                self.failed(exc)
                continue
            self.engine = engine
            if (
                engine.state is EngineState.FAILED
                and failover.fresh_crash(name, target.text, engine.crash_count)
                and self._more_to_try()
            ):
                # Its child died since this chain last used it: a healthy target is one that
                # answers now, not one that would have to be started again first. With no
                # other target left to try, starting it again is the better chance.
                self._charge("ENGINE_CRASHED", engine.last_error or "its engine crashed")
                continue
            return engine
        self.step = self.engine = None
        raise FailoverExhausted(self._exhausted())

    async def run(
        self,
        attempt: Callable[[Step, EngineActor | None], Awaitable[T]],
        *,
        refused: Callable[[T], tuple[str, str] | None] | None = None,
    ) -> T:
        """``attempt`` on each target in turn until one returns. ``refused``: the code and
        message when what an attempt returned is a failure all the same (a whole answer that
        came back as a 5xx was never sent: it moves on too)."""
        while True:
            engine = await self.next()
            assert self.step is not None
            try:
                with trio.move_on_at(self.deadline) as scope:
                    result = await attempt(self.step, engine)
            except Exception as exc:
                self.failed(exc)
                continue
            if scope.cancelled_caught:
                self.timed_out()
                continue
            if refused is not None and (why := refused(result)) is not None:
                self.failed_with(*why)
                continue
            self.succeeded()
            return result

    def _more_to_try(self) -> bool:
        return any(s.action != "skip" for s in self.steps[self._next :])

    def failed(self, exc: BaseException) -> None:
        """The current target failed with ``exc``: bench it, or raise ``exc`` again when
        the failure is the request's own."""
        code = failover_code(exc)
        if code is None:
            raise exc
        self._charge(code, getattr(exc, "message", None) or str(exc))

    def failed_with(self, code: str, message: str) -> None:
        self._charge(code, message)

    def timed_out(self) -> None:
        self._charge(
            "GATEWAY_TIMEOUT",
            f"did not start answering within the chain's timeout_s ({self.chain.timeout_s:g} s)",
        )

    def succeeded(self) -> None:
        assert self.step is not None
        crashes = self.engine.crash_count if self.engine is not None else 0
        self.runtime.failover.served(self.chain.name, self.step.target.text, crashes=crashes)
        self._tell(f"{self.step.target.text} served it")

    def _charge(self, code: str, message: str) -> None:
        assert self.step is not None
        target = self.step.target.text
        crashes = self.engine.crash_count if self.engine is not None else 0
        bench_s = self.runtime.failover.failed(
            self.chain.name, target, code, message, trio.current_time(), crashes=crashes
        )
        self._pass(target, code, f"{message} (benched {bench_s:g} s)")

    def _pass(self, target: str, code: str, why: str) -> None:
        self.passed.append((target, code, why))
        self._tell(f"{target} passed over, {code}: {why}")

    def _tell(self, line: str) -> None:
        if self._note is not None:
            self._note(line)

    def _exhausted(self) -> str:
        tried = "; ".join(f"{t}: {code} — {why}" for t, code, why in self.passed)
        peers = " and `blazar peers`" if any(t.peer is not None for t in self.chain.parsed()) else ""
        return (
            f"no target of failover chain '{self.chain.name}' could serve the request ({tried}) — "
            f"see GET /api/failover{peers}, fix or start a target, or retry once a bench ends"
        )
