"""The test model with a chat template that thinks, for the thinking control: no small
reasoning model can be downloaded here, so one is written.

This copy of the test model differs from it in one header key, its chat template: a
ChatML template whose generation prompt opens a ``<think>`` section (Qwen3's way), or
closes it at once when ``enable_thinking`` is false, and which gives earlier reasoning
back inside the tags. SmolLM2 never writes ``</think>`` itself, so with thinking on its
whole output is reasoning until llama.cpp's reasoning budget ends the section, and the
model then answers; with thinking off it answers at once. Everything in between (the
template switch, llama.cpp's reasoning parser and budget, the gateway's mapping) is real.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf

__all__ = ["THINK_TEMPLATE", "build_think_model", "cached_think_model"]

_VERSION = 1
"""Bump when the file below changes: the cached copy is then built again."""

THINK_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' and message.reasoning_content is defined"
    " and message.reasoning_content -%}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n'"
    " + message.content + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else -%}"
    "{{ '<think>\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def build_think_model(source: Path, path: Path) -> Path:
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(path, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        if field.name == gguf.Keys.Tokenizer.CHAT_TEMPLATE:
            continue  # replaced below
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_chat_template(THINK_TEMPLATE)
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


def cached_think_model(source: Path, cache: Path | None = None) -> Path:
    """The thinking copy of ``source`` (the test model), built once under the test cache."""
    default = Path(__file__).resolve().parent.parent / ".cache" / "test-models"
    root = cache or Path(os.environ.get("BLAZAR_TEST_CACHE", default))
    path = root / "synthetic" / f"smollm2-think-v{_VERSION}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        build_think_model(source, tmp)
        os.replace(tmp, path)
    return path
