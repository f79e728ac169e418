"""A request's context (``serve.context.Ask``), read from its HTTP headers once.

The service layer never reads headers: what they say about the request's claim (tier,
deadline, keep-alive, lane), its strictness, its approvals and who it is for admission's
fairness is read here, when a route first asks for it, and kept on the ``Call``.
"""

from __future__ import annotations

import trio

from actors.scheduling import Tier, class_name, parse_class, parse_tier
from blazar.auth.keys import LOCAL_NAME
from blazar.errors import BlazarError
from blazar.serve.context import APPROVE_HEADER, Ask
from blazar.serve.mcp_compact import CATALOG_HEADER, parse_catalog
from blazar.serve.policy.certified import CERTIFYING
from blazar.serve.policy.honesty import STRICT_HEADER, truthy
from blazar.web.asgi.auth import presented_secret, secret_tag
from blazar.web.asgi.call import Call, current
from blazar.web.asgi.replies import keep_alive_header, requested_lane

__all__ = ["approvals", "ask_of", "current_ask"]


def approvals(raw: str | None) -> frozenset[str]:
    """The tools an ``x-blazar-mcp-approve`` value names."""
    return frozenset(a.strip() for a in (raw or "").split(",") if a.strip())


def _client_key(call: Call) -> str:
    """Who a request is, for admission's per-client fairness: its key's name; never a secret
    (a bearer token that is no key counts by a hash of it)."""
    headers = call.headers
    if call.key is not None:
        if call.key != LOCAL_NAME:  # the local token: the CLI, keyless batch items — told apart below
            return "key:" + call.key
    elif (secret := presented_secret(headers)) is not None:
        return "tok:" + secret_tag(secret)
    if client := headers.get("x-blazar-client"):
        return "client:" + client
    return f"addr:{call.client or '?'}"


def _deadline_s(call: Call) -> float | None:
    raw = call.headers.get("x-blazar-deadline-ms")
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise BlazarError(
            "BAD_REQUEST", f"X-Blazar-Deadline-Ms must be a number of milliseconds, got {raw!r}"
        ) from None
    if ms <= 0:
        raise BlazarError("BAD_REQUEST", "X-Blazar-Deadline-Ms must be positive")
    return trio.current_time() + ms / 1000


CLASS_HEADER = "x-blazar-class"


def request_tier(call: Call) -> Tier:
    """The request's admission class: ``X-Blazar-Class`` (interactive, default, batch,
    background), else ``X-Blazar-Priority`` (high: interactive, low: batch), else default;
    capped by the key's ``class:`` scope: a class the request names above the cap is
    refused (403 ``CLASS_NOT_ALLOWED``), one it does not name is lowered to the cap."""
    headers = call.headers
    named: Tier | None = None
    if (raw := headers.get(CLASS_HEADER)) is not None:
        named = parse_class(raw)
        if named is None:
            raise BlazarError(
                "BAD_REQUEST",
                f"X-Blazar-Class must be interactive, default, batch or background, got {raw!r}",
            )
    elif (priority := headers.get("x-blazar-priority")) is not None:
        named = parse_tier(priority)
    grant = call.grant
    cap_name = grant.max_class if grant is not None else None
    if grant is None or cap_name is None:
        return named if named is not None else Tier.NORMAL
    cap = parse_class(cap_name) or Tier.NORMAL
    if named is None:
        return max(cap, Tier.NORMAL)
    if named < cap:
        raise BlazarError(
            "CLASS_NOT_ALLOWED",
            f"API key {grant.name!r} may ask for the {class_name(cap)} class or a less urgent one,"
            f" not {class_name(named)} — drop X-Blazar-Class/X-Blazar-Priority or use another key",
        )
    return named


def ask_of(call: Call) -> Ask:
    """``call``'s context, read from its headers the first time it is asked for."""
    if call.asked is None:
        headers = call.headers
        keep = headers.get("x-blazar-keep-alive")
        tier = request_tier(call)
        if call.card is not None:
            call.card.request_class = class_name(tier)
        call.asked = Ask(
            client=_client_key(call),
            grant=call.grant,
            tier=tier,
            deadline_s=_deadline_s(call),
            keep_alive_s=keep_alive_header(keep) if keep else None,
            lane=requested_lane(headers),
            strict=truthy(headers.get(STRICT_HEADER)),
            certifying=call.key == LOCAL_NAME and headers.get(CERTIFYING) == "1",
            approved=approvals(headers.get(APPROVE_HEADER)),
            mcp_catalog=parse_catalog(headers.get(CATALOG_HEADER)),
            card=call.card,
        )
    return call.asked


def current_ask() -> Ask:
    """The context of the request this task serves (for the framework's routes)."""
    return ask_of(current())
