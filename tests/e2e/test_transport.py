"""The real daemon's transport: TLS (HTTP/1.1 and HTTP/2) with a certificate made here, and
slow or idle clients that must not hold it (header timeout, connection caps, head size)."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, make_home, self_signed_cert, start_daemon

pytestmark = pytest.mark.slow


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_daemon(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path
) -> Iterator[tuple[DaemonProc, Path]]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = self_signed_cert(folder)
    home = make_home(folder / "home", model_path, config=f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    daemon = start_daemon(home)
    try:
        yield daemon, cert
    finally:
        daemon.stop()


def test_the_daemon_serves_tls_to_the_openai_client(tls_daemon: tuple[DaemonProc, Path]) -> None:
    daemon, cert = tls_daemon
    assert daemon.url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=ssl.create_default_context(cafile=cert)) as http:
        client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", http_client=http, max_retries=0)
        assert [m.id for m in client.models.list()] == [MODEL]
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert r.choices[0].message.content is not None and r.usage is not None


def test_http2_over_tls(tls_daemon: tuple[DaemonProc, Path]) -> None:
    daemon, cert = tls_daemon
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=cert), timeout=30) as http:
        r = http.get(f"{daemon.url}/v1/models")
        assert (r.http_version, r.status_code) == ("HTTP/2", 200)
        assert r.headers["x-blazar-trace-id"].startswith("blz-")
        assert [m["id"] for m in r.json()["data"]] == [MODEL]


def test_plain_http_is_not_answered_on_a_tls_port(tls_daemon: tuple[DaemonProc, Path]) -> None:
    daemon, _ = tls_daemon
    with pytest.raises(httpx.HTTPError):
        httpx.get(daemon.url.replace("https://", "http://") + "/health", timeout=10)


def test_an_unknown_certificate_is_not_trusted(tls_daemon: tuple[DaemonProc, Path]) -> None:
    daemon, _ = tls_daemon
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{daemon.url}/health", timeout=10)  # the system's CAs never issued it


def test_the_cli_works_against_a_tls_daemon(tls_daemon: tuple[DaemonProc, Path]) -> None:
    daemon, cert = tls_daemon
    info = json.loads((daemon.home / "run" / "daemon.json").read_text())
    assert info["url"] == daemon.url and info["tls_cert"] == str(cert.resolve())
    out = daemon.cli("ps", "--json")
    assert json.loads(out.stdout)["daemon"]["url"] == daemon.url


# -- slow and idle clients --------------------------------------------------------------------

HEADER_TIMEOUT_S = 2.0
PER_CLIENT = 150
HELD_PER_ADDRESS = 100
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    config = (
        f"header_timeout_s = {HEADER_TIMEOUT_S}\nmax_connections = 600\n"
        f"max_connections_per_client = {PER_CLIENT}\nmax_header_kb = 16\n"
    )
    daemon = start_daemon(make_home(tmp_path_factory.mktemp("conn") / "home", model_path, config=config))
    try:
        yield daemon
    finally:
        daemon.stop()


def _port(daemon: DaemonProc) -> int:
    return int(daemon.url.rsplit(":", 1)[1])


def _connect(daemon: DaemonProc, source: str) -> socket.socket:
    """A connection from ``source`` (any 127/8 address reaches a loopback listener)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", _port(daemon)))
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has ended the connection (EOF or reset); False while it holds it."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_and_half_header_connections_are_closed_and_others_served(guarded: DaemonProc) -> None:
    held: list[socket.socket] = []
    try:
        for source in ADDRESSES:
            for i in range(HELD_PER_ADDRESS):
                sock = _connect(guarded, source)
                if i % 2:  # half a head: a request line and part of a header, never finished
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                held.append(sock)
        # Meanwhile a client from another address is served as usual, over new connections.
        with httpx.Client(base_url=guarded.url, timeout=30) as http:
            for _ in range(3):
                assert http.get("/health").status_code == 200
        client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == [MODEL]
        # Every held connection is closed by the daemon: polled, with a generous bound.
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 60
        open_ = list(held)
        while open_ and time.monotonic() < deadline:
            open_ = [s for s in open_ if not _closed_by_server(s)]
            time.sleep(0.1)
        assert open_ == [], f"{len(open_)} of {len(held)} slow connections are still open"
        # And the daemon serves on.
        assert httpx.get(f"{guarded.url}/health", timeout=30).status_code == 200
    finally:
        for sock in held:
            sock.close()


def _mid_request(daemon: DaemonProc, source: str) -> socket.socket:
    """A connection whose request is in flight (the daemon read its head and asked for the
    body with ``100 Continue``; the body never comes): it cannot be closed to make room."""
    sock = _connect(daemon, source)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\nexpect: 100-continue\r\n\r\n"
    )
    sock.settimeout(30)
    got = b""
    while b"\r\n\r\n" not in got and (chunk := sock.recv(4096)):
        got += chunk
    assert got.startswith(b"HTTP/1.1 100"), got
    return sock


