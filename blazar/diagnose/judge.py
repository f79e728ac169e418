"""From facts to findings: pure functions, no I/O (``gather`` read everything)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

from blazar.diagnose.facts import BlobFact, Facts, Finding, Fixed, Report

__all__ = ["DISK_ERROR_BYTES", "DISK_WARN_BYTES", "LOW_RAM_BYTES", "judge", "report"]

DISK_WARN_BYTES = 4 * 2**30
"""Less free space than this under the data dir is a warning: a model pull may not fit."""
DISK_ERROR_BYTES = 512 * 2**20
"""Less than this is an error: the ledger and logs may fail to write."""
LOW_RAM_BYTES = 1 * 2**30


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def judge(facts: Facts) -> list[Finding]:
    return [
        *_machine(facts),
        *_config(facts),
        *_engines(facts),
        *_models(facts),
        *_downloads(facts),
        *_processes(facts),
        *_port(facts),
        *_ledger(facts),
        *_disk(facts),
    ]


def report(findings: list[Finding], fixed: list[Fixed] | None = None) -> Report:
    errors = sum(f.severity == "error" for f in findings)
    return Report(
        ok=errors == 0,
        errors=errors,
        warnings=sum(f.severity == "warn" for f in findings),
        findings=findings,
        fixed=fixed or [],
    )


def _machine(facts: Facts) -> Iterator[Finding]:
    c = facts.census
    cpu = c.cpu_name or "unknown CPU"
    yield Finding(
        severity="ok",
        code="MACHINE",
        message=f"{cpu}, {c.cpu_count} cores; RAM {_gib(c.ram_available)} available of {_gib(c.ram_total)}",
    )
    for gpu in c.gpus:
        yield Finding(
            severity="ok",
            code="GPU",
            message=f"GPU {gpu.index}: {gpu.name}, {_gib(gpu.free)} free of {_gib(gpu.total)}"
            + (f" (driver {c.driver})" if c.driver else ""),
        )
    if not c.gpus:
        yield Finding(severity="ok", code="NO_GPU", message=c.note or "no GPU found; engines run on the CPU")
    if c.ram_total and c.ram_available < LOW_RAM_BYTES:
        yield Finding(
            severity="warn",
            code="LOW_MEMORY",
            message=f"only {_gib(c.ram_available)} of RAM is available",
            hint="close other programs, or lower slots and ctx so models fit (`blazar fit NAME`)",
        )


def _config(facts: Facts) -> Iterator[Finding]:
    if facts.config_error:
        yield Finding(
            severity="error",
            code="CONFIG_INVALID",
            message=facts.config_error,
            hint="fix the file (every key is in docs/configuration.md); the daemon will not start until then",
            path=facts.config_file,
        )
    else:
        yield Finding(severity="ok", code="CONFIG_OK", message=f"config {facts.config_file} is valid")
    for name in facts.unknown_models:
        yield Finding(
            severity="warn",
            code="CONFIG_UNKNOWN_MODEL",
            message=f"the config names '{name}' (under [models] or in preload), which is not installed",
            hint=f"`blazar pull {name}`, or correct the name (see `blazar list`)",
        )


def _engines(facts: Facts) -> Iterator[Finding]:
    e = facts.engine
    if e.configured and not e.runnable:
        yield Finding(
            severity="error",
            code="ENGINE_BINARY_MISSING",
            message=f"engine.llama_server is {e.configured}, which is not an executable file",
            hint="point engine.llama_server at a llama-server binary, or remove it to use the bundled engine",
            path=e.configured,
        )
    elif e.binary and e.runnable:
        backend = f", {e.gpu_backend} build" if e.gpu_backend else ", CPU build"
        yield Finding(
            severity="ok",
            code="ENGINE_LLAMA_SERVER",
            message=f"llama-server {e.binary} (version {e.version or 'unknown'}{backend})",
            path=e.binary,
        )
    elif e.binary:
        yield Finding(
            severity="error",
            code="ENGINE_BINARY_MISSING",
            message=f"llama-server {e.binary} does not run",
            hint="reinstall it, or remove it from PATH to use the bundled engine",
            path=e.binary,
        )
    if e.xllamacpp:
        used = "standby: llama-server is used" if e.binary and e.runnable else "in use"
        yield Finding(severity="ok", code="ENGINE_HOST", message=f"xllamacpp {e.xllamacpp} ({used})")
    for lane, version in sorted(e.active.items()):
        if version != "bundled":
            yield Finding(severity="ok", code="ENGINE_VERSION", message=f"{lane}@{version} is active")
    if e.stale_receipts:
        shown = ", ".join(f"{m} ({v})" for m, v in sorted(e.stale_receipts.items()))
        yield Finding(
            severity="warn",
            code="RECEIPTS_PREDATE_ENGINE",
            message=f"speed receipts measured on another engine version than the active one: {shown}",
            hint="`blazar engine use` measures the active version again; until then their figures are older",
        )
    if not e.xllamacpp and not e.binary:
        yield Finding(
            severity="error",
            code="NO_ENGINE",
            message="no llama.cpp engine: no llama-server binary and no xllamacpp wheel",
            hint="`pip install xllamacpp` into Blazar's environment, or install llama-server",
        )


def _models(facts: Facts) -> Iterator[Finding]:
    for path in facts.bad_manifests:
        yield Finding(
            severity="error",
            code="MANIFEST_UNREADABLE",
            message=f"a model manifest cannot be read: {path}",
            hint="remove the file and pull or import that model again",
            path=path,
        )
    bad = 0
    for blob in facts.blobs:
        found = _blob(blob)
        if found is not None:
            bad += 1
            yield found
    if not facts.models and not facts.bad_manifests:
        yield Finding(
            severity="warn", code="NO_MODELS", message="no model is installed",
            hint="`blazar pull smollm2-135m` (or `blazar import --scan` to adopt other tools' models)",
        )  # fmt: skip
    elif not bad:
        checked = "sizes, headers and sha256" if facts.deep else "sizes and headers (add --deep for sha256)"
        yield Finding(
            severity="ok",
            code="MODELS_OK",
            message=f"{len(facts.models)} model(s), {len(facts.blobs)} file(s): {checked} check out",
        )
    if facts.orphan_files:
        yield Finding(
            severity="warn",
            code="ORPHAN_FILES",
            message=f"{facts.orphan_files} file(s) in the store ({_gib(facts.orphan_bytes)}) "
            "belong to no model",
            hint="`blazar prune --orphans` deletes them (doctor never deletes a complete blob)",
        )


def _blob(blob: BlobFact) -> Finding | None:
    """The gravest thing wrong with one stored file: missing, not the manifest's size, shorter
    than its own header says, a header that is not its format's, other bytes than its digest
    (``--deep``); None when it checks out."""
    models = ", ".join(blob.models)
    what = f"{models}: {' / '.join(blob.names) or 'file'} ({blob.path or blob.digest})"
    error = functools.partial(
        Finding,
        severity="error",
        hint=f"pull or import {models} again (or `blazar rm {blob.models[0]}`)",
        path=blob.path or None,
    )
    if blob.size is None:
        where = f" (a link to {blob.link_target}, which is gone)" if blob.link_target else ""
        return error(code="BLOB_MISSING", message=f"{what} is missing{where}")
    if blob.expected_size is not None and blob.size != blob.expected_size:
        said = f"{what} has {blob.size} bytes, the manifest says {blob.expected_size}"
        return error(code="BLOB_SIZE_MISMATCH", message=said)
    if blob.incomplete:
        return error(code="BLOB_INCOMPLETE", message=f"{what} is cut short: {blob.incomplete}")
    if blob.invalid:
        return error(code="BLOB_HEADER_INVALID", message=f"{what} is damaged: {blob.invalid}")
    if blob.sha256 is not None and f"sha256:{blob.sha256}" != blob.digest:
        said = f"{what} has sha256 {blob.sha256}, not {blob.digest}"
        return error(code="BLOB_CHECKSUM_MISMATCH", message=said)
    return None


def _downloads(facts: Facts) -> Iterator[Finding]:
    for p in facts.partials:
        if p.in_use:
            yield Finding(
                severity="ok", code="DOWNLOAD_IN_PROGRESS", message=f"a pull is writing {p.path}", path=p.path
            )
        else:
            yield Finding(
                severity="warn",
                code="PARTIAL_DOWNLOAD",
                message=f"an unfinished download holds {_gib(p.size)}: {p.path}",
                hint="pull the model again to resume it, or --fix to delete it",
                fixable=True,
                path=p.path,
            )


def _processes(facts: Facts) -> Iterator[Finding]:
    d = facts.daemon
    if d.alive:
        state = "answers" if d.answers else "does not answer /health"
        yield Finding(
            severity="ok" if d.answers else "warn",
            code="DAEMON_RUNNING" if d.answers else "DAEMON_NOT_ANSWERING",
            message=f"daemon pid {d.pid} at {d.url} {state}",
            hint=None if d.answers else "see `blazar logs`; `blazar stop` and start it again",
            pid=d.pid,
        )
    elif d.exists:
        yield Finding(
            severity="warn",
            code="STALE_DAEMON_FILE",
            message=f"{d.path} names pid {d.pid}, which is not a running daemon",
            hint="--fix removes it (a daemon left it when it was killed)",
            fixable=True,
            path=d.path,
            pid=d.pid,
        )
    else:
        yield Finding(severity="ok", code="DAEMON_STOPPED", message="no daemon runs for this home")
    orphans: dict[int, Finding] = {}
    for f in facts.pidfiles:
        if f.pid is not None and f.child_runs and f.parent_alive:
            yield Finding(
                severity="ok", code="ENGINE_RUNNING", message=f"engine pid {f.pid} ({f.path})", pid=f.pid
            )
        elif f.pid is not None and f.child_runs:
            orphans[f.pid] = _orphan(f.pid, f.argv, f"its daemon (pid {f.parent}) is gone", f.path)
        else:
            what = (
                "cannot be read" if f.pid is None else f"names pid {f.pid}, which no longer runs the engine"
            )
            yield Finding(
                severity="warn",
                code="STALE_PID_FILE",
                message=f"engine pid file {f.path} {what}",
                hint="--fix removes it",
                fixable=True,
                path=f.path,
                pid=f.pid,
            )
    for p in facts.engine_procs:
        if not p.parent_is_daemon and p.pid not in orphans:
            orphans[p.pid] = _orphan(p.pid, p.argv, f"its parent (pid {p.ppid}) is not a Blazar daemon", None)
    yield from orphans.values()


def _orphan(pid: int, argv: str, why: str, pidfile: str | None) -> Finding:
    return Finding(
        severity="error",
        code="ORPHAN_ENGINE",
        message=f"engine pid {pid} serves a model of this home but {why}; it holds memory for nothing",
        hint="--fix kills it (or `kill -9 PID`)",
        fixable=True,
        path=pidfile,
        pid=pid,
        argv=argv,
    )


def _port(facts: Facts) -> Iterator[Finding]:
    p = facts.port
    if p is None:
        return
    where = f"{p.host}:{p.port}"
    if p.free:
        yield Finding(severity="ok", code="PORT_FREE", message=f"{where} is free for `blazar serve`")
        return
    if p.blazar_version:
        who = f"a Blazar daemon (version {p.blazar_version}) of another home"
        hint = "stop it (BLAZAR_HOME of that home, then `blazar stop`), or set another port in config.toml"
    else:
        who = "another program" if p.error == "address already in use" else f"nothing usable ({p.error})"
        hint = f"find it with `ss -ltnp | grep {p.port}`, or set another port (`port = …` in config.toml)"
    yield Finding(
        severity="error",
        code="PORT_IN_USE",
        message=f"{where} is taken by {who}: `blazar serve` would fail",
        hint=hint,
    )


def _ledger(facts: Facts) -> Iterator[Finding]:
    ledger = facts.ledger
    check = "integrity_check" if facts.deep else "quick_check"
    if not ledger.exists:
        yield Finding(severity="ok", code="LEDGER_ABSENT", message="no ledger yet (the daemon creates it)")
    elif ledger.error or ledger.result != ["ok"]:
        problem = ledger.error or "; ".join(ledger.result[:5])
        yield Finding(
            severity="error",
            code="LEDGER_CORRUPT",
            message=f"the ledger {ledger.path} fails {check}: {problem}",
            hint="stop the daemon, keep a copy, then `sqlite3 blazar.db .recover | sqlite3 new.db`, "
            "or move it aside (a new one is created; request history is lost). Doctor never touches it",
            path=ledger.path,
        )
    else:
        yield Finding(
            severity="ok",
            code="LEDGER_OK",
            message=f"ledger passes {check} (schema version {ledger.schema_version})",
            path=ledger.path,
        )


def _disk(facts: Facts) -> Iterator[Finding]:
    d = facts.disk
    room = f"{_gib(d.free)} free of {_gib(d.total)} under {d.path}"
    if d.free < DISK_ERROR_BYTES:
        yield Finding(
            severity="error", code="DISK_FULL", message=room,
            hint="free space: `blazar storage`, `blazar prune --orphans --partials`, `blazar rm NAME`",
        )  # fmt: skip
    elif d.free < DISK_WARN_BYTES:
        yield Finding(
            severity="warn", code="DISK_LOW", message=room,
            hint="a pull may not fit: see `blazar storage` and `blazar prune`",
        )  # fmt: skip
    else:
        yield Finding(severity="ok", code="DISK_OK", message=room)
