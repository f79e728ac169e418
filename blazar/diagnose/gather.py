"""Reading the facts ``blazar doctor`` judges: the machine, the home, the processes.

All I/O of the doctor is here (and in ``fix``); each reader catches what it can
meet and records it as a fact, so one broken part never hides the others.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.metadata
import json
import os
import shutil
import socket
import sqlite3
import subprocess
from pathlib import Path

import msgspec

from actors.census import take_census
from actors.engines.llamacpp import find_llama_server, gpu_backend
from actors.engines.versions import DISTS, Receipt, Versions
from actors.process import cmdline, read_pidfiles
from blazar.config import Config, ConfigError, Paths, load_config
from blazar.diagnose.facts import (
    BlobFact,
    DaemonFact,
    DiskFact,
    EngineFact,
    Facts,
    LedgerFact,
    PartialFact,
    PidFact,
    PortFact,
    ProcFact,
)
from registry.disk import find_orphans
from registry.errors import RegistryError
from registry.store import ModelRecord, Store, sha256_file

__all__ = ["gather", "is_daemon_argv", "lock_is_free"]

_ENGINE_MARK = "actors.engines."


def gather(paths: Paths, *, deep: bool = False) -> Facts:
    try:
        config, config_error = load_config(paths), None
    except ConfigError as exc:
        config, config_error = Config(), str(exc)
    store = Store(Path(paths.models_dir))
    records, bad = _manifests(store)
    names = {r.name for r in records}
    named = [*config.models, *config.preload]
    orphans = [o for o in find_orphans(store) if o.kind != "partial"]
    daemon = _daemon(paths)
    return Facts(
        deep=deep,
        census=take_census(),
        config_file=paths.config_file,
        config_error=config_error,
        unknown_models=sorted({n for n in named if _canonical(n) not in names}),
        engine=_engine(config, Path(paths.data_dir)),
        models=sorted(names),
        bad_manifests=bad,
        blobs=_blobs(store, records, deep=deep),
        orphan_files=len(orphans),
        orphan_bytes=sum(o.size for o in orphans),
        partials=_partials(store),
        pidfiles=_pidfiles(Path(paths.run_dir)),
        engine_procs=_engine_procs(store.root),
        daemon=daemon,
        port=None if daemon.alive and daemon.port == config.port else _port(config.host, config.port),
        ledger=_ledger(Path(paths.data_dir) / "blazar.db", deep=deep),
        disk=_disk(Path(paths.data_dir)),
    )


def _canonical(name: str) -> str:
    from registry.store import canonical_name

    try:
        return canonical_name(name)
    except RegistryError:
        return name


def _engine(config: Config, data_dir: Path) -> EngineFact:
    configured = config.engine.llama_server
    binary = find_llama_server(configured)
    runnable = bool(binary and os.path.isfile(binary) and os.access(binary, os.X_OK))
    version = backend = None
    if binary and runnable:
        try:
            done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
            lines = (done.stdout + done.stderr).splitlines()
            version = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("version:")), None)
        except (OSError, subprocess.SubprocessError):
            runnable = False
        backend = gpu_backend(binary) if runnable else None
    try:
        wheel: str | None = importlib.metadata.version("xllamacpp")
    except importlib.metadata.PackageNotFoundError:
        wheel = None
    versions = Versions(data_dir)
    active = {lane: versions.active_name(lane) for lane in DISTS}
    newest: dict[tuple[str, str], Receipt] = {}
    current: set[tuple[str, str]] = set()  # (lane, model) with a receipt of the active version
    for receipt in versions.receipts():  # oldest first: the last one per model and lane wins
        newest[(receipt.lane, receipt.model)] = receipt
        if receipt.version == active.get(receipt.lane):
            current.add((receipt.lane, receipt.model))
    stale = {
        model: f"{lane}@{r.version}" for (lane, model), r in newest.items() if (lane, model) not in current
    }
    return EngineFact(
        configured=configured,
        binary=binary,
        runnable=runnable,
        version=version,
        gpu_backend=backend,
        xllamacpp=wheel,
        active=active,
        stale_receipts=stale,
    )


def _manifests(store: Store) -> tuple[list[ModelRecord], list[str]]:
    records, bad = [], []
    if store.manifests_dir.is_dir():
        for path in sorted(store.manifests_dir.rglob("*.json")):
            if path.name.startswith("."):
                continue
            try:
                records.append(msgspec.json.decode(path.read_bytes(), type=ModelRecord))
            except (OSError, msgspec.DecodeError):
                bad.append(str(path))
    return records, bad


def _blobs(store: Store, records: list[ModelRecord], *, deep: bool) -> list[BlobFact]:
    """Each stored file once, checked as its models' format promises (``registry.integrity``):
    its size against the manifest's, its own header where the format has one."""
    from registry.integrity import ExpectedFile, check_header, expected_files

    users: dict[str, list[str]] = {}
    expected: dict[str, list[ExpectedFile]] = {}
    for record in records:
        for file in expected_files(record):
            users.setdefault(file.digest, []).append(record.name)
            expected.setdefault(file.digest, []).append(file)
    facts = []
    for digest, models in sorted(users.items()):
        files = expected[digest]
        want = next((f.size for f in files if f.size is not None), None)
        names = sorted({f.name for f in files})
        check = next((f.check for f in files if f.check is not None), None)
        models = sorted(set(models))
        try:
            path = store.blob_path(digest)
        except RegistryError:
            facts.append(
                BlobFact(digest=digest, path="", models=models, expected_size=want, size=None, names=names)
            )
            continue
        target = os.readlink(path) if path.is_symlink() else None
        size = incomplete = invalid = sha = None
        with contextlib.suppress(OSError):
            size = path.stat().st_size
        if size is not None:
            try:
                problem = check_header(path, check) if check is not None else None
            except (OSError, ValueError) as exc:  # a reader's surprise must not end the doctor
                problem = None
                invalid = f"its header cannot be read ({getattr(exc, 'strerror', None) or exc})"
            if problem is not None and problem.incomplete:
                incomplete = problem.message
            elif problem is not None:
                invalid = problem.message
            if deep:
                with contextlib.suppress(OSError):
                    sha = sha256_file(path)
        facts.append(
            BlobFact(
                digest=digest,
                path=str(path),
                models=models,
                expected_size=want,
                size=size,
                link_target=target,
                names=names,
                check=check,
                incomplete=incomplete,
                invalid=invalid,
                sha256=sha,
            )
        )
    return facts