def test_the_per_client_cap_refuses_cleanly(guarded: DaemonProc) -> None:
    # Connections that hold no request would give way to a new one (tests/e2e/test_connections.py):
    # the address's places are all taken by requests in flight.
    held = [_mid_request(guarded, "127.0.0.5") for _ in range(PER_CLIENT)]
    try:
        extra = _connect(guarded, "127.0.0.5")
        extra.settimeout(30)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while chunk := extra.recv(4096):
            answer += chunk
        extra.close()
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["blazar_code"] == "TOO_MANY_CONNECTIONS"
        assert "max_connections_per_client" in error["message"]
        # Another address is not affected by this one's cap.
        assert httpx.get(f"{guarded.url}/health", timeout=30).status_code == 200
    finally:
        for sock in held:
            sock.close()
    # Once they are gone, the address is served again (the count goes down as they close).
    deadline = time.monotonic() + 60
    while True:
        sock = _connect(guarded, "127.0.0.5")
        sock.settimeout(30)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        first = sock.recv(64)
        sock.close()
        if first.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert first.startswith(b"HTTP/1.1 200"), first


def test_an_oversized_head_is_refused_with_431(guarded: DaemonProc) -> None:
    # Larger than max_header_kb (16) and than one read (64 KiB): the parser sees it incomplete.
    r = httpx.get(f"{guarded.url}/health", headers={"x-big": "a" * 100_000}, timeout=30)
    assert r.status_code == 431
    assert r.json()["error"]["blazar_code"] == "HEADERS_TOO_LARGE"
    assert "max_header_kb" in r.json()["error"]["message"]
    assert httpx.get(f"{guarded.url}/health", headers={"x-ok": "a" * 8000}, timeout=30).status_code == 200


@pytest.mark.parametrize("piece", [None, 4096], ids=["one write", "4 KiB pieces"])
def test_a_head_over_the_limit_is_431_however_it_arrives(guarded: DaemonProc, piece: int | None) -> None:
    """A 20 KiB head against max_header_kb = 16, under one read (64 KiB): hypercorn's parser
    bounds only an incomplete head, so the gateway measures the whole one itself."""
    host, port = guarded.url.removeprefix("http://").split(":")
    head = f"GET /health HTTP/1.1\r\nHost: {host}\r\nx-big: {'a' * 20_000}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        if piece is None:
            sock.sendall(head)
        else:
            for i in range(0, len(head), piece):
                sock.sendall(head[i : i + piece])
                time.sleep(0.01)
        answer = b""
        while b"HEADERS_TOO_LARGE" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b"HEADERS_TOO_LARGE" in answer


def _close_wait(port: int) -> int:
    """The daemon's sockets on ``port`` whose client has closed but which it has not (CLOSE-WAIT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "08":
                count += 1
    return count


def test_a_client_that_hangs_up_between_requests_is_let_go_at_once(guarded: DaemonProc) -> None:
    """A keep-alive connection whose client closes it after a request is closed by the daemon
    too, not held half-open until keep_alive_timeout_s (75 s here) ends its idle timer."""
    port = _port(guarded)
    socks = []
    for i in range(40):
        sock = _connect(guarded, f"127.0.0.{5 + i % 3}")
        body = b'{"model": "no-such-model", "messages": []}'
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)  # one of the gateway's own routes, answered at once
        assert sock.recv(4096).startswith(b"HTTP/1.1 4")
        socks.append(sock)
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 20
    while _close_wait(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _close_wait(port) == 0
    assert httpx.get(f"{guarded.url}/health", timeout=10).status_code == 200


def test_http2_by_prior_knowledge_on_the_plain_port_is_handed_to_hypercorn(guarded: DaemonProc) -> None:
    """The daemon's own HTTP/1.1 server hands a connection that opens with HTTP/2's preface to
    hypercorn, with what it read of it: the client speaks HTTP/2 to the end, and an
    HTTP/1.1 client beside it is served by the daemon's server."""
    with httpx.Client(http1=False, http2=True, timeout=30) as h2:
        health = h2.get(f"{guarded.url}/health")
        models = h2.get(f"{guarded.url}/v1/models")
    assert (health.http_version, health.status_code) == ("HTTP/2", 200)
    assert (models.http_version, models.status_code) == ("HTTP/2", 200)
    assert models.json()["object"] == "list"
    plain = httpx.get(f"{guarded.url}/health", timeout=10)
    assert (plain.http_version, plain.status_code) == ("HTTP/1.1", 200)
    assert "date" in plain.headers
