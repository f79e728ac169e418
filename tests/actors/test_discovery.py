"""What a ``dns`` remote's name resolves to, asked of a nameserver the test controls."""

from __future__ import annotations

import pytest

from actors.config import Remote
from actors.discovery import Endpoint, LookupFailed, resolve, split_server
from tests.stub_dns import stub_dns


def test_a_plain_name_gives_each_address_on_the_remotes_port() -> None:
    with stub_dns() as dns:
        dns.records[("pool.test", "A")] = ["127.0.0.3", "127.0.0.2", "127.0.0.2"]
        dns.records[("pool.test", "AAAA")] = ["::1"]
        assert resolve("pool.test", port=11435, server=dns.server) == [
            Endpoint("127.0.0.2", 11435),
            Endpoint("127.0.0.3", 11435),
            Endpoint("::1", 11435),
        ]


def test_an_srv_name_gives_hosts_and_their_ports_with_or_without_additional_records() -> None:
    with stub_dns() as dns:
        dns.records[("_http._tcp.pool.test", "SRV")] = ["0 0 9001 a.pool.test.", "0 0 9002 b.other.test."]
        dns.records[("a.pool.test", "A")] = ["10.0.0.1"]  # carried in the SRV answer
        dns.records[("b.other.test", "A")] = ["10.0.0.2"]
        assert resolve("_http._tcp.pool.test", port=None, server=dns.server) == [
            Endpoint("10.0.0.1", 9001),
            Endpoint("10.0.0.2", 9002),
        ]
        # one SRV query; the additional section answered for both targets, nothing looked up again
        assert ("_http._tcp.pool.test", "SRV") in dns.queries
        assert ("a.pool.test", "A") not in dns.queries


def test_a_name_that_does_not_resolve_fails_the_lookup_instead_of_emptying_the_pool() -> None:
    with stub_dns() as dns:
        dns.records[("other.test", "A")] = ["10.0.0.9"]
        with pytest.raises(LookupFailed):
            resolve("gone.test", port=1, server=dns.server)
        with pytest.raises(LookupFailed):
            resolve("_x._tcp.gone.test", port=None, server=dns.server)


def test_the_system_resolver_still_answers_plain_names() -> None:
    assert Endpoint("127.0.0.1", 5) in resolve("localhost", port=5)


@pytest.mark.parametrize(
    ("server", "expected"),
    [("10.0.0.10", ("10.0.0.10", 53)), ("127.0.0.1:5353", ("127.0.0.1", 5353)), ("[::1]:53", ("::1", 53))],
)
def test_a_nameserver_is_host_and_optional_port(server: str, expected: tuple[str, int]) -> None:
    assert split_server(server) == expected


def test_an_srv_remote_needs_no_port_and_a_nameserver_needs_a_name() -> None:
    assert Remote(name="k", dns="_http._tcp.blazar-peers").port is None
    with pytest.raises(ValueError, match="dns needs port"):
        Remote(name="k", dns="blazar-peers")
    with pytest.raises(ValueError, match="dns_server goes with dns"):
        Remote(name="k", url="http://x:1", dns_server="10.0.0.10")
    with pytest.raises(ValueError, match="HOST or HOST:PORT"):
        Remote(name="k", dns="x", port=1, dns_server="10.0.0.10:x")
