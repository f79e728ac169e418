"""Failover chains in the gateway: one request's walk along a chain, and the chains' routes.

The runtime decides the order (``actors/failover.py``); ``ChainRun`` walks it for one
request. Each attempt runs up to the point where the client would get its first byte;
a failure there that is the target's (a crash, an open breaker, a load that failed or
timed out, a lost engine, the chain's ``timeout_s``) benches the target and moves on. A
failure that is the request's own (a 4xx: a bad parameter, a prompt too long) is the
answer, as it would be from any target. Once bytes have gone to the client nothing is
tried again: a stream that fails later ends with the dialect's error event.

``GET /api/failover`` reports the chains; ``POST /api/failover/{name}/pin`` and
``/unpin`` need an admin key (``/api/failover/`` is an admin prefix).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.config import FailoverChain
from actors.engine import EngineActor, EngineState
from actors.errors import BlazarRuntimeError
from actors.failover import Step
from actors.runtime import Runtime
from blazar.errors import BlazarError
from blazar.serve.context import Ask
from blazar.web.ask import ask_of
from blazar.web.call import Call, Reply
from blazar.web.common import app_runtime, json_response, read_body
from registry.errors import RegistryError

__all__ = ["FAILOVER_CODES", "TARGET_HEADER", "ChainRun", "register", "relay_on_chain"]

TARGET_HEADER = "X-Blazar-Target"
FAILED_OVER_HEADER = "X-Blazar-Failover"

FAILOVER_CODES = frozenset(
    {
        "ENGINE_CRASHED",
        "ENGINE_CIRCUIT_OPEN",
        "MODEL_LOAD_TIMEOUT",
        "UNAVAILABLE",
        "BAD_GATEWAY",
        "GATEWAY_TIMEOUT",
        "MODEL_TOO_LARGE",
        "INSUFFICIENT_MEMORY",
        "MAX_LOADED_MODELS",
        "MODEL_NOT_FOUND",
        "MODEL_UNSUPPORTED_ENGINE",
        "PEER_UNAVAILABLE",
        "PEER_NOT_FOUND",
        "PEER_FAILED",
    }
)
"""The failures that are a target's, not the request's: they move a request to the next target."""


def failover_code(exc: BaseException) -> str | None:
    """The ``blazar_code`` of a failure that should move a request on; None for any other."""
    if isinstance(exc, BlazarError | BlazarRuntimeError | RegistryError):
        return exc.code if exc.code in FAILOVER_CODES else None
    return None


class ChainRun:
    """One request's walk along a chain: ``next`` gives the next target's engine (or raises
    ``FAILOVER_EXHAUSTED``), then the caller reports ``succeeded``, ``failed`` or ``timed_out``."""

    def __init__(self, runtime: Runtime, chain: FailoverChain, ask: Ask) -> None:
        if ask.lane is not None:
            raise BlazarError(
                "BAD_REQUEST",
                f"x-blazar-engine does not apply to the failover chain '{chain.name}': its targets name "
                "their lanes (MODEL@LANE) — drop the header, or ask for a target's model directly",
            )
        self.runtime = runtime
        self.chain = chain
        self.ask = ask
        self.card = ask.card
        """Where the walk is told (``blazar why``)."""
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
        return self.step.target.text if self.step is not None else None

    async def next(self) -> EngineActor:
        """The next target to try, its engine made (not started)."""
        failover = self.runtime.failover
        name = self.chain.name
        while self._next < len(self.steps):
            step = self.steps[self._next]
            self._next += 1
            target = step.target
            if step.action == "skip":
                self._pass(target.text, "skipped", step.reason or "")
                continue
            if target.peer is not None:  # the federation walks chains with remote targets itself
                self._pass(target.text, "skipped", "a remote target is not served on this route")
                continue
            try:
                self.ask.check_model(target.model)
            except BlazarError as exc:
                self._pass(target.text, "skipped", exc.message)
                continue
            self.step, self.engine = step, None
            try:
                engine = await self.runtime.engine_for(target.model, target.lane)
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
            timeout_s = self.chain.timeout_s
            self.deadline = trio.current_time() + timeout_s if timeout_s is not None else math.inf
            return engine
        self.step = self.engine = None
        raise BlazarError("FAILOVER_EXHAUSTED", self._exhausted())

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
        if self.card is not None:
            self.card.failover.append(f"{self.step.target.text} served it")

    def headers(self) -> dict[str, str]:
        """What the answer says about the walk: the target that served, those passed over."""
        out = {TARGET_HEADER: self.target} if self.target is not None else {}
        if self.passed:
            out[FAILED_OVER_HEADER] = ", ".join(f"{t}={code}" for t, code, _ in self.passed)
        return out

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
        if self.card is not None:
            self.card.failover.append(f"{target} passed over, {code}: {why}")

    def _exhausted(self) -> str:
        tried = "; ".join(f"{t}: {code} — {why}" for t, code, why in self.passed)
        return (
            f"no target of failover chain '{self.chain.name}' could serve the request ({tried}) — "
            "see GET /api/failover, fix or start a target, or retry once a bench ends"
        )


async def relay_on_chain(
    runtime: Runtime, call: Call, chain: FailoverChain, attempt: Callable[[EngineActor], Awaitable[Reply]]
) -> Reply:
    """``attempt`` (a relayed request on one engine) on each target in turn until one answers.

    A whole answer that came back as a 5xx (the engine failed it) was never sent: it moves on
    too. A stream is the answer once its head is back; what fails after is its own to tell."""
    run = ChainRun(runtime, chain, ask_of(call))
    while True:
        engine = await run.next()
        try:
            with trio.move_on_at(run.deadline) as scope:
                reply = await attempt(engine)
        except Exception as exc:
            run.failed(exc)
            continue
        if scope.cancelled_caught:
            run.timed_out()
            continue
        if reply.status >= 500 and isinstance(reply.body, bytes):
            run.failed_with(call.code or "BAD_GATEWAY", call.error or f"the engine answered {reply.status}")
            call.code = call.error = None
            continue
        run.succeeded()
        reply.headers = {**(reply.headers or {}), **run.headers()}
        return reply


# -- routes -----------------------------------------------------------------


class _PinBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    target: str


def _chain_named(runtime: Runtime, name: str) -> FailoverChain:
    chain = runtime.failover.get(name)
    if chain is None:
        known = ", ".join(runtime.failover.names()) or "none is configured"
        raise BlazarError(
            "FAILOVER_CHAIN_NOT_FOUND",
            f"no failover chain named '{name}' (configured: {known}) — "
            "add a [[failover]] entry to config.toml",
        )
    return chain


async def chains() -> Response:
    runtime = app_runtime()
    names = set(runtime.failover.names())
    installed = frozenset(
        r.name for r in await trio.to_thread.run_sync(runtime.store.list) if r.name in names
    )
    report = runtime.failover.report(trio.current_time(), installed)
    return json_response({"chains": report})


async def pin(name: str) -> Response:
    runtime = app_runtime()
    chain = _chain_named(runtime, name)
    try:
        body = msgspec.json.decode(await read_body(), type=_PinBody)
    except msgspec.ValidationError as exc:
        raise BlazarError(
            "BAD_REQUEST", f'invalid body for /api/failover/{name}/pin: {exc} — send {{"target": …}}'
        ) from None
    except msgspec.DecodeError as exc:
        raise BlazarError("INVALID_JSON", f"the body is not valid JSON: {exc}") from None
    target = next((t for t in chain.parsed() if t.text == body.target), None)
    if target is None:
        raise BlazarError(
            "BAD_REQUEST",
            f"'{body.target}' is not a target of failover chain '{name}' "
            f"(its targets: {', '.join(chain.targets)})",
            param="target",
        )
    if target.peer is not None and not runtime.failover.federated:
        raise BlazarError(
            "BAD_REQUEST",
            f"cannot pin '{body.target}': no [[remotes]] entry is configured, so remote targets are "
            "not served (docs/federation.md)",
            param="target",
        )
    runtime.failover.pin(name, body.target)
    return json_response({"chain": name, "pinned": body.target})


async def unpin(name: str) -> Response:
    runtime = app_runtime()
    _chain_named(runtime, name)
    was = runtime.failover.pinned(name)
    runtime.failover.unpin(name)
    return json_response({"chain": name, "pinned": None, "was": was})


def register(app: QuartTrio) -> None:
    """``GET /api/failover``, ``POST /api/failover/<name>/pin`` and ``/unpin``."""
    app.get("/api/failover")(chains)
    app.post("/api/failover/<name>/pin")(pin)
    app.post("/api/failover/<name>/unpin")(unpin)
