"""Format detection on small files the tests write: headers with fake shapes, no weights."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from registry.errors import InvalidModelFile
from registry.formats import (
    NeedMoreData,
    Tensor,
    classify_tensors,
    detect,
    parse_safetensors_header,
    read_safetensors_header,
)


def safetensors_bytes(
    tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None
) -> bytes:
    """A safetensors file whose header lists ``tensors`` (dtype, shape); the data is zeros,
    as long as the header's offsets say (a real file's layout, tiny shapes)."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F8_E4M3": 1, "U8": 1, "I64": 8}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype] * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None
) -> Path:
    path.write_bytes(safetensors_bytes(tensors, metadata))
    return path


def llama_tensors(
    hidden: int = 64, layers: int = 2, vocab: int = 128, dtype: str = "BF16"
) -> dict[str, tuple[str, list[int]]]:
    t: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": (dtype, [vocab, hidden])}
    for i in range(layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"model.layers.{i}.self_attn.{proj}.weight"] = (dtype, [hidden, hidden])
        t[f"model.layers.{i}.input_layernorm.weight"] = (dtype, [hidden])
    t["lm_head.weight"] = (dtype, [vocab, hidden])
    return t


def llama_params(hidden: int = 64, layers: int = 2, vocab: int = 128) -> int:
    return 2 * vocab * hidden + layers * (4 * hidden * hidden + hidden)


def hf_config(**extra: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
        **extra,
    }


def hf_dir(tmp_path: Path, config: dict[str, Any], shards: list[dict[str, tuple[str, list[int]]]], *,
           metadata: dict[str, str] | None = None, name: str = "model") -> Path:  # fmt: skip
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    for i, tensors in enumerate(shards):
        n = len(shards)
        shard = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_safetensors(folder / shard, tensors, {"format": "pt"} if metadata is None else metadata)
    return folder


# -- the header itself ------------------------------------------------------------


def test_header_parse_and_prefix() -> None:
    data = safetensors_bytes({"a": ("F16", [2, 3]), "b": ("F32", [4])}, {"format": "pt"})
    header = parse_safetensors_header(data)
    assert header.tensors == {"a": Tensor("F16", [2, 3]), "b": Tensor("F32", [4])}
    assert header.metadata == {"format": "pt"}
    assert data[header.data_offset :] == bytes(2 * 6 + 4 * 4)  # the data starts right after
    with pytest.raises(NeedMoreData) as short:
        parse_safetensors_header(data[:20])
    assert short.value.needed == header.data_offset
    with pytest.raises(NeedMoreData):
        parse_safetensors_header(data[:5])


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("<Q", 1 << 40) + b"{}",  # absurd length
        struct.pack("<Q", 4) + b"abcd",  # not JSON
        struct.pack("<Q", 4) + b"[1] ",  # JSON, not an object
        struct.pack("<Q", 20) + b'{"t": {"dtype": 1}} ',  # a tensor without dtype and shape
    ],
)
def test_header_rejects(data: bytes) -> None:
    with pytest.raises(InvalidModelFile):
        parse_safetensors_header(data)


def test_read_header_truncated(tmp_path: Path) -> None:
    path = tmp_path / "cut.safetensors"
    path.write_bytes(safetensors_bytes({"a": ("F16", [2])})[:12])
    with pytest.raises(InvalidModelFile, match="truncated"):
        read_safetensors_header(path)


# -- Hugging Face directories ------------------------------------------------------


