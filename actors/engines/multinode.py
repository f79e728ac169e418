"""Multi-node vLLM and SGLang: one safetensors model over several GPU machines, planned.

Pure functions over immutable values, like ``actors/scheduling.py``: what the model is
(``ModelFacts``, read from its config.json and the size of its weights), the machines
(``GpuNode``: address, GPUs, memory per GPU) and the lane give a ``MultiNodePlan``, or a
refusal that says why. Nothing here starts a process or reads a file.

The layout is the one both engines document for a model larger than one machine:
tensor parallelism inside a node (``tp`` GPUs, all of a node's when the model allows it)
and pipeline parallelism across nodes (``pp`` nodes, each a stage that holds a run of
the model's layers). The planner takes the fewest nodes that hold the model at the
configured context and slots, and on them the largest ``tp`` that divides the GPUs of
every node, the attention heads, and the KV heads (or is a multiple of them: each GPU
then keeps a copy of one KV head). The layers are split over the stages in proportion
to each stage's memory and passed to the engine (``VLLM_PP_LAYER_PARTITION``,
``SGLANG_PP_LAYER_PARTITION``), so the split that runs is the one checked here.

Each node's command line is the lane's own single-node flags (``vllm.serve_flags``,
``sglang.serve_flags``) with the parallel sizes, plus the engine's multi-node flags:

- vLLM, its multiprocessing executor across nodes (no Ray): every node runs
  ``vllm serve DIR --tensor-parallel-size T --pipeline-parallel-size P
  --distributed-executor-backend mp --nnodes N --node-rank R --master-addr HEAD
  --master-port PORT``; the nodes of rank above 0 add ``--headless`` (no API server).
- SGLang: every node runs ``python -m sglang.launch_server --model-path DIR --tp-size T
  --pp-size P --nnodes N --node-rank R --dist-init-addr HEAD:PORT``; only rank 0 serves HTTP.

The head (rank 0) serves the OpenAI API on loopback with the engine key, like any engine
the daemon supervises; the others serve nothing and take no key.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from actors.engines import sglang, vllm
from actors.engines._gpu import MAX_FRACTION, memory_fraction
from actors.engines.spec import LaunchSpec
from registry.fit import WEIGHTS_OVERHEAD_TEXT, WEIGHTS_WORK_TEXT

__all__ = [
    "DEFAULT_PROGRAMS",
    "RENDEZVOUS_PORT",
    "GpuNode",
    "ModelFacts",
    "MultiNodePlan",
    "NodeLaunch",
    "NodePart",
    "PartView",
    "PlanRefused",
    "choose",
    "model_facts",
    "node_argv",
    "parse_node",
    "parse_nodes",
    "part_argv",
    "part_of",
    "plan",
    "render",
]

GIB = 1 << 30
Lane = Literal["vllm", "sglang"]

RENDEZVOUS_PORT = 29501
"""The head's port for the engines' own rendezvous (torch.distributed): vLLM's default
``--master-port``; SGLang takes it in ``--dist-init-addr``."""
DEFAULT_PROGRAMS: dict[str, list[str]] = {
    "vllm": ["vllm", "serve"],
    "sglang": ["python", "-m", "sglang.launch_server"],
}
"""What a plan prints when no installed engine is named (planning needs no engine)."""
HEADROOM = 1.10
"""The margin ``_gpu.memory_fraction`` adds to the need; a plan fits when the need with it
is within ``MAX_FRACTION`` of each GPU."""
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


class PlanRefused(ValueError):
    """No plan: the model cannot run on these nodes (the message says why and what to change)."""


class GpuNode(msgspec.Struct, frozen=True, kw_only=True):
    """One machine of the plan."""

    host: str
    """The address the other nodes reach it at (the head's is the engines' rendezvous)."""
    gpus: int
    gpu_memory: int
    """Bytes of memory per GPU (all of a node's GPUs alike)."""
    name: str | None = None
    """Its peer name in ``[[remotes]]`` when it is a Blazar daemon this one federates with."""
    ifname: str | None = None
    """The network interface the engines' collectives use (``NCCL_SOCKET_IFNAME``,
    ``GLOO_SOCKET_IFNAME``); None: NCCL and Gloo pick one."""


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner needs of a model, from its config.json and its weight files."""

    name: str
    architecture: str | None = None
    weights_bytes: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int = 0
    kv_bytes_per_token: int
    """16-bit KV cache bytes per token over all layers."""
    tied_embeddings: bool = False
    bytes_per_param: float = 2.0


class NodeLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """One node's part: what it holds and what it runs."""

    rank: int
    host: str
    name: str | None = None
    role: Literal["head", "worker"]
    gpus: int
    """GPUs it uses (the tensor parallel size)."""
    first_layer: int
    layers: int
    weights_per_gpu: int
    kv_per_gpu: int
    need_per_gpu: int
    """Weights, KV cache and the engine's allowances on each of its GPUs."""
    gpu_memory: int
    memory_fraction: float
    argv: list[str] = []
    env: dict[str, str] = {}


class MultiNodePlan(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    lane: Lane
    tensor_parallel: int
    pipeline_parallel: int
    ctx_per_slot: int
    slots: int
    layer_split: list[int]
    master_addr: str
    master_port: int
    nodes: list[NodeLaunch]
    unused: list[str] = []
    """Hosts given but not needed (the model fits on fewer nodes)."""
    notes: list[str] = []


# -- the model's facts ------------------------------------------------------------------


def _int(source: Mapping[str, Any], key: str) -> int | None:
    value = source.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _bytes_per_param(config: Mapping[str, Any]) -> float:
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        bits = qc.get("bits")
        if isinstance(bits, int) and bits > 0:
            return bits / 8
        if str(qc.get("quant_method", "")).lower() == "fp8":
            return 1.0
    return float(_DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), 2))


