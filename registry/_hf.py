"""Hugging Face repos: `ORG/REPO[:QUANT]` resolved to the GGUF files to download.

huggingface_hub supplies the metadata (one `model_info` call lists every file with its
size and LFS sha256), the auth headers and the file URLs; it reads HF_TOKEN at each
call. HF_ENDPOINT and HF_HUB_OFFLINE are read here at each pull rather than once at
import, so a long-running daemon follows its environment as given.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from ._download import RETRY_STATUSES, Fetch, Plan, RetryPolicy, reason, retry_after_s
from .catalog import Catalog
from .errors import ModelNotFound, PullFailed, RegistryError

__all__ = [
    "HF_HOSTS",
    "HubUnreachable",
    "SourceFailed",
    "hf_endpoint",
    "hub_call",
    "hub_call_retrying",
    "parse_hf_ref",
    "pick_gguf",
    "resolve_cached",
    "resolve_hf",
]

HUB_CALL_TIMEOUT_S = 15.0
_READ_TIMEOUT_S = 30.0
_PREFERRED_QUANTS = ("q4_k_m", "q4_k_s", "q4_0", "q5_k_m", "q8_0")
_PREFERRED_PROJECTORS = ("f16", "bf16", "f32", "q8_0")
_HEX = re.compile(r"[0-9a-f]{64}")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
HF_HOSTS = ("huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co")
"""Where huggingface.co sends downloads (its CDN and Xet storage); other redirect targets are refused."""


class SourceFailed(Exception):
    """One source could not deliver; a catalog pull moves on to the next."""


def hf_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in {"1", "true", "yes", "on"}


def hf_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


async def hub_call(fn: Callable[[], Any], what: str) -> Any:
    """Run a blocking huggingface_hub call in a thread, giving up after HUB_CALL_TIMEOUT_S."""
    if hf_offline():
        raise SourceFailed("HF_HUB_OFFLINE is set, so the Hugging Face Hub is not contacted")
    with trio.move_on_after(HUB_CALL_TIMEOUT_S):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
    raise SourceFailed(f"no answer from the Hugging Face Hub within {HUB_CALL_TIMEOUT_S:g} s ({what})")


def http_status(exc: BaseException) -> int | None:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


async def hub_call_retrying(fn: Callable[[], Any], what: str, policy: RetryPolicy) -> Any:
    """`hub_call`, retried on 429 and 5xx answers as downloads are (Retry-After honoured)."""
    failures = 0
    while True:
        try:
            return await hub_call(fn, what)
        except SourceFailed:
            raise
        except Exception as exc:
            if http_status(exc) not in RETRY_STATUSES:
                raise
            failures += 1
            wait = retry_after_s(getattr(exc, "response", None))
            if failures >= policy.attempts or (wait or 0.0) > policy.max_retry_after_s:
                raise
            await trio.sleep(wait if wait is not None else policy.backoff(failures))


class _RemoteFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int | None
    sha256: str | None


def _stem(path: str) -> str:
    m = _SPLIT.match(path)
    return m["stem"] if m else re.sub(r"\.gguf$", "", path, flags=re.IGNORECASE)


def _quant_matches(names: Sequence[str], tag: str) -> list[str]:
    """Files whose name carries the quant `tag` as a whole token, else as any substring."""
    wanted = tag.lower()
    token = re.compile(rf"(?<![a-z0-9]){re.escape(wanted)}(?![a-z0-9_])")
    for hit in (lambda n: token.search(n) is not None, lambda n: wanted in n):
        found = [n for n in names if hit(_stem(n).lower())]
        if found:
            return found
    return []


def pick_gguf(files: Sequence[str], tag: str | None) -> str | None:
    """The model file a quant tag (or the default preference) selects; a split model by its first part."""
    ggufs = sorted(
        f
        for f in files
        if f.lower().endswith(".gguf")
        and "mmproj" not in Path(f).name.lower()
        and ((m := _SPLIT.match(f)) is None or int(m["no"]) == 1)
    )
    if tag:
        matches = _quant_matches(ggufs, tag)
        return matches[0] if matches else None
    if len(ggufs) <= 1:
        return ggufs[0] if ggufs else None
    for quant in _PREFERRED_QUANTS:
        matches = _quant_matches(ggufs, quant)
        if matches:
            return matches[0]
    return ggufs[0]


def _split_parts(files: Sequence[_RemoteFile], first: str) -> list[_RemoteFile]:
    m = _SPLIT.match(first)
    if m is None:
        return [f for f in files if f.path == first]
    count = int(m["count"])
    by_no: dict[int, _RemoteFile] = {}
    for f in files:
        part = _SPLIT.match(f.path)
        if part and part["stem"] == m["stem"] and int(part["count"]) == count:
            by_no[int(part["no"])] = f
    missing = [n for n in range(1, count + 1) if n not in by_no]
    if missing:
        raise PullFailed(f"{first} is split in {count} parts but the repo lacks part(s) {missing}")
    return [by_no[n] for n in range(1, count + 1)]


def _pick_projector(files: Sequence[_RemoteFile], model: str) -> _RemoteFile | None:
    """The mmproj file of a vision model: the one beside the weights, full precision first."""
    projectors = [
        f for f in files if f.path.lower().endswith(".gguf") and "mmproj" in Path(f.path).name.lower()
    ]
    if not projectors:
        return None
    folder = Path(model).parent
    near = [f for f in projectors if Path(f.path).parent == folder] or projectors

    def rank(f: _RemoteFile) -> tuple[int, str]:
        name = Path(f.path).name.lower()
        order = next(
            (i for i, p in enumerate(_PREFERRED_PROJECTORS) if p in name), len(_PREFERRED_PROJECTORS)
        )
        return order, f.path

    return min(near, key=rank)


def parse_hf_ref(raw: str, canonical: str, catalog: Catalog) -> tuple[str, str, str]:
    """`(repo, file, quant tag)` from `[hf.co/]org/repo[/file.gguf][:quant]`, or ModelNotFound."""
    ref = raw.strip()
    for prefix in ("hf.co/", "huggingface.co/"):
        if ref.lower().startswith(prefix):
            ref = ref[len(prefix) :]
    base, _, tag = ref.partition(":")
    parts = base.split("/")
    if len(parts) < 2:
        raise ModelNotFound(
            canonical,
            f"model '{canonical}' is not in the catalog — `blazar pull` knows "
            f"{', '.join(catalog.names()) or 'no models'}, or give a Hugging Face repo as org/repo[:quant] "
            "or an Ollama model as ollama:name[:tag]",
        )
    if tag.lower() == "latest":
        tag = ""
    file = "/".join(parts[2:])
    if file and not file.lower().endswith(".gguf"):
        raise PullFailed(f"hf:{'/'.join(parts[:2])}/{file} is not a .gguf file")
    return "/".join(parts[:2]), file, tag


def _model_info(endpoint: str, repo: str) -> tuple[list[_RemoteFile], str, dict[str, str]]:
    """Runs in a thread: the repo's files with sizes and sha256, its commit, and the request headers."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import build_hf_headers

    info = HfApi(endpoint=endpoint).model_info(repo, files_metadata=True, timeout=_READ_TIMEOUT_S)
    files = [
        _RemoteFile(path=s.rfilename, size=s.size, sha256=s.lfs.sha256.lower() if s.lfs else None)
        for s in info.siblings or []
    ]
    return files, info.sha or "main", build_hf_headers()


