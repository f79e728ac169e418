"""The daemon calling itself over HTTP, as a client would.

The model doctor and ``blazar bench`` judge what a client gets, so they send their
requests over a real connection to the daemon's own port (routing, admission, auth,
dialects and streaming all on the path), with the daemon's local token. The address is
known once the server listens: the HTTP layer sets it then (``blazar.web.app.set_address``).
"""

from __future__ import annotations

import ssl

import httpx

from blazar.auth.trust import pinned_context

__all__ = ["SelfLink"]


class SelfLink:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.url: str | None = None
        self.tls_cert: str | None = None

    def client(self, *, timeout_s: float = 300.0) -> httpx.AsyncClient:
        """A client of the daemon's own port; raises RuntimeError while it does not listen."""
        if self.url is None:
            raise RuntimeError("the daemon does not listen yet: try again once it has started")
        verify: ssl.SSLContext | bool = True
        if self.tls_cert is not None:
            verify = pinned_context(self.tls_cert)
        return httpx.AsyncClient(
            base_url=self.url,
            headers=self.headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            verify=verify,
        )
