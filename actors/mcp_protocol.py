"""Which MCP protocol revision a server speaks, settled once per session, newest first.

Blazar speaks three revisions. The newest, 2026-07-28, is stateless: there is no
``initialize`` handshake and no ``Mcp-Session-Id``; the client asks ``server/discover``
and stamps the agreed version on every request. The two before it, 2025-11-25 and
2025-06-18, are reached through the ``initialize`` handshake: the client offers its
newest handshake revision and the server answers with the one it will speak.

The order follows the official SDK's connect policy (``mcp.client._probe``): probe
``server/discover`` at 2026-07-28 first; anything that is not positive evidence of a
2026 server (an error reply, a bare HTTP 4xx the transport turns into one, a discover
answer that lists no 2026 version) falls back to ``initialize``. Only two answers end
the negotiation without a handshake: ``-32022`` (unsupported protocol version) naming
versions none of which Blazar speaks, and, from the handshake, a version outside
Blazar's three. Both are ``McpProtocolUnsupported``, whose message names what was
tried and what the server offered. A transport failure is not a verdict: it propagates
as the start's failure.

The verdicts are pure functions (``after_discover_error``, ``after_discover``,
``after_handshake``); ``negotiate`` drives them over the SDK's public ``ClientSession``
calls (``send_discover``, ``adopt``, ``initialize``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from actors.errors import BlazarRuntimeError

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = [
    "HANDSHAKE_VERSIONS",
    "MODERN_VERSION",
    "PROTOCOL_VERSIONS",
    "McpProtocolUnsupported",
    "after_discover",
    "after_discover_error",
    "after_handshake",
    "negotiate",
    "unsupported_text",
]

MODERN_VERSION = "2026-07-28"
"""The stateless revision: ``server/discover``, no handshake, no session."""
HANDSHAKE_VERSIONS: tuple[str, ...] = ("2025-11-25", "2025-06-18")
"""The handshake revisions Blazar accepts, newest first (it offers the first)."""
PROTOCOL_VERSIONS: tuple[str, ...] = (MODERN_VERSION, *HANDSHAKE_VERSIONS)
"""Every revision Blazar speaks, newest first: the order it tries them in."""

_UNSUPPORTED_PROTOCOL_VERSION = -32022  # the JSON-RPC code of the 2026 revision (and the SDK)

Verdict = Literal["adopt", "initialize", "refuse"]


class McpProtocolUnsupported(BlazarRuntimeError):
    """An MCP server speaks none of the protocol revisions Blazar does."""

    code = "MCP_PROTOCOL_UNSUPPORTED"


def unsupported_text(offered: Sequence[str], tried: Sequence[str]) -> str:
    """The error of a server that speaks none of ``PROTOCOL_VERSIONS``: what it offered,
    what Blazar speaks, and each step that was tried."""
    theirs = ", ".join(offered) if offered else "no version it named"
    ours = ", ".join(PROTOCOL_VERSIONS)
    steps = "; ".join(tried)
    return (
        f"the server speaks MCP protocol {theirs}, and Blazar speaks {ours} (tried: {steps}) — "
        "upgrade the server, or use one that speaks one of these"
    )


def after_discover_error(code: int, supported: Sequence[str] | None) -> Verdict:
    """What to do when ``server/discover`` got an error: ``refuse`` only for a -32022 that
    names versions none of which Blazar speaks; every other error means a server from
    before 2026, which the handshake may still reach."""
    if code == _UNSUPPORTED_PROTOCOL_VERSION and supported is not None:
        return "initialize" if any(v in PROTOCOL_VERSIONS for v in supported) else "refuse"
    return "initialize"


def after_discover(supported: Sequence[str]) -> Verdict:
    """A discover answer is a 2026 server only when it lists 2026-07-28; one that lists
    only handshake revisions advertises a handshake server (the SDK reads it so too)."""
    return "adopt" if MODERN_VERSION in supported else "initialize"


def after_handshake(version: str) -> Verdict:
    """The handshake's answer is spoken here only when it is one of ``HANDSHAKE_VERSIONS``."""
    return "adopt" if version in HANDSHAKE_VERSIONS else "refuse"


def _supported(data: Any) -> list[str] | None:
    if isinstance(data, dict) and isinstance(listed := data.get("supported"), list):
        return [str(v) for v in listed]
    return None


async def negotiate(session: ClientSession) -> str:
    """Settle ``session``'s protocol revision, newest first, and return it; raises
    ``McpProtocolUnsupported`` for a server that speaks none of ``PROTOCOL_VERSIONS``."""
    import mcp.types as mt
    from mcp.shared.exceptions import MCPError

    tried: list[str] = []
    for attempt in range(2):
        try:
            raw = await session.send_discover(MODERN_VERSION)
        except MCPError as exc:
            supported = _supported(exc.error.data)
            tried.append(f"server/discover at {MODERN_VERSION}: {exc.message}")
            if after_discover_error(exc.code, supported) == "refuse":
                raise McpProtocolUnsupported(unsupported_text(supported or [], tried)) from None
        else:
            try:
                result = mt.DiscoverResult.model_validate(raw)
            except ValueError:  # the SDK's model check (pydantic's ValidationError is one)
                tried.append(f"server/discover at {MODERN_VERSION}: an answer that is not a discover result")
            else:
                if after_discover(result.supported_versions) == "adopt":
                    session.adopt(result)
                    return MODERN_VERSION
                listed = ", ".join(result.supported_versions)
                tried.append(f"server/discover at {MODERN_VERSION}: the server lists {listed}")
        offer = f"initialize offering {HANDSHAKE_VERSIONS[0]}"
        try:
            init = await session.initialize()
        except MCPError as exc:
            supported = _supported(exc.error.data)
            if exc.code != _UNSUPPORTED_PROTOCOL_VERSION or supported is None:
                raise
            tried.append(f"{offer}: {exc.message}")
            if MODERN_VERSION in supported and attempt == 0:
                # A discover that timed out here but reached a slow server has made it a
                # 2026 connection, which now refuses the handshake: ask discover once more.
                continue
            raise McpProtocolUnsupported(unsupported_text(supported, tried)) from None
        except RuntimeError as exc:  # the SDK refuses a handshake answer it cannot speak
            tried.append(f"{offer}: {exc}")
            raise McpProtocolUnsupported(unsupported_text([], tried)) from None
        if after_handshake(init.protocol_version) == "refuse":
            tried.append(f"{offer}: the server answered {init.protocol_version}")
            raise McpProtocolUnsupported(unsupported_text([init.protocol_version], tried))
        return init.protocol_version
    raise McpProtocolUnsupported(unsupported_text([], tried))