def _hub_error(exc: Exception, repo: str, canonical: str, endpoint: str) -> RegistryError:
    from huggingface_hub.errors import GatedRepoError

    status = http_status(exc)
    if isinstance(exc, GatedRepoError):
        return PullFailed(
            f"hf:{repo} is gated — accept its terms on the Hub, then set HF_TOKEN to a token of that account"
        )
    if status in (401, 403):
        return PullFailed(
            f"hf:{repo} answered HTTP {status}: it is private, gated or missing — check the name, "
            "or set HF_TOKEN to a token that can read it"
        )
    if status == 404:
        return ModelNotFound(canonical, f"hf:{repo} was not found on {endpoint} — check the name")
    if status is not None:
        return PullFailed(f"hf:{repo}: HTTP {status} from {endpoint} — {reason(exc)}")
    return HubUnreachable(f"cannot reach {endpoint} for hf:{repo}: {reason(exc)}")


class HubUnreachable(PullFailed):
    """The Hub gave no answer at all (no network, HF_HUB_OFFLINE, a timeout), as opposed to
    an answer that refuses: only then may the local cache stand in for it."""


async def resolve_hf(raw: str, canonical: str, catalog: Catalog, retry: RetryPolicy) -> Plan:
    """The files `raw` names on the Hub, pinned to the repo's current commit."""
    repo, file, tag = parse_hf_ref(raw, canonical, catalog)
    endpoint = hf_endpoint()
    try:
        files, commit, headers = await hub_call_retrying(
            functools.partial(_model_info, endpoint, repo), f"hf:{repo}", retry
        )
    except SourceFailed as exc:
        raise HubUnreachable(f"cannot list the files of hf:{repo}: {exc}") from exc
    except Exception as exc:
        raise _hub_error(exc, repo, canonical, endpoint) from exc
    return _plan(repo, file, tag, files, canonical, commit=commit, endpoint=endpoint, headers=headers)


