"""Policy hooks: the operator's own checks called before a chat or completion request runs and
after it is answered (``[[hooks]]`` in config.toml, docs/security.md#policy-hooks).

A hook is an HTTP endpoint (its JSON POSTed) or a Python callable (``module:function``, sync or
async), called with a hard timeout; the wire format is ``blazar.dialects.policy``. A pre hook
sees the decoded request in its neutral form and allows it, refuses it (403 ``POLICY_REFUSED``
naming the hook, in the caller's dialect) or rewrites its messages (what runs is the rewritten
request: for a relayed OpenAI body, the body the engine gets). A post hook sees each choice's
answer text and allows it, redacts it (the answer's text replaced) or refuses it. A streamed
answer is seen by post hooks only where the hook says ``buffer_streams``: the stream is then
held whole and released after them; other post hooks skip streams, and the answer says so
(``X-Blazar-Policy: NAME=skipped_stream``, ``X-Blazar-Warnings: policy_post_skipped``). A hook
that fails (timeout, error, no verdict) lets the request through with ``on_error = "open"``
(``NAME=failed_open``) and refuses it with ``"closed"`` (503 ``POLICY_HOOK_FAILED``).

None configured, a request does no policy work: the one check is whether this runtime has
hooks (``policy_hooks_of``), in ``guarded`` and ``through``.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import httpx
import msgspec
import trio

from actors.runtime import Runtime
from blazar.config import ConfigError, HookConfig
from blazar.dialects import policy
from blazar.dialects.neutral import ChatRequest, CompletionRequest
from blazar.errors import BlazarError, Dialect
from blazar.serve.context import Ask, Cleanup, Relayed
from blazar.serve.reply import Reply

if TYPE_CHECKING:
    from blazar.auth.keys import Key
    from blazar.serve.cards import Card
    from blazar.serve.handoff import HandoffSlot

__all__ = [
    "POLICY_HEADER",
    "SKIPPED_WARNING",
    "PolicyHooks",
    "guarded",
    "open_policy_hooks",
    "policy_hooks_of",
    "through",
]

log = logging.getLogger("blazar.serve")

POLICY_HEADER = "X-Blazar-Policy"
"""The hooks that ran for a request and what each did: ``NAME=allow|rewrite|redact|failed_open|
skipped_stream``, comma-separated, in the order they ran."""
SKIPPED_WARNING = "policy_post_skipped"
"""``X-Blazar-Warnings``'s name for a streamed answer that a post hook did not see."""

HookFn = Callable[[dict[str, Any]], Any]


class Hook:
    """One configured hook, its entry point imported."""

    __slots__ = ("config", "fn", "is_async")

    def __init__(self, config: HookConfig) -> None:
        self.config = config
        self.fn: HookFn | None = None
        self.is_async = False
        if config.entry is not None:
            self.fn = _import_entry(config)
            self.is_async = inspect.iscoroutinefunction(self.fn)

    @property
    def name(self) -> str:
        return self.config.name

    def applies(self, route: str, model: str) -> bool:
        c = self.config
        if c.routes and route not in c.routes:
            return False
        return not c.models or any(fnmatch.fnmatchcase(model, p) for p in c.models)


def _import_entry(config: HookConfig) -> HookFn:
    assert config.entry is not None
    module_name, _, attr = config.entry.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"[[hooks]] {config.name!r}: entry {config.entry!r} cannot be imported "
            f"({exc.__class__.__name__}: {exc}) — install the module where the daemon's Python finds it"
        ) from None
    if not callable(fn):
        raise ConfigError(f"[[hooks]] {config.name!r}: entry {config.entry!r} is not callable")
    return fn


class _HookFailed(Exception):
    """A hook gave no verdict: it timed out, failed, or answered something else."""


