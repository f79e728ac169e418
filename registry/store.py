"""Content-addressed model store: sha256 blobs, one JSON manifest per name, atomic writes.

Layout under the root (`<home>/models`):

    blobs/sha256-<hex>        model bytes (a hardlink, a copy, or a symlink for link=True)
    manifests/<name>.json     one ModelRecord per model name
    info/sha256-<hex>.json    cached GGUF header facts
    shards/sha256-<hex>/      a split GGUF's parts under their original names (links to blobs)
    partial/                  downloads in progress (resumable, never listed), with a .lock each
    reuse-hashes.json         hashes of files in other tools' stores (registry/reuse.py)

Every method is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ._names import canonical_name
from .errors import (
    ChecksumMismatch,
    InsufficientStorage,
    InvalidModelFile,
    ModelNotFound,
    RegistryError,
)

if TYPE_CHECKING:
    from .gguf import ModelInfo

__all__ = [
    "ModelRecord",
    "ModelSettings",
    "Store",
    "canonical_name",
    "sha256_file",
]

_CHUNK_BYTES = 1 << 20
_HEX = re.compile(r"[0-9a-f]{64}")
# errnos meaning "this filesystem pair cannot hardlink", where a copy is the answer.
_NO_HARDLINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a Modelfile (Ollama ``create``, or a registry pull) adds to the weights."""

    system: str | None = None
    """Default system prompt, used when a request brings none."""
    template: str | None = None
    """Chat template (Jinja) that replaces the one in the GGUF."""
    parameters: dict[str, Any] = {}
    """Default sampling options (Ollama option names: temperature, num_predict, stop…)."""


