"""``resolve_launch``: the launch spec and the source of each setting, from one pass."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.engines import llamacpp
from actors.engines.lane import Lane
from actors.engines.llamacpp import build_argv
from actors.settings import Resolved, Setting, explain_running, resolve_launch
from registry.gguf import ModelInfo
from registry.store import ModelRecord, ModelSettings

NAME = "tiny"


def _record(settings: ModelSettings | None = None) -> ModelRecord:
    return ModelRecord(
        name=NAME, digest="sha256:" + "0" * 64, size=1, path="/m.gguf", source="t", created_at=0,
        modified_at=0, settings=settings,
    )  # fmt: skip


def _info(ctx: int | None = 8192, template: str | None = "{{ messages }}") -> ModelInfo:
    return ModelInfo(architecture="llama", parameter_count=1, context_length=ctx, chat_template=template,
                     tensor_count=0, data_offset=0)  # fmt: skip


def _lanes(binary: str | None) -> dict[str, Lane | None]:
    """llama.cpp as a binary or the wheel's host; mistral.rs's host where its wheel is installed."""
    return {"llamacpp": llamacpp.lane(EngineConfig(llama_server=binary)), "mistralrs": None}


def _resolve(config: RuntimeConfig, **kw: Any) -> Resolved:
    return resolve_launch(
        config,
        kw.pop("record", _record()),
        kw.pop("info", _info()),
        lanes=kw.pop("lanes", None) or _lanes(kw.pop("binary", None)),
        plan_gpu_layers=kw.pop("plan", lambda ctx, slots: None),
    )


def _by_name(resolved: Resolved | list[Setting]) -> dict[str, Setting]:
    settings = resolved.settings if isinstance(resolved, Resolved) else resolved
    return {s.name: s for s in settings}


def test_nothing_set_everything_is_a_default_or_the_models() -> None:
    r = _resolve(RuntimeConfig.in_home("/h"))
    s = _by_name(r)
    assert (s["ctx_per_slot"].value, s["ctx_per_slot"].source, s["ctx_per_slot"].key) == (
        4096,
        "default",
        "default_ctx",
    )
    assert (s["slots"].value, s["slots"].source) == (4, "default")
    assert (s["ctx_total"].value, s["ctx_total"].source) == (16384, "derived")
    assert (s["ctx_train"].value, s["ctx_train"].source) == (8192, "model")
    assert (s["chat_template"].value, s["chat_template"].source) == ("GGUF", "model")
    assert (s["keep_alive_s"].value, s["keep_alive_s"].source) == (300.0, "default")
    assert (s["engine"].value, s["engine"].source) == ("llamacpp-host", "default")
    assert (s["prompt_batch"].value, s["prompt_batch"].source) == (256, "default")
    assert r.spec.ctx_per_slot == 4096 and r.spec.slots == 4 and r.spec.prompt_batch == 256


def test_a_short_training_context_comes_from_the_model() -> None:
    s = _by_name(_resolve(RuntimeConfig.in_home("/h"), info=_info(ctx=2048)))
    assert (s["ctx_per_slot"].value, s["ctx_per_slot"].source) == (2048, "model")


def test_config_keys_and_overrides_are_told_apart() -> None:
    config = RuntimeConfig.in_home(
        "/h",
        slots=2,
        default_ctx=4096,  # the default value, but written in the file
        configured=frozenset({"slots", "default_ctx", "engine.threads"}),
        engine=EngineConfig(threads=3, extra_args=["--mlock"]),
        keep_alive_s=30.0,
        models={
            NAME: ModelOverride(ctx=1024, keep_alive_s=5.0, extra_args=["--no-warmup"], max_output_tokens=64)
        },
    )
    r = _resolve(config)
    s = _by_name(r)
    assert (s["ctx_per_slot"].value, s["ctx_per_slot"].source, s["ctx_per_slot"].key) == (
        1024, "override", 'models."tiny".ctx'
    )  # fmt: skip
    assert (s["slots"].value, s["slots"].source, s["slots"].key) == (2, "config", "slots")
    assert (s["threads"].value, s["threads"].source, s["threads"].key) == (3, "config", "engine.threads")
    assert (s["keep_alive_s"].value, s["keep_alive_s"].source) == (5.0, "override")
    assert (s["max_output_tokens"].value, s["max_output_tokens"].source) == (64, "override")
    assert s["extra_args"].value == ["--mlock", "--no-warmup"] and s["extra_args"].source == "override"
    assert r.keep_alive_s == 5.0
    # an unset default_ctx of the same value reads as the built-in default
    plain = _by_name(_resolve(RuntimeConfig.in_home("/h", models={})))
    assert plain["ctx_per_slot"].source == "default"
    with_key = _by_name(_resolve(msgspec.structs.replace(config, models={})))
    assert with_key["ctx_per_slot"].source == "config"


def test_every_explained_value_is_the_one_the_engine_gets() -> None:
    config = RuntimeConfig.in_home(
        "/h",
        slots=3,
        max_output_tokens=100,
        engine=EngineConfig(threads=2),
        models={NAME: ModelOverride(ctx=20000, rope_scaling="yarn", prompt_batch=64, embeddings=True)},
    )
    settings = ModelSettings(system="be brief", template="{{ tools }}", parameters={"temperature": 0.1})
    r = _resolve(config, record=_record(settings))
    s = _by_name(r)
    same = ("ctx_per_slot", "slots", "ctx_total", "rope_scaling", "rope_scale", "prompt_batch", "threads",
            "extra_args", "embeddings", "native_tools", "system_turns", "system", "defaults",
            "max_output_tokens", "gpu_layers", "ctx_train")  # fmt: skip
    for name in same:
        assert s[name].value == getattr(r.spec, name), name
    assert s["rope_scale"].source == "derived" and r.spec.rope_scale == 2.45
    assert s["chat_template"].source == "model" and s["chat_template"].key == "Modelfile TEMPLATE"
    argv = build_argv(r.spec, port=1, api_key="k", binary=None)
    assert argv[argv.index("-c") + 1] == str(s["ctx_total"].value)
    assert argv[argv.index("-np") + 1] == str(s["slots"].value)
    assert argv[argv.index("-b") + 1] == str(s["prompt_batch"].value)
    assert argv[argv.index("--rope-scale") + 1] == "2.45"


def test_a_clamped_context_says_so() -> None:
    config = RuntimeConfig.in_home("/h", models={NAME: ModelOverride(ctx=32768)})
    s = _by_name(_resolve(config))
    assert s["ctx_per_slot"].value == 8192 and s["ctx_per_slot"].source == "override"
    assert "clamped from 32768 to 8192" in (s["ctx_per_slot"].note or "")


def test_gpu_layers_from_the_plan_or_the_override() -> None:
    config = RuntimeConfig.in_home("/h")
    s = _by_name(_resolve(config, binary="/usr/bin/llama-server", plan=lambda ctx, slots: 17))
    assert (s["gpu_layers"].value, s["gpu_layers"].source) == (17, "derived")
    assert s["prompt_batch"].value is None  # llama.cpp's own on a GPU
    assert (s["engine"].value, s["engine"].source) == ("llama-server", "derived")
    config = RuntimeConfig.in_home("/h", models={NAME: ModelOverride(gpu_layers=4)})
    s = _by_name(_resolve(config, binary="/usr/bin/llama-server", plan=lambda ctx, slots: 17))
    assert (s["gpu_layers"].value, s["gpu_layers"].source) == (4, "override")


def test_a_request_that_changed_the_running_engine_is_named() -> None:
    r = _resolve(RuntimeConfig.in_home("/h"))
    running = msgspec.structs.replace(r.spec, ctx_per_slot=6000)
    s = _by_name(explain_running(r, running))
    assert (s["ctx_per_slot"].value, s["ctx_per_slot"].source) == (6000, "request")
    assert "it was 4096 from default" in (s["ctx_per_slot"].note or "")
    assert s["ctx_total"].value == 24000 and s["slots"].source == "default"
    assert _by_name(explain_running(r, r.spec))["ctx_per_slot"].source == "default"


def test_a_tuned_profile_fills_what_the_model_s_table_leaves_unset() -> None:
    from actors.config import Profile

    profile = Profile(slots=1, threads=2, prompt_batch=512, micro_batch=128, kv_cache="q8_0", flash_attn="on")
    config = RuntimeConfig.in_home(
        "/h",
        engine=EngineConfig(threads=4),  # machine-wide: the model's profile is more particular
        models={NAME: ModelOverride(prompt_batch=64)},  # the user's own table wins over the profile
        profiles={NAME: profile},
        configured=frozenset({"engine.threads"}),
    )
    r = _resolve(config)
    s = _by_name(r)
    for name, value in (
        ("slots", 1),
        ("threads", 2),
        ("micro_batch", 128),
        ("kv_cache", "q8_0"),
        ("flash_attn", "on"),
    ):
        assert (s[name].value, s[name].source) == (value, "profile"), s[name]
    assert (s["prompt_batch"].value, s["prompt_batch"].source) == (64, "override")
    argv = " ".join(build_argv(r.spec, port=1, api_key="k", binary=None)) + " "
    # the micro-batch is never above the prompt batch
    for flags in ("-np 1 ", "-t 2 ", "-b 64 -ub 64 ", "-ctk q8_0 -ctv q8_0 ", "-fa on "):
        assert flags in argv, argv
    plain = _by_name(_resolve(RuntimeConfig.in_home("/h")))
    assert all(plain[k].source == "default" for k in ("micro_batch", "kv_cache", "flash_attn", "threads"))
    assert "-ctk" not in " ".join(
        build_argv(_resolve(RuntimeConfig.in_home("/h")).spec, port=1, api_key="k", binary=None)
    )
