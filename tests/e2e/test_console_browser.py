"""The web console at /ui in a real browser (headless Chromium) against a real daemon with the
test model: every view shows live data, the playground streams, cancel and pull work from the
page, and the page never talks to another host. Each view's screenshot is saved
(tests/browser.py ``SHOTS``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import chromium, watched_page  # noqa: F401  (a fixture)
from tests.support import MODEL, DaemonProc, fake_ollama_store, make_home, start_daemon

pytestmark = pytest.mark.slow

SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a long story."}],
    "stream": True,
    "max_tokens": 4000,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    # A peer that is never up (nothing listens on the discard port): the Engines view lists it.
    remote = '[[remotes]]\nname = "spare"\nurl = "http://127.0.0.1:9"\n'
    home = make_home(tmp_path_factory.mktemp("console") / "home", model_path, config=remote)
    # An Ollama store on this machine that the pull from the page finds (no network).
    fake_ollama_store(home / "other-stores" / "ollama", "smollm2", "135m", model_path)
    d = start_daemon(home)
    try:
        for _ in range(3):
            r = httpx.post(f"{d.url}/v1/chat/completions", json=SHORT, timeout=120)
            assert r.status_code == 200, r.text
        yield d
    finally:
        d.stop()


def test_the_page_is_served_offline_with_its_types_and_caching(daemon: DaemonProc) -> None:
    page = httpx.get(f"{daemon.url}/ui", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(f"{daemon.url}/ui", headers={"If-None-Match": page.headers["etag"]}).status_code == 304
    assert httpx.get(f"{daemon.url}/ui/app.js").headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{daemon.url}/ui/app.css").headers["content-type"].startswith("text/css")
    assert httpx.get(f"{daemon.url}/ui/nothing.js").json()["error"]["blazar_code"] == "NOT_FOUND"
    assert httpx.get(f"{daemon.url}/ui/../blazar.db").status_code == 404
    for text in (page.text, httpx.get(f"{daemon.url}/ui/app.js").text):
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text


def test_each_view_renders_live_data(chromium: Any, daemon: DaemonProc) -> None:  # noqa: F811
    with watched_page(chromium, daemon.url) as w:
        page = w.page
        page.goto(f"{daemon.url}/ui#dashboard")
        page.wait_for_selector("#conn.conn-live")
        # requests were sent: the requests-per-second chart has points
        page.wait_for_function(
            "() => Number(document.querySelector('[data-chart=rps] svg')?.dataset.points) > 0"
        )
        page.wait_for_selector(f"#view [data-model='{MODEL}']")
        w.shot("dashboard")

        page.click("nav a[data-view=models]")
        row = page.wait_for_selector(f"#models-table tr[data-model='{MODEL}']")
        assert "Q4" in row.inner_text() and "ready" in row.inner_text()
        assert page.is_visible("#pull-card")
        w.shot("models")

        page.click("nav a[data-view=engines]")
        card = page.wait_for_selector(f"#engines [data-model='{MODEL}']")
        pid = next(m for m in daemon.engines() if m["model"] == MODEL)["pid"]
        text = card.inner_text()
        assert str(pid) in text and "llama.cpp" in text and "xllamacpp " in text, text
        assert card.query_selector(".breaker").inner_text() == "closed"
        page.click(f"#engines [data-model='{MODEL}'] details.stderr summary")  # its own log lines
        tail = page.wait_for_selector(f"#engines [data-model='{MODEL}'] details.stderr pre")
        assert "llama" in tail.inner_text().lower(), tail.inner_text()
        peer = page.wait_for_selector("#peers [data-peer=spare]:has-text('down')")
        assert "http://127.0.0.1:9" in peer.inner_text()
        w.shot("engines")

        page.click("nav a[data-view=compute]")
        page.wait_for_selector(f"#view tr[data-model='{MODEL}']")
        assert "System memory" in page.inner_text("#view")
        page.wait_for_selector(f"#fit-table [data-fit='{MODEL}']:has-text('loaded')")
        assert page.is_checked(f"#fit-table input[data-pick='{MODEL}']")  # the loaded set, by default
        page.click("#coreside-check")
        verdict = page.wait_for_selector("#coreside-result")
        assert verdict.get_attribute("data-fits") == "true" and "fit together" in verdict.inner_text()
        w.shot("compute")

        page.click("nav a[data-view=jobs]")
        page.wait_for_selector("#view .card")
        w.shot("jobs")


def _stream(daemon: DaemonProc, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=LONG, timeout=120) as r:
            out["trace"] = r.headers["x-blazar-trace-id"]
            out["body"] = ""
            try:
                for text in r.iter_text():
                    out["body"] += text
            except httpx.HTTPError as exc:
                out["error"] = repr(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_running_request_is_cancelled_from_the_requests_view(
    chromium: Any,  # noqa: F811
    daemon: DaemonProc,
) -> None:
    out: dict[str, Any] = {}
    with watched_page(chromium, daemon.url) as w:
        page = w.page
        page.goto(f"{daemon.url}/ui#requests")
        page.wait_for_selector("#conn.conn-live")
        t = _stream(daemon, out)
        card = page.wait_for_selector("#live-requests [data-request][data-state=running]")
        assert MODEL in card.inner_text() and "default" in card.inner_text()  # its class
        page.wait_for_selector("#classes tr[data-class=default]")
        page.wait_for_selector("#recent-requests tr[data-trace]")
        w.shot("requests")
        card_id = card.get_attribute("data-request")
        page.click(f"[data-request='{card_id}'] button[data-action=cancel]")
        t.join(60)
        assert not t.is_alive()
        assert '"CLIENT_CLOSED_REQUEST"' in out["body"] and "[DONE]" not in out["body"], out
        # the card leaves the live list, and the finished one tells its story
        page.wait_for_selector(f"[data-request='{card_id}']", state="detached")
        page.click(f"#recent-requests tr[data-trace='{out['trace']}'] button[data-action=why]")
        story = page.wait_for_selector(f"[data-story='{out['trace']}']")
        assert "cancel" in story.inner_text().lower()


def test_the_playground_streams_an_answer_token_by_token(
    chromium: Any,  # noqa: F811
    daemon: DaemonProc,
) -> None:
    with watched_page(chromium, daemon.url) as w:
        page = w.page
        page.goto(f"{daemon.url}/ui#playground")
        page.wait_for_selector(f"#play-model option[value='{MODEL}']", state="attached")
        # every length the answer had on screen, as it grew
        page.evaluate(
            """() => { window.lengths = []; new MutationObserver(() => {
                 const all = document.querySelectorAll('.msg.assistant');
                 const m = all[all.length - 1];  // the answer being written, in each dialect
                 if (m && m.textContent !== '…')
                   window.lengths.push(all.length * 1000 + m.textContent.length);
               }).observe(document.getElementById('play-log'), {subtree: true, childList: true,
                 characterData: true}); }"""
        )
        for dialect in ("openai", "ollama", "anthropic"):
            page.select_option("#play-dialect", dialect)
            page.fill("#play-max", "40")
            page.fill("#play-input", "Count from one to twenty.")
            page.click("#play-send")
            page.wait_for_selector("#play-trace code:not(:text('—'))")
            page.wait_for_function("() => !document.getElementById('play-send').disabled")
            assert not page.query_selector(".msg.error"), page.inner_text("#play-log")
        lengths = page.evaluate("window.lengths")
        assert len(set(lengths)) >= 6, lengths  # it grew piece by piece, not all at once
        trace = page.inner_text("#play-trace")
        story = httpx.get(f"{daemon.url}/api/why/{trace}", timeout=10).json()  # the answer's own id
        assert story["model"] == MODEL and story["dialect"] == "anthropic", story
        assert float(page.inner_text("#play-tps")) > 0
        w.shot("playground")


def test_a_pull_from_the_models_view_shows_progress_and_lists_the_model(
    chromium: Any,  # noqa: F811
    daemon: DaemonProc,
) -> None:
    with watched_page(chromium, daemon.url) as w:
        page = w.page
        page.goto(f"{daemon.url}/ui#models")
        page.wait_for_selector(f"#models-table tr[data-model='{MODEL}']")
        page.evaluate(
            """() => { window.statuses = []; new MutationObserver(() => {
                 for (const s of document.querySelectorAll('[data-pull-status]'))
                   window.statuses.push(s.textContent);
               }).observe(document.getElementById('pulls'), {subtree: true, childList: true}); }"""
        )
        page.fill("#pull-name", "ollama:smollm2:135m")
        page.click("#pull-button")
        done = page.wait_for_selector(
            "[data-pull='ollama:smollm2:135m']:not([data-status=running])", timeout=20_000
        )
        assert done.get_attribute("data-status") == "done", done.inner_text()
        statuses = page.evaluate("window.statuses")
        assert len(set(statuses)) >= 2 and statuses[-1].startswith("success"), statuses  # "success — 98 MB…"
        page.wait_for_selector("#models-table tr[data-model='smollm2:135m']")
        w.shot("models-pulled")


def test_a_finished_batch_is_downloaded_from_the_jobs_view(
    chromium: Any,  # noqa: F811
    daemon: DaemonProc,
) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{daemon.url}/v1", api_key="unused")
    line = {"custom_id": "greet-1", "method": "POST", "url": "/v1/chat/completions", "body": SHORT}
    upload = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    with watched_page(chromium, daemon.url) as w:
        page = w.page
        page.goto(f"{daemon.url}/ui#jobs")
        button = page.wait_for_selector(f"tr[data-job='{batch.id}'] button[data-result=output]")
        with page.expect_download() as got:
            button.click()
        saved = got.value
        assert saved.suggested_filename == f"{batch.id}_output.jsonl"
        (record,) = [json.loads(x) for x in Path(saved.path()).read_text().splitlines()]
        assert record["custom_id"] == "greet-1" and record["response"]["status_code"] == 200
        w.shot("jobs")
