"""``run/daemon.json``: where a running daemon says it listens.

The daemon writes it once it listens and removes it when it stops; the CLI reads
it to find the daemon. A leaf module, so that finding the daemon costs the CLI no
import of the gateway.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from blazar.config import Paths
from registry.files import atomic_write

__all__ = [
    "read_daemon_info",
    "read_local_token",
    "remove_daemon_info",
    "remove_local_token",
    "write_daemon_info",
    "write_local_token",
]


def read_daemon_info(paths: Paths) -> dict[str, object] | None:
    """The running daemon's pid and URL, or None when none runs."""
    try:
        info = json.loads(Path(paths.daemon_file).read_text())
        pid = int(info["pid"])
        if pid == os.getpid():
            # A file left by a daemon that was killed, naming the pid this process now has: in
            # a container restarted on the same volume, pids repeat from one boot to the next.
            return None
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return dict(info)


def write_daemon_info(paths: Paths, host: str, port: int, *, tls_cert: str | None = None) -> None:
    """``tls_cert``: the daemon serves HTTPS with this certificate, which the CLI then trusts."""
    display_host = f"[{host}]" if ":" in host else host
    scheme = "http" if tls_cert is None else "https"
    info: dict[str, object] = {
        "pid": os.getpid(),
        "host": host,
        "port": port,
        "url": f"{scheme}://{display_host}:{port}",
    }
    if tls_cert is not None:
        info["tls_cert"] = str(Path(tls_cert).expanduser().resolve())
    # Atomic (the CLI never reads half of it) but not fsynced: it describes this boot only.
    atomic_write(paths.daemon_file, json.dumps(info), durable=False)


def remove_daemon_info(paths: Paths) -> None:
    """Remove the file if this process wrote it (a newer daemon's file stays)."""
    path = Path(paths.daemon_file)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


LOCAL_TOKEN_FILE = "local.token"
"""In the run dir: the per-boot token the CLI on this machine authenticates with."""


def write_local_token(run_dir: str, token: str) -> Path:
    """Write the token readable by its owner alone (0600), atomically."""
    path = Path(run_dir) / LOCAL_TOKEN_FILE
    atomic_write(path, token, mode=0o600, durable=False)  # a new token each boot
    return path


def read_local_token(paths: Paths) -> str | None:
    try:
        return (Path(paths.run_dir) / LOCAL_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def remove_local_token(run_dir: str, token: str) -> None:
    """Remove the token file if it still holds ``token`` (a newer daemon's stays)."""
    path = Path(run_dir) / LOCAL_TOKEN_FILE
    try:
        if path.read_text().strip() == token:
            path.unlink()
    except OSError:
        pass
