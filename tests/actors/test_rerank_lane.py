"""Rerankers and per-token embeddings on the llama.cpp lane: what the engine starts with."""

from __future__ import annotations

from pathlib import Path

import msgspec

from actors.config import EngineConfig, RuntimeConfig
from actors.engines import llamacpp
from actors.engines.llamacpp import LaunchSpec, build_argv
from actors.settings import resolve_launch
from registry.gguf import ModelInfo, read_model_info
from registry.store import ModelRecord
from tests.support import cached_model
from tests.synthetic_reranker import build_reranker


def _flags(spec: LaunchSpec) -> list[str]:
    return build_argv(spec, port=1, api_key="k", binary=None)[3:]


def test_a_reranker_starts_with_reranking_and_a_step_that_holds_a_pair() -> None:
    spec = LaunchSpec(model="r", path="/r.gguf", ctx_per_slot=512, slots=2, reranking=True, prompt_batch=256)
    flags = _flags(spec)
    assert "--reranking" in flags and "--embeddings" not in flags and "--pooling" not in flags
    # an encoder reads query and document in one step: 256 would refuse a pair of 300 tokens
    assert flags[flags.index("-ub") + 1] == "512"


def test_an_engine_that_embeds_reads_a_whole_input_per_step() -> None:
    """llama.cpp refuses to embed an input longer than its step (a 500 "increase the physical
    batch size"): 256 on the CPU lane would cap every embedding input at 256 tokens."""
    spec = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=2048, slots=1, prompt_batch=256)
    assert _flags(spec)[_flags(spec).index("-ub") + 1] == "256"
    embeds = msgspec.structs.replace(spec, embeddings=True)
    assert _flags(embeds)[_flags(embeds).index("-ub") + 1] == "2048" and embeds.prompt_step == 2048
    gpu = msgspec.structs.replace(embeds, prompt_batch=None, ctx_per_slot=256)
    assert gpu.prompt_step == 512 and msgspec.structs.replace(spec, prompt_batch=None).prompt_step is None


def test_token_embeddings_pool_nothing() -> None:
    spec = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=512, slots=1, embeddings=True)
    assert _flags(spec)[_flags(spec).index("--pooling") + 1] == "mean"
    spec = msgspec.structs.replace(spec, token_embeddings=True)
    assert _flags(spec)[_flags(spec).index("--pooling") + 1] == "none"


def test_embeddings_on_several_slots_share_one_kv_stream() -> None:
    """Without it llama.cpp mean-pools the second input of a batch wrongly (the e2e test sees it)."""
    spec = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=512, slots=2, embeddings=True)
    assert "--kv-unified" in _flags(spec)
    assert "--kv-unified" not in _flags(msgspec.structs.replace(spec, slots=1))
    assert "--kv-unified" not in _flags(msgspec.structs.replace(spec, embeddings=False))
    from actors.engines.llamacpp_host import build_params, parse_args

    assert build_params(parse_args(["-m", "/x.gguf", "--kv-unified"])).kv_unified


def test_host_maps_reranking_to_rank_pooling() -> None:
    import xllamacpp as xlc

    from actors.engines.llamacpp_host import build_params, parse_args

    for flag in ("--reranking", "--rerank"):
        p = build_params(parse_args(["-m", "/x.gguf", flag]))
        assert p.embedding and p.pooling_type == xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    p = build_params(parse_args("-m /x.gguf --embeddings --pooling none".split()))
    assert p.pooling_type == xlc.llama_pooling_type.LLAMA_POOLING_TYPE_NONE


def test_the_header_says_which_model_is_a_reranker(tmp_path: Path) -> None:
    info = read_model_info(build_reranker(tmp_path / "r.gguf"))
    assert info.architecture == "bert" and info.pooling_type == 4 and info.reranker
    chat = cached_model()
    if chat is not None:
        assert not read_model_info(chat).reranker


def test_the_synthetic_reranker_is_small_and_the_same_every_time(tmp_path: Path) -> None:
    a, b = build_reranker(tmp_path / "a.gguf"), build_reranker(tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size < 1_000_000


def test_settings_start_a_reranker_with_reranking() -> None:
    record = ModelRecord(
        name="rr",
        digest="sha256:" + "0" * 64,
        size=1,
        path="/r.gguf",
        source="t",
        created_at=0,
        modified_at=0,
    )
    info = ModelInfo(architecture="bert", parameter_count=1, context_length=512, pooling_type=4,
                     tensor_count=0, data_offset=0)  # fmt: skip
    lanes = {"llamacpp": llamacpp.lane(EngineConfig()), "mistralrs": None}
    resolved = resolve_launch(
        RuntimeConfig.in_home("/h"), record, info, lanes=lanes, plan_gpu_layers=lambda ctx, slots: None
    )
    assert resolved.spec.reranking and resolved.spec.lane == "llamacpp"
    assert {s.name: s.value for s in resolved.settings}["reranking"] is True
