"""``Ask``: who asks for a piece of work and on what terms, passed explicitly.

Everything the service layer needs to know about the request it serves, beyond the
request body itself, is one value: the key and its scopes, the admission tier and
fairness key, the deadline, a pinned lane, strict mode, the MCP tools the caller
approved, and the live card that records what happened. The HTTP layer builds it from
a request's headers (``blazar.web.asgi.ask``); a job or an embedding program builds it
directly (``Ask.job``). Nothing below the HTTP layer reads headers or a context
variable to find these out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, Protocol

from actors.scheduling import Tier
from blazar.errors import BlazarError
from blazar.serve.cards import Card

if TYPE_CHECKING:
    from blazar.auth.keys import Key
    from blazar.serve.handoff import HandoffSlot

__all__ = ["ACT_AS", "APPROVE_HEADER", "Ask", "Cleanup", "Relayed", "check_scope"]

APPROVE_HEADER = "x-blazar-mcp-approve"
"""Where a client approves MCP tools (``server__tool``, ``tool`` or ``*``); named in refusals."""
ACT_AS = "x-blazar-act-as"
"""The key a local-token caller (the batch runner) acts as; ignored from anyone else."""

Cleanup = Callable[[], Awaitable[None]]


def check_scope(grant: Key | None, model: str) -> None:
    """Refuse (403 ``MODEL_NOT_IN_SCOPE``) a model ``grant`` may not use; None allows all."""
    if grant is not None and not grant.allows_model(model):
        raise BlazarError(
            "MODEL_NOT_IN_SCOPE",
            f"API key {grant.name!r} may not use model {model!r}; its models are "
            f"{', '.join(grant.models)} — use a key whose `models:` scope matches",
            param="model",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """The context of one request (or one job) as the service layer sees it."""

    client: str = "job"
    """Who asks, for admission's per-client fairness (a key's name, never a secret)."""
    grant: Key | None = None
    """The API key the request authenticated with (its ``models:`` and ``mcp:`` scopes)."""
    tier: Tier = Tier.NORMAL
    """The admission tier."""
    deadline_s: float | None = None
    """``trio.current_time()`` by which the request must have its slot, or be refused."""
    keep_alive_s: float | None = None
    """How long the engine stays loaded after the request, when the request says so."""
    lane: str | None = None
    """The engine lane the request pins (``x-blazar-engine``); None lets routing choose."""
    strict: bool = False
    """The request asked for strict mode (the config's ``strict`` applies on top)."""
    certifying: bool = False
    """A model-doctor probe: certificates do not refuse it."""
    approved: frozenset[str] = field(default_factory=frozenset)
    """The MCP tools the caller approved for this request (``server__tool``, ``tool`` or ``*``)."""
    mcp_catalog: Literal["full", "compact"] | None = None
    """How the model sees the MCP tools (``x-blazar-mcp-catalog``); None: each server's own."""
    card: Card | None = None
    """The live card that records the request: its state, usage, failover walk, stream enders."""

    @classmethod
    def job(cls, *, tier: Tier = Tier.NORMAL, card: Card | None = None, grant: Key | None = None) -> Ask:
        """The context of work that runs outside any request: a job, a probe, an embedder."""
        return cls(client="job", tier=tier, card=card, grant=grant)

    def is_strict(self, configured: bool) -> bool:
        """Strict for this request: configured so, or asked for."""
        return configured or self.strict

    def check_model(self, model: str) -> None:
        check_scope(self.grant, model)

    def but(self, **changes: object) -> Ask:
        """This context with some fields changed (a job's tier, a sub-request's card)."""
        return replace(self, **changes)  # type: ignore[arg-type]


class Relayed(Protocol):
    """A request whose body the service relays or fans out as it came (OpenAI's routes,
    the engine's own wire shapes): its bytes and headers, where its outcome is recorded for
    the ledger (``code``, ``error``) and the card, and how a stream that outlives the
    handler is closed. The HTTP layer's ``Call`` is one."""

    code: str | None
    error: str | None
    ran_body: bytes | None
    """The request as it ran where a policy hook rewrote it (``None``: ``body``): what the audit
    log and a stored completion keep."""

    @property
    def path(self) -> str: ...

    @property
    def trace_id(self) -> str: ...

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def card(self) -> Card | None: ...

    @property
    def grant(self) -> Key | None: ...

    @property
    def handoff(self) -> HandoffSlot | None:
        """Set when a data-plane worker forwarded the request and can relay its engine stream."""
        ...

    def on_cleanup(self, fn: Cleanup) -> None:
        """Run ``fn`` (shielded) when the server is done with this request, however it ends."""
        ...
