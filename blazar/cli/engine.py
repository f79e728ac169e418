"""``blazar engine``: engine versions side by side, switched only after a probe and a speed gate.

``install`` puts a version in its own directory (a venv with hash-pinned wheels from the
package index, or a SHA-256-checked binary); ``use`` probes it against a real model next to
the active version, switches when both the probe and the regression gate pass, tells a
running daemon to move its engines over (each drains its requests first), then sends the
first real requests through the daemon and rolls back by itself when they fail.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, err, listing, load_setup, open_store, out, print_json, time_ago
from blazar.daemon.client import CliError, find_daemon

__all__ = ["engine"]

engine = cyclopts.App(name="engine", help="Engine versions: install, use (after a probe), roll back, remove.")
app.command(engine)

_ALIASES = {"xllamacpp": "llamacpp", "llama.cpp": "llamacpp", "mistral.rs": "mistralrs"}
_LANES = ("llamacpp", "mistralrs")


def _split(ref: str, *, version_needed: bool = True) -> tuple[str, str | None]:
    lane, _, version = ref.partition("@")
    lane = _ALIASES.get(lane, lane)
    if lane not in _LANES:
        raise CliError(f"unknown engine {lane!r}: one of {', '.join(_LANES)} (as LANE@VERSION)")
    if version_needed and not version:
        raise CliError(f"name the version: {lane}@VERSION (`blazar engine list`)")
    return lane, version or None


def _versions() -> Any:
    from actors.engines.versions import Versions

    paths, _ = load_setup()
    return Versions(paths.data_dir)


def _latest(lane: str) -> str:
    from actors.engines.versions import DISTS

    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", DISTS[lane]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for line in done.stdout.splitlines():
        if line.startswith("Available versions:"):
            return line.split(":", 1)[1].split(",")[0].strip()
    raise CliError(
        f"could not ask the package index for {DISTS[lane]}'s versions: {done.stderr.strip()[-200:]}"
    )


@engine.command(name="list")
def list_(*, json_: Json = False) -> None:
    """Installed versions of each lane, which is active, and what the daemon was installed with."""
    from actors.engines.versions import BUNDLED, bundled_version

    versions = _versions()
    rows = [
        {"lane": lane, "version": BUNDLED, "form": "bundled", "package": bundled_version(lane),
         "active": versions.active_name(lane) == BUNDLED, "source": "the daemon's own environment",
         "installed_at": None}
        for lane in _LANES
    ]  # fmt: skip
    for v in versions.installed():
        rows.append(
            {"lane": v.lane, "version": v.version, "form": v.form, "package": v.dist, "source": v.source,
             "active": versions.active_name(v.lane) == v.version, "installed_at": v.installed_at}
        )  # fmt: skip
    if json_:
        print_json({"engines": rows, "receipts": versions.receipts()})
        return
    lines = []
    for r in rows:
        version = r["version"] + (f" ({r['package']})" if r["form"] == "bundled" and r["package"] else "")
        when = time_ago(r["installed_at"]) if r["installed_at"] else ""
        lines.append((r["lane"], version, r["form"], "*" if r["active"] else "", r["source"], when))
    headers = ("LANE", "VERSION", "FORM", "ACTIVE", "SOURCE", "INSTALLED")
    out.print(listing(headers, lines, whole=("LANE", "VERSION"), drop=("SOURCE", "INSTALLED", "FORM")))


@engine.command
def install(
    ref: str,
    *,
    from_: Annotated[str | None, Parameter(name="--from", help="A binary's path or http(s) URL.")] = None,
    sha256: Annotated[str | None, Parameter(help="The binary's SHA-256 (needed with --from).")] = None,
) -> None:
    """Install LANE[@VERSION] beside the others: from the package index (the newest when no
    version is given), or a binary with --from and --sha256. Nothing is switched."""
    lane, version = _split(ref, version_needed=from_ is not None)
    versions = _versions()
    if from_ is not None:
        if not sha256:
            raise CliError("--from needs --sha256: a binary is installed only if its hash matches")
        assert version is not None
        done = versions.install_binary(lane, version, from_, sha256)
    else:
        version = version or _latest(lane)
        err.print(f"installing {lane}@{version} …")
        done = versions.install_wheel(lane, version)
    out.print(
        f"installed {done.lane}@{done.version} ({done.form}, {len(done.files)} file(s) checked by SHA-256)"
    )
    out.print(f"[dim]switch with `blazar engine use {done.lane}@{done.version}`[/]")


def _probe_model(paths: Any, name: str | None) -> Any:
    store = open_store(paths)
    if name:
        return store.get(name)
    records = sorted(store.list(), key=lambda r: r.size)
    if not records:
        raise CliError("no model installed to probe with: `blazar pull smollm2-135m`, or pass --model")
    return records[0]


def _report(report: Any) -> None:
    mark = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[dim]N/A[/]"}
    who = f"{report.lane}@{report.release or 'bundled'}"
    out.print(f"[bold]{who}[/] ({report.version or report.kind}) on {report.model}")
    for c in report.checks:
        out.print(f"  {mark[c.ok]}  {c.name}: {c.detail}")


def _switch_daemon(paths: Any) -> list[str] | None:
    daemon = find_daemon(paths)
    if daemon is None:
        return None
    return list(daemon.post("/admin/engines/switch")["moved"])


def _first_requests(paths: Any, models: list[str]) -> str | None:
    """Real requests through the daemon to each model that moved; the first failure, if any."""
    daemon = find_daemon(paths)
    if daemon is None:
        return None
    for model in models:
        for _ in range(2):
            try:
                daemon.post(
                    "/v1/chat/completions",
                    {
                        "model": model,
                        "messages": [{"role": "user", "content": "Say hello."}],
                        "max_tokens": 4,
                    },
                )
            except CliError as exc:
                return f"{model}: {exc}"
    return None


@engine.command
def use(
    ref: str,
    *,
    model: Annotated[
        str | None, Parameter(help="The model to probe with (default: the smallest installed).")
    ] = None,
    margin: Annotated[
        float, Parameter(help="The regression gate: decode speed may drop by this much.")
    ] = 0.10,
    rounds: Annotated[int, Parameter(help="Timed answers per version; their median is compared.")] = 3,
    json_: Json = False,
) -> None:
    """Switch LANE@VERSION in (``bundled``: what the daemon was installed with), only if a probe
    against a real model passes and its decode speed (the median of --rounds answers) is within
    --margin of the active version's, both measured now, one after the other. A running daemon's
    engines finish their requests, then restart on it."""
    import msgspec
    import trio

    from actors.engines.probe import gate, probe
    from actors.engines.routing import lane_for
    from actors.engines.versions import BUNDLED, Receipt
    from actors.planning import launch_spec_for

    if rounds < 1:
        raise CliError("--rounds is how many answers each version is timed on: give 1 or more")
    lane_name, version = _split(ref)
    assert version is not None
    paths, config = load_setup()
    versions = _versions()
    if version != BUNDLED and versions.get(lane_name, version) is None:
        raise CliError(
            f"{lane_name}@{version} is not installed: `blazar engine install {lane_name}@{version}`"
        )
    current = versions.active_name(lane_name)
    if current == version:
        out.print(f"{lane_name}@{version} is already active")
        return
    runtime = config.runtime(paths)
    record = _probe_model(paths, model)
    base = msgspec.structs.replace(launch_spec_for(runtime, open_store(paths), record), lane=lane_name)

    def at(name: str) -> tuple[Any, Any]:
        spec = msgspec.structs.replace(base, engine_version=None if name == BUNDLED else name)
        return lane_for(spec, runtime.engine, runtime.home), spec

    async def both() -> tuple[Any, Any]:
        new = await probe(*at(version), runtime.engine, rounds=rounds)
        if not new.rates:  # no speed to compare: the gate refuses it whatever the active one's
            return new, None
        return new, await probe(*at(current), runtime.engine, rounds=rounds, speed_only=True)

    new, old = trio.run(both)
    for report, name in ((new, version), (old, current)):
        if report is not None and report.decode_tps is not None:
            versions.add_receipt(
                Receipt(lane=lane_name, version=name, engine=report.version, model=record.name,
                        decode_tps=report.decode_tps, at=time.time())
            )  # fmt: skip
    passed, why = gate(new.rates, old.rates if old is not None and old.passed else [], margin)
    ok = new.passed and passed
    if json_:
        print_json({"switched": ok, "gate": why, "probe": new, "current": old})
    else:
        _report(new)
        if old is not None and not old.passed:  # then the gate has no speed to compare with: say why
            out.print("the active version's own probe, for the gate:")
            _report(old)
        out.print(f"  {'[green]PASS[/]' if passed else '[red]FAIL[/]'}  regression gate: {why}")
    if not ok:
        raise CliError(f"{lane_name}@{version} was refused: {'the probe failed' if not new.passed else why}; "
                       f"{lane_name}@{current} stays active")  # fmt: skip
    versions.set_active(lane_name, version)
    moved = _switch_daemon(paths)
    failure = _first_requests(paths, moved or [])
    if failure is not None:
        versions.rollback(lane_name)
        _switch_daemon(paths)
        raise CliError(
            f"the first requests on {lane_name}@{version} failed ({failure}): rolled back to {current}"
        )
    if not json_:
        where = f"; the daemon moved {', '.join(moved)}" if moved else ""
        out.print(f"[bold]{lane_name}@{version} is active[/] (was {current}){where}")


@engine.command
def rollback(lane: str) -> None:
    """Make the version before the active one active again (a running daemon moves to it)."""
    lane_name, _ = _split(lane, version_needed=False)
    paths, _ = load_setup()
    back = _versions().rollback(lane_name)
    moved = _switch_daemon(paths)
    out.print(
        f"{lane_name}@{back} is active again" + (f"; the daemon moved {', '.join(moved)}" if moved else "")
    )


@engine.command
def rm(ref: str) -> None:
    """Remove an installed version that is not active."""
    lane, version = _split(ref)
    assert version is not None
    _versions().remove(lane, version)
    out.print(f"removed {lane}@{version}")


@engine.command
def prune(lane: str | None = None) -> None:
    """Remove every installed version but the active one and the one before it (for rollback)."""
    versions = _versions()
    for name in [_split(lane, version_needed=False)[0]] if lane else _LANES:
        for gone in versions.prune(name):
            out.print(f"removed {name}@{gone}")


@engine.command
def update(lane: str | None = None, *, check: bool = False, margin: float = 0.10) -> None:
    """Install and switch to the newest version on the package index (with --check: only say
    whether there is one)."""
    from actors.engines.versions import BUNDLED, bundled_version

    versions = _versions()
    for name in [_split(lane, version_needed=False)[0]] if lane else _LANES:
        active = versions.active_name(name)
        running = bundled_version(name) if active == BUNDLED else active
        latest = _latest(name)
        if latest == running:
            out.print(f"{name}: {running} is the newest")
            continue
        out.print(
            f"{name}: {latest} is available (active: {active}{f', {running}' if active == BUNDLED else ''})"
        )
        if check:
            continue
        if versions.get(name, latest) is None:
            versions.install_wheel(name, latest)
        use(f"{name}@{latest}", margin=margin)