def lock_is_free(lock: Path) -> bool:
    """Nobody holds the download lock (a pull in this or another process would)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _partials(store: Store) -> list[PartialFact]:
    if not store.partial_dir.is_dir():
        return []
    found = []
    for path in sorted(store.partial_dir.glob("*.partial")):
        with contextlib.suppress(OSError):
            st = path.stat()
            in_use = not lock_is_free(path.with_suffix(".lock"))
            found.append(PartialFact(path=str(path), size=st.st_size, modified_at=st.st_mtime, in_use=in_use))
    return found


def _pidfiles(run_dir: Path) -> list[PidFact]:
    facts = []
    for entry in read_pidfiles(run_dir):
        runs = entry.pid is not None and cmdline(entry.pid).strip() == entry.argv
        alive = entry.parent is not None and entry.parent != os.getpid() and bool(cmdline(entry.parent))
        facts.append(
            PidFact(
                path=entry.path,
                pid=entry.pid,
                parent=entry.parent,
                argv=entry.argv,
                child_runs=runs,
                parent_alive=alive,
            )
        )
    return facts


def is_daemon_argv(argv: str) -> bool:
    """A ``blazar serve`` command line (``python -m blazar serve``, ``…/bin/blazar serve``)."""
    words = argv.split()
    return "serve" in words and any(w == "blazar" or w.endswith("/blazar") for w in words)


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _engine_procs(models_root: Path) -> list[ProcFact]:
    """Engine processes (our hosts, the watchdog around a binary) whose model file is in this
    home's store, whoever started them."""
    found = []
    root = str(models_root) + "/"
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        argv = cmdline(int(entry.name)).strip()
        words = argv.split()
        if _ENGINE_MARK not in argv or "-m" not in words:
            continue
        model = words[words.index("-m") + 1] if words.index("-m") + 1 < len(words) else ""
        if not model.startswith(root):
            continue
        ppid = _ppid(int(entry.name))
        parent_ok = ppid is not None and is_daemon_argv(cmdline(ppid))
        found.append(ProcFact(pid=int(entry.name), ppid=ppid or 0, argv=argv, parent_is_daemon=parent_ok))
    return found


def _daemon(paths: Paths) -> DaemonFact:
    path = Path(paths.daemon_file)
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])
    except FileNotFoundError:
        return DaemonFact(path=str(path), exists=False)
    except (OSError, ValueError, KeyError, TypeError):
        return DaemonFact(path=str(path), exists=True)
    alive = is_daemon_argv(cmdline(pid))
    url, port = info.get("url"), info.get("port")
    answers = False
    if alive and url:
        import httpx

        with contextlib.suppress(httpx.HTTPError):
            answers = httpx.get(f"{url}/health", timeout=3.0).status_code == 200
    return DaemonFact(
        path=str(path),
        exists=True,
        pid=pid,
        alive=alive,
        url=url,
        port=port if isinstance(port, int) else None,
        answers=answers,
    )


def _port(host: str, port: int) -> PortFact | None:
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return PortFact(host=host, port=port, free=True)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return PortFact(host=host, port=port, free=False, error=exc.strerror or str(exc))
    import httpx

    version = None
    shown = f"[{host}]" if ":" in host else host
    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
        doc = httpx.get(f"http://{shown}:{port}/health", timeout=3.0).json()
        if doc.get("status") == "ok" and isinstance(doc.get("version"), str):
            version = doc["version"]
    return PortFact(host=host, port=port, free=False, error="address already in use", blazar_version=version)


def _ledger(path: Path, *, deep: bool) -> LedgerFact:
    if not path.exists():
        return LedgerFact(path=str(path), exists=False)
    pragma = "integrity_check" if deep else "quick_check"
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}").fetchall()]
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return LedgerFact(path=str(path), exists=True, error=str(exc))
    return LedgerFact(path=str(path), exists=True, result=rows, schema_version=version)


def _disk(data_dir: Path) -> DiskFact:
    probe = data_dir
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return DiskFact(path=str(data_dir), free=usage.free, total=usage.total)
