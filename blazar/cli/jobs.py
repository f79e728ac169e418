"""``blazar jobs``: list, show, follow and cancel the daemon's durable jobs, and print their results."""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import cyclopts
import msgspec
from rich.console import Console
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import Json, err, out, print_json, time_ago
from blazar.config import resolve_paths
from blazar.daemon.client import CliError, Daemon, find_daemon

if TYPE_CHECKING:
    import httpx

__all__ = ["jobs"]

FINISHED = ("completed", "failed", "cancelled")
POLL_S = 1.0
"""How often ``follow`` reads the job itself (its status and progress) while events stream."""

_END = object()

jobs = cyclopts.App(name="jobs", help="List, show, follow and cancel the daemon's jobs (background work).")
app.command(jobs)

State = Literal["queued", "running", "completed", "failed", "cancelled"]


def _daemon() -> Daemon:
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        raise CliError("no daemon is running — start one with `blazar serve`")
    return daemon


def _path(job_id: str, tail: str = "") -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}{tail}"


def _message(resp: httpx.Response) -> str:
    try:
        error = resp.json().get("error")
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or f"HTTP {resp.status_code}")


def _call(daemon: Daemon, method: str, job_id: str, tail: str = "") -> dict[str, Any]:
    resp = daemon.http.request(method, _path(job_id, tail))
    if resp.status_code == 404:
        raise CliError(f"no job '{job_id}' — see `blazar jobs` (finished jobs are pruned after a while)")
    if resp.status_code == 409:
        raise CliError(f"{_message(resp)} — see `blazar jobs show {job_id}`")
    if resp.status_code >= 400:
        raise CliError(_message(resp))
    doc: dict[str, Any] = resp.json()
    return doc


def _compact(progress: dict[str, Any], width: int = 40) -> str:
    text = " ".join(f"{k}={v}" for k, v in progress.items()) if progress else "-"
    return text if len(text) <= width else text[: width - 1] + "…"


@jobs.default
def list_jobs(
    *,
    state: State | None = None,
    kind: str | None = None,
    limit: int = 50,
    after: str | None = None,
    json_: Json = False,
) -> None:
    """List jobs, newest first: id, kind, model, status, attempts, age, progress.

    Parameters
    ----------
    state
        Only jobs in this state.
    kind
        Only jobs of this kind (response, batch).
    limit
        At most this many jobs (1 to 1000).
    after
        The page after this job id (see the hint under a full page).
    """
    daemon = _daemon()
    query: dict[str, str | int] = {"limit": limit}
    for name, value in (("state", state), ("kind", kind), ("after", after)):
        if value is not None:
            query[name] = value
    resp = daemon.http.get("/v1/jobs", params=query)
    if resp.status_code >= 400:
        raise CliError(_message(resp))
    page = resp.json()
    if json_:
        print_json(page)
        return
    if not page["data"]:
        out.print("no jobs" + (" match" if state or kind or after else " yet"))
        return
    table = Table(box=None)
    # the id is what gets copied into the next command: never cut it
    table.add_column("ID", no_wrap=True, min_width=max(len(j["id"]) for j in page["data"]))
    for name in ("KIND", "MODEL", "STATUS", "ATTEMPTS", "AGE", "PROGRESS"):
        table.add_column(name, no_wrap=True)
    for job in page["data"]:
        table.add_row(
            job["id"], job["kind"], job["model"] or "-", job["status"], str(job["attempts"]),
            time_ago(job["created_at"]), _compact(job["progress"]),
        )  # fmt: skip
    # piped output has no width to fit: print whole rows for grep and awk
    (out if out.is_terminal else Console(highlight=False, width=1000)).print(table)
    if page["has_more"]:
        err.print(f"[dim]more jobs: `blazar jobs --after {page['last_id']}`[/]")


