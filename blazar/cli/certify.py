"""``blazar model-doctor``, ``blazar bench`` and ``blazar scorecard``.

The first two run as jobs in the daemon (started in the background if none runs) and
wait for them; the scorecard only reads what they stored.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from cyclopts import Parameter
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, err, human_size, load_setup, out, print_json
from blazar.config import resolve_paths
from blazar.daemon.client import CliError, Daemon, ensure_daemon, find_daemon

__all__ = ["bench", "model_doctor", "scorecard"]

_FINISHED = ("completed", "failed", "cancelled")
_STYLE = {"PASS": "green", "FAIL": "red", "N/A": "dim"}


def _wait(daemon: Daemon, job: dict[str, Any], what: str, *, quiet: bool) -> dict[str, Any]:
    """Poll the job until it ends; print its progress (on stderr) unless ``quiet``."""
    seen: Any = None
    while True:
        doc: dict[str, Any] = daemon.get(f"/v1/jobs/{quote(job['id'], safe='')}")
        if doc["status"] in _FINISHED:
            if doc["status"] != "completed":
                raise CliError(
                    f"the {what} job {doc['id']} {doc['status']}: {doc.get('error') or 'no reason given'}"
                )
            return doc
        progress = doc.get("progress") or None
        if progress != seen and progress and not quiet:
            err.print(f"{what}: {progress.get('done')}/{progress.get('of')} done")
            seen = progress
        time.sleep(0.5)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _capability_table(probes: list[dict[str, Any]]) -> Table:
    table = Table("CAPABILITY", "STATUS", "DETAIL", "ANSWER", box=None)
    for p in probes:
        answer = (p.get("answer") or "").replace("\n", " ")
        answer = answer if len(answer) <= 60 else answer[:59] + "…"
        status = p["status"]
        table.add_row(p["capability"], f"[{_STYLE[status]}]{status}[/]", p["detail"], answer)
    return table


@app.command(name="model-doctor")
def model_doctor(model: str, *, json_: Json = False) -> None:
    """Certify a model: probe chat, streaming, tool calls, JSON schema, embeddings, vision and
    thinking through the daemon's own gateway, and store PASS / FAIL / N/A for each with its
    evidence. Admission then refuses requests needing a capability marked FAIL."""
    paths, config = load_setup()
    daemon, _ = ensure_daemon(paths, config)
    job = daemon.post("/api/model-doctor", {"model": model})
    done = _wait(daemon, job, "model-doctor", quiet=json_)
    cert = daemon.get(f"/api/model-doctor/{quote(done['model'], safe='')}")
    if json_:
        print_json(cert)
        return
    out.print(f"certificate of {cert['model']} — engine {cert['engine']}, {_when(cert['created_at'])}")
    out.print(_capability_table(cert["probes"]))


def _ints(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(
            f"--concurrency takes numbers separated by commas (e.g. 1,4,8), not {text!r}"
        ) from None
    if not levels:
        raise CliError("--concurrency needs at least one level (e.g. 1,4,8)")
    return levels


def _fmt(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _levels_table(levels: list[dict[str, Any]]) -> Table:
    table = Table(
        "CONC", "OK", "PROMPT", "PREFILL t/s", "DECODE t/s", "ALL t/s", "TTFT p50/p99 ms", "ITL p50/p99 ms",
        box=None,
    )  # fmt: skip
    for lv in levels:
        table.add_row(
            str(lv["concurrency"]), f"{lv['ok']}/{lv['requests']}", _fmt(lv.get("prompt_tokens")),
            _fmt(lv.get("prefill_tps")), _fmt(lv.get("decode_tps")), _fmt(lv.get("aggregate_tps")),
            f"{_fmt(lv['ttft_ms']['p50'])} / {_fmt(lv['ttft_ms']['p99'])}",
            f"{_fmt(lv['itl_ms']['p50'])} / {_fmt(lv['itl_ms']['p99'])}",
        )  # fmt: skip
    return table


def _load_line(settings: dict[str, Any]) -> str:
    load = settings.get("load_average") or [None]
    shown = "unknown" if load[0] is None else f"{load[0]:.1f}"
    return f"measured at a load average of {shown} on {settings.get('cpus')} CPUs"


def _print_receipt(r: dict[str, Any]) -> None:
    launch = r["settings"].get("launch", {})
    out.print(
        f"receipt {r['id']} of {r['model']} — engine {r['engine']}, slots {launch.get('slots')}, "
        f"ctx/slot {launch.get('ctx_per_slot')}, {_when(r['created_at'])}"
    )
    out.print(_levels_table(r["levels"]))
    out.print(_load_line(r["settings"]))
    for lv in r["levels"]:
        for error in lv.get("errors") or []:
            out.print(f"  concurrency {lv['concurrency']}: {error}")


@app.command
def bench(
    model: str | None = None,
    *,
    ctx: Annotated[int, Parameter(help="Prompt tokens per request (about).")] = 256,
    concurrency: Annotated[str, Parameter(help="Concurrency levels, comma-separated.")] = "1,4,8",
    requests: Annotated[
        int | None, Parameter(help="Requests per level (default: twice the level, at least 4).")
    ] = None,
    max_tokens: Annotated[int, Parameter(help="Tokens generated per request.")] = 64,
    list_: Annotated[
        bool, Parameter(name="--list", negative="", help="List stored receipts instead.")
    ] = False,
    json_: Json = False,
) -> None:
    """Measure a model through the gateway: prefill and decode speed, time to first token and
    inter-token percentiles per concurrency level, streamed from the real engine. The receipt
    is stored with the engine version and launch settings (`blazar bench --list`)."""
    if list_:
        _list(model, json_=json_)
        return
    if model is None:
        raise CliError("name the model to benchmark (`blazar bench MODEL`), or list receipts with --list")
    body = {"model": model, "ctx": ctx, "concurrency": _ints(concurrency), "max_tokens": max_tokens}
    if requests is not None:
        body["requests"] = requests
    paths, config = load_setup()
    daemon, _ = ensure_daemon(paths, config)
    job = daemon.post("/api/bench", body)
    done = _wait(daemon, job, "bench", quiet=json_)
    import json

    receipt = json.loads(done["result"])
    if json_:
        print_json(receipt)
        return
    _print_receipt(receipt)


def _list(model: str | None, *, json_: bool) -> None:
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        raise CliError("no daemon is running — start one with `blazar serve`")
    route = "/api/benchmarks" + (f"?model={quote(model, safe='')}" if model else "")
    receipts = daemon.get(route)["data"]
    if json_:
        print_json(receipts)
        return
    if not receipts:
        out.print("no receipts" + (f" for {model}" if model else "") + " — run `blazar bench MODEL`")
        return
    table = Table("ID", "MODEL", "ENGINE", "WHEN (UTC)", "CONC", "DECODE t/s", box=None)
    for r in receipts:
        first = r["levels"][0] if r["levels"] else {}
        when = datetime.fromtimestamp(r["created_at"], UTC).strftime("%m-%d %H:%M")
        table.add_row(
            r["id"], r["model"], r["engine"], when, ",".join(str(lv["concurrency"]) for lv in r["levels"]),
            _fmt(first.get("decode_tps")),
        )  # fmt: skip
    out.print(table)


@app.command
def scorecard(model: str, *, json_: Json = False) -> None:
    """One page on a model from what is stored (never re-runs anything): speed from the newest
    bench receipt, memory from the fit estimate, capabilities from the certificate, the engine
    version, and whether the receipt or certificate predates the active engine."""
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        raise CliError("no daemon is running — start one with `blazar serve`")
    doc = daemon.get(f"/api/scorecard/{quote(model, safe='')}")
    if json_:
        print_json(doc)
        return
    out.print(f"[bold]{doc['model']}[/] — active engine {doc['engine']}")
    mem = doc["memory"]
    need = mem.get("total_bytes") or mem.get("need_bytes")
    line = f"memory: {human_size(need)} estimated" if need else "memory: no estimate"
    if mem.get("weights_bytes") is not None:
        line += f" (weights {human_size(mem['weights_bytes'])}, KV {human_size(mem['kv_bytes'])})"
    if mem.get("slots") is not None:
        line += f" for {mem['slots']} slots x {mem['ctx_per_slot']} tokens"
    if mem.get("refused"):
        line += f"; would not load now: {mem['refused']}"
    out.print(line)
    cert = doc.get("certificate")
    if cert is None:
        out.print(f"capabilities: not certified — run `blazar model-doctor {doc['model']}`")
    else:
        stale = " [yellow](predates the active engine: re-run model-doctor)[/]" if cert["stale"] else ""
        caps = "  ".join(f"{k} [{_STYLE[v]}]{v}[/]" for k, v in cert["capabilities"].items())
        out.print(f"capabilities ({cert['engine']}, {_when(cert['created_at'])}){stale}: {caps}")
    receipt = doc.get("receipt")
    if receipt is None:
        out.print(f"speed: no receipt — run `blazar bench {doc['model']}`")
        return
    stale = " [yellow](predates the active engine: re-run bench)[/]" if receipt["stale"] else ""
    out.print(f"speed ({receipt['engine']}, {_when(receipt['created_at'])}){stale}:")
    out.print(_levels_table(receipt["levels"]))
    out.print(_load_line(receipt["settings"]))