def estimate_parameters(config: Mapping[str, Any]) -> int | None:
    """A decoder's parameters from its config.json alone (attention, MLP or experts, norms,
    embeddings): for a plan of a model not downloaded. None when the config lacks a size."""
    text = config.get("text_config")
    c = text if isinstance(text, dict) and "num_hidden_layers" in text else config
    layers, hidden, heads = (
        _int(c, "num_hidden_layers"),
        _int(c, "hidden_size"),
        _int(c, "num_attention_heads"),
    )
    inter = _int(c, "intermediate_size")
    if not (layers and hidden and heads and inter):
        return None
    kv = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or hidden // heads
    attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    experts = _int(c, "num_local_experts") or _int(c, "num_experts") or 1
    expert_inter = _int(c, "moe_intermediate_size") or inter
    mlp = 3 * hidden * expert_inter * experts + (hidden * experts if experts > 1 else 0)
    vocab = _int(c, "vocab_size") or 0
    tied = bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return layers * (attn + mlp + 2 * hidden) + hidden + vocab * hidden * (1 if tied else 2)


def model_facts(config: Mapping[str, Any], *, name: str, weights_bytes: int | None = None) -> ModelFacts:
    """``ModelFacts`` from a config.json's fields; ``weights_bytes`` from the weight files when
    they are there, else estimated from the config (its parameters at its dtype)."""
    text = config.get("text_config")
    c = text if isinstance(text, dict) and "num_hidden_layers" in text else config
    layers, hidden, heads = (
        _int(c, "num_hidden_layers"),
        _int(c, "hidden_size"),
        _int(c, "num_attention_heads"),
    )
    if not (layers and hidden and heads):
        raise PlanRefused(
            f"{name}: config.json has no num_hidden_layers, hidden_size and num_attention_heads — "
            "a multi-node plan needs a Hugging Face decoder's config"
        )
    kv = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or hidden // heads
    per_param = _bytes_per_param(config)
    if weights_bytes is None:
        params = estimate_parameters(config)
        if params is None:
            raise PlanRefused(f"{name}: no weight files and no intermediate_size to estimate them from")
        weights_bytes = int(params * per_param)
    archs = config.get("architectures")
    return ModelFacts(
        name=name,
        architecture=archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None,
        weights_bytes=weights_bytes,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        hidden=hidden,
        vocab=_int(c, "vocab_size") or 0,
        kv_bytes_per_token=layers * kv * head_dim * 2 * 2,
        tied_embeddings=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        bytes_per_param=per_param,
    )


# -- the nodes ----------------------------------------------------------------------------

_MEMORY = re.compile(r"(?:[A-Za-z0-9]+-)?(\d+(?:\.\d+)?)\s*(?:G|GB|GiB)", re.IGNORECASE)


def _gib(text: str, what: str) -> int:
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        try:
            return int(float(text) * GIB)
        except ValueError:
            raise PlanRefused(f"{what}: {text!r} is not a GPU memory size (80G, 80GB, H100-80G)") from None
    return int(float(match.group(1)) * GIB)


