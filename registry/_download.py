"""Resumable, verified downloads of content-addressed blobs over httpx.

A download lands in the store's partial/ directory, hashing as it writes, so a resumed
download only hashes the bytes it already has once. A dropped connection resumes at
once with a Range request; a refusal (429, 5xx) backs off, honouring `Retry-After`.
The sha256 is checked before the blob is moved into place; a mismatch discards the
partial file (its bytes are useless for resuming).

Two pulls of the same blob in one process share one download: the first becomes the
leader, the others wait on its flight and receive its progress events. If the leader
is cancelled, a waiter takes over from the partial file.
"""

from __future__ import annotations

import contextlib
import copy
import email.utils
import fcntl
import functools
import hashlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from .errors import ChecksumMismatch, DiskFull, PullFailed, is_disk_full
from .files import shown_folder
from .store import ModelSettings, Store

__all__ = [
    "RETRY_STATUSES",
    "Document",
    "Fetch",
    "Plan",
    "PullProgress",
    "Report",
    "RetryPolicy",
    "Throttle",
    "fetch_blob",
    "fetch_small",
    "free_bytes",
    "reason",
    "retry_after_s",
]

_REPORT_INTERVAL_S = 0.1
_LOCK_POLL_S = 0.25
_MAX_REDIRECTS = 8
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class PullProgress(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    source: str | None = None
    total: int | None = None
    completed: int | None = None
    digest: str | None = None
    message: str | None = None
    downloaded: int | None = None
    """On ``success``: the bytes this pull took from the network (0 when everything was
    reused from this machine); None when not known."""


Report = Callable[[PullProgress], None]


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How hard a download tries before giving up (the partial file is kept either way)."""

    attempts: int = 6
    """Attempts in a row that may fail without delivering a byte."""
    backoff_s: float = 1.0
    """First wait after such a failure; doubles each time, up to `max_backoff_s`."""
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0
    """A server asking for a longer wait than this fails the pull instead of stalling it."""

    def backoff(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row: doubling, capped."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1))


class Fetch(msgspec.Struct, frozen=True, kw_only=True):
    """One blob to download: where from, what it must hash to, and how big it is."""

    url: str
    sha256: str
    size: int
    label: str
    """The source, as progress events and errors name it."""
    headers: dict[str, str] = {}
    redirect_hosts: tuple[str, ...] = ()
    """Host patterns (fnmatch) a redirect may lead to; empty allows any host over https."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What a resolved name installs: the weights (split parts in order), a projector, settings."""

    source: str
    parts: list[tuple[str, Fetch]]
    """(file name, blob) per part; more than one for a split GGUF, whose names llama.cpp needs."""
    projector: Fetch | None = None
    settings: ModelSettings | None = None


class Document(msgspec.Struct, frozen=True, kw_only=True):
    """A small answer read whole (see `fetch_small`)."""

    status_code: int
    content: bytes


def reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Throttle:
    """Forwards byte-count progress at most every _REPORT_INTERVAL_S, plus forced updates."""

    def __init__(
        self, report: Report, status: str, source: str, total: int | None, digest: str | None = None
    ) -> None:
        self._report = report
        self._status = status
        self._source = source
        self._total = total
        self._digest = digest
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
                    digest=self._digest,
                )
            )


class _Transient(Exception):
    """A failure worth another attempt (connection lost, 429, 5xx)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after_s(response: Any) -> float | None:
    """Seconds a response's Retry-After asks for (delay-seconds or an HTTP date), or None."""
    headers = getattr(response, "headers", None)
    value = (headers.get("retry-after") or "").strip() if headers is not None else ""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _status_error(status: int, label: str, resp: httpx.Response) -> Exception:
    if status in RETRY_STATUSES:
        return _Transient(f"HTTP {status} from {resp.url.host}", retry_after_s(resp))
    if status in (401, 403):
        return PullFailed(f"{label}: HTTP {status} — the server refused access (a private or gated model?)")
    if status == 404:
        return PullFailed(f"{label}: HTTP 404 — the server has no such file")
    return PullFailed(f"{label}: HTTP {status} from {resp.url.host}")


