"""`blazar search`: quant tags from file names, catalog matching, offline answers."""

from __future__ import annotations

import pytest

from registry.catalog import Catalog
from registry.search import _gguf_files, quant_of, search, search_catalog


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen3-0.6B-Q8_0.gguf", "Q8_0"),
        ("qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
        ("Llama-3.2-1B-Instruct-IQ3_XS.gguf", "IQ3_XS"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("model-f16.gguf", "F16"),
        ("gemma-3-1b-it-BF16.gguf", "BF16"),
        ("ggml-model.gguf", None),
    ],
)
def test_quant_of(name: str, quant: str | None) -> None:
    assert quant_of(name) == quant


def test_split_parts_are_one_model_and_projectors_are_left_out() -> None:
    siblings = [
        {"rfilename": "m-q4_k_m-00001-of-00002.gguf", "size": 100},
        {"rfilename": "m-q4_k_m-00002-of-00002.gguf", "size": 50},
        {"rfilename": "m-q8_0.gguf", "size": 300},
        {"rfilename": "mmproj-m-f16.gguf", "size": 10},
        {"rfilename": "README.md", "size": 1},
    ]
    files = _gguf_files(siblings)
    assert [(f.file, f.quant, f.size) for f in files] == [
        ("m-q4_k_m-00001-of-00002.gguf", "Q4_K_M", 150),
        ("m-q8_0.gguf", "Q8_0", 300),
    ]


def test_catalog_matches_every_word() -> None:
    catalog = Catalog.load()
    assert [h.name for h in search_catalog(catalog, "smollm2")] == [
        "smollm2-1.7b",
        "smollm2-135m",
        "smollm2-360m",
    ]
    assert [h.name for h in search_catalog(catalog, "SMOL tiny")] == ["smollm2-135m"]
    # name matches first, then matches in the description or capabilities
    assert [h.name for h in search_catalog(catalog, "embed")][-1] == "bge-small-en"
    assert search_catalog(catalog, "smol nonexistentword") == []


async def test_offline_answers_from_the_catalog_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = await search("smollm2 135m", Catalog.load())
    assert [h.name for h in result.catalog] == ["smollm2-135m"] and result.hub == []
    assert result.note and "HF_HUB_OFFLINE" in result.note


async def test_an_unreachable_hub_is_a_note_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    result = await search("smol", Catalog.load())
    assert result.hub == [] and result.note and "could not be searched" in result.note


async def test_hub_repos_with_their_quants_and_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    from hub import open_hub

    with open_hub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        hub.add_hf_file("org/Tiny-GGUF", "tiny-Q4_K_M.gguf", b"G" * 100)
        hub.add_hf_file("org/Tiny-GGUF", "tiny-Q8_0-00001-of-00002.gguf", b"a" * 60)
        hub.add_hf_file("org/Tiny-GGUF", "tiny-Q8_0-00002-of-00002.gguf", b"b" * 40)
        hub.add_hf_file("org/Tiny-GGUF", "mmproj-tiny-f16.gguf", b"p" * 10)
        hub.add_hf_file("org/Tiny-GGUF", "README.md", b"hello", lfs=False)
        hub.add_hf_file("org/Other", "other-Q4_0.gguf", b"o" * 5)
        hub.add_hf_file("org/Tiny-Private", "p-Q4_0.gguf", b"x" * 5, token="secret")
        result = await search("tiny", Catalog.load(), limit=5)
    assert result.note is None
    (repo,) = result.hub
    assert (repo.repo, repo.downloads, repo.likes) == ("org/Tiny-GGUF", 5000, 7)
    assert [(f.quant, f.size) for f in repo.files] == [("Q4_K_M", 100), ("Q8_0", 100)]
    assert "smollm2-135m" in [h.name for h in result.catalog]  # "a tiny chat model"
