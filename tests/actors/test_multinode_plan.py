"""Multi-node vLLM and SGLang plans (``actors.engines.multinode``), pinned.

Two representative models as config.json fixtures (nothing downloaded): a Llama-3.1-405B-like
dense model, which needs two nodes of 8 x 80 GiB at any load, and a Qwen2.5-72B-like one,
which fits one node at the default load and needs the second for 64 slots of 32k tokens.
The argv of both nodes is pinned for each engine, and docs/engines.md must show what
``render`` prints for the two plans. The engines run for real only in the slow test at the
end, which skips with the reason where vLLM or SGLang, a GPU or a model is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.engines import multinode
from actors.engines.multinode import GpuNode, PlanRefused
from actors.engines.spec import LaunchSpec

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]

LLAMA_405B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN_72B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
TWO_NODES = multinode.parse_nodes("2x8xH100-80G@10.0.0.1,10.0.0.2")
OFFLINE = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def llama_plan(lane: multinode.Lane = "vllm") -> multinode.MultiNodePlan:
    facts = multinode.model_facts(LLAMA_405B, name="llama-3.1-405b-instruct")
    spec = LaunchSpec(
        model="llama-3.1-405b-instruct", path="/models/Llama-3.1-405B-Instruct", ctx_per_slot=8192, slots=4,
        architecture=facts.architecture,
    )  # fmt: skip
    return multinode.plan(facts, TWO_NODES, spec, lane=lane, port=8000, api_key="ENGINE_KEY")


def qwen_plan(lane: multinode.Lane = "sglang", *, slots: int = 64) -> multinode.MultiNodePlan:
    facts = multinode.model_facts(QWEN_72B, name="qwen2.5-72b-instruct")
    spec = LaunchSpec(
        model="qwen2.5-72b-instruct", path="/models/Qwen2.5-72B-Instruct", ctx_per_slot=32768, slots=slots,
        architecture=facts.architecture,
    )  # fmt: skip
    return multinode.plan(facts, TWO_NODES, spec, lane=lane, port=8000, api_key="ENGINE_KEY")


# -- the model's facts and the nodes -------------------------------------------------------


def test_facts_from_config() -> None:
    llama = multinode.model_facts(LLAMA_405B, name="l")
    assert llama.weights_bytes == 811_706_777_600  # 405.85e9 parameters in bf16, from the config
    assert (llama.layers, llama.heads, llama.kv_heads) == (126, 128, 8)
    assert llama.kv_bytes_per_token == 126 * 8 * 128 * 2 * 2
    qwen = multinode.model_facts(QWEN_72B, name="q", weights_bytes=145 * 10**9)
    assert qwen.weights_bytes == 145 * 10**9  # the files' own size wins over the estimate
    fp8 = multinode.model_facts({**QWEN_72B, "quantization_config": {"quant_method": "fp8"}}, name="q")
    assert fp8.bytes_per_param == 1.0
    with pytest.raises(PlanRefused, match="num_hidden_layers"):
        multinode.model_facts({"architectures": ["X"]}, name="x")


def test_node_specs() -> None:
    assert TWO_NODES == [
        GpuNode(host="10.0.0.1", gpus=8, gpu_memory=80 * GIB),
        GpuNode(host="10.0.0.2", gpus=8, gpu_memory=80 * GIB),
    ]
    assert [n.host for n in multinode.parse_nodes("3x4x141G")] == ["node0", "node1", "node2"]
    one = multinode.parse_node("host=gpu-a,gpus=4,gpu_mem_gb=48,name=box-a,ifname=ib0")
    assert one == GpuNode(host="gpu-a", gpus=4, gpu_memory=48 * GIB, name="box-a", ifname="ib0")
    for bad in ("2x8", "2x8x80G@a", "axbx80G", "2x8xlots"):
        with pytest.raises(PlanRefused):
            multinode.parse_nodes(bad)
    with pytest.raises(PlanRefused, match="host="):
        multinode.parse_node("gpus=8,gpu_mem_gb=80")


# -- the argv contract --------------------------------------------------------------------------

VLLM_COMMON = [
    "--served-model-name", "llama-3.1-405b-instruct",
    "--max-model-len", "8192",
    "--max-num-seqs", "4",
    "--gpu-memory-utilization", "0.69",
    "--tensor-parallel-size", "8",
    "--pipeline-parallel-size", "2",
    "--disable-uvicorn-access-log",
    "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json",
    "--distributed-executor-backend", "mp",
    "--nnodes", "2",
]  # fmt: skip


def test_llama_405b_vllm_on_two_nodes() -> None:
    plan = llama_plan("vllm")
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_split) == (8, 2, [63, 63])
    head, worker = plan.nodes
    assert head.argv == [
        "vllm", "serve", "/models/Llama-3.1-405B-Instruct",
        "--host", "127.0.0.1", "--port", "8000", "--api-key", "ENGINE_KEY",
        *VLLM_COMMON,
        "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501",
    ]  # fmt: skip
    assert worker.argv == [
        "vllm", "serve", "/models/Llama-3.1-405B-Instruct",
        "--host", "127.0.0.1", "--port", "8000",
        *VLLM_COMMON,
        "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501", "--headless",
    ]  # fmt: skip
    vllm_env = {
        **OFFLINE,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_PP_LAYER_PARTITION": "63,63",
    }
    assert head.env == {**vllm_env, "VLLM_HOST_IP": "10.0.0.1"}
    assert worker.env == {**vllm_env, "VLLM_HOST_IP": "10.0.0.2"}
    assert (head.first_layer, worker.first_layer) == (0, 63)
    assert 49 * GIB < head.need_per_gpu < 51 * GIB and head.memory_fraction == 0.69
    assert (head.role, worker.role) == ("head", "worker") and plan.unused == []


SGLANG_COMMON = [
    "--served-model-name", "qwen2.5-72b-instruct",
    "--context-length", "32768",
    "--max-running-requests", "64",
    "--mem-fraction-static", "0.69",
    "--tp-size", "8",
    "--pp-size", "2",
    "--enable-metrics",
    "--tool-call-parser", "qwen",
    "--nnodes", "2",
]  # fmt: skip


def test_qwen_72b_sglang_on_two_nodes() -> None:
    """64 slots of 32k tokens: 80 GiB of KV cache per GPU on one node, so a second one."""
    plan = qwen_plan("sglang")
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.layer_split) == (8, 2, [40, 40])
    head, worker = plan.nodes
    program = ["python", "-m", "sglang.launch_server", "--model-path", "/models/Qwen2.5-72B-Instruct"]
    assert head.argv == [
        *program, "--host", "127.0.0.1", "--port", "8000", "--api-key", "ENGINE_KEY",
        *SGLANG_COMMON, "--node-rank", "0", "--dist-init-addr", "10.0.0.1:29501",
    ]  # fmt: skip
    assert worker.argv == [
        *program, "--host", "127.0.0.1", "--port", "8000",
        *SGLANG_COMMON, "--node-rank", "1", "--dist-init-addr", "10.0.0.1:29501",
    ]  # fmt: skip
    assert head.env == worker.env == {**OFFLINE, "SGLANG_PP_LAYER_PARTITION": "40,40"}
    assert head.kv_per_gpu == 40 * GIB  # 32768 x 64 tokens x 40 of 80 layers over 8 KV heads


def test_the_other_lane_of_each_model() -> None:
    sgl = llama_plan("sglang")
    assert sgl.nodes[1].argv[-6:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.0.0.1:29501",
    ]
    assert "--api-key" not in sgl.nodes[1].argv and "--pp-size" in sgl.nodes[0].argv
    vl = qwen_plan("vllm")
    assert vl.nodes[1].argv[-1] == "--headless" and "--tool-call-parser" in vl.nodes[0].argv
    assert vl.nodes[0].env["VLLM_PP_LAYER_PARTITION"] == "40,40"


def test_a_model_that_fits_one_node_stays_on_it() -> None:
    plan = qwen_plan("vllm", slots=4)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.unused) == (8, 1, ["10.0.0.2"])
    (head,) = plan.nodes
    assert "--nnodes" not in head.argv and "--pipeline-parallel-size" not in head.argv
    assert "VLLM_PP_LAYER_PARTITION" not in head.env
    assert any("1 of the 2 node(s)" in n for n in plan.notes)


def test_refused_when_it_cannot_fit() -> None:
    facts = multinode.model_facts(LLAMA_405B, name="llama-3.1-405b-instruct")
    spec = LaunchSpec(model="m", path="/m", ctx_per_slot=8192, slots=4)
    with pytest.raises(PlanRefused, match=r"does not fit on 2 node\(s\).*add nodes") as caught:
        multinode.plan(facts, multinode.parse_nodes("2x8x40G"), spec, lane="vllm", port=1, api_key="k")
    assert "tp 8 x pp 2" in str(caught.value)
    with pytest.raises(PlanRefused, match="there are 2 node"):
        multinode.plan(facts, TWO_NODES, spec, lane="vllm", port=1, api_key="k", pipeline_parallel=3)
    with pytest.raises(PlanRefused, match="no nodes"):
        multinode.plan(facts, [], spec, lane="vllm", port=1, api_key="k")


def test_tensor_size_divides_heads_and_gpus() -> None:
    """28 heads (a Qwen2.5-7B-like model) do not divide over 8 GPUs: 4 of them, one node."""
    config = {**QWEN_72B, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
              "num_attention_heads": 28, "num_key_value_heads": 4}  # fmt: skip
    facts = multinode.model_facts(config, name="qwen-7b")
    spec = LaunchSpec(model="q", path="/q", ctx_per_slot=8192, slots=4)
    plan = multinode.plan(facts, TWO_NODES, spec, lane="sglang", port=1, api_key="k")
    assert (plan.tensor_parallel, plan.pipeline_parallel) == (4, 1)
    assert any("do not divide" in n for n in plan.notes)
    with pytest.raises(PlanRefused, match="must divide"):
        multinode.plan(facts, TWO_NODES, spec, lane="sglang", port=1, api_key="k", tensor_parallel=8)


def test_uneven_nodes_split_layers_by_memory() -> None:
    nodes = [GpuNode(host="a", gpus=8, gpu_memory=141 * GIB), GpuNode(host="b", gpus=8, gpu_memory=80 * GIB)]
    facts = multinode.model_facts(LLAMA_405B, name="l")
    spec = LaunchSpec(model="l", path="/l", ctx_per_slot=8192, slots=4)
    plan = multinode.plan(facts, nodes, spec, lane="vllm", port=1, api_key="k", pipeline_parallel=2)
    assert plan.layer_split == [80, 46] and sum(plan.layer_split) == 126
    assert plan.nodes[1].first_layer == 80


# -- what is printed ------------------------------------------------------------------------------


def test_docs_show_the_planned_commands() -> None:
    """docs/engines.md's multi-node examples are render()'s output for the two plans."""
    docs = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    assert "## Multi-node vLLM and SGLang" in docs
    for plan in (llama_plan("vllm"), qwen_plan("sglang")):
        assert multinode.render(plan) in docs, f"docs/engines.md is out of date for {plan.model}"


def _blazar(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BLAZAR_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_cli_plans_without_engine_or_gpu(tmp_path: Path) -> None:
    model = tmp_path / "Qwen2.5-72B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN_72B))
    done = _blazar(tmp_path / "home", "plan", str(model), "--nodes", "2x8x80G@10.0.0.1,10.0.0.2",
                   "--engine", "sglang", "--ctx", "32768", "--slots", "64", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "fits" and doc["tensor_parallel"] == 8 and doc["pipeline_parallel"] == 2
    assert doc["nodes"][1]["argv"][-2:] == ["--dist-init-addr", "10.0.0.1:29501"]
    text = _blazar(tmp_path / "home", "plan", str(model), "--node", "host=a,gpus=8,gpu_mem_gb=80")
    assert text.returncode == 0, text.stderr
    assert "tensor 8 x pipeline 1" in text.stdout and "vllm serve" in text.stdout
    refused = _blazar(tmp_path / "home", "plan", str(model), "--nodes", "1x2x24G", "--json")
    assert refused.returncode == 1 and json.loads(refused.stdout)["verdict"] == "no_fit"


# -- the engines for real (where installed) ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("lane", ["vllm", "sglang"])
def test_planned_head_runs(lane: multinode.Lane) -> None:
    """The plan for this machine's GPUs as one node starts and serves (a multi-node run needs
    two machines: scripts/gpu_check.py checks the plan on a lent GPU machine)."""
    from actors.config import EngineConfig
    from actors.engines import sglang, vllm

    module = vllm if lane == "vllm" else sglang
    found = vllm.find_vllm(None) if lane == "vllm" else sglang.find_sglang(None)
    if found is None or module.lane(EngineConfig()) is None:
        pytest.skip(f"{lane} is not installed here (pip install {lane} on a CUDA machine)")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU here (nvidia-smi not found)")
    folder = os.environ.get("BLAZAR_TEST_HF_MODEL")
    if not folder or not Path(folder, "config.json").is_file():
        pytest.skip("no Hugging Face safetensors model directory: set BLAZAR_TEST_HF_MODEL to one")
    from actors.census import take_census

    census = take_census()
    if not census.gpus:
        pytest.skip(f"no GPU measured here ({census.note})")
    facts = multinode.model_facts(json.loads(Path(folder, "config.json").read_text()), name="probe")
    node = GpuNode(host="127.0.0.1", gpus=1, gpu_memory=min(g.total for g in census.gpus))
    spec = LaunchSpec(model="probe", path=folder, ctx_per_slot=2048, slots=2, architecture=facts.architecture)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    plan = multinode.plan(facts, [node], spec, lane=lane, port=port, api_key="k", program=found.argv)
    from tests.actors.test_gpu_lanes import _chat, _run_until_healthy

    (head,) = plan.nodes
    child = _run_until_healthy(head.argv, head.env, port, module.API.health, 900)
    try:
        assert _chat(port, "probe", "k")["model"] == "probe"
        assert msgspec.to_builtins(plan)["tensor_parallel"] == 1
    finally:
        child.terminate()
        child.wait(60)


def test_gpu_check_plans_the_local_gpus() -> None:
    """scripts/gpu_check.py's dry run, on a census of 8 x 80 GiB as a lent H100 machine has."""
    import importlib.util

    from actors.census import Census, Gpu

    loader = importlib.util.spec_from_file_location("gpu_check_script", ROOT / "scripts" / "gpu_check.py")
    assert loader is not None and loader.loader is not None
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    gpus = [Gpu(index=i, name="H100", total=80 * GIB, used=0, free=80 * GIB) for i in range(8)]
    rows = script.check_multinode(Census(source="nvml", gpus=gpus))
    assert [(r["model"], r["lane"], r["status"]) for r in rows] == [
        ("llama-3.1-405b-like", "vllm", "planned"),
        ("llama-3.1-405b-like", "sglang", "planned"),
        ("qwen2.5-72b-like", "vllm", "planned"),
        ("qwen2.5-72b-like", "sglang", "planned"),
    ]
    assert (rows[0]["tensor_parallel"], rows[0]["pipeline_parallel"]) == (8, 2)
    assert rows[2]["pipeline_parallel"] == 1 and "***" in rows[0]["argv"][0]
    assert script.check_multinode(Census(source="system"))[0]["status"] == "skipped"


def test_a_worker_builds_its_part_from_the_message() -> None:
    """The head sends a worker its part (no key, no port); the worker's argv over its own copy
    of the model is the plan's, with its own path."""
    plan = llama_plan("vllm")
    part = multinode.part_of(plan, 1, TWO_NODES)
    wire = msgspec.json.decode(msgspec.json.encode(part), type=multinode.NodePart)
    assert wire == part and "ENGINE_KEY" not in msgspec.json.encode(part).decode()
    spec = LaunchSpec(model="llama-3.1-405b-instruct", path="/data/store/llama", ctx_per_slot=4096, slots=1,
                      architecture="LlamaForCausalLM")  # fmt: skip
    argv, env = multinode.part_argv(wire, spec)
    expected = [
        ("/data/store/llama" if a == "/models/Llama-3.1-405B-Instruct" else a) for a in plan.nodes[1].argv
    ]
    expected[expected.index("--port") + 1] = "0"
    assert argv == expected and env == plan.nodes[1].env
    with pytest.raises(ValueError, match="workers"):
        multinode.part_of(plan, 0, TWO_NODES)
