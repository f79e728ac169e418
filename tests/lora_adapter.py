"""A LoRA adapter for the test model, written here: no adapter for SmolLM2 can be downloaded.

The file has the form llama.cpp's ``convert_lora_to_gguf.py`` writes: ``general.type =
adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, the base architecture, and per
adapted weight a pair ``<weight>.lora_a`` (GGUF shape ``[in, rank]``, numpy ``(rank, in)``)
and ``<weight>.lora_b`` (``[rank, out]``, numpy ``(out, rank)``). Its weights are random and
large, so the model's answer changes visibly when it is applied; it means nothing else.
The shapes come from the model's own header (our fast reader, not ``GGUFReader``).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from registry.gguf import read_header

__all__ = ["build_adapter"]


def build_adapter(
    model: Path,
    path: Path,
    *,
    architecture: str | None = None,
    weights: tuple[str, ...] = ("attn_q", "attn_v", "ffn_up"),
    rank: int = 8,
    alpha: float = 8.0,
    std: float = 0.5,
    layers: int | None = None,
    transpose_a: bool = False,
    width: int | None = None,
) -> Path:
    """Write an adapter for ``model`` at ``path``. ``architecture``, ``transpose_a`` and ``width``
    make the mismatched ones the checks must refuse."""
    header = read_header(model)
    arch = architecture or header.values["general.architecture"]
    shapes = {t.name: t.shape for t in header.tensors}
    blocks = int(header.values[f"{header.values['general.architecture']}.block_count"])
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    rng = np.random.default_rng(0)
    for i in range(layers if layers is not None else blocks):
        for w in weights:
            n_in, n_out = shapes[f"blk.{i}.{w}.weight"][:2]
            n_in = width or n_in
            a = (rng.standard_normal((rank, n_in)) * std).astype(np.float32)
            b = (rng.standard_normal((n_out, rank)) * std).astype(np.float32)
            writer.add_tensor(f"blk.{i}.{w}.weight.lora_a", a.T.copy() if transpose_a else a)
            writer.add_tensor(f"blk.{i}.{w}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