def _redirect_target(
    current: httpx.URL, location: str, *, label: str, redirect_hosts: tuple[str, ...]
) -> httpx.URL:
    target = current.join(location)
    same_origin = (target.scheme, target.host, target.port) == (current.scheme, current.host, current.port)
    if same_origin:
        return target
    if target.scheme != "https":
        raise PullFailed(f"{label}: refused a redirect to {target.scheme}://{target.host} (https only)")
    if redirect_hosts and not any(fnmatch(target.host, p) for p in redirect_hosts):
        raise PullFailed(f"{label}: refused a redirect to {target.host}, which is not a known host")
    return target


@contextlib.asynccontextmanager
async def _open_stream(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    *,
    label: str,
    redirect_hosts: tuple[str, ...] = (),
) -> AsyncIterator[httpx.Response]:
    """GET with redirects followed by hand: only allowed hosts, credentials only to the first host."""
    current = httpx.URL(url)
    origin = current.host
    for _ in range(_MAX_REDIRECTS + 1):
        sent = (
            headers
            if current.host == origin
            else {k: v for k, v in headers.items() if k.lower() != "authorization"}
        )
        resp = await client.send(client.build_request("GET", current, headers=sent), stream=True)
        location = resp.headers.get("location")
        if not (resp.is_redirect and location):
            try:
                yield resp
            finally:
                await resp.aclose()
            return
        await resp.aclose()
        current = _redirect_target(current, location, label=label, redirect_hosts=redirect_hosts)
    raise PullFailed(f"{label}: too many redirects")


def _storage_error(exc: OSError, store: Store, fetch: Fetch, have: int) -> Exception:
    """A full disk is ``DiskFull`` (the bytes still to come; the partial file stays, and the
    next pull resumes it); another write error fails the pull. Neither names a local path."""
    where = shown_folder(store.partial_dir, store.root.parent)
    if is_disk_full(exc):
        return DiskFull(f"the download of {fetch.label}", where=where, needed_bytes=max(0, fetch.size - have))
    return PullFailed(f"cannot write to {where}: {exc.strerror or exc}")


class _State:
    """Bytes on disk in the partial file and the running hash over exactly those bytes."""

    def __init__(self, hasher: Any, have: int) -> None:
        self.hasher = hasher
        self.have = have