def test_plain_hf_directory(tmp_path: Path) -> None:
    tensors = llama_tensors()
    names = list(tensors)
    half = len(names) // 2
    shards = [{k: tensors[k] for k in names[:half]}, {k: tensors[k] for k in names[half:]}]
    folder = hf_dir(tmp_path, hf_config(), shards)
    found = detect(folder)
    assert found.format == "safetensors" and found.lane_format == "safetensors"
    assert found.architecture == "LlamaForCausalLM"
    assert found.quantization is None and found.dtype == "BF16"
    assert found.parameters == llama_params()
    assert found.context_length == 8192
    assert found.kv_bytes_per_token == 2 * 2 * (64 // 4) * 2 * 2  # layers, KV heads, head size, K+V, bf16
    assert found.files == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert found.size_bytes == sum((folder / f).stat().st_size for f in found.files)


def test_awq_directory(tmp_path: Path) -> None:
    hidden, packed = 64, 64 // 8  # int4 packed eight to an int32
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("F16", [128, hidden])}
    for proj in ("q_proj", "k_proj"):
        base = f"model.layers.0.self_attn.{proj}"
        tensors[f"{base}.qweight"] = ("I32", [hidden, packed])
        tensors[f"{base}.qzeros"] = ("I32", [hidden // 32, packed])
        tensors[f"{base}.scales"] = ("F16", [hidden // 32, hidden])
    config = hf_config(
        quantization_config={"quant_method": "AWQ", "bits": 4, "group_size": 32, "version": "gemm"}
    )
    found = detect(hf_dir(tmp_path, config, [tensors]))
    assert found.format == "safetensors" and found.quantization == "awq"
    assert found.lane_format == "safetensors:awq"
    # qweight unpacked to its weights; zeros and scales not counted
    assert found.parameters == 128 * hidden + 2 * hidden * hidden


@pytest.mark.parametrize(
    ("method", "key"), [("gptq", "gptq"), ("fp8", "fp8"), ("compressed-tensors", "compressed-tensors")]
)
def test_other_quantized_directories(tmp_path: Path, method: str, key: str) -> None:
    config = hf_config(quantization_config={"quant_method": method, "bits": 8})
    found = detect(hf_dir(tmp_path, config, [llama_tensors(dtype="F8_E4M3" if method == "fp8" else "BF16")]))
    assert found.lane_format == f"safetensors:{key}"


# -- MLX directories ---------------------------------------------------------------


def test_mlx_quantized_directory(tmp_path: Path) -> None:
    hidden, bits = 64, 4
    tensors: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": ("U32", [128, hidden * bits // 32]),
        "model.embed_tokens.scales": ("BF16", [128, hidden // 64]),
        "model.embed_tokens.biases": ("BF16", [128, hidden // 64]),
        "model.norm.weight": ("BF16", [hidden]),
    }
    quant = {"group_size": 64, "bits": bits}
    config = hf_config(quantization=quant, quantization_config=quant)  # mlx-lm writes both
    found = detect(hf_dir(tmp_path, config, [tensors], metadata={"format": "mlx"}))
    assert found.format == "mlx" and found.lane_format == "mlx"
    assert found.quantization == "4bit"
    assert found.parameters == 128 * hidden + hidden


def test_mlx_told_from_metadata_alone(tmp_path: Path) -> None:
    """An unquantized MLX conversion: config.json like any other, the shards say mlx."""
    found = detect(hf_dir(tmp_path, hf_config(), [llama_tensors()], metadata={"format": "mlx"}))
    assert found.format == "mlx" and found.quantization is None
    plain = detect(hf_dir(tmp_path, hf_config(), [llama_tensors()], name="plain"))
    assert plain.format == "safetensors"


def test_mlx_quantization_block_without_metadata(tmp_path: Path) -> None:
    config = hf_config(quantization={"group_size": 32, "bits": 8})
    found = detect(hf_dir(tmp_path, config, [llama_tensors()], metadata={}))
    assert found.format == "mlx" and found.quantization == "8bit"


def test_legacy_mlx_npz(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config()))
    np.savez(folder / "weights.npz", a=np.zeros(2))
    found = detect(folder)
    assert found.format == "mlx" and found.files == ["config.json", "weights.npz"]
    assert found.parameters is None
    explicit = hf_config(head_dim=32, num_key_value_heads=None)
    (folder / "config.json").write_text(json.dumps(explicit))
    assert detect(folder).kv_bytes_per_token == 2 * 4 * 32 * 2 * 2  # KV heads default to the heads
    (folder / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    assert detect(folder).kv_bytes_per_token is None


def test_directory_problems(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidModelFile, match=r"config\.json"):
        detect(empty)
    (empty / "config.json").write_text(json.dumps(hf_config()))
    with pytest.raises(InvalidModelFile, match=r"no \*\.safetensors"):
        detect(empty)
    (empty / "config.json").write_text("{not json")
    with pytest.raises(InvalidModelFile, match="JSON"):
        detect(empty)
    with pytest.raises(InvalidModelFile, match="no such"):
        detect(tmp_path / "missing")


# -- diffusion checkpoints ------------------------------------------------------------


def sd15_tensors() -> dict[str, tuple[str, list[int]]]:
    return {
        "model.diffusion_model.input_blocks.0.0.weight": ("F16", [320, 4, 3, 3]),
        "model.diffusion_model.middle_block.1.proj_in.weight": ("F16", [1280, 1280]),
        "model.diffusion_model.output_blocks.0.0.in_layers.0.weight": ("F16", [2560]),
        "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight": ("F16", [49408, 768]),
        "first_stage_model.decoder.conv_in.weight": ("F32", [512, 4, 3, 3]),
    }


def test_sd15_checkpoint(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "v1-5.safetensors", sd15_tensors())
    found = detect(path)
    assert found.format == "diffusion" and found.lane_format == "diffusion"
    assert found.architecture == "sd1" and found.container == "safetensors"
    assert found.files == ["v1-5.safetensors"] and found.size_bytes == path.stat().st_size
    assert found.parameters == 320 * 4 * 9 + 1280 * 1280 + 2560 + 49408 * 768 + 512 * 4 * 9


def test_diffusion_families() -> None:
    sdxl = ["model.diffusion_model.input_blocks.0.0.weight", "model.diffusion_model.label_emb.0.0.weight",
            "conditioner.embedders.1.model.ln_final.weight"]  # fmt: skip
    assert classify_tensors(sdxl) == "sdxl"
    sd2 = ["model.diffusion_model.input_blocks.0.0.weight", "cond_stage_model.model.ln_final.weight"]
    assert classify_tensors(sd2) == "sd2"
    assert classify_tensors(["model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight"]) == "sd3"
    flux_alone = ["double_blocks.0.img_attn.qkv.weight", "single_blocks.0.linear1.weight", "img_in.weight"]
    assert classify_tensors(flux_alone) == "flux"
    # A text model, and UNet-like names without the diffusion prefix, are not claimed.
    assert classify_tensors(["model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]) is None
    assert classify_tensors(["input_blocks.0.weight", "output_blocks.1.weight"]) is None


def test_lone_text_safetensors_refused(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "model.safetensors", llama_tensors())
    with pytest.raises(InvalidModelFile, match="directory"):
        detect(path)


def test_ckpt_searched_not_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "v1-5.ckpt"
    # A pickle that would run code if loaded: detection only searches its bytes.
    evil = b"cos\nsystem\n(S'echo pwned > " + str(tmp_path / "ran").encode() + b"'\ntR."
    names = b"".join(n.encode() + b"\x00" for n in sd15_tensors())
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", evil + names)
        zf.writestr("archive/data/0", bytes(16))
    found = detect(path)
    assert found.format == "diffusion" and found.container == "ckpt" and found.architecture == "sd1"
    assert not (tmp_path / "ran").exists()
    other = tmp_path / "other.ckpt"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("archive/data.pkl", b"layers.0.weight")
    with pytest.raises(InvalidModelFile, match="diffusion"):
        detect(other)


# -- GGUF ------------------------------------------------------------------------------


def test_gguf_text_model(tiny_gguf: Path) -> None:
    found = detect(tiny_gguf)
    assert found.format == "gguf" and found.lane_format == "gguf"
    assert found.architecture == "llama" and found.quantization == "Q4_1"
    assert found.context_length == 2048 and found.files == [tiny_gguf.name]


def test_gguf_diffusion_model(tmp_path: Path) -> None:
    path = tmp_path / "sd-q8.gguf"
    writer = gguf.GGUFWriter(path, arch="sd")
    writer.add_tensor("model.diffusion_model.input_blocks.0.0.weight", np.zeros((8, 4), dtype=np.float16))
    writer.add_tensor("model.diffusion_model.output_blocks.0.0.weight", np.zeros((8,), dtype=np.float16))
    writer.add_tensor(
        "cond_stage_model.transformer.text_model.final_layer_norm.weight", np.zeros(4, dtype=np.float32)
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    found = detect(path)
    assert found.format == "diffusion" and found.container == "gguf" and found.architecture == "sd1"
    assert found.parameters == 8 * 4 + 8 + 4


def test_unknown_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a model")
    with pytest.raises(InvalidModelFile):
        detect(path)
