"""``blazar watch``: a full-screen live view of the daemon, from ``GET /api/console/snapshot``.

It polls the snapshot once a second (``--interval``) and redraws with rich's
``Live``: the models with their slots, queue and memory, the live requests,
the request classes, latency quantiles, rates, memory and jobs, each table cut to what fits the
terminal (80x24 included). Plain characters only, no mouse: it works over SSH.
``q`` (or Ctrl-C) quits; keys are read without echo (cbreak mode on a terminal).
``--once`` prints one snapshot and exits (``--once --json``: the JSON, for scripts).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any

from cyclopts import Parameter
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from blazar.cli import app
from blazar.cli._common import Json, human_size, out, print_json
from blazar.daemon.client import CliError, Daemon

__all__ = ["render", "sparkline"]

SNAPSHOT = "/api/console/snapshot"
_RAMP = " .:-=+*#%@"
"""Plain characters from low to high: a sparkline any terminal shows."""
_SPARK_S = 60


@app.command
def watch(
    *,
    once: Annotated[bool, Parameter(negative="", help="Print one snapshot and exit.")] = False,
    json_: Json = False,
    interval: Annotated[float, Parameter(help="Seconds between refreshes (at least 0.25).")] = 1.0,
) -> None:
    """Watch the daemon live: loaded models with slots, queue and memory, live requests, request
    classes (queued, running, waits, preemptions), time to first token and per output token,
    rates, memory and jobs. `q` or Ctrl-C quits.

    With --once: one snapshot, printed (with --json: as JSON, for scripts)."""
    from blazar.cli._common import load_setup
    from blazar.daemon.client import find_daemon

    paths, _ = load_setup()
    daemon = find_daemon(paths)
    if daemon is None:
        raise CliError("no daemon is running — start one with `blazar serve`, then `blazar watch`")
    if once:
        doc = daemon.get(SNAPSHOT)
        if json_:
            print_json(doc)
        else:
            out.print(render(doc, width=out.width, height=10_000, url=daemon.url))
        return
    _live(daemon, max(interval, 0.25))


def _live(daemon: Daemon, interval_s: float) -> None:
    import httpx
    from rich.console import Console
    from rich.live import Live

    console = Console(highlight=False)
    doc: dict[str, Any] | None = None
    problem: str | None = None

    def frame() -> RenderableType:
        width, height = console.size
        if doc is None:
            return Text(f"blazar watch  {daemon.url}  waiting for the daemon... {problem or ''}")
        return render(doc, width=width, height=height, url=daemon.url, problem=problem)

    with _keys() as key, Live(console=console, screen=True, auto_refresh=False) as live:
        try:
            while True:
                try:
                    doc, problem = daemon.get(SNAPSHOT), None
                except (httpx.HTTPError, CliError) as exc:
                    problem = f"daemon unreachable ({type(exc).__name__}); retrying"
                live.update(frame(), refresh=True)
                deadline = time.monotonic() + interval_s
                while (left := deadline - time.monotonic()) > 0:
                    pressed = key(left)
                    if pressed in ("q", "Q"):
                        return
                    if pressed is not None:  # a resize or another key: redraw at once
                        live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            return


@contextmanager
def _keys() -> Iterator[Any]:
    """A function that waits up to N seconds for a key and returns it (None: none came).
    On a terminal, stdin is in cbreak mode meanwhile: keys arrive one by one, unechoed;
    Ctrl-C still interrupts."""
    import os
    import select
    import sys

    stdin = sys.stdin
    if stdin is None or not stdin.isatty():

        def sleep(timeout: float) -> str | None:
            time.sleep(timeout)
            return None

        yield sleep
        return
    import termios
    import tty

    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)

    def read(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(fd, 32)
        return data.decode(errors="replace")[:1] if data else None

    tty.setcbreak(fd)
    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# -- rendering (pure: a snapshot in, rich renderables out) --------------------


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as plain characters, scaled to the largest."""
    shown = list(values)[-width:] if width > 0 else []
    top = max(shown, default=0.0)
    if top <= 0:
        return " " * len(shown)
    steps = len(_RAMP) - 1
    return "".join(_RAMP[min(steps, max(1 if v > 0 else 0, round(v / top * steps)))] for v in shown)


def _num(v: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f}s" if v >= 1000 else f"{v:.0f}ms"


def _size(v: int | None) -> str:
    return "-" if v is None else human_size(v)


def _left(seconds: float) -> str:
    if seconds <= 0:
        return "now"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _dialect(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    return "ollama" if path.startswith("/api/") else "native"


def _table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, expand=True)
    for i, name in enumerate(columns):
        table.add_column(name, no_wrap=True, overflow="ellipsis", ratio=3 if i == 0 else None)
    return table


def _model_rows(doc: dict[str, Any]) -> list[list[str]]:
    now = doc.get("time") or time.time()
    rows = []
    for m in sorted(doc.get("models") or [], key=lambda m: (not m["loaded"], m["name"])):
        slots = m.get("slots")
        expires = m.get("expires_at")
        rows.append(
            [
                m["name"],
                m.get("state") or "idle",
                f"{m.get('busy', 0)}/{slots}" if slots is not None else "-",
                str(m.get("queued", 0)),
                _size(m.get("memory_bytes")),
                _size(m.get("rss_bytes")),
                _left(expires - now) if expires is not None else "-",
            ]
        )
    return rows


