"""The CLI's side of the daemon: find it, start it in the background, call it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from blazar.auth.trust import UnreadableCertificate, pinned_context
from blazar.config import Config, Paths
from blazar.daemon.files import read_daemon_info, read_local_token

if TYPE_CHECKING:
    import httpx

__all__ = ["CliError", "Daemon", "ensure_daemon", "error_message", "find_daemon", "start_background"]

_START_TIMEOUT_S = 60.0
_POLL_S = 0.01
"""How often a new daemon's file is looked for: a read of one small file."""


class CliError(Exception):
    """A failure the CLI reports as one line (and a non-zero exit)."""


class Daemon:
    def __init__(
        self, url: str, pid: int | None, token: str | None = None, *, tls_cert: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.pid = pid
        import httpx  # only once a daemon runs: `blazar list` and `--help` never pay for it

        try:
            verify = pinned_context(tls_cert)
        except UnreadableCertificate as exc:
            raise CliError(str(exc)) from exc
        self.http = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(30.0, read=None),
            verify=verify,
            # The daemon's per-boot local token (run/local.token, readable by its owner only):
            # the CLI passes the auth step once API keys exist.
            headers={"authorization": f"Bearer {token}"} if token else None,
        )

    def _check(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            raise CliError(error_message(resp))
        return resp.json()

    def get(self, path: str) -> Any:
        return self._check(self.http.get(path))

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._check(self.http.post(path, json=body or {}))

    def delete(self, path: str, body: dict[str, Any] | None = None) -> Any:
        resp = self.http.request("DELETE", path, json=body)
        if resp.status_code >= 400:
            raise CliError(error_message(resp))
        return resp.json() if resp.content else None

    def stream_chat(self, body: dict[str, Any], *, headers: dict[str, str] | None = None) -> Iterator[str]:
        """Yield the text deltas of a streamed chat completion."""
        with self.http.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise CliError(error_message(resp))
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = msgspec.json.decode(line[6:])
                if "error" in event:
                    raise CliError(event["error"].get("message", "the stream failed"))
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text


def error_message(resp: httpx.Response) -> str:
    try:
        doc = resp.json()
        err = doc.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        return str(message or resp.text)
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"


def find_daemon(paths: Paths) -> Daemon | None:
    info = read_daemon_info(paths)
    if info is None:
        return None
    import httpx

    cert = info.get("tls_cert")
    daemon = Daemon(
        str(info["url"]), int(str(info["pid"])), read_local_token(paths), tls_cert=str(cert) if cert else None
    )
    try:
        daemon.http.get("/health", timeout=5.0)
    except httpx.HTTPError:
        return None
    return daemon


_STARTED: dict[str, subprocess.Popen[bytes]] = {}
"""The background daemons this process started and has not waited for yet, by daemon file."""


def start_background(paths: Paths, *, preload: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``blazar serve`` in the background (its own session, its output in
    ``logs/daemon.out``), loading ``preload`` while it boots; ``ensure_daemon`` waits for it."""
    Path(paths.log_dir).mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "blazar", "serve"]
    if preload is not None:
        argv.append(f"--preload={preload}")  # one token: a name may start with "-"
    with open(os.devnull, "rb") as devnull, open(Path(paths.log_dir) / "daemon.out", "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=devnull,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    _STARTED[paths.daemon_file] = proc
    return proc


def ensure_daemon(paths: Paths, config: Config, *, preload: str | None = None) -> tuple[Daemon, bool]:
    """The running daemon, or a new background one; the flag says this process started it
    (here, or before the command line was parsed: ``blazar.entry``).

    A new daemon given ``preload`` starts loading that model while it boots, so the
    engine's start overlaps the daemon's instead of following it."""
    proc = _STARTED.pop(paths.daemon_file, None)
    daemon = find_daemon(paths)
    if daemon is not None:
        return daemon, proc is not None and daemon.pid == proc.pid
    if proc is None:
        proc = start_background(paths, preload=preload)
        _STARTED.pop(paths.daemon_file, None)
    # Imported while the daemon starts, not once it answers: httpx's first transport imports
    # httpcore, and with it h2, anyio and trio (a tenth of a second), on the way to the request.
    import httpx

    httpx.HTTPTransport().close()

    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CliError(f"the background daemon exited with code {proc.returncode} — see `blazar logs`")
        daemon = find_daemon(paths)
        if daemon is not None:
            return daemon, True
        time.sleep(_POLL_S)
    raise CliError(
        f"the background daemon did not answer within {_START_TIMEOUT_S:.0f} s — see `blazar logs`"
    )
