"""``blazar tune``: search the launch settings that run a model fastest here and keep the best.

The search runs as a job in the daemon (started in the background if none runs; see
``blazar/serve/jobs/tune.py``); this command waits for it and prints
every trial. ``--show`` prints the stored profile, ``--reset`` drops it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

from cyclopts import Parameter
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, load_setup, out, print_json
from blazar.cli.certify import _wait, _when
from blazar.daemon.client import CliError, ensure_daemon

__all__ = ["tune"]

_SHORT = {
    "threads": "threads",
    "flash_attn": "fa",
    "kv_cache": "kv",
    "prompt_batch": "batch",
    "micro_batch": "ubatch",
    "slots": "slots",
    "gpu_layers": "ngl",
}


@app.command
def tune(
    model: str,
    *,
    concurrency: Annotated[
        int, Parameter(help="Requests the workload runs at once (slots are tried above 1).")
    ] = 1,
    ctx: Annotated[int, Parameter(help="Prompt tokens per request (about).")] = 256,
    max_tokens: Annotated[int, Parameter(help="Tokens generated per request.")] = 32,
    requests: Annotated[
        int | None, Parameter(help="Requests per trial (default: twice the concurrency, at least 3).")
    ] = None,
    budget: Annotated[int, Parameter(help="The most trials, the baseline included.")] = 12,
    min_gain: Annotated[
        float, Parameter(help="How much faster a value must be to be kept (0.05: 5 %).")
    ] = 0.05,
    apply: Annotated[bool, Parameter(negative="", help="Load the model with the profile now.")] = False,
    show: Annotated[bool, Parameter(negative="", help="Print the stored profile and its trials.")] = False,
    reset: Annotated[bool, Parameter(negative="", help="Drop the stored profile.")] = False,
    json_: Json = False,
) -> None:
    """Find the fastest launch settings for MODEL on this machine: threads, flash attention,
    the KV cache's type, the prompt batch and micro-batch, slots (with --concurrency above 1)
    and GPU layers (with a GPU), each within the memory a load may use, measured with a short
    workload through the gateway. The best is stored as the model's profile and applies from
    its next load (--apply: now); settings pinned in config.toml are not searched."""
    paths, config = load_setup()
    daemon, _ = ensure_daemon(paths, config)
    route = f"/api/profiles/{quote(model, safe='')}"
    if show or reset:
        if show and reset:
            raise CliError("give --show or --reset, not both")
        doc = daemon.delete(route) if reset else daemon.get(route)
        if json_:
            print_json(doc)
        elif reset:
            said = "dropped" if doc["deleted"] else "had none"
            out.print(
                f"{doc['model']}: profile {said}; it runs with its config.toml settings from its next load"
            )
        else:
            _print(doc)
        return
    body: dict[str, Any] = {
        "model": model,
        "concurrency": concurrency,
        "ctx": ctx,
        "max_tokens": max_tokens,
        "budget": budget,
        "min_gain": min_gain,
        "apply": apply,
    }
    if requests is not None:
        body["requests"] = requests
    job = daemon.post("/api/tune", body)
    done = _wait(daemon, job, "tune", quiet=json_)
    tuned = json.loads(done["result"])
    if json_:
        print_json(tuned)
        return
    _print(tuned)
    profile = tuned["profile"]
    if profile:
        when = (
            "the engine runs with it now" if apply else "it applies from the model's next load (--apply: now)"
        )
        out.print(f"Profile stored: {_settings(profile)} — {when}.")
    else:
        out.print("The settings the model had were the fastest: the stored profile changes nothing.")
    out.print(f"`blazar explain {tuned['model']}` shows it; `blazar tune {tuned['model']} --reset` drops it.")


def _settings(values: dict[str, Any]) -> str:
    return " ".join(f"{_SHORT.get(k, k)}={'-' if v is None else v}" for k, v in values.items())


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}" if isinstance(value, float) else str(value)


def _print(tuned: dict[str, Any]) -> None:
    w = tuned["workload"]
    out.print(
        f"tune of {tuned['model']} — {tuned['engine']}, {_when(tuned['created_at'])}; workload: "
        f"{w['concurrency']} at a time, ~{w['ctx']}-token prompts, {w['max_tokens']} tokens out, "
        f"{w.get('requests') or 'default'} requests per trial; load average "
        f"{', '.join(f'{x:.2f}' for x in w.get('load_average', []))} on {w.get('cpus')} CPUs",
        markup=False,
    )
    table = Table("#", "TRIED", "TOKENS/s", "PREFILL t/s", "DECODE t/s", "TTFT p50", "VERDICT", box=None)
    for col in table.columns:
        col.overflow = "fold"
    for i, t in enumerate(tuned["trials"], 1):
        f = t.get("figures") or {}
        changed = t["changed"]
        if changed is None:
            tried = _settings(t["values"])
        elif changed.startswith("confirm"):  # the best: what differs from the baseline
            base = tuned["trials"][0]["values"]
            tried = " ".join([changed, _settings({k: v for k, v in t["values"].items() if v != base.get(k)})])
        else:
            tried = _settings({changed: t["values"][changed]})
        ttft = (f.get("ttft_ms") or {}).get("p50")
        table.add_row(
            str(i), tried, _fmt(t.get("score")), _fmt(f.get("prefill_tps")), _fmt(f.get("decode_tps")),
            "-" if ttft is None else f"{ttft:,.0f} ms", t["verdict"],
        )  # fmt: skip
    out.print(table)
    for name, why in (w.get("skipped") or {}).items():
        out.print(f"not searched: {name} — {why}", markup=False)
    out.print(f"profile: {_settings(tuned['profile']) or '(empty: the settings it had)'}", markup=False)
