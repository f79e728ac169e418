"""Reuse what other tools keep on disk: find a file by its bytes, adopt found models.

`registry.scan` says what the other stores hold; this module decides whether those
bytes are the ones wanted (by sha256, cached so a second look hashes nothing) and
places them in the Blazar store by hardlink, copy or symlink, reporting which.

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from .errors import InvalidModelFile, RegistryError
from .files import atomic_write
from .formats import detect
from .imports import import_gguf
from .scan import Companion, FoundModel, Roots, StoreKind, files_of_size
from .store import ModelRecord, Store, sha256_file
from .weights import import_weights, select_files

__all__ = ["HASH_CACHE_FILE", "Adoption", "adopt", "adopt_all", "find_reusable"]

HASH_CACHE_FILE = "reuse-hashes.json"
"""Hashes computed by `find_reusable`, kept under the Blazar store's root."""

_HEX = re.compile(r"[0-9a-f]{64}")
_PREFERRED_PROJECTORS = ("f16", "bf16", "f32", "q8_0")


class Adoption(msgspec.Struct, frozen=True, kw_only=True):
    """What `adopt_all` did with one found model."""

    name: str
    store: StoreKind
    path: str
    status: Literal["adopted", "skipped", "failed"]
    method: Literal["hardlink", "copy", "symlink", "existing"] | None = None
    """How the blob got into the store; ``existing``: the store already held those bytes."""
    bytes_copied: int = 0
    reason: str | None = None
    record: ModelRecord | None = None


# -- reuse by content ------------------------------------------------------------------------


class _HashEntry(msgspec.Struct, frozen=True, kw_only=True):
    size: int
    mtime_ns: int
    sha256: str


