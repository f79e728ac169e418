"""``workers = 2``: the HTTP data plane in two worker processes, the runtime in the daemon.

Real processes throughout: the daemon, its two workers sharing the listening socket, the
test model's engine, the official ``openai`` client. A request reaches each worker; a
handed-off stream is relayed by the worker and recorded by the runtime; a client that
leaves frees the engine slot; ``kill -9`` of a worker loses only its own request and the
daemon starts it again; ``kill -9`` of the daemon takes the workers and the engine along.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, descendants, make_home, pid_alive, start_daemon

pytestmark = pytest.mark.slow

CONFIG = "workers = 2\nslots = 4\n"
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a very long story."}],
    "max_tokens": 2000,
    "ignore_eos": True,
    "stream": True,
}


def worker_pids(d: DaemonProc) -> dict[int, int]:
    """The daemon's workers: index → pid (from each one's environment)."""
    found = {}
    for pid in descendants(d.proc.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"BLAZAR_WORKER_INDEX="):
                found[int(entry.split(b"=", 1)[1])] = pid
    return found


def wait_for(predicate: Any, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s:g} s"
        time.sleep(0.05)


def busy_slots(d: DaemonProc) -> int:
    slots = httpx.get(f"{d.url}/admin/engines/{MODEL}/slots", timeout=10).json()
    return sum(1 for s in slots if s["is_processing"])


def cards(d: DaemonProc) -> list[dict[str, Any]]:
    return httpx.get(f"{d.url}/v1/requests", timeout=10).json()["data"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("workers") / "home", model_path, config=CONFIG)
    d = start_daemon(home, timeout_s=90)
    try:
        wait_for(lambda: len(worker_pids(d)) == 2, what="two workers")
        r = httpx.post(
            f"{d.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}, timeout=120
        )
        assert r.status_code == 200, r.text
        yield d
    finally:
        d.stop()


def test_each_worker_serves_and_a_stream_is_relayed_by_one(daemon: DaemonProc) -> None:
    seen: set[str] = set()
    for _ in range(200):  # the kernel spreads new connections over the two workers
        r = httpx.get(f"{daemon.url}/api/version", headers={"connection": "close"}, timeout=10)
        assert r.status_code == 200
        seen.add(r.headers["x-blazar-worker"])
        if len(seen) == 2:
            break
    assert seen == {"0", "1"}

    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-blazar-worker"] in ("0", "1")
    assert "x-blazar-handoff" not in raw.headers  # the grant is the worker's, never the client's
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 8

    def chat_card() -> dict[str, Any]:
        return next(c for c in cards(daemon) if c["path"] == "/v1/chat/completions")

    # The runtime records the stream once the worker reports its end, just after the last byte.
    wait_for(lambda: chat_card()["state"] != "running", 5.0, "the stream's card ended")
    card = chat_card()
    assert card["state"] == "done" and card["status"] == 200, card
    assert card["chunks"] >= 1 and card["ttft_ms"] is not None
    assert busy_slots(daemon) == 0 and daemon.engines()[0]["in_flight"] == 0

    # The card counts what the worker sent the client, byte for byte (not the grant line).
    body = {**LONG, "max_tokens": 5, "ignore_eos": False}
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=60) as r:
        sent = b"".join(r.iter_raw())
        trace = r.headers["x-blazar-trace-id"]

    def card_of(trace: str) -> dict[str, Any]:
        return next(c for c in cards(daemon) if c["trace_id"] == trace)

    wait_for(lambda: card_of(trace)["state"] == "done", 5.0, "the second stream's card done")
    assert card_of(trace)["bytes_out"] == len(sent) and sent.endswith(b"data: [DONE]\n\n")

    # What is not a pass-through stream is relayed from the runtime as it answered.
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert whole.usage is not None and whole.usage.completion_tokens == 4
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert isinstance(info.value.body, dict) and info.value.body["blazar_code"] == "MODEL_NOT_FOUND"


def test_a_client_that_leaves_a_worker_frees_the_slot(daemon: DaemonProc) -> None:
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{daemon.url}/v1/chat/completions", json=LONG) as r,
    ):
        assert r.headers["x-blazar-worker"] in ("0", "1")
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert busy_slots(daemon) == 1
    wait_for(lambda: busy_slots(daemon) == 0, 2.0, "the engine slot free after the client left")
    wait_for(lambda: daemon.engines()[0]["in_flight"] == 0, 2.0, "no request in flight in the runtime")
    card = next(c for c in cards(daemon) if c["path"] == "/v1/chat/completions")
    assert card["state"] == "disconnected", card


def _stream_on(daemon: DaemonProc, worker: str, opened: list[Any]) -> Any:
    """A long stream that worker ``worker`` relays (new connections until one lands there)."""
    for _ in range(100):
        http = httpx.Client(timeout=60)
        r = http.send(http.build_request("POST", f"{daemon.url}/v1/chat/completions", json=LONG), stream=True)
        if r.headers.get("x-blazar-worker") == worker:
            opened.append((http, r))
            return r
        r.close()
        http.close()
    raise AssertionError(f"no connection reached worker {worker}")


def test_kill_9_of_a_worker_loses_only_its_requests_and_it_is_restarted(daemon: DaemonProc) -> None:
    before = worker_pids(daemon)
    opened: list[Any] = []
    try:
        doomed = _stream_on(daemon, "0", opened)
        kept = _stream_on(daemon, "1", opened)
        doomed_lines, kept_lines = doomed.iter_lines(), kept.iter_lines()
        for _ in range(4):
            next(doomed_lines)
            next(kept_lines)
        wait_for(lambda: busy_slots(daemon) == 2, 5.0, "both streams running")
        os.kill(before[0], signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            for _ in doomed_lines:
                pass
        # The other worker's stream goes on; the dead one's slot is freed.
        for _ in range(20):
            assert next(kept_lines) is not None
        wait_for(lambda: busy_slots(daemon) == 1, 3.0, "the killed worker's slot free")
    finally:
        for http, r in opened:
            r.close()
            http.close()
    wait_for(lambda: busy_slots(daemon) == 0, 3.0, "every slot free")
    wait_for(lambda: worker_pids(daemon).get(0) not in (None, before[0]), 15.0, "worker 0 started again")
    assert worker_pids(daemon)[1] == before[1]
    seen: set[str] = set()
    for _ in range(200):
        r = httpx.get(f"{daemon.url}/api/version", headers={"connection": "close"}, timeout=10)
        seen.add(r.headers["x-blazar-worker"])
        if len(seen) == 2:
            break
    assert seen == {"0", "1"}


def test_kill_9_of_the_daemon_takes_its_workers_and_engines(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config=CONFIG)
    d = start_daemon(home, timeout_s=90)
    try:
        wait_for(lambda: len(worker_pids(d)) == 2, what="two workers")
        r = httpx.post(
            f"{d.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}, timeout=120
        )
        assert r.status_code == 200
        engine_pid = d.engines()[0]["pid"]
        children = descendants(d.proc.pid)
        assert engine_pid in children and set(worker_pids(d).values()) <= set(children)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        wait_for(lambda: not any(pid_alive(p) for p in children), 10.0, "no process left behind")
    finally:
        d.stop()


def test_a_cancel_from_the_runtime_ends_a_worker_stream_with_its_last_event(daemon: DaemonProc) -> None:
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{daemon.url}/v1/chat/completions", json=LONG) as r,
    ):
        trace = r.headers["x-blazar-trace-id"]
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        cancelled = httpx.post(f"{daemon.url}/v1/requests/{trace}/cancel", timeout=10)
        assert cancelled.status_code == 200, cancelled.text
        rest = [line for line in lines if line.startswith("data: ")]
    # The stream ends with OpenAI's error event, written by the worker once it stopped.
    assert rest and '"blazar_code":"CLIENT_CLOSED_REQUEST"' in rest[-1], rest[-3:]
    assert "cancelled by POST /v1/requests/{id}/cancel" in rest[-1]
    wait_for(lambda: busy_slots(daemon) == 0, 2.0, "the engine slot free after the cancel")


def test_a_resumable_stream_is_kept_by_the_runtime(daemon: DaemonProc) -> None:
    body = {**LONG, "max_tokens": 6, "ignore_eos": False}
    with httpx.stream(
        "POST",
        f"{daemon.url}/v1/chat/completions",
        json=body,
        headers={"x-blazar-resumable": "on"},
        timeout=60,
    ) as r:
        assert r.status_code == 200 and r.headers["x-blazar-stream-id"]
        events = [line for line in r.iter_lines() if line.startswith("id: ")]
    assert [e.removeprefix("id: ") for e in events][:3] == ["1", "2", "3"]


def test_a_websocket_is_carried_to_the_runtime(daemon: DaemonProc) -> None:
    """``/v1/realtime`` through a worker: the session runs in the runtime, each message
    passed both ways; a refusal before the upgrade reaches the client as the runtime said it."""
    import json

    import trio
    from trio_websocket import ConnectionRejected, open_websocket_url

    url = daemon.url.replace("http://", "ws://") + "/v1/realtime"

    async def recv_until(ws: Any, kind: str) -> dict[str, Any]:
        while (event := json.loads(await ws.get_message()))["type"] != kind:
            pass
        return dict(event)

    async def session() -> dict[str, Any]:
        async with open_websocket_url(f"{url}?model={MODEL}") as ws:
            await recv_until(ws, "session.created")
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
            await ws.send_message(json.dumps({"type": "conversation.item.create", "item": item}))
            response = {"modalities": ["text"], "max_output_tokens": 4}
            await ws.send_message(json.dumps({"type": "response.create", "response": response}))
            with trio.fail_after(60):
                return await recv_until(ws, "response.done")

    async def refused() -> ConnectionRejected:
        try:
            async with open_websocket_url(f"{url}?model=no-such-model"):
                pass
        except ConnectionRejected as exc:
            return exc
        raise AssertionError("an unknown model was upgraded")

    done = trio.run(session)
    assert done["response"]["status"] in ("completed", "incomplete"), done
    rejected = trio.run(refused)
    assert rejected.status_code == 404
    assert json.loads(rejected.body or b"{}")["error"]["blazar_code"] == "MODEL_NOT_FOUND"

    # the runtime kept a record of each, as for a WebSocket it serves itself
    def realtime() -> list[int]:
        rows = httpx.get(f"{daemon.url}/admin/requests?limit=1000", timeout=10).json()["data"]
        return sorted(r["status"] for r in rows if r["path"] == "/v1/realtime")

    wait_for(lambda: realtime() == [101, 404], what="the ledger's two /v1/realtime records")


def test_an_engine_killed_mid_stream_ends_a_worker_stream_with_engine_crashed(daemon: DaemonProc) -> None:
    """The worker reports the broken engine connection on the stream's own channel
    connection; the runtime's crash check words the last event, as without workers."""
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
    pid = daemon.engines()[0]["pid"]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a very long story."}],
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with pytest.raises(openai.APIError) as info:
        for i, _chunk in enumerate(stream):
            if i == 3:
                os.kill(pid, signal.SIGKILL)
    assert isinstance(info.value.body, dict) and info.value.body["blazar_code"] == "ENGINE_CRASHED"
    card = next(c for c in cards(daemon) if c["path"] == "/v1/chat/completions")
    assert card["state"] != "running", card
    # the runtime freed the slot, and the next request starts the engine again
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert r.choices[0].message.content is not None
    assert daemon.engines()[0]["pid"] != pid
