"""Admission with the real engine: 2 slots, a queue of 3, live request cards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "stream": True}
BLOCKER = {**LONG, "max_tokens": 2000, "ignore_eos": True}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("adm") / "home", model_path, config="slots = 2\nmax_queue = 3\n")
    d = start_daemon(home)
    try:
        httpx.post(
            f"{d.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 1}, timeout=60
        )
        yield d
    finally:
        d.stop()


def cards(d: DaemonProc, **params: str) -> list[dict[str, Any]]:
    return httpx.get(f"{d.url}/v1/requests", params=params, timeout=10).json()["data"]  # type: ignore[no-any-return]


def busy_slots(d: DaemonProc) -> int:
    return sum(
        1 for s in httpx.get(f"{d.url}/admin/engines/{MODEL}/slots", timeout=10).json() if s["is_processing"]
    )


def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_two_run_three_queue_one_refused_and_all_finish(small: DaemonProc) -> None:
    results: list[tuple[int, str]] = []

    def stream(i: int) -> None:
        body = {**LONG, "max_tokens": 40}
        with (
            httpx.Client(timeout=120) as c,
            c.stream("POST", f"{small.url}/v1/chat/completions", json=body) as r,
        ):
            text = "".join(r.iter_text())
            results.append(
                (r.status_code, r.headers.get("retry-after", "") if r.status_code == 429 else text)
            )

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    wait_for(lambda: len(cards(small, state="queued")) == 3 or len(results) > 1)
    live = cards(small)
    queued = sorted(c["queue_position"] for c in live if c["state"] == "queued")
    running = [c for c in live if c["state"] == "running"]
    for t in threads:
        t.join(120)
    assert queued == [1, 2, 3] and len(running) == 2
    statuses = sorted(code for code, _ in results)
    assert statuses == [200, 200, 200, 200, 200, 429]
    refused = next(extra for code, extra in results if code == 429)
    assert int(refused) >= 1  # Retry-After
    assert all("[DONE]" in extra for code, extra in results if code == 200)
    wait_for(lambda: busy_slots(small) == 0)


def _start_stream(d: DaemonProc, out: dict[str, Any], **extra: Any) -> threading.Thread:
    def run() -> None:
        with (
            httpx.Client(timeout=120) as c,
            # ignore_eos: a blocker must hold its slot until the test ends it, not stop at the
            # model's end of text (sampling varies, and a short story freed the slot early)
            c.stream("POST", f"{d.url}/v1/chat/completions", json={**BLOCKER, **extra}) as r,
        ):
            out["trace"] = r.headers["x-blazar-trace-id"]
            out["status"] = r.status_code
            out["body"] = "".join(r.iter_text())

    t = threading.Thread(target=run)
    t.start()
    return t


def test_cancel_and_interrupt_from_another_connection(small: DaemonProc) -> None:
    for action, state in (("cancel", "cancelled"), ("interrupt", "interrupted")):
        out: dict[str, Any] = {}
        t = _start_stream(small, out)
        wait_for(lambda out=out: "trace" in out and busy_slots(small) == 1)  # type: ignore[misc]
        time.sleep(0.3)
        r = httpx.post(f"{small.url}/v1/requests/{out['trace']}/{action}", timeout=10)
        assert r.status_code == 200 and r.json()[f"{action}led" if action == "cancel" else "interrupted"]
        t.join(30)
        assert not t.is_alive()
        card = httpx.get(f"{small.url}/v1/requests/{out['trace']}", timeout=10).json()
        assert card["state"] == state
        if action == "cancel":
            assert '"CLIENT_CLOSED_REQUEST"' in out["body"] and "[DONE]" not in out["body"]
        else:
            assert out["body"].rstrip().endswith("data: [DONE]") and '"error"' not in out["body"]
        wait_for(lambda: busy_slots(small) == 0, timeout_s=2.0)


def test_queued_requests_cancelled_or_abandoned_never_run(small: DaemonProc) -> None:
    blockers = [dict[str, Any]() for _ in range(2)]
    threads = [_start_stream(small, b) for b in blockers]
    wait_for(lambda: busy_slots(small) == 2)
    # A queued non-stream request cancelled from elsewhere gets 499.
    holder: dict[str, Any] = {}

    def queued() -> None:
        r = httpx.post(
            f"{small.url}/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 5}, timeout=60
        )
        holder["status"], holder["body"] = r.status_code, r.json()

    q = threading.Thread(target=queued)
    q.start()
    wait_for(lambda: len(cards(small, state="queued")) == 1)
    card_id = cards(small, state="queued")[0]["id"]
    httpx.post(f"{small.url}/v1/requests/{card_id}/cancel", timeout=10)
    q.join(30)
    assert holder["status"] == 499 and holder["body"]["error"]["blazar_code"] == "CLIENT_CLOSED_REQUEST"

    # A queued client that disconnects is withdrawn and never reaches the engine.
    before = httpx.get(f"{small.url}/admin/engines", timeout=10).json()["admission"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{small.url}/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 5}, timeout=1.0
        )
    wait_for(lambda: not cards(small, state="queued"))
    after = httpx.get(f"{small.url}/admin/engines", timeout=10).json()["admission"]
    assert after["withdrawn"] == before["withdrawn"] + 1
    assert after["granted"] == before["granted"]
    assert cards(small)[-1]["state"] in ("disconnected", "cancelled") or any(
        c["state"] == "disconnected" for c in cards(small)
    )
    for b in blockers:
        httpx.post(f"{small.url}/v1/requests/{b['trace']}/cancel", timeout=10)
    for t in threads:
        t.join(30)
    wait_for(lambda: busy_slots(small) == 0, timeout_s=2.0)
