"""The test model with fill-in-the-middle tokens named, for ``/infill``: no small code model
can be downloaded here, so one is written.

SmolLM2's vocabulary has no FIM tokens, so llama.cpp refuses ``/infill`` on it. This copy
names three of its special tokens as the prefix, suffix and middle tokens in its header
(``tokenizer.ggml.fim_*_token_id``), which is all llama.cpp needs to lay out an infill
prompt: the weights and every other key are the test model's, byte for byte. What it
writes between prefix and suffix means little (it was not trained for it), but the route,
the engine's prompt layout and the answer are real.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf

__all__ = ["FIM_TOKENS", "build_fim_model", "cached_fim_model"]

_VERSION = 1
"""Bump when the file below changes: the cached copy is then built again."""

FIM_TOKENS = {"pre": "<filename>", "suf": "<gh_stars>", "mid": "<issue_start>"}
"""The special tokens of SmolLM2's vocabulary named as FIM prefix, suffix and middle."""


def build_fim_model(source: Path, path: Path) -> Path:
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(path, arch=arch, endianess=reader.endianess)
    tokens = reader.fields[gguf.Keys.Tokenizer.LIST].contents()
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for role, text in FIM_TOKENS.items():
        writer.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", tokens.index(text))
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return path


def cached_fim_model(source: Path, cache: Path | None = None) -> Path:
    """The FIM copy of ``source`` (the test model), built once under the test cache."""
    default = Path(__file__).resolve().parent.parent / ".cache" / "test-models"
    root = cache or Path(os.environ.get("BLAZAR_TEST_CACHE", default))
    path = root / "synthetic" / f"smollm2-fim-v{_VERSION}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        build_fim_model(source, tmp)
        os.replace(tmp, path)
    return path