def _plan(
    repo: str,
    file: str,
    tag: str,
    files: Sequence[_RemoteFile],
    canonical: str,
    *,
    commit: str,
    endpoint: str,
    headers: dict[str, str],
) -> Plan:
    """The weights (every part of a split file) and projector that `file` or `tag` pick."""
    names = [f.path for f in files]
    if file:
        if file not in names:
            raise ModelNotFound(canonical, f"hf:{repo} has no file {file}")
        first = file
    else:
        picked = pick_gguf(names, tag or None)
        if picked is None:
            wanted = f"matching '{tag}' " if tag else ""
            here = sorted(
                {
                    _stem(n).rsplit("-", 1)[-1]
                    for n in names
                    if n.lower().endswith(".gguf") and "mmproj" not in n.lower()
                }
            )
            raise PullFailed(
                f"hf:{repo} has no GGUF file {wanted}to pull"
                + (f" (it has: {', '.join(here)})" if here else "")
            )
        first = picked
    parts = _split_parts(files, first)
    projector = _pick_projector(files, first)

    from huggingface_hub import hf_hub_url

    def fetch(f: _RemoteFile) -> Fetch:
        if f.size is None or f.sha256 is None:
            raise PullFailed(f"the Hub lists no sha256 for hf:{repo}/{f.path}, so it cannot be verified")
        return Fetch(
            url=hf_hub_url(repo, f.path, revision=commit, endpoint=endpoint),
            sha256=f.sha256,
            size=f.size,
            label=f"hf:{repo}/{f.path}",
            headers=headers,
            redirect_hosts=HF_HOSTS,
        )

    return Plan(
        source=f"hf:{repo}/{first}",
        parts=[(Path(f.path).name, fetch(f)) for f in parts],
        projector=fetch(projector) if projector else None,
    )


# -- the Hugging Face cache on this machine ------------------------------------------------


def _cached_snapshot(hub: Path, repo: str) -> Path | None:
    """The snapshot of `repo` the cache's `main` ref names (else its newest), or None.
    The repo's own spelling is in the path: ``models--ORG--REPO/snapshots/<commit>``."""
    from huggingface_hub.file_download import repo_folder_name

    folder = hub / repo_folder_name(repo_id=repo, repo_type="model")
    if not folder.is_dir():
        # Repo names are case-insensitive on the Hub, the cache's folder names are not.
        wanted = folder.name.lower()
        folder = next((p for p in hub.glob("models--*") if p.name.lower() == wanted), folder)
    snapshots = folder / "snapshots"
    with contextlib.suppress(OSError):
        commit = (folder / "refs" / "main").read_text().strip()
        if commit and (snapshots / commit).is_dir():
            return snapshots / commit
    try:
        candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def _cached_files(snapshot: Path) -> list[_RemoteFile]:
    """The snapshot's files with their sizes; an LFS file's sha256 is its blob's name."""
    files = []
    for link in sorted(snapshot.rglob("*")):
        try:
            real = link.resolve(strict=True)
            if not real.is_file():
                continue
            size = real.stat().st_size
        except (OSError, RuntimeError):
            continue  # a dangling link: the download of that file never finished
        sha = real.name if real.parent.name == "blobs" and _HEX.fullmatch(real.name) else None
        files.append(_RemoteFile(path=link.relative_to(snapshot).as_posix(), size=size, sha256=sha))
    return files


def resolve_cached(
    raw: str, canonical: str, catalog: Catalog, hubs: Sequence[str | os.PathLike[str]]
) -> Plan | None:
    """Runs in a thread: what `raw` names, read from a Hugging Face cache (huggingface_hub's
    layout) instead of the Hub, or None when no cache under `hubs` holds the repo. The pull
    then finds the bytes in that cache by their sha256 and links them."""
    repo, file, tag = parse_hf_ref(raw, canonical, catalog)
    for hub in hubs:
        snapshot = _cached_snapshot(Path(hub), repo)
        if snapshot is None:
            continue
        repo = snapshot.parent.parent.name.removeprefix("models--").replace("--", "/")
        files = _cached_files(snapshot)
        # Only files named by their sha256 can be verified; git files (README, config) never are GGUF.
        verified = [f for f in files if f.sha256 is not None or not f.path.lower().endswith(".gguf")]
        try:
            return _plan(
                repo, file, tag, verified, canonical, commit=snapshot.name, endpoint=hf_endpoint(), headers={}
            )
        except (ModelNotFound, PullFailed):
            continue
    return None
