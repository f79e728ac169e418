"""Who is behind a ``[[remotes]] dns`` name: the addresses (and ports) its records give.

Two kinds of name (docs/federation.md):

- a plain name (``blazar-peers.pool.svc.cluster.local``): its A/AAAA records are the peers,
  each on the remote's ``port``;
- an SRV name, which starts with ``_`` (``_http._tcp.blazar-peers.pool.svc.cluster.local``):
  each record names a host and its port, and the host's addresses are the peers (the answer's
  additional section is read first, then the host is looked up).

Without ``dns_server`` a plain name goes through the system's resolver (``getaddrinfo``, so
``/etc/hosts`` counts) and an SRV name through dnspython with the system's ``resolv.conf``.
With ``dns_server = "HOST[:PORT]"`` both ask that server only, which is how a test (or a
sidecar resolver) controls the answer. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import dns.message
    import dns.resolver

__all__ = ["Endpoint", "LookupFailed", "is_srv", "resolve", "split_server"]


class Endpoint(NamedTuple):
    address: str
    port: int


class LookupFailed(Exception):
    """The name could not be resolved this time (the peers found before are kept)."""


def is_srv(name: str) -> bool:
    return name.startswith("_")


def split_server(server: str) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT`` or ``[V6]:PORT`` → (host, port); port 53 by default."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else 53
    if server.count(":") == 1:
        host, _, port = server.partition(":")
        return host, int(port)
    return server, 53


def _resolver(server: str | None) -> dns.resolver.Resolver:
    import dns.resolver

    if server is None:
        return dns.resolver.Resolver()
    resolver = dns.resolver.Resolver(configure=False)
    host, port = split_server(server)
    resolver.nameservers = [host]
    resolver.port = port
    return resolver


def _addresses(resolver: dns.resolver.Resolver, host: str, known: dict[str, list[str]]) -> list[str]:
    import dns.resolver

    if host in known:
        return known[host]
    found: list[str] = []
    for rdtype in ("A", "AAAA"):
        try:
            answer = resolver.resolve(host, rdtype, search=False)
        except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            continue
        found += [rr.to_text() for rr in answer]
    return found


def _additional(response: dns.message.Message) -> dict[str, list[str]]:
    """The A/AAAA records an SRV answer carried along: host → addresses."""
    import dns.rdatatype
    import dns.rrset

    known: dict[str, list[str]] = {}
    for rrset in response.additional:
        assert isinstance(rrset, dns.rrset.RRset)
        if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            known.setdefault(rrset.name.to_text(omit_final_dot=True), []).extend(rr.to_text() for rr in rrset)
    return known


def resolve(name: str, *, port: int | None, server: str | None = None) -> list[Endpoint]:
    """The endpoints behind ``name``, sorted and without repeats. dnspython is imported here,
    not with the module: a daemon without a ``dns`` remote never pays its 0.2 s."""
    import dns.exception

    try:
        if is_srv(name):
            resolver = _resolver(server)
            answer = resolver.resolve(name, "SRV", search=False)
            assert answer.response is not None
            known = _additional(answer.response)
            endpoints = {
                Endpoint(address, int(rr.port))
                for rr in answer
                for address in _addresses(resolver, rr.target.to_text(omit_final_dot=True), known)
            }
        else:
            assert port is not None, "a plain name needs the remote's port"
            if server is None:
                infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
                addresses = [str(info[4][0]) for info in infos]
            else:
                addresses = _addresses(_resolver(server), name, {})
                if not addresses:
                    raise LookupFailed(f"{name} has no A or AAAA record")
            endpoints = {Endpoint(a, port) for a in addresses}
    except (OSError, dns.exception.DNSException) as exc:
        raise LookupFailed(str(exc) or type(exc).__name__) from exc
    return sorted(endpoints)
