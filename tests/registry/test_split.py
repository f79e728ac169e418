"""registry.split: a model spread over this machine and llama.cpp RPC workers."""

from __future__ import annotations

import pytest

from registry.fit import (
    GPU_OVERHEAD,
    HOST_OVERHEAD,
    MIB,
    Memory,
    Settings,
    compute_buffer,
    estimate,
    kv_cache,
)
from registry.shape import ModelShape
from registry.split import RPC_WORKER_OVERHEAD, Worker, local_share, placed, split

GIB = 1 << 30


def shape(n_layer: int = 10, layer_mib: int = 100, output_mib: int = 50) -> ModelShape:
    """A plain attention model: ``layer_mib`` of weights per layer, 4 KV heads of 64."""
    return ModelShape(
        architecture="llama",
        parameter_count=1,
        context_length=4096,
        n_layer=n_layer,
        n_embd=256,
        n_ff=512,
        n_vocab=1000,
        n_head=[4] * n_layer,
        n_head_kv=[4] * n_layer,
        head_dim_k=[64] * n_layer,
        head_dim_v=[64] * n_layer,
        has_kv=[True] * n_layer,
        swa=[False] * n_layer,
        recurrent=[False] * n_layer,
        weights=n_layer * layer_mib * MIB + 2 * output_mib * MIB,
        weights_by_type={"Q4_0": n_layer * layer_mib * MIB + 2 * output_mib * MIB},
        layer_weights=[layer_mib * MIB] * n_layer,
        input_weights=output_mib * MIB,
        output_weights=output_mib * MIB,
    )


SETTINGS = Settings(ctx_per_slot=1024, slots=1)


def test_layers_follow_each_parts_memory_and_the_flags_say_so() -> None:
    s = shape()
    plan = split(s, SETTINGS, Memory(ram_available=GIB), [Worker(address="10.0.0.2:50052", memory=2 * GIB)])
    local, worker = plan.parts
    # every layer is placed once, in order: the CPU's first, then the worker's
    assert local.layers + worker.layers == 10
    assert local.first_layer == 0 and worker.first_layer == local.layers
    # about a third here and two thirds there (their memory after fixed costs)
    assert 2 <= local.layers <= 4
    # llama.cpp offloads from the end, the output layer first: it goes to the worker, and
    # -ngl and the split count it beside the worker's repeating layers
    assert worker.output and not local.output
    assert plan.gpu_layers == worker.layers + 1 == plan.n_layers - local.layers
    assert plan.tensor_split == [worker.layers + 1]
    assert plan.verdict == "fits"
    assert all(p.headroom >= 0 for p in plan.parts)


def test_bytes_are_weights_kv_compute_and_overheads() -> None:
    s = shape()
    plan = split(s, SETTINGS, Memory(ram_available=GIB), [Worker(address="w:1", memory=2 * GIB)])
    local, worker = plan.parts
    per_layer = 100 * MIB + kv_cache(s, SETTINGS).per_layer[0]
    compute = compute_buffer(s, SETTINGS)
    logits = 1000 * 4 * 1 + MIB
    assert worker.bytes == worker.layers * per_layer + 50 * MIB + compute + RPC_WORKER_OVERHEAD
    assert local.bytes == local.layers * per_layer + 50 * MIB + HOST_OVERHEAD + logits + compute
    assert plan.total == local.bytes + worker.bytes


def test_a_model_too_large_for_this_machine_fits_over_two_workers() -> None:
    s = shape(n_layer=32, layer_mib=200)  # 6.5 GiB of layers
    here = Memory(ram_available=512 * MIB)
    alone = split(s, SETTINGS, here, [Worker(address="a:1", memory=0)])
    assert alone.verdict == "no_fit"
    assert "short of memory" in alone.notes[-1]
    plan = split(
        s, SETTINGS, here, [Worker(address="a:1", memory=4 * GIB), Worker(address="b:1", memory=4 * GIB)]
    )
    assert plan.verdict == "fits"
    local, a, b = plan.parts
    assert local.layers + a.layers + b.layers == 32
    assert abs(a.layers - b.layers) <= 1  # equal workers, equal shares
    assert plan.tensor_split == [a.layers, b.layers + 1] and b.output


def test_everything_on_the_workers_puts_the_output_layer_on_the_last_one() -> None:
    s = shape(n_layer=8, layer_mib=100)
    plan = split(s, SETTINGS, Memory(ram_available=HOST_OVERHEAD + 60 * MIB),
                 [Worker(address="a:1", memory=4 * GIB), Worker(address="b:1", memory=4 * GIB)])  # fmt: skip
    local, a, b = plan.parts
    assert local.layers == 0 and not local.output
    assert b.output and not a.output
    # -ngl counts the output layer: n_layer + 1, split as llama.cpp will place it
    assert plan.gpu_layers == 9 == plan.n_layers
    assert plan.tensor_split == [a.layers, b.layers + 1]
    assert a.layers + b.layers == 8


def test_local_gpus_come_after_the_workers() -> None:
    s = shape(n_layer=12)
    plan = split(s, SETTINGS, Memory(ram_available=64 * MIB, gpu_free=[GPU_OVERHEAD + 2 * GIB]),
                 [Worker(address="a:1", memory=2 * GIB)])  # fmt: skip
    assert [p.kind for p in plan.parts] == ["local", "worker", "gpu"]
    assert [p.name for p in plan.parts] == ["local", "a:1", "GPU0"]
    assert len(plan.tensor_split) == 2
    assert sum(plan.tensor_split) == plan.gpu_layers


def test_a_split_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one RPC worker"):
        split(shape(), SETTINGS, Memory(ram_available=GIB), [])


@pytest.mark.parametrize("ram_mib", [64 + 110, 1024, 4096])
def test_the_local_share_is_what_the_plan_leaves_here(ram_mib: int) -> None:
    """What admission counts against this machine's budget for a split model (``local_share``
    at the plan's -ngl) is the plan's own local part, whichever way the output layer went."""
    s = shape(n_layer=16, layer_mib=100)
    plan = split(s, SETTINGS, Memory(ram_available=ram_mib * MIB), [Worker(address="a:1", memory=2 * GIB)])
    assert local_share(s, SETTINGS, plan.gpu_layers) == plan.parts[0].bytes
    assert local_share(s, SETTINGS, plan.gpu_layers) < estimate(s, SETTINGS).total


def test_the_placement_read_back_from_a_splits_flags_is_the_split() -> None:
    s = shape()
    workers = [Worker(address="10.0.0.2:50052", memory=2 * GIB), Worker(address="10.0.0.3:50052", memory=GIB)]
    memory = Memory(ram_available=GIB)
    plan = split(s, SETTINGS, memory, workers)
    assert placed(s, SETTINGS, memory, workers, plan.tensor_split, plan.gpu_layers) == plan
    # a split not in whole layers is shared out as llama.cpp normalises it
    halves = placed(s, SETTINGS, memory, workers, [1, 1], 8)
    assert halves.tensor_split == [4, 4] and halves.parts[0].layers == 3 and halves.parts[2].output