class _HashCache:
    """sha256 of files elsewhere, keyed by (path, size, mtime), so a second scan hashes nothing."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self.entries: dict[str, _HashEntry] = {}
        self.dirty = False
        if file is not None:
            with contextlib.suppress(OSError, msgspec.DecodeError):
                self.entries = msgspec.json.decode(file.read_bytes(), type=dict[str, _HashEntry])

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = str(path)
        hit = self.entries.get(key)
        if hit is not None and hit.size == st.st_size and hit.mtime_ns == st.st_mtime_ns:
            return hit.sha256
        sha = sha256_file(path)
        self.entries[key] = _HashEntry(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha)
        self.dirty = True
        return sha

    def save(self) -> None:
        if self.file is None or not self.dirty:
            return
        live = {k: v for k, v in self.entries.items() if os.path.exists(k)}
        # The cache only saves time; failing to write it must not fail the caller.
        with contextlib.suppress(OSError):
            atomic_write(self.file, msgspec.json.encode(live), mode=0o600)
        self.dirty = False


def _hash_cache(store: Store | None) -> _HashCache:
    return _HashCache(store.root / HASH_CACHE_FILE if store is not None else None)


def find_reusable(
    size: int,
    sha256: str | None,
    roots: Roots | None = None,
    *,
    store: Store | None = None,
    filename: str | None = None,
) -> FoundModel | None:
    """A file in another store with these bytes (model or projector), or None.

    With `sha256`, a candidate of the right size is hashed only when its store does not name
    it by its sha256; hashes are cached in `<store.root>/reuse-hashes.json` when `store` is
    given. Without `sha256` nothing can be proven: a candidate must then have the same size
    and the same file name (`filename`), and no `filename` means no match.
    """
    if sha256 is None:
        if not filename:
            return None
        same_name = files_of_size(size, roots, filename=filename)
        return same_name[0] if same_name else None
    want = sha256.lower().removeprefix("sha256:")
    if not _HEX.fullmatch(want):
        raise RegistryError(f"'{sha256}' is not a sha256 hex digest")
    candidates = files_of_size(size, roots)
    for found in candidates:
        if found.sha256 == want:
            return found
    cache = _hash_cache(store)
    try:
        for found in candidates:
            if found.sha256 is not None:
                continue
            try:
                got = cache.sha256(Path(found.path))
            except OSError:
                continue
            if got == want:
                return msgspec.structs.replace(found, sha256=got)
    finally:
        cache.save()
    return None


# -- adoption ------------------------------------------------------------------------------------


def adopt(store: Store, found: FoundModel, name: str | None = None, link: bool = False) -> ModelRecord:
    """Add a found model to `store` (hardlink, else copy; a symlink with `link`).

    The model keeps its settings (Ollama) and its vision projector, placed in the store the
    same way. Replaces any model already called `name`, like `Store.import_file`. A known
    sha256 is checked against the file's bytes, so a corrupt blob elsewhere is refused.
    """
    if found.role != "model":
        raise InvalidModelFile(f"{found.path} is a vision projector, not a model")
    if found.format != "gguf":
        # A snapshot directory or a diffusion checkpoint: each file becomes a blob, linked from
        # the other store's own (a Hugging Face snapshot's files are symlinks into its blobs/).
        single = not Path(found.path).is_dir()
        return import_weights(
            store, Path(found.path), name or found.name, link=link, source=found.source,
            expected_sha256=found.sha256 if single else None,
            filename=Path(found.origin).name if single else None,
        )  # fmt: skip
    projector = _pick_projector(found.companions)
    return import_gguf(
        store,
        Path(found.path),
        name or found.name,
        link=link,
        source=found.source,
        expected_sha256=found.sha256,
        settings=found.settings,
        projector=Path(projector.path) if projector else None,
        projector_sha256=projector.sha256 if projector else None,
    )


def _pick_projector(companions: Sequence[Companion]) -> Companion | None:
    def rank(c: Companion) -> tuple[int, str]:
        name = c.filename.lower()
        order = next(
            (i for i, p in enumerate(_PREFERRED_PROJECTORS) if p in name), len(_PREFERRED_PROJECTORS)
        )
        return order, c.filename

    return min(companions, key=rank) if companions else None


def _same_tree(installed: ModelRecord, found: FoundModel) -> bool:
    """A directory model installed from the same snapshot files: the same names and sizes,
    and the same sha256 where the other store names a file by it (no file is hashed)."""
    folder = Path(found.path)
    try:
        pairs = select_files(folder, detect(folder))
        have = {f.name: f for f in installed.files}
        if set(have) != {rel for rel, _ in pairs}:
            return False
        for rel, path in pairs:
            real = path.resolve()
            if real.stat().st_size != have[rel].size:
                return False
            if _HEX.fullmatch(real.name) and have[rel].digest != f"sha256:{real.name}":
                return False
    except (RegistryError, OSError):
        return False
    return True


def _same_bytes(installed: ModelRecord, found: FoundModel, cache: _HashCache) -> bool:
    if installed.format != found.format and found.format != "gguf":
        return False
    if Path(found.path).is_dir():
        return _same_tree(installed, found)
    if found.sha256 is not None:
        return installed.digest == f"sha256:{found.sha256}"
    if installed.size != found.size:
        return False
    with contextlib.suppress(OSError):
        if os.path.samefile(installed.path, found.path):
            return True
    try:
        return installed.digest == f"sha256:{cache.sha256(Path(found.path))}"
    except OSError:
        return False


def adopt_all(
    store: Store,
    found: Sequence[FoundModel],
    *,
    link: bool = False,
    on_result: Callable[[Adoption], None] | None = None,
) -> list[Adoption]:
    """Adopt each found model under its suggested name; never replaces an installed model.

    A name already installed with the same bytes is skipped as done; a name taken by other
    bytes is skipped with a reason. One failure does not stop the others. `on_result` hears
    of each model as soon as it is done (copies across filesystems take a while).
    """
    results: list[Adoption] = []
    cache = _hash_cache(store)
    try:
        for item in found:
            if item.role != "model":
                continue
            results.append(outcome := _adopt_one(store, item, link, cache))
            if on_result is not None:
                on_result(outcome)
    finally:
        cache.save()
    return results


def _adopt_one(store: Store, item: FoundModel, link: bool, cache: _HashCache) -> Adoption:
    def result(status: Literal["adopted", "skipped", "failed"], **kw: Any) -> Adoption:
        return Adoption(name=item.name, store=item.store, path=item.path, status=status, **kw)

    try:
        installed = store.find(item.name)
        if installed is not None and Path(installed.path).exists():
            if _same_bytes(installed, item, cache):
                return result("skipped", reason="already installed", record=installed)
            return result(
                "skipped",
                reason=f"'{item.name}' is installed with other bytes — import this one under another "
                f"name: blazar import {item.path} --name NAME",
            )
        try:
            before = set(os.listdir(store.blobs_dir))
        except OSError:
            before = set()
        record = adopt(store, item, link=link)
    except (RegistryError, OSError) as exc:
        reason = exc.message if isinstance(exc, RegistryError) else f"{exc.strerror or exc}"
        return result("failed", reason=reason)
    if record.files:
        method, copied = _tree_placement(store, record, Path(item.path), before)
        return result("adopted", method=method, bytes_copied=copied, record=record)
    method, copied = _placement(Path(record.path), Path(item.path), before, record.size)
    if record.projector is not None:
        projector = _pick_projector(item.companions)
        if projector is not None:
            copied += _placement(Path(record.projector), Path(projector.path), before, projector.size)[1]
    return result("adopted", method=method, bytes_copied=copied, record=record)


def _placement(
    blob: Path, src: Path, before: set[str], size: int
) -> tuple[Literal["hardlink", "copy", "symlink", "existing"], int]:
    """How `blob` came to hold `src`'s bytes, and how many bytes that copied."""
    if blob.is_symlink():
        return "symlink", 0
    if _inode(blob) == _inode(src):
        return "hardlink", 0
    if blob.name in before:
        return "existing", 0
    return "copy", size


def _tree_placement(
    store: Store, record: ModelRecord, src: Path, before: set[str]
) -> tuple[Literal["hardlink", "copy", "symlink", "existing"], int]:
    """How a multi-file model's blobs came to hold ``src``'s files (a folder, or the one file),
    and how many bytes that copied: ``copy`` when any was copied."""
    methods = set()
    copied = 0
    for f in record.files:
        origin = src / f.name if src.is_dir() else src
        method, n = _placement(store.blob_path(f.digest), origin.resolve(), before, f.size)
        methods.add(method)
        copied += n
    for method in ("copy", "symlink", "hardlink"):
        if method in methods:
            return method, copied
    return "existing", copied


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino
