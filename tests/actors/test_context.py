"""How much context a slot gets: clamping to the training length, extension, the flags."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.config import ModelOverride, RuntimeConfig
from actors.context import choose_context, context_limit, describe_clamp, rope_factor
from actors.engines.llamacpp import LaunchSpec, build_argv
from actors.errors import ContextTooLarge
from actors.planning import context_note, launch_spec_for
from registry.store import Store


def test_a_context_above_the_limit_is_clamped_or_refused() -> None:
    assert choose_context(4096, 8192, strict=True, model="m", what="ctx").ctx == 4096
    choice = choose_context(32768, 8192, strict=False, model="m", what="ctx")
    assert (choice.ctx, choice.asked, choice.clamped) == (8192, 32768, True)
    assert choose_context(32768, None, strict=True, model="m", what="ctx").ctx == 32768  # limit unknown
    with pytest.raises(ContextTooLarge) as info:
        choose_context(9000, 8192, strict=True, model="m", what="num_ctx")
    assert info.value.code == "CONTEXT_TOO_LARGE" and "num_ctx 9000" in info.value.message


def test_the_extension_factor_and_the_limit() -> None:
    assert rope_factor(8192, None, 4.0, 32768) is None  # no rope_scaling: no extension at all
    assert rope_factor(8192, "yarn", 4.0, 4096) == 4.0
    assert rope_factor(8192, "yarn", None, 32768) == 4.0  # just enough for ctx
    assert rope_factor(8192, "yarn", None, 10000) == 1.23
    assert context_limit(8192, rope_factor(8192, "yarn", None, 10000)) >= 10000  # type: ignore[operator]
    assert rope_factor(8192, "yarn", None, 4096) is None  # ctx fits the training length
    assert context_limit(8192, None) == 8192 and context_limit(None, 2.0) is None


def test_the_clamp_is_described_with_a_lever_that_works() -> None:
    assert describe_clamp(32768, 8192, trained=8192, extended=False) == (
        "clamped from 32768 to 8192 (training length); set rope_scaling to extend"
    )
    assert "raise rope_scale" in (describe_clamp(40000, 32768, trained=8192, extended=True) or "")
    assert describe_clamp(4096, 4096, trained=8192, extended=False) is None


def _config(tmp_path: Path, **models: ModelOverride) -> RuntimeConfig:
    return RuntimeConfig(
        home=str(tmp_path), run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "c"), models=models
    )


def test_launch_spec_clamps_the_configured_context(tmp_path: Path, model_path: Path) -> None:
    store = Store(tmp_path / "models")
    record = store.import_file(model_path, "smol")
    spec = launch_spec_for(_config(tmp_path, smol=ModelOverride(ctx=32768, slots=2)), store, record)
    assert (spec.ctx_per_slot, spec.ctx_asked, spec.ctx_train, spec.ctx_total) == (8192, 32768, 8192, 16384)
    assert spec.rope_scaling is None and "--rope-scaling" not in build_argv(
        spec, port=1, api_key="k", binary=None
    )
    assert context_note(spec) == "clamped from 32768 to 8192 (training length); set rope_scaling to extend"
    # Served less than asked (an engine that caps the slot itself): said so.
    assert "serves 2048" in (context_note(launch_spec_for(_config(tmp_path), store, record), 2048) or "")

    ext = _config(tmp_path, smol=ModelOverride(ctx=32768, rope_scaling="yarn", rope_scale=8.0))
    spec = launch_spec_for(ext, store, record)
    assert (spec.ctx_per_slot, spec.ctx_asked, spec.ctx_limit) == (32768, None, 65536)
    flags = build_argv(spec, port=1, api_key="k", binary=None)
    assert (
        flags[flags.index("--rope-scaling") + 1] == "yarn" and flags[flags.index("--rope-scale") + 1] == "8"
    )
    strict = msgspec.structs.replace(_config(tmp_path, smol=ModelOverride(ctx=9000)), strict=True)
    with pytest.raises(ContextTooLarge):
        launch_spec_for(strict, store, record)


def test_the_host_maps_the_rope_flags() -> None:
    import xllamacpp as xlc

    from actors.engines.llamacpp_host import build_params, parse_args

    p = build_params(parse_args("-m /x.gguf --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 8192".split()))
    assert p.rope_scaling_type == xlc.llama_rope_scaling_type.LLAMA_ROPE_SCALING_TYPE_YARN
    assert p.rope_freq_scale == pytest.approx(0.25) and p.yarn_orig_ctx == 8192
    p = build_params(parse_args("-m /x.gguf --rope-scaling linear --rope-freq-scale 0.5".split()))
    assert p.rope_scaling_type == xlc.llama_rope_scaling_type.LLAMA_ROPE_SCALING_TYPE_LINEAR
    assert p.rope_freq_scale == pytest.approx(0.5)
    spec = LaunchSpec(model="m", path="/x", ctx_per_slot=4096, slots=1, rope_scaling="yarn", rope_scale=1.5)
    flags = build_argv(spec, port=1, api_key="k", binary=None)[3:]
    assert parse_args(flags).rope_scale == 1.5  # what build_argv writes, the host reads
