"""The test model in f16: the source ``blazar quantize`` expects, which no small download has.

The test model ships quantized (Q4_1, its embeddings Q8_0). Its weights dequantized to f16
(norms and other 1-D tensors stay f32, as in any f16 GGUF) give a real f16 model with the
same vocabulary, template and answers, written by the same writer ``blazar quantize`` uses
(a few seconds; tests build it once per module, in their own temporary folder).
"""

from __future__ import annotations

from pathlib import Path

from registry.quantize import quantize_file

__all__ = ["build_f16_model"]


def build_f16_model(source: Path, folder: Path) -> Path:
    """The f16 copy of ``source`` (the test model) at ``folder/smollm2-f16.gguf``."""
    path = folder / "smollm2-f16.gguf"
    quantize_file(source, path, "F16")
    return path