def _resume_state(partial: Path, size: int) -> _State:
    """Runs in a thread: hash what the partial file already holds."""
    hasher = hashlib.sha256()
    try:
        have = partial.stat().st_size
    except FileNotFoundError:
        return _State(hasher, 0)
    if have > size:
        partial.unlink()
        return _State(hasher, 0)
    with open(partial, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return _State(hasher, have)


def _write_chunk(f: Any, hasher: Any, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        written = f.write(view)
        view = view[written:]
    hasher.update(chunk)


async def _attempt(
    client: httpx.AsyncClient, store: Store, fetch: Fetch, partial: Path, state: _State, progress: Throttle
) -> None:
    headers = {**fetch.headers, "Accept-Encoding": "identity"}
    if state.have:
        headers["Range"] = f"bytes={state.have}-"
    try:
        async with _open_stream(
            client, fetch.url, headers, label=fetch.label, redirect_hosts=fetch.redirect_hosts
        ) as resp:
            status = resp.status_code
            if status == 206:
                content_range = resp.headers.get("content-range", "")
                if content_range and not content_range.startswith(f"bytes {state.have}-"):
                    raise _Transient(f"the server answered a different range ({content_range})")
            elif status == 200:
                if state.have:  # the server ignored Range: start over
                    state.hasher, state.have = hashlib.sha256(), 0
            elif status == 416:
                await trio.Path(partial).unlink(missing_ok=True)
                state.hasher, state.have = hashlib.sha256(), 0
                raise _Transient("the server refused to resume; starting over")
            else:
                raise _status_error(status, fetch.label, resp)
            mode = "ab" if state.have else "wb"
            try:
                f = await trio.to_thread.run_sync(functools.partial(open, partial, mode, buffering=0))
            except OSError as exc:
                raise _storage_error(exc, store, fetch, state.have) from exc
            try:
                async for chunk in resp.aiter_bytes():
                    if state.have + len(chunk) > fetch.size:
                        raise PullFailed(
                            f"{fetch.label}: the server sent more than the {fetch.size} bytes expected"
                        )
                    try:
                        await trio.to_thread.run_sync(_write_chunk, f, state.hasher, chunk)
                    except OSError as exc:
                        raise _storage_error(exc, store, fetch, state.have) from exc
                    state.have += len(chunk)
                    progress(state.have)
            finally:
                f.close()
    except httpx.TransportError as exc:
        raise _Transient(f"connection lost ({reason(exc)})") from exc
    if state.have < fetch.size:
        raise PullFailed(
            f"{fetch.label}: download stopped at {state.have} of {fetch.size} bytes "
            "(kept; the next pull resumes it)"
        )


async def _download(
    client: httpx.AsyncClient, store: Store, fetch: Fetch, report: Report, retry: RetryPolicy
) -> Path:
    digest = f"sha256:{fetch.sha256}"
    partial = await trio.to_thread.run_sync(store.partial_path, fetch.sha256)
    state = await trio.to_thread.run_sync(_resume_state, partial, fetch.size)
    progress = Throttle(report, "downloading", fetch.label, fetch.size, digest)
    progress(state.have, force=True)
    failures = 0
    while state.have < fetch.size:
        start = state.have
        try:
            await _attempt(client, store, fetch, partial, state, progress)
        except _Transient as exc:
            progressed = state.have > start
            failures = 0 if progressed else failures + 1
            if failures >= retry.attempts:
                raise PullFailed(
                    f"{fetch.label}: {exc} — gave up after {failures} attempts; "
                    "the partial download is kept, pull again to resume"
                ) from exc
            if exc.retry_after_s is not None:
                if exc.retry_after_s > retry.max_retry_after_s:
                    raise PullFailed(
                        f"{fetch.label}: {exc}; the server asks to wait {exc.retry_after_s:.0f} s — try later"
                    ) from exc
                delay = exc.retry_after_s
            elif progressed:
                delay = 0.0
            else:
                delay = retry.backoff(failures)
            report(
                PullProgress(
                    status="retrying",
                    source=fetch.label,
                    digest=digest,
                    total=fetch.size,
                    completed=state.have,
                    message=f"{exc} — retrying in {delay:g} s",
                )
            )
            await trio.sleep(delay)
    progress(state.have, force=True)
    sha = state.hasher.hexdigest()
    if sha != fetch.sha256:
        await trio.Path(partial).unlink(missing_ok=True)
        raise ChecksumMismatch(
            f"{fetch.label}: the downloaded bytes have sha256 {sha}, expected {fetch.sha256}"
        )
    report(
        PullProgress(
            status="verifying", source=fetch.label, digest=digest, total=fetch.size, completed=fetch.size
        )
    )
    return await trio.to_thread.run_sync(store.add_blob, partial, fetch.sha256)


class _Flight:
    """One download in progress, which other pulls of the same blob join."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: Exception | None = None
        self.listeners: list[Report] = []

    def report(self, progress: PullProgress) -> None:
        for listener in list(self.listeners):
            listener(progress)


# Per trio run: a flight's Event belongs to the run that made it.
_FLIGHTS: trio.lowlevel.RunVar[dict[tuple[str, str], _Flight]] = trio.lowlevel.RunVar("blazar_pull_flights")


def _flights() -> dict[tuple[str, str], _Flight]:
    try:
        return _FLIGHTS.get()
    except LookupError:
        flights: dict[tuple[str, str], _Flight] = {}
        _FLIGHTS.set(flights)
        return flights


async def fetch_blob(
    client: httpx.AsyncClient,
    store: Store,
    fetch: Fetch,
    report: Report,
    *,
    retry: RetryPolicy | None = None,
) -> Path:
    """Make sure the blob `fetch.sha256` is in `store`, downloading it if needed; returns its path."""
    digest = f"sha256:{fetch.sha256}"
    key = (str(store.root), fetch.sha256)
    flights = _flights()
    while True:
        if await trio.to_thread.run_sync(store.has_blob, fetch.sha256):
            report(
                PullProgress(
                    status="downloading",
                    source=fetch.label,
                    digest=digest,
                    total=fetch.size,
                    completed=fetch.size,
                )
            )
            return store.blob_path(fetch.sha256)
        flight = flights.get(key)
        if flight is None:
            break
        report(
            PullProgress(
                status="waiting",
                source=fetch.label,
                digest=digest,
                total=fetch.size,
                message="another pull is downloading this file; sharing its download",
            )
        )
        flight.listeners.append(report)
        try:
            await flight.done.wait()
        finally:
            flight.listeners.remove(report)
        if flight.error is not None:
            raise copy.copy(flight.error) from flight.error
        # The leader was cancelled: loop, and take over from its partial file.

    flight = _Flight()
    flight.listeners.append(report)
    flights[key] = flight
    try:
        async with _process_lock(store, fetch, flight.report) as blob:
            if blob is not None:  # another process finished it while we waited
                return blob
            return await _download(client, store, fetch, flight.report, retry or RetryPolicy())
    except Exception as exc:
        flight.error = exc
        raise
    finally:
        del flights[key]
        flight.done.set()


@asynccontextmanager
async def _process_lock(store: Store, fetch: Fetch, report: Report) -> AsyncIterator[Path | None]:
    """Hold an exclusive lock on the blob's download, across processes (a CLI pull and the
    daemon's): the partial file has one writer. Yields the blob's path when another process
    completed it while this one waited, else None."""
    lock = store.partial_path(fetch.sha256).with_suffix(".lock")
    fd = await trio.to_thread.run_sync(lambda: os.open(lock, os.O_RDWR | os.O_CREAT, 0o644))
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    told = True
                    report(
                        PullProgress(
                            status="waiting",
                            source=fetch.label,
                            digest=f"sha256:{fetch.sha256}",
                            total=fetch.size,
                            message="another process is downloading this file; waiting for it",
                        )
                    )
                await trio.sleep(_LOCK_POLL_S)
        # Checked under the lock: the holder we waited for may have installed the blob.
        if await trio.to_thread.run_sync(store.has_blob, fetch.sha256):
            yield store.blob_path(fetch.sha256)
        else:
            yield None
    finally:
        with contextlib.suppress(OSError):
            if store.has_blob(fetch.sha256):
                lock.unlink()  # done for good; a waiter re-checks the blob once it gets the lock
        os.close(fd)  # releases the lock


async def fetch_small(
    client: httpx.AsyncClient,
    url: str,
    *,
    label: str,
    max_bytes: int,
    headers: dict[str, str] | None = None,
    sha256: str | None = None,
    retry: RetryPolicy | None = None,
) -> Document:
    """GET a small document (a manifest, a template layer) into memory, with the same retries.

    Returns the final answer whatever its status, except statuses worth a retry, which are
    retried; a body over `max_bytes`, or a 200 body that does not hash to `sha256`, is refused.
    """
    policy = retry or RetryPolicy()
    failures = 0
    while True:
        try:
            async with _open_stream(client, url, headers or {}, label=label) as resp:
                if resp.status_code in RETRY_STATUSES:
                    raise _Transient(f"HTTP {resp.status_code} from {resp.url.host}", retry_after_s(resp))
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise PullFailed(f"{label}: the answer is larger than {max_bytes} bytes")
                result = Document(status_code=resp.status_code, content=bytes(body))
        except (_Transient, httpx.TransportError) as exc:
            failures += 1
            wait = exc.retry_after_s if isinstance(exc, _Transient) else None
            if failures >= policy.attempts or (wait or 0) > policy.max_retry_after_s:
                raise PullFailed(f"{label}: {reason(exc)} — gave up after {failures} attempts") from exc
            await trio.sleep(wait if wait is not None else policy.backoff(failures))
            continue
        if sha256 is not None and result.status_code == 200:
            got = hashlib.sha256(result.content).hexdigest()
            if got != sha256:
                raise ChecksumMismatch(f"{label}: the bytes have sha256 {got}, expected {sha256}")
        return result


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds `path` (or its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free
