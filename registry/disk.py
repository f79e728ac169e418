"""Disk care for the model store: what uses the space, and what can go.

Blobs are content-addressed, so two names can share one file; every figure here
counts a blob once. A blob that no manifest names is an orphan (left by a crash
between writing the blob and the manifest, or by an older version); a partial
file is a resumable download. All functions are blocking: async callers run
them in a worker thread.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from ._names import canonical_name
from .errors import InvalidModelName, ModelExists
from .store import ModelRecord, Store

__all__ = [
    "BlobUse",
    "Orphan",
    "StorageReport",
    "cache_files",
    "copy_model",
    "find_orphans",
    "prune_cache",
    "prune_orphans",
    "storage_report",
    "unused_models",
]

_DAY_S = 86400.0
_CACHE_BUSY_S = 600.0
"""A cache file changed this recently may belong to a download in progress: prune leaves it."""


class BlobUse(msgspec.Struct, frozen=True, kw_only=True):
    digest: str
    size: int
    names: list[str]
    linked: bool
    """The blob is a symlink into another tool's store: it takes no space here."""


class Orphan(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int
    kind: str
    """``blob`` (no manifest names it), ``info`` (cached header of a gone blob), ``shards``
    (the part links of a gone split model), ``trees`` (the file links of a gone multi-file
    model), ``partial`` (a resumable download) or ``cache`` (a file in the download cache:
    a wheel a pull left behind)."""
    modified_at: float


class StorageReport(msgspec.Struct, frozen=True, kw_only=True):
    root: str
    models: list[ModelRecord]
    blobs: list[BlobUse]
    used_bytes: int
    """Bytes the store's own blobs take (shared blobs once, symlinked ones not at all)."""
    partial_bytes: int
    orphan_bytes: int
    cache_bytes: int = 0
    """Bytes in the download cache (``cache_dir``): wheels a pull no longer needs."""
    free_bytes: int
    total_bytes: int


def _digest_hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def storage_report(store: Store, cache_dir: Path | None = None) -> StorageReport:
    records = store.list()
    by_digest: dict[str, list[str]] = {}
    for record in records:
        for digest in record.digests():
            by_digest.setdefault(digest, []).append(record.name)
    blobs: list[BlobUse] = []
    for digest, names in sorted(by_digest.items()):
        path = store.blob_path(_digest_hex(digest))
        linked = path.is_symlink()
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # a blob whose file vanished (a dangling link): nothing to count
        blobs.append(BlobUse(digest=digest, size=size, names=sorted(names), linked=linked))
    orphans = find_orphans(store)
    disk = shutil.disk_usage(store.root if store.root.exists() else store.root.parent)
    return StorageReport(
        root=str(store.root),
        models=records,
        blobs=blobs,
        used_bytes=sum(b.size for b in blobs if not b.linked),
        partial_bytes=sum(o.size for o in orphans if o.kind == "partial"),
        orphan_bytes=sum(o.size for o in orphans if o.kind != "partial"),
        cache_bytes=sum(f.size for f in cache_files(cache_dir)) if cache_dir is not None else 0,
        free_bytes=disk.free,
        total_bytes=disk.total,
    )


def _orphan(path: Path, kind: str) -> Orphan | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return Orphan(path=str(path), size=st.st_size, kind=kind, modified_at=st.st_mtime)


def find_orphans(store: Store) -> list[Orphan]:
    """Blobs and cached headers that no manifest uses, and partial downloads."""
    used = {_digest_hex(d) for d in store.used_digests()}
    used |= {t.removeprefix("sha256-") for t in store.used_trees()}
    found: list[Orphan] = []
    for directory, kind, suffix in (
        (store.blobs_dir, "blob", ""),
        (store.info_dir, "info", ".json"),
        (store.shards_dir, "shards", ""),
        (store.trees_dir, "trees", ""),
        (store.partial_dir, "partial", None),
    ):
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.name.startswith(".") or path.suffix == ".lock":
                continue  # a lock belongs to a download that may be running now
            if suffix is not None:
                sha = path.name.removeprefix("sha256-").removesuffix(suffix)
                if sha in used:
                    continue
            if (orphan := _orphan(path, kind)) is not None:
                found.append(orphan)
    return found


def prune_orphans(
    store: Store, *, orphans: bool = True, partials: bool = False, dry_run: bool = False
) -> list[Orphan]:
    """Delete orphaned blobs, headers and part links (``orphans``) and partial downloads
    (``partials``); returns what went."""
    removed: list[Orphan] = []
    for orphan in find_orphans(store):
        if (orphan.kind == "partial" and not partials) or (orphan.kind != "partial" and not orphans):
            continue
        if not dry_run:
            try:
                if orphan.kind in ("shards", "trees"):
                    shutil.rmtree(orphan.path)
                else:
                    os.unlink(orphan.path)
            except FileNotFoundError:
                continue
        removed.append(orphan)
    return removed


def cache_files(cache_dir: Path) -> list[Orphan]:
    """Every file in the download cache (a pull removes its wheel once done: what is here
    was left by an interrupted pull, or by an older version)."""
    found: list[Orphan] = []
    for folder, _, names in os.walk(cache_dir):
        for name in sorted(names):
            if (orphan := _orphan(Path(folder) / name, "cache")) is not None:
                found.append(orphan)
    return found


def prune_cache(cache_dir: Path, *, dry_run: bool = False, now: float | None = None) -> list[Orphan]:
    """Delete the download cache's files, except those changed in the last minutes (a pull
    may be writing them); returns what went."""
    cutoff = (time.time() if now is None else now) - _CACHE_BUSY_S
    removed: list[Orphan] = []
    for found in cache_files(cache_dir):
        if found.modified_at > cutoff:
            continue
        if not dry_run:
            try:
                os.unlink(found.path)
            except FileNotFoundError:
                continue
        removed.append(found)
    return removed


def unused_models(
    store: Store, days: float, last_used: Mapping[str, float], *, now: float | None = None
) -> list[ModelRecord]:
    """Models not used for ``days``: last request from ``last_used`` (the ledger), else
    the time the model was installed or last changed."""
    cutoff = (time.time() if now is None else now) - days * _DAY_S
    # The ledger keeps names as clients wrote them ("SmolLM2-135M", "x:latest").
    used: dict[str, float] = {}
    for name, at in last_used.items():
        try:
            key = canonical_name(name)
        except InvalidModelName:
            continue
        used[key] = max(at, used.get(key, 0.0))
    return [r for r in store.list() if max(used.get(r.name, 0.0), r.modified_at) < cutoff]


def copy_model(store: Store, src: str, dst: str, *, replace: bool = False) -> ModelRecord:
    """A second name for a model's bytes: a new manifest, no copy of the file.

    An existing ``dst`` is refused unless ``replace`` (Ollama's ``/api/copy`` replaces).
    """
    record = store.get(src)
    target = canonical_name(dst)
    previous = store.find(target)
    if previous is not None and not replace:
        raise ModelExists(target)
    now = time.time()
    copy = msgspec.structs.replace(record, name=target, created_at=now, modified_at=now)
    store.write_manifest(copy)  # a replaced model's blobs go when unused
    return copy