def parse_nodes(spec: str) -> list[GpuNode]:
    """``NxGxMEM[@HOST,HOST…]``: N nodes of G GPUs with MEM each (``2x8x80G``,
    ``2x8xH100-80G@10.0.0.1,10.0.0.2``; GiB). Without hosts they are ``node0``, ``node1``…"""
    body, _, hosts_text = spec.partition("@")
    parts = body.split("x", 2)
    if len(parts) != 3 or not parts[0].strip().isdigit() or not parts[1].strip().isdigit():
        raise PlanRefused(f"--nodes {spec!r}: expected NODESxGPUSxMEMORY, e.g. 2x8x80G or 2x8xH100-80G")
    count, gpus = int(parts[0]), int(parts[1])
    memory = _gib(parts[2], f"--nodes {spec!r}")
    hosts = [h.strip() for h in hosts_text.split(",") if h.strip()] if hosts_text else []
    if hosts and len(hosts) != count:
        raise PlanRefused(f"--nodes {spec!r}: {count} node(s) but {len(hosts)} host(s)")
    if count < 1 or gpus < 1:
        raise PlanRefused(f"--nodes {spec!r}: at least one node of one GPU")
    return [
        GpuNode(host=hosts[i] if hosts else f"node{i}", gpus=gpus, gpu_memory=memory) for i in range(count)
    ]


def parse_node(spec: str) -> GpuNode:
    """``host=H,gpus=G,gpu_mem_gb=M[,name=PEER][,ifname=IF]``: one node (GiB)."""
    fields: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise PlanRefused(f"--node {spec!r}: {item!r} is not KEY=VALUE")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"host", "gpus", "gpu_mem_gb", "name", "ifname"}
    if unknown or not {"host", "gpus", "gpu_mem_gb"} <= set(fields):
        raise PlanRefused(
            f"--node {spec!r}: expected host=…,gpus=…,gpu_mem_gb=… (and optionally name=…, ifname=…)"
        )
    if not fields["gpus"].isdigit() or int(fields["gpus"]) < 1:
        raise PlanRefused(f"--node {spec!r}: gpus must be a positive whole number")
    return GpuNode(
        host=fields["host"],
        gpus=int(fields["gpus"]),
        gpu_memory=_gib(fields["gpu_mem_gb"], f"--node {spec!r}"),
        name=fields.get("name"),
        ifname=fields.get("ifname"),
    )


# -- choosing the sizes -----------------------------------------------------------------------


class _Stage(msgspec.Struct, frozen=True, kw_only=True):
    layers: int
    first: int
    weights: int
    kv: int
    need: int


def _tp_ok(facts: ModelFacts, tp: int) -> bool:
    kv_ok = facts.kv_heads % tp == 0 or tp % facts.kv_heads == 0
    return facts.heads % tp == 0 and kv_ok


def _split(layers: int, weights: Sequence[int]) -> list[int]:
    """Layers per stage in proportion to ``weights`` (largest remainders first; each stage at
    least one)."""
    total = sum(weights)
    exact = [layers * w / total for w in weights]
    counts = [max(1, math.floor(x)) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: -(exact[i] - math.floor(exact[i])))
    i = 0
    while sum(counts) < layers:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > layers:
        j = max(range(len(counts)), key=lambda k: counts[k] - exact[k])
        counts[j] -= 1
    return counts


def _stages(facts: ModelFacts, nodes: Sequence[GpuNode], tp: int, ctx: int, slots: int) -> list[_Stage]:
    pp = len(nodes)
    split = _split(facts.layers, [n.gpu_memory for n in nodes])
    embed = int(facts.vocab * facts.hidden * facts.bytes_per_param)
    head = 0 if facts.tied_embeddings else embed
    per_layer = max(0, facts.weights_bytes - embed - head) / facts.layers
    kv_shards = min(tp, facts.kv_heads)  # past the KV heads, each GPU keeps a copy of one
    stages: list[_Stage] = []
    first = 0
    for s, count in enumerate(split):
        weights = per_layer * count + (embed if s == 0 else 0) + (head if s == pp - 1 else 0)
        weights_gpu = int(weights / tp)
        kv_gpu = facts.kv_bytes_per_token * count * ctx * slots // (facts.layers * kv_shards)
        need = weights_gpu + kv_gpu + WEIGHTS_WORK_TEXT + WEIGHTS_OVERHEAD_TEXT
        stages.append(_Stage(layers=count, first=first, weights=weights_gpu, kv=kv_gpu, need=need))
        first += count
    return stages


