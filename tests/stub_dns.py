"""A DNS server the tests control: UDP on loopback, answering from a dict they may change.

``records`` maps ``(name, type)`` to the record texts (``"127.0.0.2"`` for A,
``"0 0 8080 b.pool.test."`` for SRV); an SRV answer carries the A records of its targets in
the additional section when the stub has them, as a Kubernetes DNS server does. A name with
no record of any type is NXDOMAIN; a known name without the type asked is an empty answer.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class StubDns:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[str]] = {}
        self.queries: list[tuple[str, str]] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()

    @property
    def server(self) -> str:
        """What ``[[remotes]] dns_server`` takes."""
        return f"127.0.0.1:{self.port}"

    def _rrset(self, name: str, rdtype: str) -> dns.rrset.RRset | None:
        texts = self.records.get((name.rstrip("."), rdtype))
        if not texts:
            return None
        return dns.rrset.from_text_list(dns.name.from_text(name), 5, dns.rdataclass.IN, rdtype, texts)

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True)
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype))
        if not any(n == name for n, _ in self.records):
            reply.set_rcode(dns.rcode.NXDOMAIN)
            return reply
        rrset = self._rrset(name, rdtype)
        if rrset is not None:
            reply.answer.append(rrset)
            if rdtype == "SRV":
                for rr in rrset:
                    extra = self._rrset(rr.target.to_text(), "A")
                    if extra is not None:
                        reply.additional.append(extra)
        return reply

    def serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self._sock.sendto(self.answer(dns.message.from_wire(data)).to_wire(), peer)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@contextmanager
def stub_dns() -> Iterator[StubDns]:
    stub = StubDns()
    thread = threading.Thread(target=stub.serve, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.close()
        thread.join(timeout=2)
