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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def versioned_servers(*protocols: str) -> Iterator[dict[str, str]]:
    """``{protocol: url}`` for one server per revision, stopped on the way out. A synchronous
    context manager (for a fixture): it waits for other processes' ports, outside trio."""
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for protocol in protocols:
            port = _free_port()
            argv = [sys.executable, str(VERSIONED), "--http", str(port), "--protocol", protocol]
            procs[protocol] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL), port)
        deadline = time.monotonic() + 60
        for protocol, (proc, port) in procs.items():
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert proc.poll() is None, f"the {protocol} MCP server exited"
                    assert time.monotonic() < deadline, f"the {protocol} MCP server did not listen"
                    time.sleep(0.05)
        yield {protocol: f"http://127.0.0.1:{port}/mcp" for protocol, (_, port) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(10)
