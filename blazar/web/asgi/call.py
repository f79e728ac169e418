"""One HTTP request as the gateway sees it: ``Call``, and ``Reply`` for the routes
that the gateway serves itself.

The gateway layer (``blazar.web.asgi.gateway``) makes a ``Call`` for every request
and makes it current for the request's task (a context variable, which the
tasks a route starts inherit), so route code anywhere below — the framework's
routes as well as the gateway's own — names the request's model, its error code,
its cleanups and its live card in one typed place, and reads its headers without
a framework.

The hot inference routes are served by the gateway itself, straight on ASGI
(``Routes``): such a handler takes the ``Call`` with its body already read and
returns a ``Reply``. Everything else goes to the Quart app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from blazar.errors import BlazarError
from blazar.serve.cards import Card
from blazar.serve.context import Ask, check_scope
from blazar.serve.reply import Reply

if TYPE_CHECKING:
    from blazar.auth.keys import Key
    from blazar.serve.handoff import HandoffSlot

HANDOFF_EXTENSION = "blazar.handoff"
"""The scope extension where the runtime's listener for its workers puts a request's slot."""

__all__ = ["HANDOFF_EXTENSION", "Call", "Cleanup", "Handler", "Reply", "Routes", "current", "current_or_none"]

Cleanup = Callable[[], Awaitable[None]]

_CURRENT: ContextVar[Call] = ContextVar("blazar_call")


def current() -> Call:
    """The request being handled by this task (LookupError outside a request)."""
    return _CURRENT.get()


def current_or_none() -> Call | None:
    return _CURRENT.get(None)


class Call:
    """The gateway's state of one request; ``headers`` has lower-case names."""

    __slots__ = (
        "_token",
        "asked",
        "body",
        "card",
        "cleanups",
        "client",
        "code",
        "error",
        "grant",
        "handoff",
        "headers",
        "key",
        "max_body",
        "method",
        "model",
        "path",
        "ran_body",
        "route",
        "scheme",
        "trace_id",
    )

    def __init__(
        self, scope: Mapping[str, Any], *, trace_id: str, max_body: int, card: Card | None = None
    ) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.scheme: str = scope.get("scheme") or "http"
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or ()}
        client = scope.get("client")
        self.client: str | None = client[0] if client else None
        self.trace_id = trace_id
        self.max_body = max_body
        self.card = card
        self.handoff: HandoffSlot | None = (scope.get("extensions") or {}).get(HANDOFF_EXTENSION)
        self.cleanups: list[Cleanup] = []
        self.model: str | None = None
        self.code: str | None = None
        self.error: str | None = None
        """The message of the error the request was answered with (for the ledger, scrubbed there)."""
        self.route: str | None = None
        """The route's template (``/v1/requests/<card_id>``), once the framework matched one."""
        self.key: str | None = None
        """The name of the API key the request authenticated with (never the secret)."""
        self.grant: Key | None = None
        """The key itself (its scopes), set by the gateway's auth step."""
        self.body = b""
        self.ran_body: bytes | None = None
        """The request as it ran where a policy hook rewrote it (the audit log keeps this)."""
        self.asked: Ask | None = None
        """The request's context for the service layer (``blazar.web.asgi.ask.ask_of``)."""
        self._token: Any = None

    def __enter__(self) -> Call:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)

    def set_model(self, name: str) -> None:
        """Name the model in the request's ledger record and live card; refuse it (403
        ``MODEL_NOT_IN_SCOPE``) when the request's key may not use it."""
        self.check_model(name)
        self.model = name
        if self.card is not None:
            self.card.model = name

    def check_model(self, name: str) -> None:
        check_scope(self.grant, name)

    def on_cleanup(self, fn: Cleanup) -> None:
        """Run ``fn`` (shielded) when the server is done with this request, however it ends."""
        self.cleanups.append(fn)

    def check_length(self, size: int) -> None:
        """Refuse a body that is (or has grown) larger than the configured limit."""
        if size > self.max_body:
            raise BlazarError("PAYLOAD_TOO_LARGE", f"body of {size} bytes exceeds {self.max_body} bytes")

    def declared_length(self) -> int | None:
        raw = self.headers.get("content-length")
        return int(raw) if raw is not None and raw.isdigit() else None


Handler = Callable[[Call], Awaitable[Reply]]


class Routes:
    """The routes the gateway serves itself, by exact path: POST routes, and a few GET ones."""

    def __init__(self) -> None:
        self.post: dict[str, Handler] = {}
        self.shared: set[str] = set()
        """Paths whose other methods the app serves (``GET /v1/videos`` beside the POST)."""
        self.get: dict[str, Handler] = {}
        """GET routes (``/health``): their other methods (HEAD, OPTIONS) go to the app."""

    def add(self, path: str, handler: Handler, *, shared: bool = False) -> None:
        if path in self.post:
            raise ValueError(f"route POST {path} is already served")
        self.post[path] = handler
        if shared:
            self.shared.add(path)

    def add_get(self, path: str, handler: Handler) -> None:
        if path in self.get or path in self.post:
            raise ValueError(f"route GET {path} is already served")
        self.get[path] = handler

    def handler_for(self, method: str, path: str) -> Handler | None:
        """The handler of ``method path`` when the gateway serves that path; a POST path's
        handler for any method the app does not serve there (the gateway refuses those)."""
        if method == "GET" and (handler := self.get.get(path)) is not None:
            return handler
        handler = self.post.get(path)
        if handler is not None and method != "POST" and path in self.shared:
            return None  # the app serves this path's other methods
        return handler

    def serves(self, path: str) -> bool:
        return path in self.post or path in self.get
