"""Speculative decoding and LoRA adapters at launch: draft pairing, the governor, the engine's
flags (``llama-server`` and our xllamacpp host alike), and where ``blazar explain`` says so."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from actors.config import EngineConfig, ModelOverride, RuntimeConfig, Speculation
from actors.engines import llamacpp
from actors.engines.llamacpp import build_argv, speculation_flags
from actors.engines.llamacpp_host import build_params, parse_args
from actors.engines.spec import LaunchSpec, LoraLoad, SpecLoad
from actors.settings import resolve_launch
from actors.speculation import (
    MIN_DRAFTED,
    PARK_AFTER,
    RESUME_AFTER_S,
    WINDOW_S,
    Candidate,
    GovernorState,
    SpeculationBook,
    Vocabulary,
    govern,
    pair_problem,
    vocabulary,
)
from registry.gguf import ModelInfo
from registry.store import Adapter, ModelRecord

VOCAB = Vocabulary(model="gpt2", pre="smollm", size=49152, bos=1, eos=2)


def _candidate(name: str, **kw: Any) -> Candidate:
    fields: dict[str, Any] = {"name": name, "digest": f"sha256:{name}", "path": f"/{name}.gguf",
                              "format": "gguf", "size": 100, "lane": "llamacpp", "vocab": VOCAB}  # fmt: skip
    return Candidate(**{**fields, **kw})


BIG = _candidate("big", size=1000)


@pytest.mark.parametrize(
    ("draft", "why"),
    [
        (_candidate("big", size=10), "the model itself"),
        (_candidate("copy", digest="sha256:big"), "the model itself"),
        (_candidate("st", format="safetensors"), "own format"),
        (
            _candidate("other", vocab=msgspec.structs.replace(VOCAB, pre="qwen2")),
            "share the model's vocabulary",
        ),
        (_candidate("other", vocab=msgspec.structs.replace(VOCAB, eos=7)), "BOS/EOS"),
        (_candidate("other", vocab=msgspec.structs.replace(VOCAB, size=60000)), "more than 128 apart"),
        (_candidate("huge", size=5000), "not smaller"),
    ],
)
def test_a_draft_that_cannot_pair_is_refused_with_the_reason(draft: Candidate, why: str) -> None:
    problem = pair_problem(BIG, draft)
    assert problem is not None and why in problem


def test_a_small_draft_of_the_same_vocabulary_pairs() -> None:
    assert pair_problem(BIG, _candidate("small", vocab=msgspec.structs.replace(VOCAB, size=49200))) is None
    mistral = msgspec.structs.replace(BIG, lane="mistralrs")
    assert "llama.cpp lane" in (pair_problem(mistral, _candidate("small")) or "")


def test_vocabulary_comes_from_the_header_values() -> None:
    values = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}  # fmt: skip
    assert vocabulary(values, {"tokenizer.ggml.tokens": 49152}) == VOCAB


def _window(state: GovernorState, start: float, drafted: int, accepted: int) -> tuple[GovernorState, Any]:
    """One window's traffic: a request at its start, one at its end that closes it."""
    state, effect = govern(state, now_s=start, drafted=drafted, accepted=accepted)
    assert effect is None
    return govern(state, now_s=start + WINDOW_S)


def test_the_governor_parks_after_low_windows_and_resumes_later() -> None:
    state, effect = _window(GovernorState(), 0.0, 100, 5)  # 5 % accepted
    assert effect is None and state.low_windows == 1 and state.last_acceptance == pytest.approx(0.05)
    state, effect = _window(state, WINDOW_S, 100, 60)  # a good window resets the count
    assert effect is None and state.low_windows == 0
    for i in range(PARK_AFTER):
        state, effect = _window(state, (2 + i) * WINDOW_S, 200, 10)
    assert effect == "park" and state.parked_at_s is not None
    assert state.reason is not None and "acceptance 0.05 < 0.15" in state.reason
    parked_at = state.parked_at_s
    state, effect = govern(state, now_s=parked_at + RESUME_AFTER_S - 1, drafted=0)
    assert effect is None and state.parked_at_s == parked_at
    state, effect = govern(state, now_s=parked_at + RESUME_AFTER_S)
    assert effect == "resume" and state.parked_at_s is None and state.low_windows == 0


