from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import CHAT_TEMPLATE, TOKENS

from registry.errors import InvalidModelFile
from registry.gguf import NeedMoreData, looks_like_gguf, parse, parse_header, read_model_info


def test_synthetic_header(tiny_gguf: Path) -> None:
    info = read_model_info(tiny_gguf)
    assert info.architecture == "llama"
    assert info.name == "Tiny Test"
    assert info.size_label == "1K"
    assert info.file_type == "Q4_1"
    assert info.context_length == 2048
    assert info.block_count == 2
    assert info.head_count == 4
    assert info.head_count_kv == 2
    assert info.embedding_length == 16
    assert info.feed_forward_length == 32
    assert info.rope_freq_base == 10000.0
    assert info.vocab_size == len(TOKENS)
    assert info.chat_template == CHAT_TEMPLATE
    assert info.key_length is None
    assert info.tensor_count == 3
    assert [t.name for t in info.tensors] == [
        "token_embd.weight",
        "blk.0.attn_norm.weight",
        "output_norm.weight",
    ]
    assert info.tensors[0].shape == [16, len(TOKENS)]
    assert [t.type for t in info.tensors] == ["F32", "F32", "F16"]
    assert info.parameter_count == 16 * len(TOKENS) + 16 + 16


def test_data_offset_matches_gguf_reader(tiny_gguf: Path) -> None:
    info = read_model_info(tiny_gguf)
    reader = gguf.GGUFReader(tiny_gguf)
    assert info.data_offset == reader.data_offset
    assert [info.data_offset + t.offset for t in info.tensors] == [t.data_offset for t in reader.tensors]
    assert info.data_offset % 32 == 0


def test_prefix_asks_for_more_then_succeeds(tiny_gguf: Path) -> None:
    data = tiny_gguf.read_bytes()
    full = parse(data)
    with pytest.raises(NeedMoreData) as first:
        parse(data[:100])
    assert 100 < first.value.needed <= len(data)
    buf = data[: first.value.needed]
    # Keep feeding exactly what is asked for; it must converge without reading tensor data.
    for _ in range(1000):
        try:
            info = parse(memoryview(buf))
            break
        except NeedMoreData as more:
            assert more.needed > len(buf)
            buf = data[: more.needed]
    else:
        pytest.fail("parse never converged")
    assert info == full
    assert len(buf) <= full.data_offset


def test_a_string_array_is_skipped_and_a_prefix_of_it_asks_for_more(tmp_path: Path) -> None:
    path = tmp_path / "merges.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges([f"tok{i} en{i}" for i in range(500)])
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    full = parse_header(data)
    assert full.array_lengths["tokenizer.ggml.merges"] == 500
    assert "tokenizer.ggml.merges" not in full.values
    asked = []
    for cut in range(0, full.data_offset - 32, 97):  # inside lengths and strings; not the padding
        try:
            parse_header(data[:cut])
        except NeedMoreData as more:
            assert cut < more.needed <= full.data_offset
            asked.append(more.needed)
        else:
            pytest.fail(f"a prefix of {cut} bytes parsed")
    assert len(asked) > 100


def test_tiny_prefixes_need_more() -> None:
    with pytest.raises(NeedMoreData):
        parse(b"")
    with pytest.raises(NeedMoreData):
        parse(b"GGUF\x03\x00")


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    assert not looks_like_gguf(path)
    assert not looks_like_gguf(tmp_path / "missing.gguf")
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        read_model_info(path)
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        parse(b"GGML" + b"\x00" * 32)


def test_unsupported_version() -> None:
    with pytest.raises(InvalidModelFile, match="version 1"):
        parse(b"GGUF\x01\x00\x00\x00" + b"\x00" * 32)


def test_truncated_file(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:500])
    assert looks_like_gguf(cut)
    with pytest.raises(InvalidModelFile, match="truncated"):
        read_model_info(cut)


def test_real_model(real_model: Path) -> None:
    started = time.perf_counter()
    info = read_model_info(real_model)
    elapsed_s = time.perf_counter() - started
    assert info.architecture == "llama"
    assert info.block_count == 30
    assert info.head_count == 9
    assert info.head_count_kv == 3
    assert info.embedding_length == 576
    assert info.context_length == 8192
    assert info.vocab_size == 49152
    assert info.token_bytes_max == 81  # a newline and 80 spaces
    assert info.file_type == "Q4_1"
    assert info.chat_template and "<|im_start|>" in info.chat_template
    assert info.parameter_count == 134515008
    assert info.tensor_count == len(info.tensors) == 272
    last = max(info.tensors, key=lambda t: t.offset)
    assert last.n_bytes is not None
    assert info.data_offset + last.offset + last.n_bytes == real_model.stat().st_size
    # GGUFReader takes over a second here; the header reader must stay well under that.
    assert elapsed_s < 1.0


def _vocabulary_gguf(path: Path, tokenizer: str, tokens: list[str]) -> Path:
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_longest_token_in_decoded_bytes(tmp_path: Path, tiny_gguf: Path) -> None:
    assert read_model_info(tiny_gguf).token_bytes_max == max(len(t) for t in TOKENS)
    # Byte-level BPE spells each byte as one character (Ġ is a space): 3 bytes, not 6.
    bpe = _vocabulary_gguf(tmp_path / "bpe.gguf", "gpt2", ["a", "ĠĠĠ", "ab"])
    assert read_model_info(bpe).token_bytes_max == 3
    # SentencePiece stores ▁ (3 bytes) for a space (1): its stored length is an upper bound.
    spm = _vocabulary_gguf(tmp_path / "spm.gguf", "llama", ["<0x0A>", "▁hello", "é"])
    assert read_model_info(spm).token_bytes_max == len("▁hello".encode())


def test_the_constants_alone_match_the_package() -> None:
    """registry._gguf_constants loads gguf's constants module without the package (and numpy);
    its tables must be the package's, value for value."""
    from registry._gguf_constants import constants

    assert constants.__file__ == gguf.constants.__file__
    assert constants.GGML_QUANT_SIZES == gguf.constants.GGML_QUANT_SIZES
    assert constants.GGUFValueType.STRING == gguf.GGUFValueType.STRING
    assert constants.Keys.General.ARCHITECTURE == gguf.Keys.General.ARCHITECTURE
    assert constants.LlamaFileType(2).name == gguf.LlamaFileType(2).name