def _request_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in doc.get("requests") or []:
        pos = r.get("queue_position")
        rows.append(
            [
                r.get("model") or "-",
                _dialect(r.get("path", "")),
                r["state"] + (f" #{pos}" if pos is not None else ""),
                (r.get("class") or "-") + (f" x{r['preempted']}" if r.get("preempted") else ""),
                str(r.get("chunks", 0)),
                _ms(r.get("ttft_ms")),
                _ms(r.get("elapsed_ms")),
                r["id"],
            ]
        )
    return rows


def _latency_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for model, temps in sorted((doc.get("quantiles") or {}).items()):
        for temp in ("warm", "cold"):
            q = temps.get(temp)
            if not q:
                continue
            ttft, tpot = q.get("ttft_ms") or {}, q.get("tpot_ms") or {}
            rows.append(
                [
                    model,
                    temp,
                    str(q.get("count", 0)),
                    _ms(ttft.get("p50")),
                    _ms(ttft.get("p95")),
                    _ms(tpot.get("p50")),
                    _ms(tpot.get("p95")),
                ]
            )
    return rows


def _class_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The classes that saw any request (an idle daemon shows "none")."""
    rows = []
    for c in doc.get("classes") or []:
        counts = (c["queued"], c["running"], c["granted"], c["rejected"], c["expired"], c["preempted"])
        if any(counts):
            rows.append(
                [c["name"], *(str(n) for n in counts[:3]), _ms(c.get("mean_wait_ms")), *map(str, counts[3:])]
            )
    return rows


def _job_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = []
    for j in doc.get("jobs") or []:
        p = j.get("progress")
        rows.append(
            [j["id"], j["kind"], j["state"], "-" if p is None else f"{p * 100:.0f}%", j.get("detail") or ""]
        )
    return rows


_SECTIONS = (
    ("Models", ("model", "state", "slots", "queue", "memory", "rss", "expires"), _model_rows),
    ("Requests", ("model", "dialect", "state", "class", "chunks", "ttft", "elapsed", "id"), _request_rows),
    (
        "Classes",
        ("class", "queued", "running", "granted", "wait", "full", "timeout", "preempted"),
        _class_rows,
    ),
    ("Latency", ("model", "", "n", "ttft p50", "p95", "tpot p50", "p95"), _latency_rows),
    ("Jobs", ("id", "kind", "state", "done", "detail"), _job_rows),
)


def _fit(needs: list[int], room: int) -> list[int]:
    """Rows shown per section: one each first (its rows or a "none" line), then one more at a
    time to each that wants more, in order, until ``room`` is spent."""
    shown = [1] * len(needs)
    room -= len(needs)
    while room > 0 and any(s < n for s, n in zip(shown, needs, strict=True)):
        for i, need in enumerate(needs):
            if room > 0 and shown[i] < need:
                shown[i] += 1
                room -= 1
    return shown


def _summary(doc: dict[str, Any], width: int) -> list[Text]:
    rates = doc.get("rates") or {}
    mem = doc.get("memory") or {}
    rps = [p.get("requests_per_s", 0.0) for p in doc.get("series") or []]
    line1 = Text(no_wrap=True, overflow="ellipsis")
    line1.append(f"req/s {_num(rates.get('requests_per_s'), digits=2)}  ", style="bold")
    line1.append(f"err/s {_num(rates.get('errors_per_s'), digits=2)}  ")
    line1.append(
        f"tok/s in {_num(rates.get('tokens_in_per_s'))} out {_num(rates.get('tokens_out_per_s'))}"
        f"  (last {rates.get('window_s', '-')} s)  "
    )
    spark_w = max(0, min(_SPARK_S, width - len(line1.plain) - 3))
    if spark_w >= 10:
        line1.append("[" + sparkline(rps, spark_w) + "]", style="cyan")
    line2 = Text(no_wrap=True, overflow="ellipsis")
    avail, total = mem.get("available_bytes"), mem.get("total_bytes")
    line2.append(f"RAM {_size(avail)} free of {_size(total)}")
    if mem.get("budget_bytes") is not None:
        line2.append(f"  budget {_size(mem['budget_bytes'])}")
    for i, gpu in enumerate(mem.get("gpus") or []):
        line2.append(f"  GPU{i} {_size(gpu.get('free_bytes'))} free of {_size(gpu.get('total_bytes'))}")
    return [line1, line2]


def render(
    doc: dict[str, Any], *, width: int, height: int, url: str = "", problem: str | None = None
) -> RenderableType:
    """The whole view of one snapshot, cut to ``height`` lines."""
    header = Text(no_wrap=True, overflow="ellipsis")
    header.append("blazar watch", style="bold")
    header.append(f"  {doc.get('version', '')}  {url}  ")
    header.append(time.strftime("%H:%M:%S", time.localtime(doc.get("time") or time.time())))
    header.append("  q quits", style="dim")
    if problem:
        header.append(f"  {problem}", style="bold red")
    parts: list[RenderableType] = [header, *_summary(doc, width)]
    sections = [(title, cols, rows_of(doc)) for title, cols, rows_of in _SECTIONS]
    # fixed lines: header, two summary lines, and a title and a column line per section
    room = height - len(parts) - 2 * len(sections)
    shown = _fit([len(rows) for _, _, rows in sections], max(room, len(sections)))
    for (title, cols, rows), limit in zip(sections, shown, strict=True):
        table = _table(*cols)
        cut = rows if len(rows) <= limit else rows[: max(0, limit - 1)]
        for row in cut:
            table.add_row(*row)
        if len(cut) < len(rows):
            table.add_row(Text(f"... {len(rows) - len(cut)} more", style="dim"))
        elif not rows:
            table.add_row(Text("none", style="dim"))
        parts.append(Text(f"{title} ({len(rows)})", style="bold underline"))
        parts.append(table)
    return Group(*parts)
