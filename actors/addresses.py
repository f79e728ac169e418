"""Which addresses are this machine's own: the one rule for everything that binds or trusts one.

The gateway accepts keyless requests only on loopback, ``blazar keys`` and the daemon warn
when they are about to expose a port, and ``rpc-worker`` refuses to bind anything else.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """``localhost``, or an IPv4 or IPv6 loopback address (``[::1]`` bracketed or not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
