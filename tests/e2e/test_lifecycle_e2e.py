"""Model lifecycle and shutdown with the real engine: LRU with two models, SIGTERM drains."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from registry.store import Store
from tests.support import MODEL, make_home, start_daemon, wait_gone, wait_until

pytestmark = pytest.mark.slow

OTHER = "smol-two"


def _ask(url: str, model: str, max_tokens: int = 4, timeout_s: float = 60) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)


def _loaded(url: str) -> set[str]:
    engines = httpx.get(f"{url}/admin/engines", timeout=10).json()["engines"]
    return {e["model"] for e in engines if e["state"] == "ready"}


def test_max_loaded_models_evicts_lru_but_never_during_work(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="max_loaded_models = 1\n")
    Store(home / "models").import_file(model_path, OTHER, source="test")
    d = start_daemon(home)
    try:
        assert _ask(d.url, MODEL).status_code == 200
        assert _loaded(d.url) == {MODEL}
        assert _ask(d.url, OTHER).status_code == 200
        assert _loaded(d.url) == {OTHER}  # the idle one was evicted

        # While OTHER streams, a request for MODEL must wait for it, not evict it.
        done: dict[str, int] = {}

        def long_stream() -> None:
            body = {
                "model": OTHER,
                "messages": [{"role": "user", "content": "Tell a story."}],
                "max_tokens": 120,
            }
            with httpx.stream(
                "POST", f"{d.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
            ) as r:
                done["chunks"] = sum(1 for _ in r.iter_lines())
                done["status"] = r.status_code

        t = threading.Thread(target=long_stream)
        t.start()
        time.sleep(0.5)
        assert _ask(d.url, MODEL, timeout_s=120).status_code == 200
        t.join(120)
        assert done["status"] == 200 and done["chunks"] > 20  # the stream ran to its end
        assert _loaded(d.url) == {MODEL}
    finally:
        d.stop()


def test_sigterm_lets_the_running_stream_finish(tmp_path: Path, model_path: Path) -> None:
    d = start_daemon(make_home(tmp_path / "home", model_path))
    assert _ask(d.url, MODEL).status_code == 200
    engine_pid = httpx.get(f"{d.url}/admin/engines", timeout=10).json()["engines"][0]["pid"]
    out: dict[str, str] = {}
    streaming = threading.Event()

    def stream() -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 60,
            "stream": True,
        }
        parts = []
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=60) as r:
            for text in r.iter_text():
                parts.append(text)
                streaming.set()
        out["body"] = "".join(parts)

    t = threading.Thread(target=stream)
    t.start()
    # Terminate once the stream is really running (a fixed sleep raced the request's
    # arrival on a loaded machine); the drain must then let it finish.
    assert streaming.wait(60)
    d.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert out["body"].rstrip().endswith("data: [DONE]")  # drained, not cut
    assert d.proc.wait(30) == 0
    assert wait_gone([engine_pid]) == []


def test_keep_alive_header_on_the_openai_route(tmp_path: Path, model_path: Path) -> None:
    d = start_daemon(make_home(tmp_path / "home", model_path))
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        r = httpx.post(
            f"{d.url}/v1/chat/completions", json=body, headers={"X-Blazar-Keep-Alive": "0"}, timeout=60
        )
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while _loaded(d.url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _loaded(d.url) == set()  # unloaded right after the request
        bad = httpx.post(
            f"{d.url}/v1/chat/completions", json=body, headers={"X-Blazar-Keep-Alive": "soon"}, timeout=60
        )
        assert bad.status_code == 400 and bad.json()["error"]["blazar_code"] == "BAD_REQUEST"
    finally:
        d.stop()


def test_rm_is_refused_while_the_model_serves(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    Store(home / "models").import_file(model_path, OTHER, source="test")
    d = start_daemon(home)
    try:
        body = {
            "model": OTHER,
            "messages": [{"role": "user", "content": "Tell a long story."}],
            # Far longer than the rm below takes on a busy machine (an answer that ended early
            # let the rm through); the client leaves after it, which cancels the rest.
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            next(lines)  # the model is loaded and generating
            refused = d.cli("rm", OTHER, check=False)
            assert refused.returncode == 1 and "is serving 1 request" in refused.stderr, refused.stderr
            next(lines)  # still generating after the refusal
        removed = wait_until(
            lambda: (done := d.cli("rm", OTHER, check=False)).returncode == 0 and done,
            timeout_s=30,
            what="the rm once the client left",
        )
        assert "deleted" in removed.stdout, removed.stderr
        assert OTHER not in {m["name"] for m in httpx.get(f"{d.url}/api/tags", timeout=10).json()["models"]}
        assert OTHER not in _loaded(d.url)  # its engine was stopped with it
        assert _ask(d.url, MODEL).status_code == 200  # the file is shared: the other name still works
    finally:
        d.stop()


def _footprint_mib(model_path: Path, ctx: int, slots: int) -> float:
    from registry import fit
    from registry.shape import read_shape

    return fit.estimate(read_shape(model_path), fit.Settings(ctx_per_slot=ctx, slots=slots)).total / 2**20


def test_memory_budget_evicts_idle_and_refuses_with_numbers(tmp_path: Path, model_path: Path) -> None:
    one = _footprint_mib(model_path, 512, 1)
    home = make_home(
        tmp_path / "home",
        model_path,
        config=f"slots = 1\ndefault_ctx = 512\nmemory_budget_mb = {one * 1.5:.0f}\n",
    )
    Store(home / "models").import_file(model_path, OTHER, source="test")
    d = start_daemon(home)
    try:
        assert _ask(d.url, MODEL).status_code == 200
        assert _ask(d.url, OTHER).status_code == 200  # two do not fit: the idle one made room
        assert _loaded(d.url) == {OTHER}
        plan = httpx.get(f"{d.url}/api/plan/{MODEL}", timeout=30).json()
        assert plan["preview"]["evict"] == [OTHER] and plan["preview"]["refused"] is None
        assert plan["estimate"]["total"] == plan["preview"]["need_bytes"] and not plan["loaded"]
        capacity = httpx.get(f"{d.url}/api/capacity", timeout=30).json()
        (resident,) = capacity["models"]
        assert resident["model"] == OTHER and resident["estimated_bytes"] == plan["preview"]["need_bytes"]
        assert resident["rss_bytes"] > 50 << 20 and capacity["census"]["ram_total"] > 0
        assert capacity["memory_budget_bytes"] == int(float(f"{one * 1.5:.0f}") * 2**20)

        body = {"model": OTHER, "messages": [{"role": "user", "content": "Tell a long story."}]}
        with httpx.stream(
            "POST",
            f"{d.url}/v1/chat/completions",
            json={**body, "max_tokens": 4000, "ignore_eos": True, "stream": True},
            timeout=120,
        ) as r:
            lines = r.iter_lines()
            next(lines)  # OTHER is busy now (until this client leaves)
            refused = _ask(d.url, MODEL)
            if refused.status_code == 200:  # seen twice on a loaded machine, not reproduced since
                rest = list(lines)
                pytest.fail(f"'{OTHER}' was not busy: its stream had ended ({len(rest)} lines: {rest[-3:]})")
            assert refused.status_code == 507 and refused.headers.get("retry-after")
            error = refused.json()["error"]
            assert error["blazar_code"] == "INSUFFICIENT_MEMORY"
            preview = httpx.get(f"{d.url}/api/plan/{MODEL}", timeout=30).json()["preview"]
            assert preview["code"] == "INSUFFICIENT_MEMORY" and preview["evict"] == []
            assert f"'{OTHER}'" in error["message"] and "MiB" in error["message"]
            assert _loaded(d.url) == {OTHER}  # the busy model was never evicted
    finally:
        d.stop()

    (home / "config.toml").write_text(f"slots = 1\ndefault_ctx = 512\nmemory_budget_mb = {one / 2:.0f}\n")
    d = start_daemon(home)
    try:
        refused = _ask(d.url, MODEL)
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["blazar_code"] == "MODEL_TOO_LARGE"
        assert "needs about" in error["message"] and "memory budget" in error["message"]
        assert "blazar fit" in error["message"]  # where the levers are
        assert _loaded(d.url) == set()
    finally:
        d.stop()


def test_serve_preload_loads_the_model_before_any_request(tmp_path: Path, model_path: Path) -> None:
    """`blazar serve --preload` (what `blazar run` passes to a daemon it starts) loads the
    model through the runtime with no request sent; a name that is not installed is logged
    and skipped, and the daemon carries on."""
    home = make_home(tmp_path / "home", model_path)
    d = start_daemon(home, "--preload=not-installed", "--preload", MODEL)
    try:
        deadline = time.monotonic() + 120
        while MODEL not in _loaded(d.url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _loaded(d.url) == {MODEL}
        ps = httpx.get(f"{d.url}/api/ps", timeout=10).json()["models"]
        assert [m["name"] for m in ps] == [f"{MODEL}:latest"]
        assert ps[0]["expires_at"] is not None  # the keep-alive timer runs, as after a request
        requests = httpx.get(f"{d.url}/admin/requests", timeout=10).json()["data"]
        assert [r for r in requests if r["method"] != "GET"] == []  # loaded without any request
        log = (home / "logs" / "daemon.log").read_text()
        assert "could not preload 'not-installed'" in log
        assert f"preloaded '{MODEL}'" in log
        assert d.proc.poll() is None
        assert _ask(d.url, MODEL).status_code == 200
        assert httpx.get(f"{d.url}/admin/engines", timeout=10).json()["engines"][0]["starts"] == 1
    finally:
        d.stop()
