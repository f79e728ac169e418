"""The host guard: on a loopback-bound daemon, only local names and local origins may call.

A daemon on 127.0.0.1 trusts whoever can reach the port, which is this machine. A web page
in a browser on the same machine can reach it too, and so can a page whose DNS name was
rebound to 127.0.0.1; the first sends an ``Origin``, the second a foreign ``Host``. Either
is refused with ``HOST_FORBIDDEN`` (403). Origins that ``cors_origins`` grants may call,
but their ``Host`` must still be local.

It runs first, before the key step: a page must not get to try keys, nor wait for a key's
place, and a refused request gets no CORS grant whatever its ``Origin``. It is off on a
non-loopback bind (``applies_to``), where keys are the barrier.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from blazar.errors import BlazarError
from blazar.web.middleware.cors import LOOPBACK_NAMES, CorsPolicy, host_name, local_origin

__all__ = ["HostGuard"]


class HostGuard:
    """A daemon bound to loopback answers only local names and local origins: a web
    page (which sends ``Origin``) or a DNS-rebound name must not drive it. Origins that
    ``cors`` grants (``cors_origins``) may call; their ``Host`` must still be local."""

    def __init__(self, allowed_hosts: Iterable[str] = (), cors: CorsPolicy | None = None) -> None:
        self.allowed = LOOPBACK_NAMES | {h.lower() for h in allowed_hosts}
        self.cors = cors

    @staticmethod
    def applies_to(bind_host: str) -> bool:
        return bind_host in LOOPBACK_NAMES or bind_host.startswith("127.")

    def refusal(self, headers: Mapping[str, str]) -> BlazarError | None:
        host = host_name(headers.get("host", "").strip().lower())
        if host and host not in self.allowed:
            return BlazarError(
                "HOST_FORBIDDEN",
                f"Host '{host}' is not allowed on a loopback-bound daemon; call it as 127.0.0.1 or "
                "localhost, or add the name to `allowed_hosts` in config.toml",
            )
        origin = headers.get("origin")
        if origin and not local_origin(origin) and not (self.cors is not None and self.cors.grants(origin)):
            return BlazarError(
                "HOST_FORBIDDEN",
                f"requests from the web origin {origin} are refused: only local clients may call "
                "(an operator can list the origin in `cors_origins` in config.toml)",
            )
        return None
