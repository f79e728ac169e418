"""Splitting one GGUF model over this machine and llama.cpp RPC workers: a pure plan.

llama.cpp's RPC backend makes each ``rpc-server`` a device of the main engine. The
engine places layers as it places them on GPUs, counting the output layer as the last
of ``n_layer + 1``: the first ``n_layer + 1 - ngl`` stay on the local CPU, the last
``ngl`` (the output layer among them) go to the devices in order, the RPC devices first
(llama.cpp puts them at the front of its device list), then the local GPUs;
``--tensor-split`` gives each device its share. Each layer's KV cache lives with it.

``split`` decides how many layers each part holds so that each part's share of the
model is proportional to the memory it has, and checks every part against its
memory: the local machine (system RAM, or its GPUs' free memory) and each worker's
advertised memory (``[models."NAME"] rpc_memory_mb``: ``rpc-server`` reports its free
memory only over its own protocol, to the engine that connects to it).

It returns the flags the engine is started with: ``-ngl`` and ``--tensor-split``
with whole layer counts per device (llama.cpp normalises the split and gives device
``j`` the layers whose offset from the first offloaded layer lies in
``[sum(split[:j]), sum(split[:j+1]))``, so counts are exact).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .fit import GPU_OVERHEAD, HOST_OVERHEAD, MIB, Memory, Settings, compute_buffer, kv_cache
from .shape import ModelShape

__all__ = ["RPC_WORKER_OVERHEAD", "Part", "RpcSplit", "Worker", "local_share", "placed", "split"]

RPC_WORKER_OVERHEAD = 64 * MIB
"""An ``rpc-server`` process beyond the buffers it holds for the engine (its runtime and
the graph it receives). An allowance: measured only on a CPU worker (docs/federation.md)."""

PartKind = Literal["local", "worker", "gpu"]


class Worker(msgspec.Struct, frozen=True, kw_only=True):
    address: str
    """``host:port`` of its ``rpc-server``."""
    memory: int
    """Bytes it offers (advertised in the config)."""


class Part(msgspec.Struct, frozen=True, kw_only=True):
    """One place that holds part of the model."""

    name: str
    """``local`` (this machine's CPU and RAM), the worker's ``host:port``, or ``GPU0``…"""
    kind: PartKind
    layers: int
    """Repeating layers it holds (the output layer counted apart)."""
    first_layer: int | None
    """Index of its first repeating layer; None when it holds none."""
    output: bool
    """It holds the output layer."""
    bytes: int
    """Weights, KV cache, compute buffer and process overhead it would hold."""
    available: int
    headroom: int


class RpcSplit(msgspec.Struct, frozen=True, kw_only=True):
    verdict: Literal["fits", "no_fit"]
    parts: list[Part]
    gpu_layers: int
    """``-ngl``: layers on the devices (workers and local GPUs), the output layer counted."""
    tensor_split: list[int]
    """``--tensor-split``: layers per device, workers first then local GPUs."""
    n_layers: int
    """Repeating layers plus the output layer (as ``-ngl`` counts them)."""
    total: int
    """All parts together."""
    notes: list[str] = []


def _targets(weights: list[int], caps: list[int]) -> list[int]:
    """Layers per part, in order, so that each part's bytes follow its share of ``caps``.

    Walks the layers once: a part takes the next layer while the bytes given so far stay
    within the running total of the shares up to it (rounded to the nearer layer
    boundary); the last part takes the rest."""
    total = sum(weights)
    room = sum(max(0, c) for c in caps)
    counts = [0] * len(caps)
    if not caps:
        return counts
    if room <= 0:
        counts[-1] = len(weights)
        return counts
    i = 0
    given = 0
    bound = 0.0
    for part, cap in enumerate(caps[:-1]):
        bound += total * max(0, cap) / room
        while i < len(weights) and given + weights[i] / 2 <= bound:
            given += weights[i]
            counts[part] += 1
            i += 1
    counts[-1] = len(weights) - i
    return counts


def split(
    shape: ModelShape,
    settings: Settings,
    memory: Memory,
    workers: list[Worker],
) -> RpcSplit:
    """How ``shape`` at ``settings`` would be spread over this machine (``memory``) and
    ``workers``, with the ``-ngl`` and ``--tensor-split`` that make llama.cpp do it.

    The local CPU holds the token embeddings and the engine process in any case; the
    layers are shared in proportion to each part's memory left after its fixed costs
    (a compute buffer where it holds layers, the process or runtime allowance)."""
    if not workers:
        raise ValueError("a split needs at least one RPC worker")
    costs = _Costs(shape, settings, memory, workers)
    caps = [a - f for a, f in zip(costs.available, costs.fixed, strict=True)]
    # llama.cpp counts the output layer as the last of n_layer + 1 and offloads from the end:
    # -ngl k puts the last k of them on the devices, so the output layer goes first, to the
    # last device (checked against its load log: -ngl 29 of 30 layers keeps layers 0-1 here).
    return costs.parts(_targets([*costs.layer, shape.output_weights], caps))


def placed(
    shape: ModelShape,
    settings: Settings,
    memory: Memory,
    workers: list[Worker],
    tensor_split: list[int],
    gpu_layers: int | None,
) -> RpcSplit:
    """Where an engine started with ``-ngl gpu_layers --tensor-split tensor_split`` over
    ``workers`` (and this machine's GPUs) holds ``shape``'s layers: ``split``'s answer for
    the flags it gave, read back from the flags (a split planned earlier, or by hand)."""
    costs = _Costs(shape, settings, memory, workers)
    n_all = shape.n_layer + 1
    devices = len(costs.names) - 1
    on_devices = n_all if gpu_layers is None else max(0, min(gpu_layers, n_all))
    shares = [max(0, c) for c in tensor_split[:devices]] + [0] * max(0, devices - len(tensor_split))
    if sum(shares) != on_devices:  # llama.cpp normalises a split that is not in whole layers
        weights = shares if sum(shares) else [1] * devices
        shares = _targets([1] * on_devices, weights) if devices else []
    return costs.parts([n_all - on_devices, *shares])


class _Costs:
    """Each part's memory and fixed costs for one model, its settings and workers."""

    def __init__(self, shape: ModelShape, settings: Settings, memory: Memory, workers: list[Worker]) -> None:
        self.shape = shape
        kvc = kv_cache(shape, settings)
        compute = compute_buffer(shape, settings)
        self.layer = [w + kv for w, kv in zip(shape.layer_weights, kvc.per_layer, strict=True)]
        logits = shape.n_vocab * 4 * settings.slots + MIB
        gpus = [max(0, free - GPU_OVERHEAD) for free in memory.gpu_free]
        self.local_fixed = shape.input_weights + HOST_OVERHEAD + logits
        # Parts in llama.cpp's order: the CPU's first layers, then the devices.
        self.names: list[tuple[str, PartKind]] = [("local", "local")]
        self.names += [(w.address, "worker") for w in workers]
        self.names += [(f"GPU{i}", "gpu") for i in range(len(gpus))]
        self.available = [memory.ram_available, *(w.memory for w in workers), *gpus]
        self.fixed = [self.local_fixed + compute]
        self.fixed += [RPC_WORKER_OVERHEAD + compute] * len(workers) + [compute] * len(gpus)

    def parts(self, combined: list[int]) -> RpcSplit:
        """The split that gives each part ``combined[j]`` of the ``n_layer + 1`` layers (the
        output layer counted last, so it goes to the last part that takes any)."""
        shape, layer, fixed, available = self.shape, self.layer, self.fixed, self.available
        output_on = max((j for j, c in enumerate(combined) if c), default=0)
        device_counts = combined[1:]
        counts = list(combined)
        counts[output_on] = max(0, counts[output_on] - 1)
        parts: list[Part] = []
        start = 0
        for j, ((name, kind), count) in enumerate(zip(self.names, counts, strict=True)):
            held = sum(layer[start : start + count]) + (shape.output_weights if j == output_on else 0)
            holds = count > 0 or j == output_on
            used = held + (fixed[j] if holds else self.local_fixed if j == 0 else 0)
            parts.append(
                Part(
                    name=name,
                    kind=kind,
                    layers=count,
                    first_layer=start if count else None,
                    output=j == output_on,
                    bytes=used,
                    available=available[j],
                    headroom=available[j] - used,
                )
            )
            start += count
        fits = all(p.headroom >= 0 for p in parts)
        notes = [
            "each part's compute buffer is counted in full (an estimate that errs high); "
            f"a worker's rpc-server is allowed {RPC_WORKER_OVERHEAD // MIB} MiB beyond its buffers",
            "workers' memory is what the config advertises (rpc_memory_mb), not measured from here",
        ]
        if not fits:
            short = [p.name for p in parts if p.headroom < 0]
            notes.append(
                f"short of memory: {', '.join(short)} — add a worker, raise its memory, or lower ctx"
            )
        return RpcSplit(
            verdict="fits" if fits else "no_fit",
            parts=parts,
            gpu_layers=sum(device_counts),
            tensor_split=list(device_counts),
            n_layers=shape.n_layer + 1,
            total=sum(p.bytes for p in parts),
            notes=notes,
        )


def local_share(shape: ModelShape, settings: Settings, gpu_layers: int) -> int:
    """Bytes this machine's RAM holds for a split model started with ``-ngl gpu_layers``: the
    token embeddings, the engine process, the output logits, and the first
    ``n_layer + 1 - gpu_layers`` layers (with their KV cache and a compute buffer); the
    output layer too when nothing is offloaded."""
    n = shape.n_layer
    on_devices = max(0, min(gpu_layers, n + 1))
    kept = min(n, n + 1 - on_devices)
    kvc = kv_cache(shape, settings)
    layers = sum(w + kv for w, kv in list(zip(shape.layer_weights, kvc.per_layer, strict=True))[:kept])
    held = shape.input_weights + HOST_OVERHEAD + shape.n_vocab * 4 * settings.slots + MIB + layers
    if on_devices == 0:
        held += shape.output_weights
    if kept or on_devices == 0:
        held += compute_buffer(shape, settings)
    return held