def test_a_window_with_few_drafts_is_not_judged() -> None:
    state = GovernorState()
    for i in range(PARK_AFTER + 2):
        state, effect = _window(state, i * WINDOW_S, MIN_DRAFTED - 1, 0)
        assert effect is None
    assert state.low_windows == 0 and state.last_acceptance is None


def test_the_book_counts_per_model_and_parks_through_the_governor() -> None:
    book = SpeculationBook()
    effects = []
    for i in range(PARK_AFTER):
        effects.append(book.observe("m", 100, 1, now_s=i * WINDOW_S))
        effects.append(book.observe("m", 100, 1, now_s=(i + 1) * WINDOW_S - 0.001))
    effects.append(book.observe("m", 0, 0, now_s=PARK_AFTER * WINDOW_S + 1))
    assert "park" in effects
    assert book.parked("m") is not None and book.parked("other") is None
    (row,) = book.statistics().models
    assert (row.model, row.drafted_total, row.accepted_total, row.parked) == ("m", 400, 4, True)
    # Parked, the model drafts nothing; its requests still move the governor's clock.
    resumed_at = PARK_AFTER * WINDOW_S + 1 + RESUME_AFTER_S  # parked by the call at that +1
    assert book.observe("m", 0, 0, now_s=resumed_at) == "resume" and book.parked("m") is None
    assert book.observe("plain", 0, 0, now_s=0) is None
    assert [m.model for m in book.statistics().models] == ["m"]  # never speculated: not listed
    off = SpeculationBook(governor=False)
    assert all(off.observe("m", 100, 0, now_s=t * WINDOW_S) is None for t in range(10))
    assert off.statistics().models[0].drafted_total == 1000 and off.parked("m") is None


def _spec(**kw: Any) -> LaunchSpec:
    return LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=1024, slots=2, **kw)


def test_flags_of_a_draft_n_grams_and_adapters() -> None:
    assert speculation_flags(_spec()) == []
    draft = SpecLoad(draft_model="d", draft_path="/d.gguf", max=12, min=2)
    assert speculation_flags(_spec(speculation=draft)) == [
        "--model-draft", "/d.gguf", "--spec-draft-n-max", "12", "--spec-draft-n-min", "2",
    ]  # fmt: skip
    simple = SpecLoad(ngram="ngram-simple", max=16)
    assert speculation_flags(_spec(speculation=simple)) == ["--spec-type", "ngram-simple",
                                                            "--spec-ngram-simple-size-m", "16"]  # fmt: skip
    mod = SpecLoad(ngram="ngram-mod", max=8)
    assert speculation_flags(_spec(speculation=mod)) == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "0",
    ]  # fmt: skip
    loras = [LoraLoad(name="a", path="/a.gguf", scale=0.5), LoraLoad(name="b", path="/b.gguf")]
    argv = build_argv(_spec(loras=loras, speculation=mod), port=1, api_key="k", binary="/bin/llama-server")
    joined = " ".join(argv)
    assert "--lora-scaled /a.gguf 0.5 --lora-scaled /b.gguf 1 --spec-type ngram-mod" in joined


def test_the_host_maps_the_same_flags_onto_xllamacpp() -> None:
    argv = build_argv(
        _spec(loras=[LoraLoad(name="a", path="/a.gguf", scale=0.5)], speculation=SpecLoad(ngram="ngram-mod")),
        port=1, api_key="k", binary=None,
    )  # fmt: skip
    p = build_params(parse_args(argv[argv.index("actors.engines.llamacpp_host") + 1 :]))
    assert [(a.path, a.scale) for a in p.lora_adapters] == [("/a.gguf", 0.5)]
    assert [t.name for t in p.speculative.types] == ["COMMON_SPECULATIVE_TYPE_NGRAM_MOD"]
    assert (p.speculative.ngram_mod.n_max, p.speculative.ngram_mod.n_min) == (16, 0)
    draft = SpecLoad(draft_model="d", draft_path="/d.gguf", max=12, min=2)
    argv = build_argv(_spec(speculation=draft), port=1, api_key="k", binary=None)
    p = build_params(parse_args(argv[argv.index("actors.engines.llamacpp_host") + 1 :]))
    assert p.speculative.draft.mparams.path == "/d.gguf"
    assert (p.speculative.draft.n_max, p.speculative.draft.n_min) == (12, 2)
    assert [t.name for t in p.speculative.types] == ["COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE"]


