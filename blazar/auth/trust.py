"""What a client of the daemon trusts when it calls the daemon's own port (the CLI, and the
daemon itself for its doctor, bench and tune jobs)."""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["UnreadableCertificate", "pinned_context"]


class UnreadableCertificate(Exception):
    """The daemon's certificate file is missing or is not a PEM certificate."""


def pinned_context(tls_cert: str | None) -> ssl.SSLContext:
    """What a client of the daemon trusts: exactly the daemon's own certificate (from
    daemon.json), or nothing; ``UnreadableCertificate`` when its file cannot be read.

    A plain-HTTP daemon needs no CAs (httpx's default bundle costs a tenth of a second per
    client; a verifying context without CAs trusts no TLS peer). A TLS daemon's certificate
    is pinned: the file's first certificate is trusted as an anchor by itself, so a
    self-signed one works and a CA-issued leaf needs no chain; its names are not checked,
    since the CLI calls the address the daemon wrote, which a certificate made for a
    public name rarely carries."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls_cert is not None:
        context.check_hostname = False
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        try:
            # The leaf alone: a chain's intermediates as anchors would trust what else they issued.
            pem = Path(tls_cert).read_text()
            end = pem.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
            context.load_verify_locations(cadata=pem[pem.index("-----BEGIN CERTIFICATE-----") : end])
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise UnreadableCertificate(f"cannot read the daemon's certificate {tls_cert}: {exc}") from exc
    return context
