from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import msgspec
import pytest
from conftest import TRUNCATED_BYTES, write_gguf

import registry.gguf as gguf_mod
import registry.store as store_mod
from registry.errors import (
    ChecksumMismatch,
    InvalidModelFile,
    InvalidModelName,
    ModelFileIncomplete,
    ModelNotFound,
    RegistryError,
)
from registry.store import ModelRecord, Store, canonical_name, sha256_file


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home" / "models")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_import_hardlinks_and_records(store: Store, tiny_gguf: Path) -> None:
    record = store.import_file(tiny_gguf, "tiny")
    sha = _sha(tiny_gguf)
    assert record.name == "tiny"
    assert record.digest == f"sha256:{sha}"
    assert record.size == tiny_gguf.stat().st_size
    assert record.format == "gguf"
    assert record.source == f"import:{tiny_gguf}"
    assert Path(record.path) == store.root / "blobs" / f"sha256-{sha}"
    assert os.path.samefile(record.path, tiny_gguf)
    assert store.get("tiny") == record
    assert store.list() == [record]


def test_reimport_dedups(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    first = store.import_file(tiny_gguf, "a")
    other = tmp_path / "copy.gguf"
    other.write_bytes(tiny_gguf.read_bytes())
    second = store.import_file(other, "b")
    assert first.path == second.path
    assert len(list((store.root / "blobs").iterdir())) == 1
    again = store.import_file(tiny_gguf, "a")
    assert again.created_at == first.created_at
    assert [r.name for r in store.list()] == ["a", "b"]


def test_reimport_replaces_and_collects_old_blob(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    old = store.import_file(tiny_gguf, "m")
    newer = write_gguf(tmp_path / "newer.gguf", seed=1)
    new = store.import_file(newer, "m")
    assert new.digest != old.digest
    assert store.get("m") == new
    assert not Path(old.path).exists()


def test_copy_when_hardlink_crosses_filesystems(
    store: Store, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    record = store.import_file(tiny_gguf, "tiny")
    blob = Path(record.path)
    assert not blob.is_symlink()
    assert not os.path.samefile(blob, tiny_gguf)
    assert blob.read_bytes() == tiny_gguf.read_bytes()
    assert not [p for p in blob.parent.iterdir() if p.name.startswith(".tmp-")]


def test_symlink_on_request(store: Store, tiny_gguf: Path) -> None:
    record = store.import_file(tiny_gguf, "tiny", link=True)
    blob = Path(record.path)
    assert blob.is_symlink()
    assert blob.resolve() == tiny_gguf.resolve()


def test_rm_keeps_shared_blob(store: Store, tiny_gguf: Path) -> None:
    a = store.import_file(tiny_gguf, "a")
    store.import_file(tiny_gguf, "team/b:v1")
    removed = store.remove("a")
    assert removed == a
    assert Path(a.path).exists()
    assert store.find("a") is None
    store.remove("team/b:v1")
    assert not Path(a.path).exists()
    assert store.list() == []
    assert not (store.root / "manifests" / "team").exists()
    with pytest.raises(ModelNotFound, match="blazar pull a"):
        store.remove("a")


def test_names_normalise(store: Store, tiny_gguf: Path) -> None:
    record = store.import_file(tiny_gguf, "Tiny:latest")
    assert record.name == "tiny"
    assert store.get("tiny:latest") == store.get("TINY") == record
    assert canonical_name("org/model-1.5b:q4_k_m") == "org/model-1.5b:q4_k_m"
    assert canonical_name("org/model:latest") == "org/model"


@pytest.mark.parametrize(
    "bad",
    ["", "  ", "a#b", "../x", "a/../b", "/abs", "a//b", "a/", ".hidden", "a b", "x:", "x:a/b", "a:b:c"],
)
def test_invalid_names(store: Store, tiny_gguf: Path, bad: str) -> None:
    with pytest.raises(InvalidModelName):
        canonical_name(bad)
    with pytest.raises(InvalidModelName):
        store.import_file(tiny_gguf, bad)
    assert store.list() == []


def test_get_missing(store: Store) -> None:
    assert store.find("nope") is None
    with pytest.raises(ModelNotFound) as exc:
        store.get("nope")
    assert exc.value.code == "MODEL_NOT_FOUND"
    assert "blazar pull nope" in exc.value.message


def test_non_gguf_refused(store: Store, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model at all")
    with pytest.raises(InvalidModelFile) as exc:
        store.import_file(bogus, "bogus")
    assert exc.value.code == "BAD_REQUEST"
    with pytest.raises(InvalidModelFile):
        store.import_file(tmp_path / "missing.gguf", "bogus")
    assert store.list() == []
    assert not (store.root / "blobs").exists() or not list((store.root / "blobs").iterdir())


def test_expected_sha256(store: Store, tiny_gguf: Path) -> None:
    with pytest.raises(ChecksumMismatch) as exc:
        store.import_file(tiny_gguf, "tiny", expected_sha256="0" * 64)
    assert exc.value.code == "BAD_GATEWAY"
    assert store.find("tiny") is None
    record = store.import_file(tiny_gguf, "tiny", expected_sha256=f"sha256:{_sha(tiny_gguf)}")
    assert record.digest.endswith(_sha(tiny_gguf))


def test_manifest_written_atomically(store: Store, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = store.import_file(tiny_gguf, "tiny", source="first")
    manifest = store.root / "manifests" / "tiny.json"
    assert msgspec.json.decode(manifest.read_bytes(), type=ModelRecord) == good

    def crash(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "disk on fire")

    monkeypatch.setattr(store_mod.os, "replace", crash)
    with pytest.raises(RegistryError):
        store.import_file(tiny_gguf, "tiny", source="second")
    monkeypatch.undo()
    # The old manifest survives whole and no temp file is left beside it.
    assert store.get("tiny") == good
    assert [p.name for p in manifest.parent.iterdir()] == ["tiny.json"]


def test_damaged_manifest_does_not_hide_others(store: Store, tiny_gguf: Path) -> None:
    store.import_file(tiny_gguf, "good")
    (store.root / "manifests" / "bad.json").write_bytes(b"{not json")
    assert [r.name for r in store.list()] == ["good"]


def test_info_cached(store: Store, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = store.import_file(tiny_gguf, "tiny")
    first = store.info("tiny")
    assert first.architecture == "llama"
    assert (store.root / "info" / f"sha256-{_sha(tiny_gguf)}.json").is_file()

    def boom(path: object) -> None:
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(gguf_mod, "read_model_info", boom)
    assert store.info(record) == first


def test_info_recomputed_when_cache_missing(store: Store, tiny_gguf: Path) -> None:
    store.import_file(tiny_gguf, "tiny")
    cache = store.root / "info" / f"sha256-{_sha(tiny_gguf)}.json"
    cache.write_bytes(b"garbage")
    assert store.info("tiny").head_count == 4
    assert msgspec.json.decode(cache.read_bytes())["head_count"] == 4


def test_add_blob_and_partial(store: Store, tmp_path: Path, tiny_gguf: Path) -> None:
    sha = _sha(tiny_gguf)
    partial = store.partial_path(sha)
    assert partial.parent == store.root / "partial"
    partial.write_bytes(tiny_gguf.read_bytes())
    blob = store.add_blob(partial, sha)
    assert blob == store.blob_path(sha)
    assert not partial.exists()
    assert _sha(blob) == sha
    # A second copy of the same bytes is discarded in favour of the stored blob.
    partial.write_bytes(tiny_gguf.read_bytes())
    assert store.add_blob(partial, sha) == blob
    assert not partial.exists()
    assert store.list() == []
    with pytest.raises(RegistryError):
        store.partial_path("not-hex")


def test_sha256_file_progress(tiny_gguf: Path) -> None:
    seen: list[int] = []
    assert sha256_file(tiny_gguf, seen.append) == _sha(tiny_gguf)
    assert seen[-1] == tiny_gguf.stat().st_size


def test_projectors_and_split_parts_are_not_models(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from registry.errors import InvalidModelFile

    store = Store(tmp_path / "models")
    projector = tmp_path / "mmproj-f16.gguf"
    writer = gguf.GGUFWriter(projector, arch="clip")
    writer.add_tensor("v.patch_embd.weight", np.ones(4, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InvalidModelFile, match="vision projector"):
        store.import_file(projector, "proj")

    part = tmp_path / "m-00001-of-00002.gguf"
    writer = gguf.GGUFWriter(part, arch="llama")
    writer.add_uint16("split.count", 2)
    writer.add_tensor("token_embd.weight", np.ones(4, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InvalidModelFile, match="one part of a split model"):
        store.import_file(part, "part")
    assert store.list() == []


def test_import_refuses_a_truncated_file(store: Store, truncated_model: Path, model_path: Path) -> None:
    with pytest.raises(ModelFileIncomplete) as info:
        store.import_file(truncated_model, "short")
    err = info.value
    assert err.code == "MODEL_FILE_INCOMPLETE"
    assert (err.expected, err.found) == (model_path.stat().st_size, TRUNCATED_BYTES)
    assert err.message == (
        f"{truncated_model} is incomplete (expected {model_path.stat().st_size} bytes, "
        f"found {TRUNCATED_BYTES}) — re-download it"
    )
    assert store.list() == [] and not store.blobs_dir.exists()


def test_the_whole_real_model_is_complete(store: Store, model_path: Path) -> None:
    from registry.gguf import data_end, read_header

    # The header's tensor table ends exactly where the file does: the check is not a loose bound.
    assert data_end(read_header(model_path)) == model_path.stat().st_size
    assert store.import_file(model_path, "whole").size == model_path.stat().st_size
