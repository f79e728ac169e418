"""Slot bank: the first request after a restart, with and without the bank.

Two homes with the same model and config but ``session_bank`` on in one and off in
the other. Each run, for each home in turn: start the daemon, send a request whose
long system prompt (the shared prefix) fills a slot, stop the daemon gracefully
(SIGTERM; with the bank on, the warm slot is saved under ``sessions/``), start it
again (the model is preloaded: with the bank its start reads the saved slot back),
wait until its engine is ready, and time the first streamed request with the same
prefix and another question: from the send to the first token. The reply's
``cached_tokens`` says how much of the prompt came from the cache. "restart →
ready" is the time from the daemon's spawn to its engine's readiness (the bank's
read is part of it), and a second request on the same engine shows the warm case.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import MODEL, log
from bench._stats import ratio, summarize
from bench._system import descendants
from tests.support import ensure_model, make_home, start_daemon, wait_gone, wait_until

__all__ = ["TITLE", "run"]

TITLE = "Slot bank: first request after a restart"
MAX_TOKENS = 4


def _prefix(facts: int) -> str:
    return "You answer questions about a small town. " + " ".join(
        f"House {i} on Main Street is painted {colour} and has {i % 7 + 1} windows."
        for i, colour in zip(range(facts), ("red", "blue", "green", "white") * facts, strict=False)
    )


def _body(prefix: str, question: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": prefix}, {"role": "user", "content": question}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _first_token(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """Seconds from the send to the first content delta, and the usage the stream ends with."""
    t0 = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900.0) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                if first is None and (choice.get("delta") or {}).get("content"):
                    first = time.perf_counter() - t0
            if event.get("usage"):
                usage = event["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_s": first if first is not None else time.perf_counter() - t0,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens", 0),
    }


def _restart_once(home: Path, prefix: str) -> dict[str, Any]:
    daemon = start_daemon(home, timeout_s=120.0)
    try:
        _first_token(daemon.url, _body(prefix, "What colour is house 3?"))
    finally:
        daemon.stop()
    t0 = time.perf_counter()
    daemon = start_daemon(home, timeout_s=120.0)
    pids = [daemon.proc.pid]
    try:
        wait_until(
            lambda: any(e["state"] == "ready" for e in daemon.engines()), 300.0, "the preloaded engine"
        )
        ready_s = time.perf_counter() - t0
        after = _first_token(daemon.url, _body(prefix, "How many windows has house 5?"))
        pids += descendants(daemon.proc.pid)
        warm = _first_token(daemon.url, _body(prefix, "What colour is house 9?"))
    finally:
        daemon.stop()
        wait_gone(pids, timeout_s=15.0)
    return {"first": after, "warm": warm, "ready_s": ready_s}


def run(ctx: Context) -> dict[str, Any]:
    facts = ctx.pick(60, 12)
    prefix = _prefix(facts)
    tmp = Path(tempfile.mkdtemp(prefix="blazar-bench-sessions-"))
    model = ensure_model()
    config = f'slots = {ctx.slots}\ndefault_ctx = 4096\nkeep_alive_s = -1\npreload = ["{MODEL}"]\n'
    homes = {
        "bank": make_home(tmp / "bank", model, config=config + "session_bank = true\n"),
        "none": make_home(tmp / "none", model, config=config + "session_bank = false\n"),
    }
    runs: list[dict[str, Any]] = []
    try:
        for r in range(ctx.runs):
            log(f"sessions: run {r + 1}/{ctx.runs}")
            runs.append({who: _restart_once(home, prefix) for who, home in homes.items()})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def get(who: str, when: str, key: str) -> dict[str, Any]:
        return summarize(r[who][when][key] for r in runs)

    speedup = summarize(ratio(r["none"]["first"]["ttft_s"], r["bank"]["first"]["ttft_s"]) for r in runs)
    prompt_tokens = runs[0]["bank"]["first"]["prompt_tokens"] if runs else None
    rows = [
        [f"bank {'on' if who == 'bank' else 'off'}: {label}", get(who, when, "ttft_s"),
         get(who, when, "cached_tokens")]
        for when, label in (("first", "first request after restart"), ("warm", "second request (warm)"))
        for who in ("bank", "none")
    ]  # fmt: skip
    rows += [
        [f"bank {'on' if who == 'bank' else 'off'}: restart → engine ready",
         summarize(r[who]["ready_s"] for r in runs), ""]
        for who in ("bank", "none")
    ]  # fmt: skip
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {
            "prompt_tokens": prompt_tokens,
            "max_tokens": MAX_TOKENS,
            "slots": ctx.slots,
            "default_ctx": 4096,
        },
        "values": {
            "bank_first_ttft_s": get("bank", "first", "ttft_s"),
            "nobank_first_ttft_s": get("none", "first", "ttft_s"),
            "bank_ttft_speedup": speedup,
        },
        "tables": [
            {
                "title": f"First token after a restart, {prompt_tokens} prompt tokens; "
                f"median [min, max] over {len(runs)} runs",
                "columns": ["what", "seconds", "cached tokens"],
                "rows": rows,
            },
            {
                "title": "TTFT without the bank ÷ with it (first request after restart)",
                "columns": ["ratio"],
                "rows": [[speedup]],
            },
        ],
        "plots": [],
        "commands": {
            "config": config.strip().replace("\n", "; ") + "; session_bank = true|false",
            "restart": "blazar serve; POST /v1/chat/completions (stream); SIGTERM; blazar serve; POST again",
        },
        "raw_runs": runs,
    }
