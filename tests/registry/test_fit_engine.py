"""registry.fit against the real engine: llama.cpp logs the buffers it allocates at load.

Each case starts llama.cpp (the xllamacpp host's own flag mapping, at info log
level, no warm-up), reads the ``model``/``KV``/``RS``/``compute``/``output``
buffer sizes from its log, stops it, and compares them with the estimate. The
KV cache must match within 2%, the buffers' total within 10%.

Besides the SmolLM2 test model, small synthetic models (zero weights, a 320-token
vocabulary) exercise the sliding-window, latent-attention and recurrent formulas
in the engine itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest

from actors.engines.llamacpp import LaunchSpec, build_argv
from registry.fit import Settings, compute_buffer, estimate, kv_cache
from registry.shape import read_shape
from tests.support import MODEL, ROOT, home_env

pytestmark = pytest.mark.slow

MIB = 1 << 20

_CHILD = """
import sys
import xllamacpp
from actors.engines.llamacpp_host import build_params, parse_args

params = build_params(parse_args(sys.argv[1:]))
params.verbosity = 4  # info: llama.cpp reports every buffer it allocates
params.warmup = False
server = xllamacpp.Server(params)
print("READY", flush=True)
sys.stdin.read()  # alive until the parent has read the load log, which llama.cpp's log thread may
# still be writing: on a busy machine it came after READY, and a child that had exited lost it
"""

_BUFFER = re.compile(r"^.*?(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB", re.M)
_KV_SPLIT = re.compile(r"K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB")


def engine_buffers(model: Path, ctx_per_slot: int, slots: int, cache_type: str = "f16") -> dict[str, float]:
    """Start llama.cpp as Blazar would, return the MiB of each buffer kind it logged."""
    spec = LaunchSpec(model="fit-check", path=str(model), ctx_per_slot=ctx_per_slot, slots=slots)
    argv = build_argv(spec, port=0, api_key="fit-check", binary=None)
    flags = [*argv[argv.index("actors.engines.llamacpp_host") + 1 :], "-ctk", cache_type, "-ctv", cache_type]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    lines: list[str] = []
    ready = logged = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            # The child's READY and llama.cpp's log share the pipe and may share a line.
            ready = ready or "READY" in line
            logged = logged or "compute buffer size" in line  # the load log's last buffer
            if ready and logged:
                break
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    log = "".join(lines)
    assert "READY" in log, f"llama.cpp did not start:\n{log[-3000:]}"
    # The load log comes after llama.cpp's own dry-run fit, which logs nothing at info level.
    sizes = {"model": 0.0, "KV": 0.0, "RS": 0.0, "compute": 0.0, "output": 0.0, "K": 0.0, "V": 0.0}
    for _buf, kind, mib in _BUFFER.findall(log):
        sizes[kind] += float(mib)
    for _tk, k, _tv, v in _KV_SPLIT.findall(log):
        sizes["K"] += float(k)
        sizes["V"] += float(v)
    return sizes


def _close(estimate_bytes: int, engine_mib: float, tolerance: float) -> bool:
    engine_bytes = engine_mib * MIB
    # The log rounds to 0.01 MiB; allow that on top of the relative tolerance.
    return abs(estimate_bytes - engine_bytes) <= tolerance * engine_bytes + 0.006 * MIB


CASES = [(4096, 1, "f16"), (1100, 3, "f16"), (1024, 4, "q8_0"), (2048, 2, "q4_0")]


@pytest.mark.parametrize(("ctx", "slots", "cache"), CASES)
def test_smollm2_buffers_match_the_engine(model_path: Path, ctx: int, slots: int, cache: str) -> None:
    shape = read_shape(model_path)
    settings = Settings(ctx_per_slot=ctx, slots=slots, cache_type_k=cache, cache_type_v=cache)
    est = estimate(shape, settings)
    engine = engine_buffers(model_path, ctx, slots, cache)

    assert _close(est.weights, engine["model"], 0.005), (est.weights / MIB, engine)
    assert _close(est.kv, engine["KV"], 0.02), (est.kv / MIB, engine)
    assert _close(est.k, engine["K"], 0.02) and _close(est.v, engine["V"], 0.02)
    buffers = engine["model"] + engine["KV"] + engine["compute"] + engine["output"]
    ours = est.weights + est.kv + est.compute
    assert _close(ours, buffers, 0.10), (ours / MIB, buffers, engine)


def test_cli_acceptance_line_matches_the_engine(home: Path, model_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "blazar", "fit", MODEL, "--ctx", "4096", "--slots", "1", "--json"],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    engine = engine_buffers(model_path, 4096, 1)
    # 30 layers x 4096 cells x (3 KV heads x 64 dims) x K and V x 2 bytes.
    assert doc["kv"] == 30 * 4096 * 3 * 64 * 2 * 2
    assert _close(doc["kv"], engine["KV"], 0.02)
    assert _close(doc["weights"], engine["model"], 0.005)
    assert doc["total"] > doc["weights"] + doc["kv"]


# -- synthetic models: zero weights, a small SentencePiece-style vocabulary -----------------


def _vocab(w: gguf.GGUFWriter) -> int:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))]
    tokens += [f"\u2581t{i}" for i in range(320 - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3, *([6] * 256), *([1] * (len(tokens) - 259))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    return len(tokens)


def _t(w: gguf.GGUFWriter, name: str, *shape: int) -> None:
    # numpy order: (rows, columns) = ggml (columns, rows).
    w.add_tensor(name, np.zeros(shape, np.float32))


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gemma(path: Path, arch: str, *, layers: int = 12, window: int = 512) -> Path:
    embd, heads, kv_heads, hd, ff = 64, 4, 2, 64, 128
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_context_length(8192)
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    n_vocab = _vocab(w)
    _t(w, "token_embd.weight", n_vocab, embd)
    _t(w, "output_norm.weight", embd)
    for i in range(layers):
        p = f"blk.{i}."
        _t(w, p + "attn_norm.weight", embd)
        _t(w, p + "attn_q.weight", heads * hd, embd)
        _t(w, p + "attn_k.weight", kv_heads * hd, embd)
        _t(w, p + "attn_v.weight", kv_heads * hd, embd)
        _t(w, p + "attn_output.weight", embd, heads * hd)
        _t(w, p + "post_attention_norm.weight", embd)
        _t(w, p + "ffn_norm.weight", embd)
        _t(w, p + "ffn_gate.weight", ff, embd)
        _t(w, p + "ffn_up.weight", ff, embd)
        _t(w, p + "ffn_down.weight", embd, ff)
        _t(w, p + "post_ffw_norm.weight", embd)
        if arch == "gemma3":
            _t(w, p + "attn_q_norm.weight", hd)
            _t(w, p + "attn_k_norm.weight", hd)
    _finish(w)
    return path


def write_deepseek2(path: Path, *, layers: int = 3) -> Path:
    embd, heads, kv_lora, rope, nope, v_dim, ff = 64, 4, 64, 32, 32, 32, 128
    w = gguf.GGUFWriter(path, arch="deepseek2")
    w.add_context_length(8192)
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_uint32("deepseek2.attention.key_length_mla", nope + rope)
    w.add_uint32("deepseek2.attention.value_length_mla", v_dim)
    w.add_kv_lora_rank(kv_lora)
    w.add_q_lora_rank(0)
    w.add_rope_dimension_count(rope)
    w.add_leading_dense_block_count(layers)
    w.add_expert_count(0)
    w.add_expert_used_count(0)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_shared_count(0)
    w.add_expert_weights_scale(1.0)
    n_vocab = _vocab(w)
    _t(w, "token_embd.weight", n_vocab, embd)
    _t(w, "output_norm.weight", embd)
    _t(w, "output.weight", n_vocab, embd)
    for i in range(layers):
        p = f"blk.{i}."
        _t(w, p + "attn_norm.weight", embd)
        _t(w, p + "attn_q.weight", heads * (nope + rope), embd)
        _t(w, p + "attn_kv_a_mqa.weight", kv_lora + rope, embd)
        _t(w, p + "attn_kv_a_norm.weight", kv_lora)
        _t(w, p + "attn_k_b.weight", heads, kv_lora, nope)
        _t(w, p + "attn_v_b.weight", heads, v_dim, kv_lora)
        _t(w, p + "attn_output.weight", embd, heads * v_dim)
        _t(w, p + "ffn_norm.weight", embd)
        _t(w, p + "ffn_gate.weight", ff, embd)
        _t(w, p + "ffn_up.weight", ff, embd)
        _t(w, p + "ffn_down.weight", embd, ff)
    _finish(w)
    return path


def write_mamba(path: Path, *, layers: int = 3) -> Path:
    embd, d_conv, d_inner, d_state, dt_rank = 64, 4, 128, 16, 4
    w = gguf.GGUFWriter(path, arch="mamba")
    w.add_context_length(1 << 20)
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    n_vocab = _vocab(w)
    _t(w, "token_embd.weight", n_vocab, embd)
    _t(w, "output_norm.weight", embd)
    for i in range(layers):
        p = f"blk.{i}."
        _t(w, p + "attn_norm.weight", embd)
        _t(w, p + "ssm_in.weight", 2 * d_inner, embd)
        _t(w, p + "ssm_conv1d.weight", d_inner, d_conv)
        _t(w, p + "ssm_conv1d.bias", d_inner)
        _t(w, p + "ssm_x.weight", dt_rank + 2 * d_state, d_inner)
        _t(w, p + "ssm_dt.weight", d_inner, dt_rank)
        _t(w, p + "ssm_dt.bias", d_inner)
        _t(w, p + "ssm_a", d_inner, d_state)
        _t(w, p + "ssm_d", d_inner)
        _t(w, p + "ssm_out.weight", embd, d_inner)
    _finish(w)
    return path


SYNTHETIC = {
    "gemma2": lambda p: write_gemma(p, "gemma2"),
    "gemma3": lambda p: write_gemma(p, "gemma3"),
    "deepseek2": write_deepseek2,
    "mamba": write_mamba,
}


@pytest.mark.parametrize("arch", sorted(SYNTHETIC))
@pytest.mark.parametrize(("ctx", "slots"), [(4096, 1), (700, 3)])
def test_synthetic_architectures_match_the_engine(tmp_path: Path, arch: str, ctx: int, slots: int) -> None:
    model = SYNTHETIC[arch](tmp_path / f"{arch}.gguf")
    shape = read_shape(model)
    settings = Settings(ctx_per_slot=ctx, slots=slots)
    kvc = kv_cache(shape, settings)
    engine = engine_buffers(model, ctx, slots)
    assert _close(kvc.kv, engine["KV"], 0.02), (arch, kvc, engine)
    assert _close(kvc.recurrent, engine["RS"], 0.02), (arch, kvc, engine)
    if arch == "deepseek2":
        assert kvc.v == 0 and engine["V"] == 0  # latent attention: no V cache
    if arch.startswith("gemma"):
        # Window 512 + micro-batch 512: the sliding layers hold 1024 cells when the context is longer.
        assert kvc.swa_cells_per_stream == min(kvc.cells_per_stream, 1024)
    assert _close(shape.weights, engine["model"], 0.005)
    # The compute estimate is an upper-side estimate; tiny models carry relatively more slack.
    assert compute_buffer(shape, settings) >= engine["compute"] * MIB * 0.9