def _fits(stages: Sequence[_Stage], nodes: Sequence[GpuNode]) -> bool:
    return all(s.need * HEADROOM <= MAX_FRACTION * n.gpu_memory for s, n in zip(stages, nodes, strict=True))


def choose(
    facts: ModelFacts,
    nodes: Sequence[GpuNode],
    *,
    ctx_per_slot: int,
    slots: int,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
) -> tuple[int, int]:
    """``(tp, pp)``: the fewest nodes that hold the model, and on them the largest tensor
    parallel size that divides every node's GPUs and the heads (see the module docstring).
    A size given is kept (checked). Raises ``PlanRefused`` with the reason otherwise."""
    if not nodes:
        raise PlanRefused(
            "no nodes to plan over — give --nodes (2x8x80G) or --node host=…,gpus=…,gpu_mem_gb=…"
        )
    if pipeline_parallel is not None and not 1 <= pipeline_parallel <= len(nodes):
        raise PlanRefused(f"pipeline parallel size {pipeline_parallel}: there are {len(nodes)} node(s)")
    if pipeline_parallel is not None and pipeline_parallel > facts.layers:
        raise PlanRefused(f"{facts.name} has {facts.layers} layers: fewer than {pipeline_parallel} stages")
    pps = [pipeline_parallel] if pipeline_parallel else range(1, min(len(nodes), facts.layers) + 1)
    tried: list[str] = []
    for pp in pps:
        used = nodes[:pp]
        most = min(n.gpus for n in used)
        if tensor_parallel is not None:
            if most % tensor_parallel or not _tp_ok(facts, tensor_parallel):
                raise PlanRefused(
                    f"tensor parallel size {tensor_parallel} must divide the GPUs of each node ({most}) "
                    f"and the {facts.heads} attention heads, and divide or be a multiple of the "
                    f"{facts.kv_heads} KV heads"
                )
            sizes = [tensor_parallel]
        else:
            sizes = [tp for tp in range(most, 0, -1) if most % tp == 0 and _tp_ok(facts, tp)]
        for tp in sizes:
            stages = _stages(facts, used, tp, ctx_per_slot, slots)
            if _fits(stages, used):
                return tp, pp
        tp = sizes[0]
        worst = max(_stages(facts, used, tp, ctx_per_slot, slots), key=lambda s: s.need)
        tried.append(f"tp {tp} x pp {pp}: {worst.need * HEADROOM / GIB:.1f} GiB per GPU")
    room = min(n.gpu_memory for n in nodes) * MAX_FRACTION / GIB
    raise PlanRefused(
        f"{facts.name} does not fit on {len(nodes)} node(s) at {ctx_per_slot} tokens x {slots} slot(s): "
        f"{'; '.join(tried[-2:])} with a {HEADROOM - 1:.0%} margin, more than the {room:.1f} GiB "
        f"({MAX_FRACTION:.0%}) a GPU gives — add nodes, lower ctx or slots, or use a quantized "
        "checkpoint (fp8, AWQ)"
    )


# -- the command lines --------------------------------------------------------------------------


def node_argv(
    lane: Lane,
    spec: LaunchSpec,
    *,
    rank: int,
    nnodes: int,
    tensor_parallel: int,
    pipeline_parallel: int,
    master_addr: str,
    master_port: int,
    memory_fraction: float,
    port: int,
    api_key: str,
    program: Sequence[str] | None = None,
    tool_parser: str | None = None,
) -> list[str]:
    """One node's command line (the engine's own, without our watchdog): the lane's flags with
    the parallel sizes, then the multi-node flags. The head (rank 0) gets the port and key; the
    others serve no HTTP. A worker's daemon calls this with its own model path in ``spec``."""
    head = rank == 0
    key = api_key if head else None
    argv = list(program or DEFAULT_PROGRAMS[lane])
    gpu = spec.gpu
    if lane == "vllm":
        argv += vllm.serve_flags(
            spec, port=port, api_key=key, gpu_memory_fraction=memory_fraction,
            tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
            quantization=gpu.quantization, dtype=gpu.dtype,
            tool_parser=tool_parser or gpu.tool_parser or vllm.tool_parser_for(spec.architecture),
        )  # fmt: skip
        if nnodes > 1:
            argv += [
                "--distributed-executor-backend", "mp",
                "--nnodes", str(nnodes),
                "--node-rank", str(rank),
                "--master-addr", master_addr,
                "--master-port", str(master_port),
            ]  # fmt: skip
            if not head:
                argv.append("--headless")
        return argv
    argv += sglang.serve_flags(
        spec, port=port, api_key=key, mem_fraction=memory_fraction,
        tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
        quantization=gpu.quantization, dtype=gpu.dtype,
        tool_parser=tool_parser or gpu.tool_parser or sglang.tool_parser_for(spec.architecture),
    )  # fmt: skip
    if nnodes > 1:
        argv += [
            "--nnodes", str(nnodes),
            "--node-rank", str(rank),
            "--dist-init-addr", f"{master_addr}:{master_port}",
        ]  # fmt: skip
    return argv


