"""A model copied between two stores: the blob receiver's verification and the install.

The sending store is the test cache's (the real SmolLM2 GGUF, the real piper voice: a
multi-file model); the receiving one is empty. The bytes go through ``BlobReceiver`` in
chunks, as the daemon's upload route feeds it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from registry.errors import ChecksumMismatch, InvalidModelFile
from registry.replica import BlobReceiver, Replica, install, replica_of
from registry.store import ModelFile, Store
from tests.support import MODEL, TEST_CACHE, speech_model

_CHUNK = 1 << 20


def _send(source: Store, target: Store, digest: str, *, tamper_at: int | None = None) -> None:
    with BlobReceiver(target, digest) as rx, open(source.blob_path(digest), "rb") as f:
        offset = 0
        while chunk := f.read(_CHUNK):
            if tamper_at is not None and offset <= tamper_at < offset + len(chunk):
                i = tamper_at - offset
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
            rx.write(chunk)
            offset += len(chunk)
        rx.finish()


@pytest.fixture
def source(model_path: Path, tmp_path: Path) -> Store:
    store = Store(tmp_path / "a")
    store.import_file(model_path, MODEL, source="test")
    return store


def test_a_blob_whose_bytes_are_its_digest_is_stored(tmp_path: Path) -> None:
    target = Store(tmp_path / "b")
    data = b"blazar" * 100_000
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with BlobReceiver(target, digest) as rx:
        for i in range(0, len(data), 4096):
            rx.write(data[i : i + 4096])
        blob = rx.finish()
    assert blob == target.blob_path(digest) and blob.read_bytes() == data
    assert not list(target.partial_dir.iterdir())


def test_a_tampered_stream_is_refused_and_nothing_is_stored_or_installed(
    source: Store, tmp_path: Path
) -> None:
    record = source.get(MODEL)
    replica = replica_of(source, record)
    target = Store(tmp_path / "b")
    with pytest.raises(ChecksumMismatch) as refused:
        _send(source, target, replica.digest, tamper_at=record.size // 2)
    assert replica.digest.removeprefix("sha256:") in str(refused.value)
    assert not target.has_blob(replica.digest)
    assert not list(target.partial_dir.iterdir())  # the partial file went too
    with pytest.raises(InvalidModelFile, match="not here"):
        install(target, replica)
    assert target.list() == []


def test_a_stream_cut_midway_leaves_no_partial_file(source: Store, tmp_path: Path) -> None:
    target = Store(tmp_path / "b")
    digest = source.get(MODEL).digest
    with pytest.raises(ConnectionError), BlobReceiver(target, digest) as rx:
        rx.write(b"GGUF")
        raise ConnectionError("the sender went away")
    assert not target.has_blob(digest) and not list(target.partial_dir.iterdir())


def test_a_gguf_model_arrives_with_the_same_digest_and_opens(source: Store, tmp_path: Path) -> None:
    record = source.get(MODEL)
    replica = replica_of(source, record)
    wire = msgspec.json.encode(replica)
    assert str(source.root).encode() not in wire  # no path of the sending machine travels
    target = Store(tmp_path / "b")
    for digest in replica.digests():
        _send(source, target, digest)
    installed = install(target, msgspec.json.decode(wire, type=Replica))
    assert (installed.name, installed.digest, installed.size) == (record.name, record.digest, record.size)
    assert Path(installed.path) == target.blob_path(record.digest)
    assert target.info(installed).architecture == source.info(record).architecture


def test_a_multi_file_model_arrives_laid_out_for_its_engine(tmp_path: Path) -> None:
    speech_model("piper-joe-us")  # fetched once into the test cache
    source = Store(TEST_CACHE / "models")
    record = source.get("piper-joe-us")
    replica = replica_of(source, record)
    assert len(replica.files) == 2 and len(replica.digests()) == 2
    target = Store(tmp_path / "b")
    for digest in replica.digests():
        _send(source, target, digest)
    installed = install(target, replica)
    opened = Path(installed.path)
    assert opened.name == record.entry and opened.is_relative_to(target.trees_dir)
    assert (opened.parent / "en_US-joe-medium.onnx.json").read_bytes() == (
        Path(record.path).parent / "en_US-joe-medium.onnx.json"
    ).read_bytes()
    assert installed.files == record.files and installed.speech == record.speech


def test_a_replica_naming_a_file_outside_its_folder_is_refused(source: Store, tmp_path: Path) -> None:
    replica = replica_of(source, source.get(MODEL))
    target = Store(tmp_path / "b")
    _send(source, target, replica.digest)
    bad = msgspec.structs.replace(replica, files=[ModelFile(name="../x", digest=replica.digest, size=1)])
    with pytest.raises(InvalidModelFile):
        install(target, bad)
    assert target.list() == []
