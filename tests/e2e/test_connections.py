"""The real daemon at its connection caps: unused connections give way to a working client.

With caps of 20 in all and 10 per address, sockets that never send a whole request head
(or idle keep-alive ones) must not lock anyone out: a new client is served at once and the
oldest such socket is closed. Only when every place is held by a request in flight is a new
client refused with ``503 TOO_MANY_CONNECTIONS``. The header and keep-alive timeouts are a
minute here, so no timer frees a place during a test: only shedding can. Any 127/8 address
reaches a loopback listener, so each test uses addresses of its own.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import DaemonProc, make_home, self_signed_cert, start_daemon

pytestmark = pytest.mark.slow

TOTAL = 20
PER_CLIENT = 10
HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
WAIT_S = 30.0
"""A generous bound on waiting for the daemon to act (close a socket, let one go)."""


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    config = (
        f"max_connections = {TOTAL}\nmax_connections_per_client = {PER_CLIENT}\n"
        "header_timeout_s = 60.0\nkeep_alive_timeout_s = 60.0\n"
    )
    daemon = start_daemon(make_home(tmp_path_factory.mktemp("caps") / "home", model_path, config=config))
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def port(capped: DaemonProc) -> Iterator[int]:
    """The daemon's port, once it holds no connection from an earlier test."""
    number = int(capped.url.rsplit(":", 1)[1])
    _wait_until(lambda: _held_by_daemon(number) == 0, "the daemon still holds earlier tests' connections")
    yield number


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _held_by_daemon(port: int) -> int:
    """The daemon's connected sockets on ``port`` (established, or closed by the client only)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in ("01", "08"):
                count += 1
    return count


def _connect(port: int, source: str, first: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    if first:
        sock.sendall(first)
    return sock


def _unused(port: int, source: str, n: int) -> list[socket.socket]:
    """``n`` connections from ``source`` that never finish a request head (every other one
    sends half of one), opened one after the other: the daemon admits them in that order."""
    return [_connect(port, source, HALF_HEAD if i % 2 else b"") for i in range(n)]


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer with a content length: its head and body."""
    sock.settimeout(WAIT_S)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the daemon closed the connection; it had sent {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    fields = dict(line.lower().split(b":", 1) for line in head.split(b"\r\n")[1:])
    length = int(fields[b"content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def _get(port: int, source: str, *, close: bool = True) -> tuple[socket.socket, bytes, bytes]:
    """``GET /health`` from ``source`` over a new connection: the socket, the head, the body."""
    sock = _connect(port, source)
    ending = b"Connection: close\r\n" if close else b""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + ending + b"\r\n")
    head, body = _read_answer(sock)
    return sock, head, body


def _served(port: int, source: str) -> bytes:
    """The status line of a normal client's request from ``source``, over a new connection."""
    sock, head, _ = _get(port, source)
    sock.close()
    return head.split(b"\r\n", 1)[0]


def _mid_request(port: int, source: str) -> socket.socket:
    """A connection whose request is in flight: its head is sent and the daemon has read it
    (it asked for the body with ``100 Continue``), its body never comes."""
    sock = _connect(
        port,
        source,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\nexpect: 100-continue\r\n\r\n",
    )
    sock.settimeout(WAIT_S)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 100"), got
    return sock


def _still_open(socks: list[socket.socket]) -> list[bool]:
    return [not _closed_by_server(s) for s in socks]


def _close_all(*groups: list[socket.socket] | list[ssl.SSLSocket]) -> None:
    for group in groups:
        for sock in group:
            sock.close()


def test_an_address_at_its_cap_of_unused_sockets_is_still_served(port: int) -> None:
    oldest = _unused(port, "127.0.0.11", 1)
    assert _served(port, "127.0.0.99").startswith(b"HTTP/1.1 200")  # the daemon has admitted it
    rest = _unused(port, "127.0.0.11", PER_CLIENT - 1)
    try:
        # The address holds its 10 places; its next client is served at once, not refused.
        assert _served(port, "127.0.0.11").startswith(b"HTTP/1.1 200")
        # The oldest unused socket gave way (closed, unanswered); the others are kept.
        _wait_until(lambda: _closed_by_server(oldest[0]), "the oldest unused socket is still open")
        assert _still_open(rest) == [True] * len(rest)
        # And again, once the address is back at its cap: the oldest remaining one goes.
        _wait_until(lambda: _held_by_daemon(port) == PER_CLIENT - 1, "the served client is still held")
        rest += _unused(port, "127.0.0.11", 1)
        assert _served(port, "127.0.0.11").startswith(b"HTTP/1.1 200")
        _wait_until(lambda: _closed_by_server(rest[0]), "the next oldest unused socket is still open")
        assert _still_open(rest[1:]) == [True] * (len(rest) - 1)
    finally:
        _close_all(oldest, rest)


def test_the_total_cap_filled_from_several_addresses_does_not_lock_out_a_client(port: int) -> None:
    sources = ("127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24")
    oldest = _unused(port, sources[0], 1)
    assert _served(port, "127.0.0.99").startswith(b"HTTP/1.1 200")
    rest = _unused(port, sources[0], 4)
    for source in sources[1:]:
        rest += _unused(port, source, 5)
    assert len(oldest + rest) == TOTAL
    try:
        # No address is at its own cap, but the daemon is at max_connections.
        assert _served(port, "127.0.0.30").startswith(b"HTTP/1.1 200")
        _wait_until(lambda: _closed_by_server(oldest[0]), "the oldest unused socket is still open")
        assert _still_open(rest) == [True] * len(rest)
        _wait_until(lambda: _held_by_daemon(port) == TOTAL - 1, "the served client is still held")
        rest += _unused(port, sources[-1], 1)
        assert _served(port, "127.0.0.31").startswith(b"HTTP/1.1 200")
        _wait_until(lambda: _closed_by_server(rest[0]), "the next oldest unused socket is still open")
    finally:
        _close_all(oldest, rest)


def test_idle_keep_alive_connections_give_way_only_after_unused_ones(port: int) -> None:
    source = "127.0.0.41"
    kept: list[socket.socket] = []
    busy: list[socket.socket] = []
    for _ in range(PER_CLIENT // 2):  # served once each, then idle between requests
        sock, head, _ = _get(port, source, close=False)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        kept.append(sock)
    fresh = _unused(port, source, PER_CLIENT // 2)
    assert _served(port, "127.0.0.99").startswith(b"HTTP/1.1 200")
    try:
        assert _served(port, source).startswith(b"HTTP/1.1 200")
        # The unused ones go first, although the idle ones are older.
        _wait_until(lambda: _closed_by_server(fresh[0]), "the oldest unused socket is still open")
        assert _still_open(kept) == [True] * len(kept)
        for sock in fresh[1:]:
            sock.close()  # no unused socket left: the idle ones are next, longest idle first
        _wait_until(lambda: _held_by_daemon(port) == len(kept), "the daemon still holds closed sockets")
        busy = [_mid_request(port, source) for _ in range(PER_CLIENT - len(kept))]
        assert _served(port, source).startswith(b"HTTP/1.1 200")
        _wait_until(lambda: _closed_by_server(kept[0]), "the longest-idle connection is still open")
        assert _still_open(kept[1:]) == [True] * (len(kept) - 1)
        assert _still_open(busy) == [True] * len(busy)
        # A kept connection still works for its client.
        kept[1].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_answer(kept[1])[0].startswith(b"HTTP/1.1 200")
    finally:
        _close_all(kept, fresh, busy)


def test_with_every_place_in_use_by_a_request_a_new_client_is_refused(port: int) -> None:
    first = [_mid_request(port, "127.0.0.51") for _ in range(PER_CLIENT)]
    second: list[socket.socket] = []
    try:
        sock, head, body = _get(port, "127.0.0.51")
        sock.close()
        assert head.startswith(b"HTTP/1.1 503") and b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["blazar_code"] == "TOO_MANY_CONNECTIONS"
        assert "max_connections_per_client" in error["message"]
        second = [_mid_request(port, "127.0.0.52") for _ in range(TOTAL - PER_CLIENT)]
        sock, head, body = _get(port, "127.0.0.53")
        sock.close()
        assert head.startswith(b"HTTP/1.1 503")
        error = json.loads(body)["error"]
        assert error["blazar_code"] == "TOO_MANY_CONNECTIONS"
        assert "(max_connections)" in error["message"]
        # No request in flight was cut to make room.
        assert _still_open(first + second) == [True] * TOTAL
    finally:
        _close_all(first, second)
    # Once they end, the places are free again.
    _wait_until(lambda: _held_by_daemon(port) == 0, "the daemon still holds the closed sockets")
    assert _served(port, "127.0.0.53").startswith(b"HTTP/1.1 200")


# -- over TLS: a connection is shed before, during or after its handshake -----------------------


@pytest.fixture(scope="module")
def capped_tls(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path
) -> Iterator[tuple[DaemonProc, Path]]:
    folder = tmp_path_factory.mktemp("caps-tls")
    cert, key = self_signed_cert(folder)
    config = (
        f'tls_cert = "{cert}"\ntls_key = "{key}"\nmax_connections = {TOTAL}\n'
        "max_connections_per_client = 3\nheader_timeout_s = 60.0\nkeep_alive_timeout_s = 60.0\n"
    )
    daemon = start_daemon(make_home(folder / "home", model_path, config=config))
    try:
        yield daemon, cert
    finally:
        daemon.stop()


def _tls_get(port: int, source: str, cert: Path) -> tuple[ssl.SSLSocket, bytes]:
    """``GET /health`` over a new TLS connection from ``source``, kept open: the socket, the head."""
    context = ssl.create_default_context(cafile=cert)
    sock = context.wrap_socket(_connect(port, source), server_hostname="127.0.0.1")
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, _ = _read_answer(sock)
    return sock, head


def _tls_closed_by_server(sock: ssl.SSLSocket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except ssl.SSLWantReadError:
        return False
    except (ConnectionResetError, ssl.SSLError):
        return True
    finally:
        sock.setblocking(True)


def test_tls_connections_give_way_too_and_the_daemon_serves_on(capped_tls: tuple[DaemonProc, Path]) -> None:
    daemon, cert = capped_tls
    port = int(daemon.url.rsplit(":", 1)[1])
    # Three connections that never start their handshake fill 127.0.0.61's places.
    silent = [_connect(port, "127.0.0.61")]
    _tls_get(port, "127.0.0.99", cert)[0].close()  # the daemon has admitted it
    silent += [_connect(port, "127.0.0.61") for _ in range(2)]
    # Three served TLS connections, idle between requests, fill 127.0.0.62's.
    kept = [_tls_get(port, "127.0.0.62", cert)[0] for _ in range(3)]
    newcomers: list[ssl.SSLSocket] = []
    try:
        sock, head = _tls_get(port, "127.0.0.61", cert)
        newcomers.append(sock)
        assert head.startswith(b"HTTP/1.1 200")
        _wait_until(lambda: _closed_by_server(silent[0]), "the oldest silent socket is still open")
        assert _still_open(silent[1:]) == [True, True]
        sock, head = _tls_get(port, "127.0.0.62", cert)
        newcomers.append(sock)
        assert head.startswith(b"HTTP/1.1 200")
        _wait_until(lambda: _tls_closed_by_server(kept[0]), "the longest-idle TLS connection is still open")
        assert [not _tls_closed_by_server(s) for s in kept[1:]] == [True, True]
        # Ending connections in and after their handshake did not harm the daemon.
        with httpx.Client(verify=ssl.create_default_context(cafile=cert), timeout=30) as http:
            assert http.get(f"{daemon.url}/health").status_code == 200
    finally:
        _close_all(silent, kept, newcomers)