def node_env(lane: Lane, spec: LaunchSpec, node: GpuNode, split: Sequence[int]) -> dict[str, str]:
    """What a node's engine adds to its environment: the lane's own, the layer split when
    there is more than one stage, this node's address (vLLM), the collectives' interface."""
    env = vllm.launch_env(spec) if lane == "vllm" else sglang.launch_env(spec)
    if len(split) > 1:
        partition = ",".join(str(n) for n in split)
        env["VLLM_PP_LAYER_PARTITION" if lane == "vllm" else "SGLANG_PP_LAYER_PARTITION"] = partition
    if lane == "vllm":
        env["VLLM_HOST_IP"] = node.host
    if node.ifname:
        env["NCCL_SOCKET_IFNAME"] = node.ifname
        env["GLOO_SOCKET_IFNAME"] = node.ifname
    return env


def plan(
    facts: ModelFacts,
    nodes: Sequence[GpuNode],
    spec: LaunchSpec,
    *,
    lane: Lane,
    port: int,
    api_key: str,
    program: Sequence[str] | None = None,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    master_port: int = RENDEZVOUS_PORT,
) -> MultiNodePlan:
    """The plan for ``facts`` at ``spec``'s context and slots over ``nodes`` (the head first),
    with every node's command line; raises ``PlanRefused`` with the reason when it cannot fit."""
    if lane not in ("vllm", "sglang"):
        raise PlanRefused(f"multi-node plans are for the vLLM and SGLang lanes, not {lane!r}")
    tp, pp = choose(
        facts, nodes, ctx_per_slot=spec.ctx_per_slot, slots=spec.slots,
        tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
    )  # fmt: skip
    used = list(nodes[:pp])
    stages = _stages(facts, used, tp, spec.ctx_per_slot, spec.slots)
    split = [s.layers for s in stages]
    master = used[0].host
    launches: list[NodeLaunch] = []
    for rank, (node, stage) in enumerate(zip(used, stages, strict=True)):
        fraction = memory_fraction(stage.need, node.gpu_memory, headroom=HEADROOM)
        argv = node_argv(
            lane, spec, rank=rank, nnodes=pp, tensor_parallel=tp, pipeline_parallel=pp,
            master_addr=master, master_port=master_port, memory_fraction=fraction,
            port=port, api_key=api_key, program=program,
        )  # fmt: skip
        launches.append(
            NodeLaunch(
                rank=rank, host=node.host, name=node.name, role="head" if rank == 0 else "worker",
                gpus=tp, first_layer=stage.first, layers=stage.layers, weights_per_gpu=stage.weights,
                kv_per_gpu=stage.kv, need_per_gpu=stage.need, gpu_memory=node.gpu_memory,
                memory_fraction=fraction, argv=argv, env=node_env(lane, spec, node, split),
            )
        )  # fmt: skip
    notes = [
        "weights from the files (or config.json), 16-bit KV cache from config.json, "
        f"{(WEIGHTS_WORK_TEXT + WEIGHTS_OVERHEAD_TEXT) / GIB:.1f} GiB per GPU for activations and the "
        "engine; the memory fraction adds a 10% margin"
    ]
    if pp < len(nodes):
        notes.append(f"fits on {pp} of the {len(nodes)} node(s): the others are left out")
    if any(n.gpus > tp for n in used):
        notes.append(
            f"tensor parallel {tp}: the attention heads ({facts.heads}) do not divide over more GPUs"
        )
    if lane == "vllm" and pp > 1:
        notes.append(
            "vLLM's multi-node flags without Ray (--nnodes, --headless) need a release that has them"
        )
    return MultiNodePlan(
        model=spec.alias or spec.model, lane=lane, tensor_parallel=tp, pipeline_parallel=pp,
        ctx_per_slot=spec.ctx_per_slot, slots=spec.slots, layer_split=split, master_addr=master,
        master_port=master_port, nodes=launches, unused=[n.host for n in nodes[pp:]], notes=notes,
    )  # fmt: skip