class PolicyHooks:
    """The daemon's hooks (one set per runtime), and the HTTP client of those with a ``url``."""

    def __init__(self, configs: list[HookConfig]) -> None:
        hooks = [Hook(c) for c in configs]
        self.pre = [h for h in hooks if h.config.stage == "pre"]
        self.post = [h for h in hooks if h.config.stage == "post"]
        self.client: httpx.AsyncClient | None = None
        if any(h.config.url is not None for h in hooks):
            self.client = httpx.AsyncClient(timeout=None, trust_env=False)

    async def verdict(
        self, hook: Hook, payload: dict[str, Any], *, completion: bool = False
    ) -> policy.Verdict | None:
        """What ``hook`` says of ``payload`` (``completion``: of a legacy completion); None: it
        failed and fails open. Failing closed raises 503 ``POLICY_HOOK_FAILED``."""
        timeout_s = hook.config.timeout_ms / 1000
        why = f"did not answer within {hook.config.timeout_ms} ms"
        with trio.move_on_after(timeout_s):
            try:
                answer = await self._call(hook, payload)
                return policy.decode_verdict(answer, hook.config.stage, completion=completion)
            except (_HookFailed, policy.VerdictError) as exc:
                why = str(exc)
            except Exception as exc:  # the operator's own code: any failure is the hook's
                why = f"failed ({exc.__class__.__name__})"
                log.warning("policy hook %r failed", hook.name, exc_info=exc)
        if hook.config.on_error == "open":
            log.warning("policy hook %r %s: failing open", hook.name, why)
            return None
        raise BlazarError(
            "POLICY_HOOK_FAILED",
            f"policy hook {hook.name!r} {why}, and it fails closed: the request was refused — "
            "retry later, or ask the operator to check the hook",
        )

    async def _call(self, hook: Hook, payload: dict[str, Any]) -> object:
        if hook.fn is not None:
            if hook.is_async:
                return await hook.fn(payload)
            return await trio.to_thread.run_sync(hook.fn, payload, abandon_on_cancel=True)
        assert self.client is not None and hook.config.url is not None
        try:
            r = await self.client.post(
                hook.config.url,
                content=msgspec.json.encode(payload),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise _HookFailed(f"could not be reached ({exc.__class__.__name__})") from None
        if not r.is_success:
            raise _HookFailed(f"answered HTTP {r.status_code}")
        if not r.content.strip():
            return None
        try:
            return msgspec.json.decode(r.content)
        except msgspec.DecodeError:
            raise _HookFailed("answered something that is not JSON") from None

    async def guard(
        self,
        call: Relayed,
        req: Guarded,
        dialect: Dialect,
        run: Run,
        *,
        relays_body: bool = False,
        shape: policy.Shape | None = None,
    ) -> Reply:
        """``run(call, req)`` behind the hooks that apply to the request's route and model;
        ``relays_body``: the request's own body goes to the engine (a pre hook's rewrite is
        written into it); ``shape``: the answer's wire shape where it is not the dialect's
        own (Responses, legacy completions)."""
        route = call.path
        pre = [h for h in self.pre if h.applies(route, req.model)]
        post = [h for h in self.post if h.applies(route, req.model)]
        said: list[str] = []
        key = call.grant.name if call.grant is not None else None
        completion = isinstance(req, CompletionRequest)
        wire: policy.Shape = shape if shape is not None else cast("policy.Shape", str(dialect))

        def payload(
            hook: Hook, stage: str, req: Guarded, answer: tuple[int, str] | None = None
        ) -> dict[str, Any]:
            return policy.hook_payload(
                hook=hook.name,
                stage=stage,
                route=route,
                dialect=dialect,
                key=key,
                trace_id=call.trace_id,
                req=req,
                answer=answer,
            )

        rewritten = False
        for hook in pre:
            verdict = await self.verdict(hook, payload(hook, "pre", req), completion=completion)
            if verdict is None:
                said.append(f"{hook.name}=failed_open")
            elif verdict.action == "refuse":
                raise _refused(hook, verdict, "the request")
            elif verdict.action == "rewrite":
                req = _rewritten(req, verdict)
                rewritten = True
                said.append(f"{hook.name}=rewrite")
            else:
                said.append(f"{hook.name}=allow")
        buffered = [h for h in post if h.config.buffer_streams] if req.stream else post
        if rewritten:
            # What ran is what is kept: the audit log and a stored completion get the rewrite.
            call.ran_body = _ran_body(call.body, req, wire)
        if (rewritten and relays_body) or (buffered and req.stream and call.handoff is not None):
            # A rewritten body is what runs; a held stream is relayed here, not by a worker.
            body = call.ran_body if rewritten and relays_body else None
            call = _Changed(call, body, keep_handoff=not (buffered and req.stream))
        _note_card(call, said)
        reply = await run(call, req)
        if req.stream:
            said += [f"{h.name}=skipped_stream" for h in post if h not in buffered]
        if buffered and reply.status == 200:
            reply = await self._after(buffered, req, wire, reply, said, payload)
        _note_card(call, said)
        return _with_headers(reply, said, skipped=len(buffered) < len(post))

    async def _after(
        self,
        hooks: list[Hook],
        req: Guarded,
        shape: policy.Shape,
        reply: Reply,
        said: list[str],
        payload: Callable[..., dict[str, Any]],
    ) -> Reply:
        """The post hooks on an answer (a stream: held whole first)."""
        streamed = not isinstance(reply.body, bytes)
        data = await _drain(reply.body) if not isinstance(reply.body, bytes) else reply.body
        texts = policy.stream_texts(shape, data) if streamed else policy.answer_texts(shape, data)
        if texts is None:  # not an answer the hooks can read (an error already said as much)
            return reply
        redacted = False
        for hook in hooks:
            acted = "allow"
            for i, text in enumerate(texts):
                verdict = await self.verdict(hook, payload(hook, "post", req, (i, text)))
                if verdict is None:
                    acted = "failed_open"
                elif verdict.action == "refuse":
                    raise _refused(hook, verdict, "the answer")
                elif verdict.action == "redact":
                    assert verdict.text is not None
                    texts[i], redacted, acted = verdict.text, True, "redact"
            said.append(f"{hook.name}={acted}")
        if redacted:
            data = (
                policy.stream_with_texts(shape, data, texts)
                if streamed
                else policy.with_texts(shape, data, texts)
            )
        body: bytes | AsyncIterator[bytes] = _once(data) if streamed else data
        return Reply(body, reply.status, reply.content_type, reply.headers)


Guarded = ChatRequest | CompletionRequest
"""What hooks see of a request: the neutral chat request, or a legacy completion's."""
Run = Callable[[Relayed, Any], Awaitable[Reply]]
"""``run(call, req)``: the request served, ``req`` as the hooks left it (the type it came as)."""


def _rewritten(req: Guarded, verdict: policy.Verdict) -> Guarded:
    if isinstance(req, CompletionRequest):
        assert verdict.prompt is not None
        return msgspec.structs.replace(req, prompt=verdict.prompt)
    assert verdict.messages is not None
    return msgspec.structs.replace(req, messages=verdict.messages)


def _ran_body(body: bytes, req: Guarded, shape: str) -> bytes:
    """The request as a pre hook rewrote it: an OpenAI body with its new messages or prompt,
    else the neutral request as JSON (what the audit log reads its prompt from)."""
    if isinstance(req, CompletionRequest):
        assert isinstance(req.prompt, str)
        return policy.prompt_into_body(body, req.prompt)
    if shape == "openai":
        return policy.messages_into_body(body, req.messages)
    return msgspec.json.encode(req)


def _refused(hook: Hook, verdict: policy.Verdict, what: str) -> BlazarError:
    reason = (verdict.reason or "").strip() or "no reason given"
    return BlazarError("POLICY_REFUSED", f"policy hook {hook.name!r} refused {what}: {reason}")


async def _drain(stream: AsyncIterator[bytes]) -> bytes:
    chunks: list[bytes] = []
    try:
        async for chunk in stream:
            chunks.append(chunk)
    finally:
        if (aclose := getattr(stream, "aclose", None)) is not None:
            with trio.CancelScope(shield=True):
                await aclose()
    return b"".join(chunks)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _note_card(call: Relayed, said: list[str]) -> None:
    if call.card is not None and said:
        call.card.policy = ",".join(said)


def _with_headers(reply: Reply, said: list[str], *, skipped: bool) -> Reply:
    if not said:
        return reply
    headers = dict(reply.headers or {})
    headers[POLICY_HEADER] = ",".join(said)
    if skipped:
        warned = headers.get("X-Blazar-Warnings")
        headers["X-Blazar-Warnings"] = f"{warned},{SKIPPED_WARNING}" if warned else SKIPPED_WARNING
    reply.headers = headers
    return reply


class _Changed:
    """A request as the hooks changed it: the body a pre hook rewrote, no hand-off to a worker
    for a stream a post hook holds. Everything else is the request's own."""

    def __init__(self, call: Relayed, body: bytes | None, *, keep_handoff: bool) -> None:
        self._call = call
        self._body = body
        self._keep_handoff = keep_handoff

    @property
    def code(self) -> str | None:
        return self._call.code

    @code.setter
    def code(self, value: str | None) -> None:
        self._call.code = value

    @property
    def ran_body(self) -> bytes | None:
        return self._call.ran_body

    @ran_body.setter
    def ran_body(self, value: bytes | None) -> None:
        self._call.ran_body = value

    @property
    def error(self) -> str | None:
        return self._call.error

    @error.setter
    def error(self, value: str | None) -> None:
        self._call.error = value

    @property
    def path(self) -> str:
        return self._call.path

    @property
    def trace_id(self) -> str:
        return self._call.trace_id

    @property
    def body(self) -> bytes:
        return self._call.body if self._body is None else self._body

    @property
    def headers(self) -> Mapping[str, str]:
        return self._call.headers

    @property
    def card(self) -> Card | None:
        return self._call.card

    @property
    def grant(self) -> Key | None:
        return self._call.grant

    @property
    def handoff(self) -> HandoffSlot | None:
        return self._call.handoff if self._keep_handoff else None

    def on_cleanup(self, fn: Cleanup) -> None:
        self._call.on_cleanup(fn)


_STORES: weakref.WeakKeyDictionary[Runtime, PolicyHooks] = weakref.WeakKeyDictionary()
_ANY = False
"""Set once any runtime of this process has hooks: until then the request path reads this alone."""


def open_policy_hooks(runtime: Runtime, configs: list[HookConfig]) -> PolicyHooks | None:
    """The daemon's hooks for ``runtime`` (their entry points imported now: one that does not
    import is a ``ConfigError``); None, and nothing kept, when none is configured."""
    if not configs:
        _STORES.pop(runtime, None)
        return None
    global _ANY
    hooks = PolicyHooks(configs)
    _STORES[runtime] = hooks
    _ANY = True
    return hooks


def policy_hooks_of(runtime: Runtime) -> PolicyHooks | None:
    return _STORES.get(runtime)


async def through(
    runtime: Runtime,
    call: Relayed,
    req: Guarded,
    dialect: Dialect,
    run: Run,
    *,
    relays_body: bool = False,
    shape: policy.Shape | None = None,
) -> Reply:
    """``run(call, req)``, behind the policy hooks where the daemon has any (``guard``)."""
    if not _ANY or (hooks := _STORES.get(runtime)) is None:
        return await run(call, req)
    return await hooks.guard(call, req, dialect, run, relays_body=relays_body, shape=shape)


Answer = Callable[[Runtime, Relayed, Ask, ChatRequest], Awaitable[Reply]]


def guarded(answer: Answer) -> Answer:
    """``answer`` (OpenAI chat's whole service, its body relayed) behind the policy hooks."""

    @functools.wraps(answer)
    def run(runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest) -> Awaitable[Reply]:
        # A plain function handing back ``answer``'s own coroutine: with no hooks configured
        # (``_ANY`` false) a request costs this one check, not a coroutine of its own.
        if not _ANY or (hooks := _STORES.get(runtime)) is None:
            return answer(runtime, call, ask, req)
        return hooks.guard(
            call, req, Dialect.OPENAI, lambda c, r: answer(runtime, c, ask, r), relays_body=True
        )

    return run
