"""The web console stays responsive while the daemon serves 200+ requests a second.

One daemon runs ``bench/instant-upstream`` as its engine, each answer a stream of 16
chunks 10 ms apart (about a fifth of a second per request, like a fast engine), so that
44 concurrent clients keep about 44 requests live and finish about 200 or more a second. A
headless Chromium (Debian's ``chromium``, through Playwright) shows the console's
Requests view, the busiest one: a card per live request and the recent list, redrawn on
every snapshot of its live stream. In every run the page is measured twice, side by
side: idle (no request), then under that load, from a separate load-generator process.
Inside the page:

- main-thread lag: a 50 ms timer's lateness, sampled all the time (what a user's typing
  or scrolling would wait);
- the time from a click on another view to the next painted frame, 20 clicks;
- the time the page spends applying each snapshot of the stream (parse and redraw);
- long tasks (over 50 ms), as the browser reports them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench._harness import Context
from bench._rigs import LoadGen, daemon_commands, instant_config, log, running_daemon
from bench._stats import percentile, summarize
from bench._workloads import chat_request, job
from tests.browser import CHROMIUM, skip_reason

__all__ = ["TITLE", "run"]

TITLE = "Web console under load"
CHUNKS = 16
INTERVAL_MS = 10.0
CONCURRENCY = 44
CLICKS = 20
UPSTREAM_ARGS = ("--chunks", str(CHUNKS), "--interval-ms", str(INTERVAL_MS))
VIEWS = ("dashboard", "models", "engines", "requests")

# Installed before the page's own script: probes that cost the page next to nothing.
PROBES = """
(() => {
  const p = window.__probe = { lag: [], long: [], apply: [] };
  let last = performance.now();
  setInterval(() => {
    const now = performance.now();
    p.lag.push(Math.max(0, now - last - 50));
    last = now;
  }, 50);
  try {
    new PerformanceObserver((list) => { for (const e of list.getEntries()) p.long.push(e.duration); })
      .observe({ type: "longtask", buffered: true });
  } catch (_) {}
  window.addEventListener("DOMContentLoaded", () => {
    const inner = window.apply;  // the page's snapshot handler, a global of its script
    window.apply = function (snap) {
      const t0 = performance.now();
      const out = inner(snap);
      p.apply.push(performance.now() - t0);
      return out;
    };
  });
})();
"""

CLICK = """
async (view) => {
  const t0 = performance.now();
  document.querySelector(`nav a[data-view=${view}]`).click();
  await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
  return performance.now() - t0;
}
"""


def _phase(page: Any, seconds: float) -> dict[str, Any]:
    """Measure the page for ``seconds`` on the Requests view, then time view switches."""
    page.evaluate("() => { const p = window.__probe; p.lag = []; p.long = []; p.apply = []; }")
    time.sleep(seconds)
    probe = page.evaluate("() => window.__probe")
    clicks = []
    for i in range(CLICKS):
        clicks.append(page.evaluate(CLICK, VIEWS[i % len(VIEWS)]))
        time.sleep(0.05)
    page.evaluate(CLICK, "requests")
    lag, apply = probe["lag"], probe["apply"]
    return {
        "lag_p50_ms": percentile(lag, 50),
        "lag_p99_ms": percentile(lag, 99),
        "lag_max_ms": max(lag, default=None),
        "click_p50_ms": percentile(clicks, 50),
        "click_p99_ms": percentile(clicks, 99),
        "apply_p50_ms": percentile(apply, 50),
        "apply_p99_ms": percentile(apply, 99),
        "snapshots_per_s": len(apply) / seconds,
        "long_tasks": len(probe["long"]),
        "live_cards": page.evaluate(
            "() => document.querySelectorAll('#live-requests [data-request]').length"
        ),
    }


def run(ctx: Context) -> dict[str, Any]:
    reason = skip_reason()
    if reason is not None:
        raise RuntimeError(f"the console benchmark needs the browser: {reason}")
    from playwright.sync_api import sync_playwright

    seconds = ctx.pick(8.0, 2.0)
    config = instant_config(*UPSTREAM_ARGS)
    request = chat_request("openai", max_tokens=CHUNKS, stream=True)
    runs: list[dict[str, Any]] = []
    with running_daemon(config, tag="console") as daemon, LoadGen() as lg, sync_playwright() as pw:
        lg.run(job(daemon.url, [request], concurrency=4, count=ctx.pick(100, 10)))  # the engine starts
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        page.add_init_script(PROBES)
        page.goto(f"{daemon.url}/ui#requests")
        page.wait_for_selector("#conn.conn-live")
        for r in range(ctx.runs):
            log(f"console: run {r + 1}/{ctx.runs}")
            idle = _phase(page, seconds)
            result: dict[str, Any] = {}
            load = job(daemon.url, [request], concurrency=CONCURRENCY, duration_s=seconds + 3)
            thread = threading.Thread(target=lambda out=result, j=load: out.update(lg.run(j)), daemon=True)
            thread.start()
            time.sleep(1.0)  # the clients ramp up
            loaded = _phase(page, seconds)
            thread.join(seconds + 120)
            loaded["rps"] = result["count"] / result["wall_s"] if result.get("wall_s") else None
            loaded["errors"] = result.get("errors")
            runs.append({"idle": idle, "load": loaded})
        browser.close()
    return _summarize(runs, seconds, config, daemon)


def _summarize(runs: list[dict[str, Any]], seconds: float, config: str, daemon: Any) -> dict[str, Any]:
    def get(phase: str, key: str) -> dict[str, Any]:
        return summarize(r[phase][key] for r in runs if r[phase][key] is not None)

    figures = [
        ("main-thread lag p50 (ms)", "lag_p50_ms"),
        ("main-thread lag p99 (ms)", "lag_p99_ms"),
        ("main-thread lag max (ms)", "lag_max_ms"),
        ("click → next frame p50 (ms)", "click_p50_ms"),
        ("click → next frame p99 (ms)", "click_p99_ms"),
        ("snapshot applied p50 (ms)", "apply_p50_ms"),
        ("snapshot applied p99 (ms)", "apply_p99_ms"),
        ("snapshots applied per second", "snapshots_per_s"),
        ("long tasks (> 50 ms) in the window", "long_tasks"),
        ("live request cards shown at the end", "live_cards"),
    ]
    rows = [[label, get("idle", key), get("load", key)] for label, key in figures]
    errors = [r["load"]["errors"] for r in runs if r["load"].get("errors")]
    notes = [f"requests that failed during the load: {errors}"] if errors else []
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "concurrency": CONCURRENCY,
            "chunks_per_stream": CHUNKS,
            "chunk_interval_ms": INTERVAL_MS,
            "seconds_per_phase": seconds,
            "clicks_per_phase": CLICKS,
            "view": "requests",
        },
        "values": {
            "console_load_rps": get("load", "rps"),
            "console_click_p99_ms": get("load", "click_p99_ms"),
            "console_lag_p99_ms": get("load", "lag_p99_ms"),
        },
        "tables": [
            {
                "title": f"The page idle and with {CONCURRENCY} clients streaming "
                "(median [min, max] over runs)",
                "columns": ["figure", "idle", "under load"],
                "rows": [["requests/s served", "", get("load", "rps")], *rows],
            }
        ],
        "plots": [],
        "notes": notes,
        "commands": daemon_commands(config)
        | {
            "browser": f"{CHROMIUM} (headless, Playwright), /ui#requests at 1280x800",
            "load generator": " ".join(LoadGen.command)
            + f" — {CONCURRENCY} clients, OpenAI chat streams of {CHUNKS} chunks",
        },
        "raw_runs": runs,
    }
