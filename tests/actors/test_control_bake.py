"""The copy of the model the bundled llama.cpp host runs control vectors with
(``actors.engines.control_bake``): the summed directions as ``ffn_down`` biases, the rest
byte for byte. That it steers as llama.cpp would is shown on the real engine in
tests/e2e/test_control_e2e.py."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from actors.engines.control_bake import BakeError, bake, summed
from actors.engines.llamacpp import build_argv
from actors.engines.llamacpp_host import parse_args
from actors.engines.spec import ControlLoad, LaunchSpec
from registry.gguf import read_header
from tests.support import ensure_model
from tests.synthetic_control import build_vector, model_shape


@pytest.fixture(scope="module")
def model_file() -> Path:
    return ensure_model()


def test_the_baked_copy_holds_the_summed_directions_as_biases(model_file: Path, tmp_path: Path) -> None:
    width, blocks = model_shape(model_file)
    a = build_vector(model_file, tmp_path / "a.gguf", seed=1)
    b = build_vector(model_file, tmp_path / "b.gguf", seed=2, layers=3)
    sums = summed([(str(a), 2.0), (str(b), -1.0)], blocks=blocks, width=width, layers=(2, 4))
    assert sorted(sums) == [2, 3, 4]  # a has 1..blocks-1, b 1..3; only 2..4 are in the range
    out = bake(str(model_file), [(str(a), 2.0), (str(b), -1.0)], (2, 4), tmp_path)
    original, copy = read_header(model_file), read_header(out)
    assert copy.tensor_count == original.tensor_count + 3
    assert copy.tensors[: original.tensor_count] == original.tensors  # the old table, offsets and all
    biases = {t.name: t for t in copy.tensors[original.tensor_count :]}
    assert sorted(biases) == [f"blk.{n}.ffn_down.bias" for n in (2, 3, 4)]
    for n in (2, 3, 4):
        t = biases[f"blk.{n}.ffn_down.bias"]
        data = np.fromfile(out, dtype="<f4", count=width, offset=copy.data_offset + t.offset)
        assert np.allclose(data, sums[n])
    first = original.tensors[0]
    size = first.n_bytes or 0
    with open(model_file, "rb") as f, open(out, "rb") as g:
        f.seek(original.data_offset + first.offset)
        g.seek(copy.data_offset + first.offset)
        assert f.read(size) == g.read(size)  # the weights, byte for byte
    wide = build_vector(model_file, tmp_path / "wide.gguf", width=width + 1)
    with pytest.raises(BakeError, match="width"):
        bake(str(model_file), [(str(wide), 1.0)], None, tmp_path)


def test_the_host_takes_llama_servers_control_vector_flags() -> None:
    ns = parse_args(
        ["-m", "m.gguf", "--control-vector", "a.gguf", "--control-vector-scaled", "b.gguf", "-0.5",
         "--control-vector-layer-range", "3", "7"]
    )  # fmt: skip
    assert ns.control_vectors == ["a.gguf", ["b.gguf", "-0.5"]] and ns.control_vector_layer_range == [3, 7]


def test_a_steered_spec_starts_the_engine_with_the_vectors() -> None:
    spec = LaunchSpec(
        model="m+steer-1",
        alias="m",
        path="m.gguf",
        ctx_per_slot=512,
        slots=1,
        control_vectors=[ControlLoad(name="calm", path="/b/calm", strength=0.25)],
        control_layers=(2, 9),
    )
    argv = build_argv(spec, port=1, api_key="k", binary=None)
    at = argv.index("--control-vector-scaled")
    assert argv[at : at + 3] == ["--control-vector-scaled", "/b/calm", "0.25"]
    assert argv[argv.index("--control-vector-layer-range") :][:3] == [
        "--control-vector-layer-range",
        "2",
        "9",
    ]
    ns = parse_args(argv[3:])  # the host reads what the lane writes
    assert ns.control_vectors == [["/b/calm", "0.25"]] and ns.alias == "m"
    plain = build_argv(msgspec.structs.replace(spec, control_vectors=[]), port=1, api_key="k", binary=None)
    assert "--control-vector-layer-range" not in plain