@jobs.command
def show(job_id: str, /, *, json_: Json = False) -> None:
    """Show one job: its status, attempts, times, progress, error and result."""
    job = _call(_daemon(), "GET", job_id)
    if json_:
        print_json(job)
        return
    fields: list[tuple[str, str]] = [
        ("id", job["id"]),
        ("kind", job["kind"]),
        ("model", job["model"] or "-"),
        ("status", job["status"]),
        ("attempts", str(job["attempts"])),
        ("created", time_ago(job["created_at"])),
        ("updated", time_ago(job["updated_at"])),
        ("progress", _compact(job["progress"], width=200)),
    ]
    if job.get("error"):
        fields.append(("error", str(job["error"])))
    if "artifact" in job:
        from blazar.config import resolve_paths

        fields.append(("artifact", str(Path(resolve_paths().data_dir) / job["artifact"]["path"])))
    elif job.get("result") is not None:
        result = job["result"]
        more = f" … ({len(result)} chars; --json shows all)" if len(result) > 200 else ""
        fields.append(("result", result[:200].replace("\n", " ") + more))
    table = Table(box=None, show_header=False)
    for name, value in fields:
        table.add_row(f"[bold]{name}[/]", value)
    out.print(table)


def _stream_events(daemon: Daemon, job_id: str, after: int, events: queue.Queue[Any]) -> None:
    """Put each event of the job's SSE stream on ``events``, then ``_END`` (or the error)."""
    try:
        with daemon.http.stream(
            "GET", _path(job_id, "/events"), params={"after": after}, headers={"Accept": "text/event-stream"}
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                events.put(CliError(_message(resp)))
                return
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    events.put(msgspec.json.decode(line[5:].strip()))
    except Exception as exc:
        events.put(exc)
    finally:
        events.put(_END)


@jobs.command
def follow(job_id: str, /) -> None:
    """Follow a job live until it ends; exits non-zero unless it completed."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    daemon = _daemon()
    job = _call(daemon, "GET", job_id)
    deltas, seq = 0, -1
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(job_id)

        def show_state() -> None:
            detail = f"{deltas} text deltas" if job["kind"] == "response" else _compact(job["progress"], 60)
            bar.update(task, description=f"{job_id} {job['status']}  {detail}")

        while True:
            show_state()
            events: queue.Queue[Any] = queue.Queue()
            threading.Thread(target=_stream_events, args=(daemon, job_id, seq, events), daemon=True).start()
            polled = time.monotonic()
            while (item := _next(events)) is not _END:
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, dict):
                    seq = item.get("sequence_number", seq)
                    if item.get("type") == "response.output_text.delta":
                        deltas += 1
                if time.monotonic() - polled >= POLL_S:
                    job, polled = _call(daemon, "GET", job_id), time.monotonic()
                show_state()
            job = _call(daemon, "GET", job_id)
            if job["status"] in FINISHED:
                break
            # the stream ended with the job still going (the daemon dropped it): pick up where it left off
            time.sleep(POLL_S)
    status = job["status"]
    detail = f" ({deltas} text deltas)" if job["kind"] == "response" else ""
    if status == "failed":
        raise CliError(f"job {job_id} failed: {job.get('error') or 'no reason given'}")
    if status == "cancelled":
        raise CliError(f"job {job_id} was cancelled{detail}")
    out.print(f"job {job_id} {status}{detail}")


def _next(events: queue.Queue[Any]) -> Any:
    try:
        return events.get(timeout=POLL_S)
    except queue.Empty:
        return None


@jobs.command
def cancel(job_id: str, /) -> None:
    """Cancel a queued or running job; prints its final status."""
    job = _call(_daemon(), "POST", job_id, "/cancel")
    out.print(f"job {job_id} {job['status']}")


@jobs.command
def result(job_id: str, /) -> None:
    """Print a completed job's result (an async transcription's transcript, in its format)."""
    daemon = _daemon()
    resp = daemon.http.get(_path(job_id, "/result"))
    if resp.status_code == 404:
        raise CliError(f"no job '{job_id}' — see `blazar jobs` (finished jobs are pruned after a while)")
    if resp.status_code >= 400:
        raise CliError(_message(resp))
    text = resp.text
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
