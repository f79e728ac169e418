"""registry.fit on synthetic GGUF headers, checked against figures worked out by hand.

Each model below is a header with the published geometry of a real model (from its
model card / config.json) and, where weights matter, a few tiny tensors. The
expected byte counts are written out as arithmetic so they can be checked by eye.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from registry.errors import InvalidModelFile
from registry.fit import (
    GPU_OVERHEAD,
    HOST_OVERHEAD,
    MIB,
    Memory,
    Settings,
    bytes_per_token,
    cache_type_problem,
    compute_buffer,
    default_ctx,
    estimate,
    fit,
    kv_cache,
)
from registry.gguf import NeedMoreData, parse, parse_header
from registry.shape import PrefixReader, parse_shape, read_shape

GIB = 1 << 30


def write_gguf(
    path: Path,
    arch: str,
    keys: dict[str, Any],
    tensors: list[tuple[str, np.ndarray, gguf.GGMLQuantizationType | None]] | None = None,
) -> Path:
    """A GGUF with `keys` (``{arch}`` is expanded) and tiny or given tensors."""
    w = gguf.GGUFWriter(path, arch=arch)
    for key, value in keys.items():
        key = key.format(arch=arch)
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, data, qtype in tensors or [("token_embd.weight", np.zeros((4, 8), np.float32), None)]:
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def attn(layers: int, embd: int, heads: int, kv_heads: int, ctx: int = 8192, **extra: Any) -> dict[str, Any]:
    return {
        "{arch}.block_count": layers,
        "{arch}.context_length": ctx,
        "{arch}.embedding_length": embd,
        "{arch}.feed_forward_length": 4 * embd,
        "{arch}.attention.head_count": heads,
        "{arch}.attention.head_count_kv": kv_heads,
        **extra,
    }


def settings(ctx: int, slots: int = 1, cache: str = "f16", **kw: Any) -> Settings:
    return Settings(ctx_per_slot=ctx, slots=slots, cache_type_k=cache, cache_type_v=cache, **kw)


# -- grouped-query attention: Llama 3 8B ------------------------------------------------


@pytest.fixture
def llama3_8b(tmp_path: Path) -> Path:
    # config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads (head dim 4096/32 = 128).
    return write_gguf(tmp_path / "llama3.gguf", "llama", attn(32, 4096, 32, 8))


def test_gqa_llama3_8b(llama3_8b: Path) -> None:
    shape = read_shape(llama3_8b)
    assert shape.head_dim_k == [128] * 32 and shape.n_head_kv == [8] * 32
    # K + V, 8 KV heads x 128 dims, f16, 32 layers = 128 KiB per token.
    assert bytes_per_token(shape) == 2 * 8 * 128 * 2 * 32 == 131_072
    kv = kv_cache(shape, settings(8192))
    assert kv.k == kv.v == 512 * MIB and kv.kv == 1 * GIB
    # Every context is per slot: 4 slots of 2048 hold as much as one of 8192.
    assert kv_cache(shape, settings(2048, slots=4)).kv == 1 * GIB
    # q8_0 packs 32 values in 34 bytes, q4_0 in 18 (vs 64 bytes in f16).
    assert kv_cache(shape, settings(8192, cache="q8_0")).kv == GIB * 34 // 64
    assert kv_cache(shape, settings(8192, cache="q4_0")).kv == GIB * 18 // 64


def test_cells_are_padded_per_slot(llama3_8b: Path) -> None:
    shape = read_shape(llama3_8b)
    kv = kv_cache(shape, settings(1100, slots=3))
    # llama.cpp rounds each slot's cells up to a multiple of 256: 1100 -> 1280.
    assert kv.cells_per_stream == 1280 and kv.streams == 3
    assert kv.kv == 131_072 * 1280 * 3
    unified = kv_cache(shape, settings(1100, slots=3, unified_kv=True))
    assert unified.streams == 1 and unified.cells_per_stream == 3328  # pad256(3300)


# -- sliding window: Gemma 2 9B and Gemma 3 4B -------------------------------------------


def test_swa_gemma2_9b(tmp_path: Path) -> None:
    # config.json: 42 layers, 16 heads, 8 KV heads, head_dim 256, sliding_window 4096,
    # alternating local/global layers (llama.cpp: even layers slide).
    keys = attn(42, 3584, 16, 8, **{
        "{arch}.attention.key_length": 256,
        "{arch}.attention.value_length": 256,
        "{arch}.attention.sliding_window": 4096,
    })  # fmt: skip
    shape = read_shape(write_gguf(tmp_path / "g2.gguf", "gemma2", keys))
    assert shape.swa == [i % 2 == 0 for i in range(42)]
    per_cell = 2 * 8 * 256 * 2  # K + V bytes per layer and cell = 8 KiB
    kv = kv_cache(shape, settings(8192))
    # Global layers keep 8192 cells; sliding ones pad256(min(8192, 4096 + 512)) = 4608.
    assert kv.swa_cells_per_stream == 4608
    assert kv.kv == 21 * 8192 * per_cell + 21 * 4608 * per_cell == 2_202_009_600
    # A short context is never padded past itself: both kinds hold 2048 cells.
    assert kv_cache(shape, settings(2048)).kv == 42 * 2048 * per_cell


def test_swa_gemma3_4b(tmp_path: Path) -> None:
    # config.json: 34 layers, 8 heads, 4 KV heads, head_dim 256, sliding_window 1024,
    # five local layers to one global (layers 5, 11, 17, 23, 29 are global).
    keys = attn(34, 2560, 8, 4, ctx=131072, **{
        "{arch}.attention.key_length": 256,
        "{arch}.attention.value_length": 256,
        "{arch}.attention.sliding_window": 1024,
    })  # fmt: skip
    shape = read_shape(write_gguf(tmp_path / "g3.gguf", "gemma3", keys))
    assert [i for i, s in enumerate(shape.swa) if not s] == [5, 11, 17, 23, 29]
    per_cell = 2 * 4 * 256 * 2  # 4 KiB
    kv = kv_cache(shape, settings(32768))
    assert kv.swa_cells_per_stream == 1536  # pad256(1024 + 512)
    assert kv.kv == 5 * 32768 * per_cell + 29 * 1536 * per_cell == 853_540_864
    # Without the window it would be 34 * 32768 * 4 KiB = 4.25 GiB.
    assert kv.kv < 34 * 32768 * per_cell / 5
    # Four slots: each slot has its own window.
    four = kv_cache(shape, settings(8192, slots=4))
    assert four.kv == 5 * 8192 * 4 * per_cell + 29 * 1536 * 4 * per_cell


def test_swa_pattern_keys(tmp_path: Path) -> None:
    base = attn(8, 512, 8, 8, **{"{arch}.attention.sliding_window": 256})
    # A numeric pattern key: layer i slides iff i % 4 < 3.
    shape = read_shape(
        write_gguf(tmp_path / "a.gguf", "llama", {**base, "{arch}.attention.sliding_window_pattern": 4})
    )
    assert shape.swa == [True, True, True, False] * 2
    # A per-layer flag array.
    flags = [True, False] * 4
    shape = read_shape(
        write_gguf(tmp_path / "b.gguf", "llama", {**base, "{arch}.attention.sliding_window_pattern": flags})
    )
    assert shape.swa == flags
    # A window without a pattern on an architecture llama.cpp does not pattern: all full, with a note.
    shape = read_shape(write_gguf(tmp_path / "c.gguf", "llama", base))
    assert not any(shape.swa) and "sliding window" in shape.notes[0]


# -- multi-head latent attention: DeepSeek-V2-Lite / V3 ----------------------------------


def mla_keys(layers: int, embd: int, heads: int) -> dict[str, Any]:
    # DeepSeek-V2 paper / config.json: kv_lora_rank 512, qk_rope_head_dim 64,
    # qk_nope_head_dim 128, v_head_dim 128; GGUF (2025 layout) stores the compressed
    # cache row as key_length = 512 + 64 and one KV head.
    return attn(layers, embd, heads, 1, **{
        "{arch}.attention.kv_lora_rank": 512,
        "{arch}.rope.dimension_count": 64,
        "{arch}.attention.key_length": 576,
        "{arch}.attention.value_length": 512,
        "{arch}.attention.key_length_mla": 192,
        "{arch}.attention.value_length_mla": 128,
    })  # fmt: skip


def test_mla_deepseek_v2_lite(tmp_path: Path) -> None:
    shape = read_shape(write_gguf(tmp_path / "dsl.gguf", "deepseek2", mla_keys(27, 2048, 16)))
    assert shape.mla and shape.head_dim_v == [0] * 27
    # The paper's (d_c + d_h^R) * l elements per token: (512 + 64) * 27, in f16.
    assert bytes_per_token(shape) == (512 + 64) * 27 * 2 == 31_104
    kv = kv_cache(shape, settings(4096))
    assert kv.k == 31_104 * 4096 and kv.v == 0
    # Plain multi-head attention would cache 16 heads x (192 + 128) dims per layer: 8.9x more.
    assert 16 * (192 + 128) * 27 * 2 / bytes_per_token(shape) == pytest.approx(8.89, abs=0.01)
    # 576 is a multiple of 32, so quantized caches are allowed.
    assert cache_type_problem(shape, "q8_0", "q8_0") is None


def test_mla_deepseek_v3(tmp_path: Path) -> None:
    shape = read_shape(write_gguf(tmp_path / "ds3.gguf", "deepseek2", mla_keys(61, 7168, 128)))
    assert bytes_per_token(shape) == 576 * 61 * 2 == 70_272
    assert kv_cache(shape, settings(16384)).kv == 70_272 * 16384


def test_mla_old_layout_is_plain_attention(tmp_path: Path) -> None:
    # GGUFs converted before 2025 have no *_mla keys: llama.cpp caches full K and V per head.
    keys = attn(27, 2048, 16, 16, **{
        "{arch}.attention.kv_lora_rank": 512,
        "{arch}.attention.key_length": 192,
        "{arch}.attention.value_length": 128,
    })  # fmt: skip
    shape = read_shape(write_gguf(tmp_path / "old.gguf", "deepseek2", keys))
    assert not shape.mla
    assert bytes_per_token(shape) == 16 * (192 + 128) * 2 * 27


# -- recurrent state: Mamba, RWKV-6, hybrids ----------------------------------------------


def test_recurrent_mamba_2_8b(tmp_path: Path) -> None:
    # state-spaces/mamba-2.8b: d_model 2560, 64 layers, expand 2 (d_inner 5120), d_state 16, d_conv 4.
    keys = {
        "{arch}.block_count": 64,
        "{arch}.context_length": 1 << 20,
        "{arch}.embedding_length": 2560,
        "{arch}.ssm.conv_kernel": 4,
        "{arch}.ssm.inner_size": 5120,
        "{arch}.ssm.state_size": 16,
        "{arch}.ssm.time_step_rank": 160,
    }
    shape = read_shape(write_gguf(tmp_path / "mamba.gguf", "mamba", keys))
    assert all(shape.recurrent) and not any(shape.has_kv)
    # Per layer and slot: conv state 3 x 5120 plus SSM state 16 x 5120, f32.
    per_slot = 64 * (3 * 5120 + 16 * 5120) * 4
    assert per_slot == 24_903_680
    short, long = kv_cache(shape, settings(2048)), kv_cache(shape, settings(65536))
    assert short.recurrent == long.recurrent == per_slot  # no growth with context
    assert short.kv == 0
    assert kv_cache(shape, settings(2048, slots=3)).recurrent == 3 * per_slot
    # A quantized KV cache changes nothing for a recurrent model, so it is no lever.
    report = fit(shape, settings(4096, slots=2), Memory(ram_available=64 * GIB))
    assert not [lever for lever in report.levers if lever.kind == "cache_type"]


def test_recurrent_rwkv6(tmp_path: Path) -> None:
    # RWKV-6 "Finch" 1.6B: n_embd 2048, 24 layers, head size 64, two token-shift rows.
    keys = {
        "{arch}.block_count": 24,
        "{arch}.embedding_length": 2048,
        "{arch}.wkv.head_size": 64,
        "{arch}.token_shift_count": 2,
    }
    shape = read_shape(write_gguf(tmp_path / "rwkv.gguf", "rwkv6", keys))
    per_slot = 24 * (2 * 2048 + 2048 * 64) * 4
    assert per_slot == 12_976_128
    assert kv_cache(shape, settings(32768)).recurrent == per_slot


def test_hybrid_by_kv_head_array(tmp_path: Path) -> None:
    # Jamba-style: one attention layer in four (KV heads 0 marks a Mamba layer).
    heads_kv = [0, 0, 0, 8] * 2
    keys = attn(8, 4096, 32, heads_kv, **{
        "{arch}.ssm.conv_kernel": 4,
        "{arch}.ssm.inner_size": 8192,
        "{arch}.ssm.state_size": 16,
    })  # fmt: skip
    shape = read_shape(write_gguf(tmp_path / "jamba.gguf", "jamba", keys))
    assert shape.recurrent == [True, True, True, False] * 2
    kv = kv_cache(shape, settings(4096))
    assert kv.kv == 2 * 4096 * 2 * 8 * 128 * 2
    assert kv.recurrent == 6 * (3 * 8192 + 16 * 8192) * 4


def test_hybrid_by_full_attention_interval(tmp_path: Path) -> None:
    # Qwen3-Next-style: every 4th layer is full attention, the rest linear (recurrent).
    keys = attn(8, 2048, 16, 2, **{
        "{arch}.attention.key_length": 256,
        "{arch}.attention.value_length": 256,
        "{arch}.full_attention_interval": 4,
        "{arch}.ssm.conv_kernel": 4,
        "{arch}.ssm.inner_size": 4096,
        "{arch}.ssm.state_size": 128,
        "{arch}.ssm.group_count": 16,
    })  # fmt: skip
    shape = read_shape(write_gguf(tmp_path / "q3n.gguf", "qwen3next", keys))
    assert [i for i, r in enumerate(shape.recurrent) if not r] == [3, 7]
    kv = kv_cache(shape, settings(4096))
    assert kv.kv == 2 * 4096 * 2 * 2 * 256 * 2
    assert kv.recurrent == 6 * (3 * (4096 + 2 * 16 * 128) + 128 * 4096) * 4


# -- weights, prefixes, splits -------------------------------------------------------------


def test_weights_per_type(tmp_path: Path) -> None:
    q4 = gguf.GGMLQuantizationType.Q4_0
    q8 = gguf.GGMLQuantizationType.Q8_0
    tensors = [
        # Quantized tensors are passed as raw bytes: rows x (columns / 32 * block bytes).
        ("token_embd.weight", np.zeros((100, 64 // 32 * 34), np.uint8), q8),
        ("blk.0.attn_q.weight", np.zeros((64, 64 // 32 * 18), np.uint8), q4),
        ("blk.1.attn_q.weight", np.zeros((64, 64 // 32 * 18), np.uint8), q4),
        ("blk.0.attn_norm.weight", np.zeros(64, np.float32), None),
        ("output_norm.weight", np.zeros(64, np.float16), None),
    ]
    shape = read_shape(write_gguf(tmp_path / "w.gguf", "llama", attn(2, 64, 4, 4), tensors))
    assert shape.weights_by_type == {"Q8_0": 100 * 68, "Q4_0": 2 * 64 * 36, "F32": 256, "F16": 128}
    assert shape.weights == 6800 + 4608 + 256 + 128
    assert shape.layer_weights == [64 * 36 + 256, 64 * 36]
    assert shape.input_weights == 6800
    # No output.weight: the tied embedding is counted again for the GPU's output layer.
    assert shape.output_weights == 128 + 6800
    assert shape.parameter_count == 100 * 64 + 2 * 64 * 64 + 64 + 64


def test_prefix_reader_drives_range_reads(tmp_path: Path, llama3_8b: Path) -> None:
    data = llama3_8b.read_bytes()
    reader = PrefixReader(total_size=len(data), first_bytes=64)
    fetched = []
    while (wanted := reader.next_range()) is not None:
        start, end = wanted
        assert start == reader.received and end > start
        fetched.append(wanted)
        reader.feed(data[start:end])
    assert len(fetched) > 1  # 64 bytes were not enough: it asked for more
    assert reader.shape == read_shape(llama3_8b)
    assert reader.next_range() is None
    with pytest.raises(NeedMoreData):
        parse_shape(data[:40])


def test_prefix_reader_rejects_truncated_files(llama3_8b: Path) -> None:
    data = llama3_8b.read_bytes()[:200]
    reader = PrefixReader(total_size=200, first_bytes=200)
    with pytest.raises(InvalidModelFile, match="truncated"):
        reader.feed(data)


def test_split_model_adds_the_other_parts(tmp_path: Path) -> None:
    def part(no: int) -> Path:
        keys = {**attn(2, 64, 4, 4), "split.count": 2, "split.no": no - 1}
        tensors = [(f"blk.{no - 1}.ffn_up.weight", np.zeros((64, 64), np.float32), None)]
        return write_gguf(tmp_path / f"m-{no:05d}-of-00002.gguf", "llama", keys, tensors)

    first, _ = part(1), part(2)
    shape = read_shape(first)
    assert shape.weights == 2 * 64 * 64 * 4
    assert shape.layer_weights == [16384, 16384]


def test_header_keeps_short_arrays_only(tmp_path: Path) -> None:
    keys = {**attn(4, 64, 4, [4, 4, 0, 4]), "tokenizer.ggml.scores": [0.5] * 5000}
    header = parse_header(write_gguf(tmp_path / "arr.gguf", "llama", keys).read_bytes())
    assert header.values["llama.attention.head_count_kv"] == [4, 4, 0, 4]
    assert "tokenizer.ggml.scores" not in header.values
    assert header.array_lengths["tokenizer.ggml.scores"] == 5000
    # The ModelInfo view leaves per-layer arrays out rather than picking one value.
    assert parse((tmp_path / "arr.gguf").read_bytes()).head_count_kv is None


# -- compute, verdicts, levers --------------------------------------------------------------


def test_compute_buffer_tracks_context_and_flash_attention(llama3_8b: Path) -> None:
    shape = read_shape(llama3_8b)
    small, large = compute_buffer(shape, settings(1024)), compute_buffer(shape, settings(8192))
    # The f16 attention mask is cells x 512 tokens x 2 bytes.
    assert large - small == (8192 - 1024) * 512 * 2
    no_fa = compute_buffer(shape, settings(8192, flash_attn=False))
    assert no_fa - large >= 32 * 8192 * 512 * 4  # K*Q scores, 32 heads, f32
    est = estimate(shape, settings(8192))
    assert est.total == est.weights + est.kv + est.compute + HOST_OVERHEAD


def test_cache_type_problems(tmp_path: Path) -> None:
    keys = attn(2, 320, 4, 4, **{"{arch}.attention.key_length": 80, "{arch}.attention.value_length": 80})
    shape = read_shape(write_gguf(tmp_path / "hd80.gguf", "llama", keys))
    assert "divisible by 32" in (cache_type_problem(shape, "q8_0", "f16") or "")
    assert cache_type_problem(shape, "f16", "f16") is None
    llama = read_shape(write_gguf(tmp_path / "ok.gguf", "llama", attn(2, 512, 4, 4)))
    assert "flash attention" in (cache_type_problem(llama, "f16", "q8_0", flash_attn=False) or "")
    with pytest.raises(ValueError, match="unknown KV cache type"):
        kv_cache(llama, settings(1024, cache="q9_9"))


def _big_model(tmp_path: Path) -> Path:
    # 8 layers of 1 MiB each (f32 256 x 1024), 8 KV heads x 128 dims: KV 32 KiB per token.
    tensors = [(f"blk.{i}.ffn_up.weight", np.zeros((256, 1024), np.float32), None) for i in range(8)]
    tensors.append(("token_embd.weight", np.zeros((256, 1024), np.float32), None))
    tensors.append(("output.weight", np.zeros((256, 1024), np.float32), None))
    return write_gguf(tmp_path / "big.gguf", "llama", attn(8, 1024, 8, 8), tensors)


def test_verdict_on_cpu(tmp_path: Path) -> None:
    shape = read_shape(_big_model(tmp_path))
    s = settings(4096, slots=2)
    need = estimate(shape, s).total
    fits = fit(shape, s, Memory(ram_available=need + 100 * MIB))
    assert fits.verdict == "fits" and fits.device == "cpu" and fits.headroom == 100 * MIB
    # When it fits, each lever shows one step down and its saving.
    assert {lever.change for lever in fits.levers} >= {"--ctx 2048", "--cache-type q8_0", "--slots 1"}
    assert all(lever.total < need for lever in fits.levers)
    short = fit(shape, s, Memory(ram_available=need - 40 * MIB))
    assert short.verdict == "no_fit" and short.headroom < 0
    # When it does not fit, each lever goes as far as needed to make it fit.
    by_kind = {lever.kind: lever for lever in short.levers}
    assert by_kind["ctx"].verdict == "fits" and by_kind["ctx"].settings.ctx_per_slot < 4096
    assert by_kind["slots"].change == "--slots 1" and by_kind["slots"].verdict == "fits"
    assert by_kind["cache_type"].verdict == "fits"


def test_verdict_on_gpu_offloads_layers(tmp_path: Path) -> None:
    shape = read_shape(_big_model(tmp_path))
    s = settings(1024, slots=1)
    est = estimate(shape, s)
    kvc = kv_cache(shape, s)
    per_layer = MIB + kvc.per_layer[0]
    ram = Memory(ram_available=64 * GIB, gpu_free=[100 * GIB])
    whole = fit(shape, s, ram)
    assert whole.verdict == "fits" and whole.gpu_layers == 9 == whole.n_layers
    # Room for the compute buffer and exactly three layers: three layers go to the GPU.
    vram = GPU_OVERHEAD + est.compute + 3 * per_layer + 1000
    part = fit(shape, s, Memory(ram_available=64 * GIB, gpu_free=[vram]))
    assert part.verdict == "offload" and part.gpu_layers == 3
    assert part.gpu_bytes == est.compute + 3 * per_layer
    # And if the rest does not fit in RAM either, it does not fit at all.
    none = fit(shape, s, Memory(ram_available=MIB, gpu_free=[vram]))
    assert none.verdict == "no_fit"


def test_default_ctx() -> None:
    shape = parse_shape(write_gguf_bytes())
    assert default_ctx(shape) == 2048  # trained on 2048: less than the 4096 cap
    assert default_ctx(shape, cap=1024) == 1024


def write_gguf_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return write_gguf(Path(d) / "m.gguf", "llama", attn(2, 64, 4, 4, ctx=2048)).read_bytes()
