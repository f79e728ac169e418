"""Start real MCP servers for a test: ``versioned_server.py`` over Streamable HTTP, one
subprocess per protocol revision, side by side, each on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VERSIONED = Path(__file__).resolve().parent / "versioned_server.py"


@contextmanager
def versioned_servers(*protocols: str) -> Iterator[dict[str, str]]:
    """``{protocol: url}`` for one server per revision, stopped on the way out. Each serves on
    a socket bound and listening here and handed to it, so no other process can take its port
    between choosing and binding it (with ports chosen first, two servers once met on one and
    a test spoke to the wrong revision). A synchronous context manager (for a fixture)."""
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for protocol in protocols:
            with socket.socket() as listener:
                listener.bind(("127.0.0.1", 0))
                listener.listen(64)
                fd = listener.fileno()
                argv = [sys.executable, str(VERSIONED), "--fd", str(fd), "--protocol", protocol]
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, pass_fds=(fd,))
                procs[protocol] = (proc, int(listener.getsockname()[1]))
        deadline = time.monotonic() + 60
        for protocol, (proc, port) in procs.items():
            while not _answers(port):  # the socket listens already: wait for the server itself
                assert proc.poll() is None, f"the {protocol} MCP server exited"
                assert time.monotonic() < deadline, f"the {protocol} MCP server did not answer"
                time.sleep(0.05)
        yield {protocol: f"http://127.0.0.1:{port}/mcp" for protocol, (_, port) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(10)


def _answers(port: int) -> bool:
    """Whether an HTTP request to ``port`` gets an answer (any status)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return conn.recv(16).startswith(b"HTTP/")
    except OSError:
        return False
