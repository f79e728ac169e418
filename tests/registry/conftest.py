from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import trio

from registry.catalog import Catalog
from registry.pull import PullProgress, RetryPolicy, pull
from registry.store import ModelRecord, Store
from tests.registry.hub import Hub, open_hub

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
TOKENS = [f"tok{i}" for i in range(300)]


def write_gguf(path: Path, *, name: str = "Tiny Test", seed: int = 0) -> Path:
    """A small but complete llama-style GGUF; `seed` varies the tensor bytes (and so the digest)."""
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name(name)
    writer.add_size_label("1K")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_context_length(2048)
    writer.add_block_count(2)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * len(TOKENS))
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", rng.random((len(TOKENS), 16), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", rng.random(16, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(16, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def no_foreign_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pulls look for the bytes in other tools' stores first: point every one of them
    at an empty folder of the test, never at the machine's own (a test builds one there)."""
    others = tmp_path / "other-stores"
    monkeypatch.setenv("HOME", str(others / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(others / "cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(others / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(others / "hf"))
    monkeypatch.setenv("LLAMA_CACHE", str(others / "llama.cpp"))
    return others


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    return write_gguf(folder / "tiny.gguf")


@pytest.fixture
def real_model(model_path: Path) -> Path:
    """SmolLM2-135M: BLAZAR_TEST_MODEL when set, else the cached test model (fetched if absent)."""
    value = os.environ.get("BLAZAR_TEST_MODEL")
    path = Path(value) if value else model_path
    assert path.is_file(), f"BLAZAR_TEST_MODEL={value} does not exist"
    return path


TRUNCATED_BYTES = 20_000_000
"""What is left of the test model when a download or copy stops after 20 MB (of 98 MB)."""


@pytest.fixture
def truncated_model(tmp_path: Path, model_path: Path) -> Path:
    """The first 20 MB of the real test model: its header is whole, most tensor data is not."""
    folder = tmp_path / "truncated"
    folder.mkdir()
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with open(model_path, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(TRUNCATED_BYTES))
    return path


# -- pulls against the test hub (tests/registry/hub.py) --------------------------------

FAST = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.05)
HANG_S = 60  # catches hangs only


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Hub]:
    import huggingface_hub.constants as hf_constants

    with open_hub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("BLAZAR_OLLAMA_REGISTRY", h.url)
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        # huggingface_hub reads these once at import; another test may have imported it offline.
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-hf-token"))
        yield h


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home" / "models")


class Pulls:
    """Calls `pull` with an empty catalog and a fast retry policy, recording progress events."""

    def __init__(self, store: Store, cache: Path) -> None:
        self.store = store
        self.cache = cache
        self.events: list[PullProgress] = []

    async def __call__(self, name: str, **kwargs: Any) -> ModelRecord:
        kwargs.setdefault("on_progress", self._record)
        kwargs.setdefault("retry", FAST)
        kwargs.setdefault("catalog", Catalog([], default_model="none"))
        with trio.fail_after(HANG_S):
            return await pull(self.store, name, cache_dir=self.cache, **kwargs)

    def _record(self, event: PullProgress) -> None:
        trio.lowlevel.current_trio_token()  # raises off the Trio thread: progress must arrive on it
        self.events.append(event)

    def statuses(self) -> list[str]:
        return [e.status for e in self.events]


@pytest.fixture
def do_pull(store: Store, tmp_path: Path) -> Pulls:
    return Pulls(store, tmp_path / "cache")
