"""A control vector for the test model, written here: none for SmolLM2 can be downloaded.

The file has the form llama.cpp's ``llama-cvector-generator`` writes: ``general.architecture
= controlvector``, ``controlvector.model_hint``, ``controlvector.layer_count`` and one F32
tensor ``direction.N`` of the model's embedding width per layer ``N`` from 1. The directions
are random and large, so a strong strength visibly changes the model's answer; they mean
nothing else. The width and block count come from the model's own header.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from registry.gguf import read_header

__all__ = ["build_vector", "model_shape"]


def model_shape(model: Path) -> tuple[int, int]:
    """The model's (embedding width, block count)."""
    values = read_header(model).values
    arch = values["general.architecture"]
    return int(values[f"{arch}.embedding_length"]), int(values[f"{arch}.block_count"])


def build_vector(
    model: Path,
    path: Path,
    *,
    layers: int | None = None,
    width: int | None = None,
    scale: float = 1.0,
    seed: int = 0,
    architecture: str = "controlvector",
) -> Path:
    """Write a control vector for ``model`` at ``path``: ``layers`` directions (default: the
    model's blocks less one, as the generator writes), each of ``width`` floats (default: the
    model's). ``layers``, ``width`` and ``architecture`` make the mismatched ones."""
    n_embd, blocks = model_shape(model)
    count = layers if layers is not None else blocks - 1
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string("controlvector.model_hint", str(read_header(model).values["general.architecture"]))
    writer.add_int32("controlvector.layer_count", count)
    rng = np.random.default_rng(seed)
    for layer in range(1, count + 1):
        direction = rng.standard_normal(width or n_embd).astype(np.float32)
        direction *= scale / float(np.linalg.norm(direction))
        writer.add_tensor(f"direction.{layer}", direction)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
