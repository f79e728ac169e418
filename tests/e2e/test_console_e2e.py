"""The console's read model on the real daemon: ``/api/console/snapshot`` after requests in all
three dialects from the official clients, a live card while a stream runs, the SSE stream, its
end when the client goes and when the daemon stops, the key scopes, and ``blazar watch``
(``--once --json``, and the live view in a real 80x24 terminal under tmux)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support import MODEL, DaemonProc, home_env, make_home, start_daemon

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi"}]
SNAPSHOT_KEYS = {
    "time",
    "version",
    "viewer",
    "models",
    "requests",
    "recent",
    "rates",
    "series",
    "quantiles",
    "jobs",
    "memory",
    "classes",
    "peers",
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    d = start_daemon(make_home(tmp_path_factory.mktemp("console") / "home", model_path))
    try:
        yield d
    finally:
        d.stop()


def snapshot(d: DaemonProc, **headers: str) -> dict[str, Any]:
    resp = httpx.get(f"{d.url}/api/console/snapshot", headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


def until(check: Any, what: str, timeout_s: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy (a bound on a hang, not a timing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen in {timeout_s:.0f} s")


def test_snapshot_after_requests_in_three_dialects(daemon: DaemonProc) -> None:
    oa = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    oa.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    ollama.Client(host=daemon.url).chat(model=MODEL, messages=HI, options={"num_predict": 4})
    an = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    an.messages.create(model=MODEL, max_tokens=4, messages=HI)  # type: ignore[arg-type]

    doc = snapshot(daemon)
    assert set(doc) == SNAPSHOT_KEYS
    assert doc["viewer"] == {"key": None, "admin": True, "scopes": doc["viewer"]["scopes"]}
    (model,) = [m for m in doc["models"] if m["name"] == MODEL]
    assert model["loaded"] is True and model["state"] == "ready"
    assert model["source"] == "test" and model["quant"] and model["ctx_train"]
    assert model["pid"] and model["port"] and model["slots"] >= 1 and model["ctx_per_slot"] > 0
    assert model["memory_bytes"] and model["rss_bytes"] and model["expires_at"] > doc["time"]
    paths = [r["path"] for r in doc["recent"]]
    for path in ("/v1/chat/completions", "/api/chat", "/v1/messages"):
        assert path in paths
    assert all(r["state"] == "done" for r in doc["recent"][:3])

    series = doc["series"]
    assert len(series) == 300
    assert [p["time"] for p in series] == sorted(p["time"] for p in series)
    assert sum(p["requests_per_s"] for p in series) >= 3
    assert sum(p["tokens_out_per_s"] for p in series) > 0
    assert any(p["ttft_p50_s"] is not None for p in series)
    assert doc["rates"]["window_s"] == 10 and doc["rates"]["requests_per_s"] > 0
    assert doc["rates"]["errors_per_s"] == 0.0
    assert MODEL in doc["quantiles"]
    assert doc["memory"]["total_bytes"] > 0 and isinstance(doc["memory"]["gpus"], list)
    assert doc["jobs"] == []


def test_a_running_stream_has_a_live_card_that_goes_when_it_ends(daemon: DaemonProc) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to one thousand in words."}],
        "max_tokens": 2000,
        "ignore_eos": True,  # llama.cpp's own: the answer runs its whole length, the card stays live
        "stream": True,
    }
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{daemon.url}/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            trace_id = resp.headers["x-blazar-trace-id"]
            lines = resp.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            # snapshots are shared for a fraction of a second: the first one may predate the card
            doc = until(
                lambda: (d := snapshot(daemon)) and any(r["id"] == trace_id for r in d["requests"]) and d,
                "the live card",
            )
            (card,) = [r for r in doc["requests"] if r["id"] == trace_id]
            assert card["state"] == "running" and card["model"] == MODEL
            assert card["path"] == "/v1/chat/completions" and card["chunks"] >= 1
            (model,) = [m for m in doc["models"] if m["name"] == MODEL]
            assert model["busy"] >= 1
        # the client left mid-stream
    gone = until(
        lambda: (d := snapshot(daemon)) and all(r["id"] != trace_id for r in d["requests"]) and d,
        "the card's end",
    )
    (ended,) = [r for r in gone["recent"] if r["id"] == trace_id]
    assert ended["state"] == "disconnected"


def _events(lines: Iterator[str], count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            assert event == "snapshot"
            found.append(json.loads(line[6:]))
            if len(found) == count:
                return found
        elif line and not line.startswith(":"):
            raise AssertionError(f"not SSE: {line!r}")
    raise AssertionError("the stream ended early")


def test_the_event_stream_sends_snapshots_and_ends_when_the_client_goes(daemon: DaemonProc) -> None:
    with httpx.Client(timeout=60) as client:
        with client.stream("GET", f"{daemon.url}/api/console/events?interval_ms=250") as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            trace_id = resp.headers["x-blazar-trace-id"]
            first, second = _events(resp.iter_lines(), 2)
    assert set(first) == SNAPSHOT_KEYS and set(second) == SNAPSHOT_KEYS
    assert second["time"] > first["time"]
    assert any(m["name"] == MODEL for m in second["models"])

    # The daemon ended the request: its record reaches the ledger only once it has ended.
    def recorded() -> list[dict[str, Any]]:
        resp = httpx.get(f"{daemon.url}/admin/requests", params={"trace_id": trace_id}, timeout=30)
        data: list[dict[str, Any]] = resp.json()["data"]
        return data

    (record,) = until(recorded, "the stream's end on the daemon")
    assert record["path"] == "/api/console/events"


def test_keys_scope_the_console(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    secrets = {}
    for name, scope in (("watcher", "metrics"), ("chatter", "chat"), ("boss", "admin")):
        done = subprocess.run(
            [sys.executable, "-m", "blazar", "keys", "add", name, "--scope", scope],
            env=home_env(home),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        secrets[name] = done.stdout.strip()
    d = start_daemon(home)
    try:
        url = f"{d.url}/api/console/snapshot"
        assert httpx.get(url, timeout=30).status_code == 401
        refused = httpx.get(url, headers={"authorization": f"Bearer {secrets['chatter']}"}, timeout=30)
        assert refused.status_code == 403
        watcher = snapshot(d, authorization=f"Bearer {secrets['watcher']}")
        assert watcher["viewer"] == {"key": "watcher", "admin": False, "scopes": ["metrics"]}
        boss = snapshot(d, authorization=f"Bearer {secrets['boss']}")
        assert boss["viewer"]["key"] == "boss" and boss["viewer"]["admin"] is True
        assert [m["name"] for m in boss["models"]] == [MODEL]
    finally:
        d.stop()


def test_an_open_event_stream_does_not_hold_up_stop(tmp_path: Path, model_path: Path) -> None:
    # A drain grace longer than `blazar stop` waits: a stream that held the drain up would
    # get the daemon killed and `stop` would fail.
    home = make_home(tmp_path / "home", model_path, config="drain_grace_s = 300\n")
    d = start_daemon(home)
    ended = threading.Event()
    seen: list[dict[str, Any]] = []

    def tab() -> None:
        with httpx.Client(timeout=httpx.Timeout(30, read=None)) as client:
            with client.stream("GET", f"{d.url}/api/console/events") as resp:
                lines = resp.iter_lines()
                seen.extend(_events(lines, 1))
                for _ in lines:  # until the daemon ends the stream
                    pass
        ended.set()

    thread = threading.Thread(target=tab, daemon=True)
    thread.start()
    try:
        until(lambda: seen, "the first event")
        done = d.cli("stop", check=False, timeout_s=120)
        assert done.returncode == 0, done.stderr
        assert "stopped the daemon" in done.stdout
        assert d.proc.wait(timeout=60) == 0
        assert ended.wait(timeout=60), "the console stream was not closed by the daemon"
    finally:
        d.stop()


def test_watch_once_json(daemon: DaemonProc) -> None:
    done = daemon.cli("watch", "--once", "--json")
    doc = json.loads(done.stdout)
    assert set(doc) == SNAPSHOT_KEYS
    assert doc["viewer"]["key"] == "local" or doc["viewer"]["admin"] is True
    assert MODEL in [m["name"] for m in doc["models"]]
    plain = daemon.cli("watch", "--once")
    assert MODEL in plain.stdout and "Models" in plain.stdout


def test_watch_without_a_daemon_says_so(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    done = subprocess.run(
        [sys.executable, "-m", "blazar", "watch", "--once", "--json"],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "no daemon is running" in done.stderr and "blazar serve" in done.stderr


TMUX = shutil.which("tmux") or ("/usr/bin/tmux" if Path("/usr/bin/tmux").exists() else None)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed: the live view's smoke test needs it")
def test_watch_live_in_an_80x24_terminal(daemon: DaemonProc) -> None:
    assert TMUX is not None
    socket = f"blazar-watch-{uuid.uuid4().hex[:8]}"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in daemon.env.items() if k.startswith(("BLAZAR_", "HF_")))
    script = (
        f"env {env} {shlex.quote(sys.executable)} -m blazar watch --interval 0.5; "
        'echo "watch exited rc=$?"; sleep 120'
    )
    tmux = [TMUX, "-L", socket]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "w", "-x", "80", "-y", "24", "sh", "-c", script],
        check=True,
        env={k: v for k, v in daemon.env.items() if k != "TMUX"},
        timeout=30,
    )

    def pane() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "w"], capture_output=True, text=True, timeout=30
        ).stdout

    try:
        screen = until(lambda: p if MODEL in (p := pane()) and "Models" in p else None, "the live view")
        lines = screen.rstrip("\n").split("\n")
        assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
        assert "blazar watch" in screen and "Requests" in screen and "q quits" in screen
        subprocess.run([*tmux, "send-keys", "-t", "w", "q"], check=True, timeout=30)
        after = until(lambda: p if "watch exited" in (p := pane()) else None, "the exit on q")
        assert "watch exited rc=0" in after
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
