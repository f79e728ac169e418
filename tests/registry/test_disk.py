"""Disk care: usage with shared blobs counted once, orphans, prune, unused models, cp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import write_gguf

from registry.disk import (
    copy_model,
    find_orphans,
    prune_cache,
    prune_orphans,
    storage_report,
    unused_models,
)
from registry.errors import ModelExists, ModelNotFound
from registry.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "models")
    store.import_file(write_gguf(tmp_path / "a.gguf", seed=1), "alpha")
    store.import_file(write_gguf(tmp_path / "b.gguf", seed=2), "beta")
    return store


def test_report_counts_a_shared_blob_once(store: Store) -> None:
    before = storage_report(store)
    copy_model(store, "alpha", "alpha-again")
    after = storage_report(store)
    assert after.used_bytes == before.used_bytes
    assert len(after.blobs) == 2
    shared = next(b for b in after.blobs if len(b.names) == 2)
    assert shared.names == ["alpha", "alpha-again"]
    assert after.free_bytes > 0 and after.total_bytes >= after.free_bytes
    assert after.orphan_bytes == after.partial_bytes == 0


def test_cp_is_a_new_name_for_the_same_file(store: Store) -> None:
    copied = copy_model(store, "alpha", "team/alpha:v2")
    original = store.get("alpha")
    assert copied.name == "team/alpha:v2" and copied.digest == original.digest
    assert os.stat(copied.path).st_ino == os.stat(original.path).st_ino
    with pytest.raises(ModelExists, match="already exists"):
        copy_model(store, "beta", "alpha")
    with pytest.raises(ModelNotFound):
        copy_model(store, "ghost", "x")


def test_cp_replace_collects_the_replaced_blob(store: Store) -> None:
    beta_blob = Path(store.get("beta").path)
    copy_model(store, "alpha", "beta", replace=True)
    assert store.get("beta").digest == store.get("alpha").digest
    assert not beta_blob.exists()  # no name uses it any more


def test_orphans_and_partials_are_found_and_pruned(store: Store) -> None:
    # A blob and header left behind by a crash between the blob and its manifest.
    stray = store.blobs_dir / ("sha256-" + "ab" * 32)
    stray.write_bytes(b"x" * 100)
    stray_info = store.info_dir / ("sha256-" + "ab" * 32 + ".json")
    stray_info.write_text("{}")
    partial = store.partial_path("cd" * 32)
    partial.write_bytes(b"y" * 50)

    found = {(Path(o.path).name, o.kind, o.size) for o in find_orphans(store)}
    assert found == {(stray.name, "blob", 100), (stray_info.name, "info", 2), (partial.name, "partial", 50)}
    report = storage_report(store)
    assert (report.orphan_bytes, report.partial_bytes) == (102, 50)

    assert {o.kind for o in prune_orphans(store, dry_run=True)} == {"blob", "info"}
    assert stray.exists()
    pruned = prune_orphans(store)
    assert {o.kind for o in pruned} == {"blob", "info"}
    assert not stray.exists() and not stray_info.exists() and partial.exists()  # resumable by default
    assert [o.kind for o in prune_orphans(store, partials=True)] == ["partial"]
    assert not partial.exists()
    assert store.get("alpha") and store.get("beta")  # installed models untouched
    assert Path(store.get("alpha").path).exists()


def test_unused_uses_the_last_request_else_the_install_time(store: Store) -> None:
    now = store.get("alpha").modified_at + 10 * 86400
    # beta was used a day ago; alpha never since it was installed ten days ago
    last_used = {"beta": now - 86400}
    assert [r.name for r in unused_models(store, 7, last_used, now=now)] == ["alpha"]
    assert [r.name for r in unused_models(store, 0.5, last_used, now=now)] == ["alpha", "beta"]
    assert unused_models(store, 30, last_used, now=now) == []


def test_split_parts_and_projector_belong_to_their_model(store: Store, tmp_path: Path) -> None:
    """Blobs a record names besides its main file are in use: never orphans; removed with it."""
    import msgspec

    extra = store.import_file(write_gguf(tmp_path / "part2.gguf", seed=3), "tmp-part")
    part_digest = extra.digest
    alpha = store.get("alpha")
    shards = store.shards_dir / ("sha256-" + alpha.digest.removeprefix("sha256:"))
    shards.mkdir(parents=True)
    (shards / "m-00002-of-00002.gguf").symlink_to(extra.path)
    # the pull's record of a split model: the main file plus the other part
    store.write_manifest(msgspec.structs.replace(alpha, name="split", blobs=[part_digest]))
    store.remove("tmp-part")
    assert Path(extra.path).exists()  # still used by "split"
    assert find_orphans(store) == []
    report = storage_report(store)
    assert {b.digest: b.names for b in report.blobs}[part_digest] == ["split"]

    store.remove("split")
    store.remove("alpha")
    assert not Path(extra.path).exists() and not shards.exists()


def test_partials_and_orphans_are_pruned_separately(store: Store) -> None:
    stray = store.blobs_dir / ("sha256-" + "ab" * 32)
    stray.write_bytes(b"x")
    partial = store.partial_path("cd" * 32)
    partial.write_bytes(b"y")
    assert [o.kind for o in prune_orphans(store, orphans=False, partials=True)] == ["partial"]
    assert stray.exists() and not partial.exists()


def test_unused_matches_the_names_clients_wrote(store: Store) -> None:
    now = store.get("alpha").modified_at + 10 * 86400
    last_used = {"ALPHA": now - 3600, "beta:latest": now - 3600, "bad#name": now}
    assert unused_models(store, 7, last_used, now=now) == []


def test_replacing_a_name_frees_the_old_file(store: Store) -> None:
    import msgspec

    beta = store.get("beta")
    alpha = store.get("alpha")
    store.write_manifest(msgspec.structs.replace(alpha, name="beta"))  # as /api/create over a name
    assert not Path(beta.path).exists() and Path(alpha.path).exists()


def test_the_download_cache_is_counted_and_pruned(store: Store, tmp_path: Path) -> None:
    """A wheel an interrupted pull left in the cache shows in the report, and prune takes it,
    though not a file written in the last minutes (a pull may be writing it)."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    old = cache / "wheels" / "llm_x-1.0-py3-none-any.whl"
    old.write_bytes(b"w" * 5000)
    os.utime(old, (0, 1_000_000))
    fresh = cache / "wheels" / "llm_y-1.0-py3-none-any.whl"
    fresh.write_bytes(b"y" * 300)
    report = storage_report(store, cache)
    assert report.cache_bytes == 5300
    assert storage_report(store).cache_bytes == 0  # no cache named: none counted
    assert [f.path for f in prune_cache(cache, dry_run=True)] == [str(old)] and old.exists()
    assert [f.kind for f in prune_cache(cache)] == ["cache"]
    assert not old.exists() and fresh.exists()
    assert storage_report(store, cache).cache_bytes == 300
