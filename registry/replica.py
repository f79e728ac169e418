"""A model copied from one store to another: what travels, how a blob is received, and the
install once every blob is in.

A manifest names files by absolute paths of the machine that wrote it, so what travels is a
``Replica``: the manifest's portable fields (name, kind, format, every file by its digest,
the settings and header facts), with the projector and a split GGUF's parts named by digest
and file name instead of by path. The receiving store takes each blob through a
``BlobReceiver`` (hashed as it is written; a blob whose bytes do not hash to its digest is
deleted, never stored), then ``install`` lays the model out from its own blobs and writes the
manifest last, so a model is listed only once every byte it needs is in and verified.

Blocking, like the store; async callers run these in a worker thread (``BlobReceiver.write``
is cheap enough for a request handler's loop).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO

import msgspec

from .errors import ChecksumMismatch, InvalidModelFile, ModelNotFound, disk_full_as
from .files import shown_folder
from .store import ModelFile, ModelRecord, ModelSettings, SpeechFacts, Store, WeightFacts, check_file_name

__all__ = ["BlobReceiver", "Part", "Replica", "install", "replica_of"]


class Part(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a split GGUF: the file name llama.cpp expects and the part's blob."""

    name: str
    digest: str


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    """A model as it travels between stores: no path of the sending machine in it."""

    name: str
    digest: str
    size: int
    format: str = "gguf"
    kind: str = "chat"
    source: str = ""
    blobs: list[str] = []
    files: list[ModelFile] = []
    entry: str = ""
    projector: str | None = None
    """The vision projector's digest, when the model has one."""
    parts: list[Part] = []
    """A split GGUF's parts in order (the first is ``digest``); empty for any other model."""
    settings: ModelSettings | None = None
    speech: SpeechFacts | None = None
    facts: WeightFacts | None = None

    def digests(self) -> list[str]:
        """Every blob the model needs, each once, its main file first."""
        out = [self.digest]
        for d in [*self.blobs, *(p.digest for p in self.parts)]:
            if d not in out:
                out.append(d)
        return out


def _digest_of_blob(path: Path) -> str:
    return "sha256:" + path.name.removeprefix("sha256-")


def replica_of(store: Store, record: ModelRecord) -> Replica:
    """The portable form of an installed model, its blobs checked present."""
    missing = [d for d in record.digests() if not store.has_blob(d)]
    if missing:
        raise ModelNotFound(
            record.name,
            f"model '{record.name}' is missing {len(missing)} of its files here ({missing[0][:19]}…) — "
            f"run `blazar pull {record.name}` again before copying it",
        )
    parts: list[Part] = []
    path = Path(record.path)
    if not record.files and path.parent.parent == store.root / "shards":
        for link in sorted(path.parent.iterdir()):
            if link.is_symlink():
                parts.append(Part(name=link.name, digest=_digest_of_blob(Path(os.readlink(link)))))
    projector = _digest_of_blob(Path(record.projector)) if record.projector else None
    return Replica(
        name=record.name, digest=record.digest, size=record.size, format=record.format, kind=record.kind,
        source=record.source, blobs=record.blobs, files=record.files, entry=record.entry,
        projector=projector, parts=parts, settings=record.settings, speech=record.speech, facts=record.facts,
    )  # fmt: skip


class BlobReceiver:
    """One blob arriving in chunks: written to the store's partial file and hashed on the way;
    ``finish`` stores it only when its bytes hash to ``digest``. Use it as a context manager:
    leaving it without ``finish`` (an error, a cut stream) deletes the partial file."""

    def __init__(self, store: Store, digest: str, *, expected_bytes: int | None = None) -> None:
        self.store = store
        self.sha = digest.removeprefix("sha256:")
        self.path = store.partial_path(self.sha)  # checks the digest's form
        self.expected_bytes = expected_bytes
        """The blob's size when the sender said it: a full disk's error names it."""
        self._hash = hashlib.sha256()
        self._file: BinaryIO | None = None
        self.received = 0

    def _disk_full_as(self) -> contextlib.AbstractContextManager[None]:
        """``DiskFull`` for the upload (the partial file is deleted on the way out)."""
        where = shown_folder(self.path.parent, self.store.root.parent)
        what = f"the blob sha256:{self.sha[:12]}…"
        return disk_full_as(what, where=where, needed_bytes=self.expected_bytes)

    def __enter__(self) -> BlobReceiver:
        with self._disk_full_as():
            self._file = open(self.path, "wb")
        return self

    def write(self, chunk: bytes) -> None:
        assert self._file is not None, "use BlobReceiver as a context manager"
        self._hash.update(chunk)
        with self._disk_full_as():
            self._file.write(chunk)
        self.received += len(chunk)

    def finish(self) -> Path:
        """Store the blob; ``ChecksumMismatch`` (and nothing stored) when its bytes are not it."""
        assert self._file is not None
        with self._disk_full_as():
            self._file.close()
        got = self._hash.hexdigest()
        if got != self.sha:
            self.path.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"the {self.received} bytes received hash to sha256:{got}, not sha256:{self.sha} — "
                "nothing was stored; send the blob again"
            )
        return self.store.add_blob(self.path, self.sha)

    def __exit__(self, *exc: object) -> None:
        if self._file is not None and not self._file.closed:
            # what it buffered may not fit either: the partial file goes anyway
            with contextlib.suppress(OSError):
                self._file.close()
        if self.path.exists() and exc[0] is not None:
            self.path.unlink(missing_ok=True)


def install(store: Store, replica: Replica) -> ModelRecord:
    """Install ``replica`` from blobs already in ``store`` (each verified as it came in):
    the layout its engine opens, then the manifest, last. ``InvalidModelFile`` names the
    blobs still missing."""
    missing = [d for d in replica.digests() if not store.has_blob(d)]
    if missing:
        raise InvalidModelFile(
            f"model '{replica.name}' cannot be installed: {len(missing)} of its blobs are not here "
            f"({', '.join(d[:19] for d in missing)}) — upload them first (POST /api/blobs/DIGEST)"
        )
    for f in replica.files:
        check_file_name(f.name)
    for p in replica.parts:
        check_file_name(p.name)
    previous = store.find(replica.name)
    now = time.time()
    record = ModelRecord(
        name=replica.name, digest=replica.digest, size=replica.size, path="", format=replica.format,
        kind=replica.kind, source=replica.source, created_at=previous.created_at if previous else now,
        modified_at=now, settings=replica.settings,
        projector=str(store.blob_path(replica.projector)) if replica.projector else None,
        blobs=replica.blobs, files=replica.files, entry=replica.entry, speech=replica.speech,
        facts=replica.facts,
    )  # fmt: skip
    if replica.files:
        path = store.materialize(record)
    elif replica.parts:
        path = _link_parts(store, replica.parts)
    else:
        path = store.blob_path(replica.digest)
    record = msgspec.structs.replace(record, path=str(path))
    store.write_manifest(record)
    return record


def _link_parts(store: Store, parts: list[Part]) -> Path:
    """The folder where a split GGUF's parts carry the names llama.cpp derives from the first."""
    folder = store.shards_dir / f"sha256-{parts[0].digest.removeprefix('sha256:')}"
    folder.mkdir(parents=True, exist_ok=True)
    for p in parts:
        link = folder / p.name
        target = os.path.relpath(store.blob_path(p.digest), folder)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return folder / parts[0].name
