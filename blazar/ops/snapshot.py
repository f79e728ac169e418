"""``blazar snapshot`` and ``blazar restore-snapshot``: a home's durable state in one archive.

The archive (tar.gz) holds ``snapshot.json`` (what it is, the models' manifests), the
config file, consistent copies of ``blazar.db`` (the ledger: stored responses,
conversations, jobs, batches, files, the request log) and ``keys.db`` made with
SQLite's backup API (so a running daemon may keep writing), and the job folders
(``jobs/``: a job's input and result files). Model weights are not in it: a restore
reuses the bytes when the blob with the same digest is still on disk (the store the
snapshot was made from, verified by hash), and pulls the model again otherwise.

Every function is blocking (the CLI runs them directly).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sqlite3
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from blazar import __version__
from blazar.config import Paths
from registry.files import atomic_writer
from registry.store import ModelRecord, Store

__all__ = ["DATABASES", "ModelOutcome", "SnapshotError", "SnapshotInfo", "make_snapshot", "restore_snapshot"]

DATABASES = ("blazar.db", "keys.db")
_FORMAT = 1


class SnapshotError(Exception):
    """A snapshot that cannot be made or restored; the message says what to do."""


class SnapshotInfo(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    version: str
    created_at: float
    models_dir: str
    """The store the snapshot was made from: its blobs are reused when still there."""
    models: list[ModelRecord]
    databases: list[str]
    config: bool
    jobs: int
    """Files under ``jobs/``."""


class ModelOutcome(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    how: str
    """``reused`` (the blobs were on disk), ``pulled`` or ``failed``."""
    detail: str = ""


def _backup(src: Path, dst: Path) -> None:
    """A consistent copy of the SQLite database ``src`` (WAL and all), made with the backup API."""
    source = sqlite3.connect(f"{src.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
    try:
        target = sqlite3.connect(dst)
        try:
            source.backup(target)
        finally:
            target.close()
    finally:
        source.close()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    member.mtime = int(time.time())
    member.mode = 0o600
    tar.addfile(member, io.BytesIO(data))


def make_snapshot(paths: Paths, out: Path) -> SnapshotInfo:
    """Write ``paths``' durable state to ``out`` (tar.gz, written atomically)."""
    data = Path(paths.data_dir)
    store = Store(Path(paths.models_dir))
    config = Path(paths.config_file)
    jobs_dir = data / "jobs"
    job_files = [p for p in sorted(jobs_dir.rglob("*")) if p.is_file()] if jobs_dir.is_dir() else []
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="blazar-snapshot-") as tmp:
        databases = []
        for name in DATABASES:
            if (data / name).is_file():
                _backup(data / name, Path(tmp) / name)
                databases.append(name)
        info = SnapshotInfo(
            format=_FORMAT,
            version=__version__,
            created_at=time.time(),
            models_dir=str(store.root),
            models=store.list(),
            databases=databases,
            config=config.is_file(),
            jobs=len(job_files),
        )
        with atomic_writer(out) as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
            _add_bytes(tar, "snapshot.json", msgspec.json.format(msgspec.json.encode(info)))
            if info.config:
                tar.add(config, arcname="config.toml")
            for name in databases:
                tar.add(Path(tmp) / name, arcname=name)
            for record in info.models:
                _add_bytes(tar, f"manifests/{record.name}.json", msgspec.json.encode(record))
            for path in job_files:
                tar.add(path, arcname=f"jobs/{path.relative_to(jobs_dir).as_posix()}")
    return info


def home_in_use(paths: Paths) -> list[str]:
    """What already lives in the home a snapshot would be restored into."""
    data = Path(paths.data_dir)
    found = [name for name in DATABASES if (data / name).exists()]
    if Path(paths.config_file).exists():
        found.append("config.toml")
    if Store(Path(paths.models_dir)).list():
        found.append("models")
    return found


def _read_info(tar: tarfile.TarFile) -> SnapshotInfo:
    try:
        handle = tar.extractfile("snapshot.json")
    except KeyError:
        raise SnapshotError("the archive has no snapshot.json: it is not a blazar snapshot") from None
    if handle is None:
        raise SnapshotError("the archive's snapshot.json is not a file")
    try:
        info = msgspec.json.decode(handle.read(), type=SnapshotInfo)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(f"the archive's snapshot.json cannot be read: {exc}") from None
    if info.format > _FORMAT:
        raise SnapshotError(
            f"the snapshot has format {info.format}, newer than this blazar reads: upgrade it"
        )
    return info


def _extract_to(tar: tarfile.TarFile, member: str, dst: Path) -> None:
    """The archive's file ``member`` written to ``dst`` atomically (owner-only permissions)."""
    handle = tar.extractfile(member)
    if handle is None:
        raise SnapshotError(f"the archive's {member} is not a file")
    with atomic_writer(dst, mode=0o600) as f:
        shutil.copyfileobj(handle, f)


def _reuse(store: Store, record: ModelRecord, old_root: Path) -> bool:
    """Place ``record``'s blobs from the old store (hash-checked) when every one is on disk."""
    wanted = [d.removeprefix("sha256:") for d in record.digests()]
    old = Store(old_root)
    path = Path(record.path)
    if not record.files and path.name != f"sha256-{wanted[0]}" and path.is_relative_to(old_root):
        return False  # a split model's folder of parts: laid out by a pull
    sources = []
    for sha in wanted:
        if store.has_blob(sha):
            continue
        src = old.blob_path(sha)
        if not src.exists():
            return False
        sources.append((src, sha))
    for src, sha in sources:
        store.adopt_blob(src, sha)
    main = store.blob_path(wanted[0])
    moved = not record.files and path.name == main.name
    fixed = msgspec.structs.replace(record, path=str(main)) if moved else record
    if record.projector and record.blobs:
        projector = next((d for d in record.blobs if record.projector.endswith(d.replace(":", "-"))), None)
        if projector is not None:
            fixed = msgspec.structs.replace(
                fixed, projector=str(store.blob_path(projector.removeprefix("sha256:")))
            )
    store.write_manifest(fixed)
    if record.files:
        store.write_manifest(msgspec.structs.replace(fixed, path=str(store.materialize(fixed))))
    return True


def restore_snapshot(
    paths: Paths,
    archive: Path,
    *,
    force: bool = False,
    pull: Callable[[str], None] | None = None,
    on_model: Callable[[ModelOutcome], None] | None = None,
) -> tuple[SnapshotInfo, list[ModelOutcome]]:
    """Bring ``archive``'s state into the home ``paths``: refused over a home in use unless
    ``force``. ``pull(name)`` installs a model whose bytes are not on disk (None: report it)."""
    if not force and (used := home_in_use(paths)):
        raise SnapshotError(
            f"{paths.data_dir} is not empty ({', '.join(used)}): restore into a fresh home "
            "(BLAZAR_HOME=DIR) or pass --force to overwrite"
        )
    try:
        tar = tarfile.open(archive, "r:gz")
    except (OSError, tarfile.TarError) as exc:
        raise SnapshotError(f"cannot open {archive}: {exc}") from None
    data = Path(paths.data_dir)
    with tar:
        info = _read_info(tar)
        names = set(tar.getnames())
        if info.config and "config.toml" in names:
            _extract_to(tar, "config.toml", Path(paths.config_file))
        for name in info.databases:
            for suffix in ("-wal", "-shm"):  # an old WAL would be replayed over the copy
                with contextlib.suppress(FileNotFoundError):
                    (data / f"{name}{suffix}").unlink()
            _extract_to(tar, name, data / name)
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith("jobs/"):
                rel = Path(member.name)
                if rel.is_absolute() or ".." in rel.parts:
                    raise SnapshotError(f"the archive holds an unsafe path: {member.name}")
                _extract_to(tar, member.name, data / rel)
    store = Store(Path(paths.models_dir))
    outcomes = []
    for record in info.models:
        outcome = _restore_model(store, record, Path(info.models_dir), pull)
        outcomes.append(outcome)
        if on_model is not None:
            on_model(outcome)
    return info, outcomes


def _restore_model(
    store: Store, record: ModelRecord, old_root: Path, pull: Callable[[str], None] | None
) -> ModelOutcome:
    try:
        if _reuse(store, record, old_root):
            return ModelOutcome(name=record.name, how="reused")
    except Exception as exc:  # a blob that does not verify: pull it instead
        reuse_failed = f"{type(exc).__name__}: {exc}"
    else:
        reuse_failed = ""
    if pull is None:
        return ModelOutcome(
            name=record.name, how="failed", detail=reuse_failed or "its files are not on disk"
        )
    try:
        pull(record.name)
    except Exception as exc:
        return ModelOutcome(name=record.name, how="failed", detail=f"{exc} — run `blazar pull {record.name}`")
    return ModelOutcome(name=record.name, how="pulled", detail=reuse_failed)