class NodePart(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """What the head's daemon tells a worker node's daemon: start your part of this plan.

    Everything a worker needs to build its command line with ``node_argv`` over the model in
    its own store (its path may differ from the head's): the sizes, its rank, the layer split
    and the rendezvous. It carries no key and no port (a worker serves no HTTP)."""

    model: str
    lane: Lane
    rank: int
    nnodes: int
    tensor_parallel: int
    pipeline_parallel: int
    layer_split: list[int]
    master_addr: str
    master_port: int
    memory_fraction: float
    ctx_per_slot: int
    slots: int
    host: str
    """The worker's own address (``VLLM_HOST_IP``)."""
    ifname: str | None = None
    port: int = 0
    """The head's engine port, which every node's command line carries (a worker serves no
    HTTP on it: vLLM's headless node ignores it, SGLang's derives its own ports from it)."""
    lease_s: float = 0.0
    """The worker stops the part unless the head asks after it within this many seconds (the
    head's poll renews it), so a head that dies leaves no part running; 0: until stopped."""


class PartView(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's part as its daemon reports it (``/admin/multinode/parts``)."""

    id: str
    model: str
    lane: Lane
    rank: int
    state: Literal["running", "exited", "stopped"]
    pid: int | None
    returncode: int | None = None
    reason: str | None = None
    """Why it is no longer running: how it exited, or who stopped it."""
    argv: list[str]
    started_at: float
    stderr_tail: str = ""


def part_of(plan: MultiNodePlan, rank: int, nodes: Sequence[GpuNode], *, port: int = 0) -> NodePart:
    """The message for the node of ``rank`` (above 0) of ``plan`` made over ``nodes``; ``port``:
    the head's engine port, as the plan's command lines have it."""
    if not 0 < rank < len(plan.nodes):
        raise ValueError(f"rank {rank}: the workers of this plan are 1..{len(plan.nodes) - 1}")
    node = plan.nodes[rank]
    return NodePart(
        model=plan.model, lane=plan.lane, rank=rank, nnodes=len(plan.nodes),
        tensor_parallel=plan.tensor_parallel, pipeline_parallel=plan.pipeline_parallel,
        layer_split=plan.layer_split, master_addr=plan.master_addr, master_port=plan.master_port,
        memory_fraction=node.memory_fraction, ctx_per_slot=plan.ctx_per_slot, slots=plan.slots,
        host=node.host, ifname=nodes[rank].ifname, port=port,
    )  # fmt: skip


def part_argv(
    part: NodePart, spec: LaunchSpec, program: Sequence[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """A worker daemon's argv and environment for ``part``, over ``spec`` (its own model path;
    the context and slots are the plan's): the same ``node_argv`` the plan printed."""
    spec = msgspec.structs.replace(spec, ctx_per_slot=part.ctx_per_slot, slots=part.slots)
    argv = node_argv(
        part.lane, spec, rank=part.rank, nnodes=part.nnodes, tensor_parallel=part.tensor_parallel,
        pipeline_parallel=part.pipeline_parallel, master_addr=part.master_addr,
        master_port=part.master_port, memory_fraction=part.memory_fraction, port=part.port, api_key="",
        program=program,
    )  # fmt: skip
    node = GpuNode(host=part.host, gpus=part.tensor_parallel, gpu_memory=0, ifname=part.ifname)
    return argv, node_env(part.lane, spec, node, part.layer_split)


def render(plan: MultiNodePlan) -> str:
    """Each node's command as shell lines: its environment, the program, then one flag with
    its value per line (``\\`` between): what ``blazar plan --nodes`` prints and
    docs/engines.md shows."""
    blocks: list[str] = []
    for node in plan.nodes:
        last = node.first_layer + node.layers - 1
        title = f"# node {node.rank} ({node.role}) {node.host}: {node.gpus} GPU(s)"
        title += f", layers {node.first_layer}-{last}"
        groups: list[list[str]] = [[f"{k}={v}" for k, v in sorted(node.env.items())], []]
        for word in node.argv:  # the program with its positionals, then a line per long flag
            if word.startswith("--"):
                groups.append([])
            groups[-1].append(word)
        lines = [" ".join(shlex.quote(w) for w in g) for g in groups if g]
        body = " \\\n  ".join(lines)
        blocks.append(f"{title}\n{body}")
    return "\n\n".join(blocks)
