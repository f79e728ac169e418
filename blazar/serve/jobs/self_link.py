"""The daemon calling itself over HTTP, as a client would.

The model doctor and ``blazar bench`` judge what a client gets, so they send their
requests over a real connection to the daemon's own port (routing, admission, auth,
dialects and streaming all on the path), with the daemon's local token. The address is
known once the server listens: ``set_address`` is called then.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from quart_trio import QuartTrio

__all__ = ["SELF_LINK", "SelfLink", "link_of", "set_address"]

SELF_LINK = "BLAZAR_SELF_LINK"
"""The app config key that holds the ``SelfLink``."""


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
            from blazar.client import _trust

            verify = _trust(self.tls_cert)
        return httpx.AsyncClient(
            base_url=self.url,
            headers=self.headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            verify=verify,
        )


def link_of(app: QuartTrio) -> SelfLink:
    link = app.config.get(SELF_LINK)
    if not isinstance(link, SelfLink):
        link = SelfLink({})
        app.config[SELF_LINK] = link
    return link


def set_address(app: QuartTrio, url: str, tls_cert: str | None) -> None:
    link = link_of(app)
    link.url, link.tls_cert = url, tls_cert
