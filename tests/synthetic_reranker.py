"""A tiny reranker GGUF for tests: no reranker can be downloaded here, so one is written.

It is a real BERT cross-encoder as llama.cpp loads it (the layout its converter writes for
bge-reranker and jina-reranker: WordPiece vocabulary, two encoder blocks, a classifier
head and ``pooling_type`` rank), with random weights from a fixed seed: its scores mean
nothing, but they are the same on every run, so the order they give is a fact a test can
check. 32-wide and 2 layers deep, it is about 150 kB and loads in well under a second.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

__all__ = ["WORDS", "build_reranker", "cached_reranker"]

_VERSION = 1
"""Bump when the file below changes: the cached copy is then built again."""

WORDS = ("the", "cat", "dog", "sat", "mat", "bird", "fish", "sky", "sea", "blue")
"""Whole words of the vocabulary; any other lower-case text is spelt out letter by letter."""

_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_WORD_START = "\u2581"  # llama.cpp's WordPiece marks a piece that starts a word with it


def build_reranker(path: Path, *, seed: int = 1234) -> Path:
    """Write the reranker to ``path`` (the same bytes for the same seed)."""
    rng = np.random.default_rng(seed)
    n_embd, n_ff, n_layer, n_head, n_ctx = 32, 64, 2, 2, 512
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    tokens = [*_SPECIAL, *(_WORD_START + w for w in WORDS), *(_WORD_START + c for c in chars), *chars]
    tokens += [_WORD_START + p for p in ".,?!"]
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("blazar-test-reranker")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_token_type_count(2)
    w.add_classifier_output_labels(["relevance"])
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(_SPECIAL) + [gguf.TokenType.NORMAL] * (len(tokens) - 5))
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    w.add_bos_token_id(2)  # [CLS]
    w.add_sep_token_id(3)
    w.add_eos_token_id(3)
    w.add_add_bos_token(True)

    def weights(name: str, *shape: int, scale: float = 0.2) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name: str) -> None:
        w.add_tensor(f"{name}.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"{name}.bias", np.zeros(n_embd, dtype=np.float32))

    # numpy shapes are ggml's reversed: (rows = outputs, columns = inputs)
    weights("token_embd.weight", len(tokens), n_embd)
    weights("token_types.weight", 2, n_embd)
    weights("position_embd.weight", n_ctx, n_embd)
    norm("token_embd_norm")
    for b in range(n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            weights(f"blk.{b}.{part}.weight", n_embd, n_embd)
            weights(f"blk.{b}.{part}.bias", n_embd, scale=0.05)
        norm(f"blk.{b}.attn_output_norm")
        weights(f"blk.{b}.ffn_up.weight", n_ff, n_embd)
        weights(f"blk.{b}.ffn_up.bias", n_ff, scale=0.05)
        weights(f"blk.{b}.ffn_down.weight", n_embd, n_ff)
        weights(f"blk.{b}.ffn_down.bias", n_embd, scale=0.05)
        norm(f"blk.{b}.layer_output_norm")
    weights("cls.weight", n_embd, n_embd)
    weights("cls.bias", n_embd, scale=0.05)
    weights("cls.output.weight", 1, n_embd, scale=1.0)
    weights("cls.output.bias", 1, scale=0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cached_reranker(cache: Path | None = None) -> Path:
    """The reranker, built once under the test cache (``BLAZAR_TEST_CACHE``) and reused."""
    default = Path(__file__).resolve().parent.parent / ".cache" / "test-models"
    root = cache or Path(os.environ.get("BLAZAR_TEST_CACHE", default))
    path = root / "synthetic" / f"blazar-test-reranker-v{_VERSION}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        build_reranker(tmp)
        os.replace(tmp, path)
    return path