NAME = "big"


def _record(**kw: Any) -> ModelRecord:
    return ModelRecord(name=NAME, digest="sha256:" + "0" * 64, size=1000, path="/blobs/big.gguf", source="t",
                       created_at=0, modified_at=0, **kw)  # fmt: skip


def _resolve(config: RuntimeConfig, record: ModelRecord | None = None, **kw: Any) -> Any:
    info = ModelInfo(
        architecture="llama", parameter_count=1, context_length=8192, tensor_count=0, data_offset=0
    )
    known = {"big": BIG, "small": _candidate("small"), "smollm": BIG}
    r = resolve_launch(
        config, record or _record(), info,
        lanes={"llamacpp": llamacpp.lane(EngineConfig()), "mistralrs": None},
        plan_gpu_layers=lambda ctx, slots: None,
        candidate=lambda name, lane: known.get(name),
        **kw,
    )  # fmt: skip
    return r, {s.name: s for s in r.settings}


def _with(spec: Any) -> RuntimeConfig:
    return RuntimeConfig.in_home("/h", models={NAME: ModelOverride(spec=spec)})


def test_explain_tells_the_speculation_a_model_runs_with_and_why() -> None:
    r, s = _resolve(RuntimeConfig.in_home("/h"))
    assert r.spec.speculation is None and (s["spec"].value, s["spec"].source) == ("off", "default")
    r, s = _resolve(RuntimeConfig.in_home("/h", spec="ngram"))
    assert r.spec.speculation == SpecLoad(ngram="ngram-simple", max=16)
    assert (s["spec"].value, s["spec"].source) == ("ngram-simple, max 16", "config")
    r, s = _resolve(_with(Speculation(draft="small", max=8)))
    assert r.spec.speculation == SpecLoad(draft_model="small", draft_path="/small.gguf", max=8)
    assert s["spec"].source == "override" and s["spec"].key == 'models."big".spec'
    for draft, why in (("smollm", "the model itself"), ("absent", "'absent' is not installed")):
        r, s = _resolve(_with(Speculation(draft=draft)))
        assert r.spec.speculation is None and s["spec"].value == "off"
        assert why in s["spec"].note and s["spec"].source == "derived"
    r, s = _resolve(_with("ngram"), parked="parked: acceptance 0.05 < 0.15")
    assert r.spec.speculation is None and "the governor parked" in s["spec"].note


def test_adapters_load_with_the_model_in_order() -> None:
    adapters = [Adapter(name="pirate", digest="sha256:" + "a" * 64, size=1, scale=0.5),
                Adapter(name="poet", digest="sha256:" + "b" * 64, size=1)]  # fmt: skip
    r, s = _resolve(RuntimeConfig.in_home("/h"), record=_record(adapters=adapters))
    assert r.spec.loras == [
        LoraLoad(name="pirate", path="/blobs/sha256-" + "a" * 64, scale=0.5),
        LoraLoad(name="poet", path="/blobs/sha256-" + "b" * 64, scale=1.0),
    ]
    assert s["loras"].value == ["0: pirate x0.5", "1: poet x1"]
    r, s = _resolve(RuntimeConfig.in_home("/h"))
    assert r.spec.loras == [] and s["loras"].value == []


def test_speculation_is_for_models_that_generate() -> None:
    config = RuntimeConfig.in_home("/h", spec="ngram", models={NAME: ModelOverride(embeddings=True)})
    r, s = _resolve(config)
    assert r.spec.speculation is None and "does not generate" in s["spec"].note
    pinned = RuntimeConfig.in_home("/h", spec="ngram", models={NAME: ModelOverride(engine="mistralrs")})
    lanes = {"llamacpp": llamacpp.lane(EngineConfig()), "mistralrs": llamacpp.lane(EngineConfig())}
    info = ModelInfo(architecture="llama", parameter_count=1, tensor_count=0, data_offset=0)
    r = resolve_launch(pinned, _record(), info, lanes=lanes, plan_gpu_layers=lambda ctx, slots: None)
    row = next(x for x in r.settings if x.name == "spec")
    assert r.spec.speculation is None and "the mistralrs lane runs no speculation" in (row.note or "")