class ModelRecord(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    digest: str
    size: int
    path: str
    format: str = "gguf"
    source: str
    created_at: float
    modified_at: float
    settings: ModelSettings | None = None
    projector: str | None = None
    """Path of the vision projector (mmproj) blob, when the model has one."""
    blobs: list[str] = []
    """The other blobs the model needs (``sha256:`` digests): split parts 2..N, the projector."""

    def digests(self) -> list[str]:
        """Every blob this model uses, its main file first."""
        return [self.digest, *self.blobs]


def sha256_file(path: str | os.PathLike[str], on_progress: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file; `on_progress` receives the running count of bytes hashed."""
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
            done += len(chunk)
            if on_progress is not None:
                on_progress(done)
    return digest.hexdigest()


def _check_hex(sha256_hex: str) -> str:
    value = sha256_hex.lower().removeprefix("sha256:")
    if not _HEX.fullmatch(value):
        raise RegistryError(f"'{sha256_hex}' is not a sha256 hex digest")
    return value


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; some filesystems refuse directory fds, which is harmless.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _storage_error(exc: OSError, what: str) -> RegistryError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(f"not enough disk space to {what} — free some space and retry")
    return RegistryError(f"cannot {what}: {exc.strerror or exc}")


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _atomic_copy(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, _CHUNK_BYTES)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(dst.parent)


class Store:
    """The model store rooted at `root`; directories are created on first write."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir = self.root / "manifests"
        self.info_dir = self.root / "info"
        self.partial_dir = self.root / "partial"
        self.shards_dir = self.root / "shards"

    def __repr__(self) -> str:
        return f"<Store {self.root}>"

    def blob_path(self, sha256_hex: str) -> Path:
        return self.blobs_dir / f"sha256-{_check_hex(sha256_hex)}"

    def has_blob(self, sha256_hex: str) -> bool:
        # exists() follows symlinks, so a linked blob whose target vanished counts as absent.
        return self.blob_path(sha256_hex).exists()

    def partial_path(self, sha256_hex: str) -> Path:
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        return self.partial_dir / f"sha256-{_check_hex(sha256_hex)}.partial"

    def _manifest_path(self, canonical: str) -> Path:
        return self.manifests_dir / f"{canonical}.json"

    def _manifests(self) -> Iterator[Path]:
        if not self.manifests_dir.is_dir():
            return
        for path in self.manifests_dir.rglob("*.json"):
            if not path.name.startswith("."):
                yield path

    def _read_manifest(self, path: Path) -> ModelRecord | None:
        try:
            return msgspec.json.decode(path.read_bytes(), type=ModelRecord)
        except (OSError, msgspec.DecodeError):
            # A damaged manifest must not hide every other model from listings.
            return None

    def list(self) -> builtins.list[ModelRecord]:
        records = [r for p in self._manifests() if (r := self._read_manifest(p)) is not None]
        return sorted(records, key=lambda r: r.name)

    def find(self, name: str) -> ModelRecord | None:
        path = self._manifest_path(canonical_name(name))
        return self._read_manifest(path) if path.is_file() else None

    def get(self, name: str) -> ModelRecord:
        record = self.find(name)
        if record is None:
            raise ModelNotFound(canonical_name(name))
        return record

    def write_manifest(self, record: ModelRecord) -> None:
        """Install ``record`` under its name (atomically); the blobs of a model it replaces
        are deleted once no name uses them."""
        canonical = canonical_name(record.name)
        if canonical != record.name:
            record = msgspec.structs.replace(record, name=canonical)
        previous = self.find(canonical)
        try:
            _atomic_write(self._manifest_path(canonical), msgspec.json.encode(record))
        except OSError as exc:
            raise _storage_error(exc, f"write the manifest of '{canonical}'") from exc
        if previous is not None:
            self.collect(*(set(previous.digests()) - set(record.digests())))

    def add_blob(self, tmp_file: Path, sha256_hex: str) -> Path:
        """Move a fully downloaded, already verified file into the blob directory."""
        blob = self.blob_path(sha256_hex)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if blob.exists():
            Path(tmp_file).unlink(missing_ok=True)
            return blob
        try:
            with open(tmp_file, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp_file, blob)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise _storage_error(exc, f"store blob sha256-{sha256_hex}") from exc
            _atomic_copy(Path(tmp_file), blob)
            Path(tmp_file).unlink(missing_ok=True)
        _fsync_dir(blob.parent)
        return blob

    def _place_blob(self, src: Path, blob: Path, *, link: bool) -> None:
        blob.parent.mkdir(parents=True, exist_ok=True)
        if blob.is_symlink() and not blob.exists():
            blob.unlink()
        if link:
            try:
                blob.symlink_to(src.resolve())
            except FileExistsError:
                pass
            return
        try:
            os.link(src, blob)
            return
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno not in _NO_HARDLINK:
                raise
        _atomic_copy(src, blob)

    def import_file(
        self,
        src: Path,
        name: str,
        *,
        link: bool = False,
        source: str | None = None,
        expected_sha256: str | None = None,
        settings: ModelSettings | None = None,
        projector: Path | None = None,
        projector_sha256: str | None = None,
    ) -> ModelRecord:
        """Add a local GGUF file under `name`, replacing any model already called so.

        ``projector`` (a vision mmproj file) is placed the same way and recorded with
        the model; ``*_sha256`` are checked against the bytes when given. The manifest
        is written once, last."""
        from .gguf import check_complete, looks_like_gguf, model_info, read_header

        canonical = canonical_name(name)
        src = Path(src).absolute()
        if not src.is_file():
            raise InvalidModelFile(f"no such file: {src}")
        if not looks_like_gguf(src):
            raise InvalidModelFile(f"{src} is not a GGUF file (bad magic bytes)")
        header = read_header(src)
        info = model_info(header)
        if info.architecture == "clip":
            raise InvalidModelFile(
                f"{src} is a vision projector (mmproj), not a model — give it with its model "
                "(`blazar pull` of the repo brings both)"
            )
        if int(header.values.get("split.count") or 1) > 1:
            raise InvalidModelFile(
                f"{src} is one part of a split model — pull the repo (`blazar pull ORG/REPO:QUANT`), "
                "or merge the parts first (`llama-gguf-split --merge`)"
            )
        # Before hashing: a short file is refused from its header alone, without reading it all.
        check_complete(header, src.stat().st_size, str(src))
        if projector is not None:
            check_complete(read_header(projector), Path(projector).stat().st_size, str(projector))
        sha = self._verified_sha256(src, expected_sha256)
        projector_blob = None
        if projector is not None:
            projector_blob = self.blob_path(self._verified_sha256(Path(projector), projector_sha256))
        blob = self.blob_path(sha)
        for source_file, target in ((src, blob), (projector, projector_blob)):
            if source_file is None or target is None or target.exists():
                continue
            try:
                self._place_blob(Path(source_file), target, link=link)
            except OSError as exc:
                raise _storage_error(exc, f"import {source_file}") from exc
        self._write_info(sha, info)

        previous = self.find(canonical)
        now = time.time()
        record = ModelRecord(
            name=canonical,
            digest=f"sha256:{sha}",
            size=src.stat().st_size,
            path=str(blob),
            format="gguf",
            source=source or f"import:{src}",
            created_at=previous.created_at if previous else now,
            modified_at=now,
            settings=settings,
            projector=str(projector_blob) if projector_blob else None,
            blobs=[f"sha256:{projector_blob.name.removeprefix('sha256-')}"] if projector_blob else [],
        )
        self.write_manifest(record)
        return record

    def adopt_blob(self, src: Path, sha256_hex: str, *, link: bool = False) -> str:
        """Make a file from elsewhere the blob ``sha256_hex`` (hardlink, else copy; symlink
        with ``link``), after checking its bytes. Returns how: ``hardlinked``, ``copied``,
        ``symlinked`` or ``already stored``."""
        blob = self.blob_path(sha256_hex)
        if blob.exists():
            return "already stored"
        self._verified_sha256(Path(src), sha256_hex)
        try:
            self._place_blob(Path(src), blob, link=link)
            if link:
                return "symlinked"
            return "hardlinked" if os.stat(blob).st_ino == os.stat(src).st_ino else "copied"
        except OSError as exc:
            raise _storage_error(exc, f"add {src} to the store") from exc

    @staticmethod
    def _verified_sha256(path: Path, expected: str | None) -> str:
        try:
            sha = sha256_file(path)
        except OSError as exc:
            raise InvalidModelFile(f"cannot read {path}: {exc.strerror or exc}") from exc
        if expected is not None and _check_hex(expected) != sha:
            raise ChecksumMismatch(f"{path} has sha256 {sha}, expected {_check_hex(expected)}")
        return sha

    def remove(self, name: str) -> ModelRecord:
        """Remove a model's manifest, and its blob when no other name still uses it."""
        canonical = canonical_name(name)
        record = self.get(canonical)
        path = self._manifest_path(canonical)
        path.unlink(missing_ok=True)
        _fsync_dir(path.parent)
        # Tidy directories left empty by names with '/', never the manifests root itself.
        parent = path.parent
        while parent != self.manifests_dir and parent.is_relative_to(self.manifests_dir):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        self.collect(*record.digests())
        return record

    def used_digests(self) -> set[str]:
        return {d for r in self.list() for d in r.digests()}

    def collect(self, *digests: str) -> None:
        """Delete blobs (with their cached header and split-part folder) no manifest uses."""
        used = self.used_digests()
        for digest in digests:
            if digest in used:
                continue
            sha = _check_hex(digest)
            self.blob_path(sha).unlink(missing_ok=True)
            (self.info_dir / f"sha256-{sha}.json").unlink(missing_ok=True)
            shutil.rmtree(self.shards_dir / f"sha256-{sha}", ignore_errors=True)

    def _write_info(self, sha: str, info: ModelInfo) -> None:
        # The cache only saves time; failing to write it must not fail the operation.
        with contextlib.suppress(OSError):
            _atomic_write(self.info_dir / f"sha256-{sha}.json", msgspec.json.encode(info))

    def info(self, name_or_record: str | ModelRecord) -> ModelInfo:
        """GGUF header facts of an installed model, cached on disk by digest."""
        # Here, not at the top: the header reader brings the `gguf` package (and numpy),
        # which listing, finding and removing models never need.
        from .gguf import ModelInfo, read_model_info

        record = self.get(name_or_record) if isinstance(name_or_record, str) else name_or_record
        sha = _check_hex(record.digest)
        cache = self.info_dir / f"sha256-{sha}.json"
        with contextlib.suppress(OSError, msgspec.DecodeError):
            cached = msgspec.json.decode(cache.read_bytes(), type=ModelInfo)
            # A cache written before the vocabulary was measured is read again once.
            if cached.token_bytes_max is not None or not cached.vocab_size:
                return cached
        info = read_model_info(record.path)
        self._write_info(sha, info)
        return info
