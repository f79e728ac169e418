"""Which lane runs a model: format, capabilities and a pin, each lane with its reason."""

from __future__ import annotations

import msgspec
import pytest

from actors.config import EngineConfig, ModelOverride, RuntimeConfig
from actors.engines import llamacpp, mistralrs
from actors.engines.lane import Lane
from actors.engines.routing import lane_for, route
from actors.engines.spec import LaunchSpec
from actors.errors import UnsupportedEngine
from tests.actors.test_settings import _record, _resolve

LLAMA = llamacpp.lane(EngineConfig())
MISTRAL = Lane(
    name="mistral.rs",
    kind="mistralrs-host",
    binary=None,
    argv=lambda spec, port, key: ["host", spec.path],
    version=lambda: "mistralrs 0.9.5",
    capabilities=frozenset({"chat", "completions", "json_schema"}),
    formats=frozenset({"gguf"}),
    cpu_sequences=1,
)
BOTH: dict[str, Lane | None] = {"llamacpp": LLAMA, "mistralrs": MISTRAL}


def _why(r: object) -> dict[str, tuple[bool, str]]:
    return {c.lane: (c.taken, c.why) for c in r.considered}  # type: ignore[attr-defined]


def test_a_gguf_goes_to_llama_cpp_unless_pinned() -> None:
    r = route("gguf", needs=frozenset(), pin=None, lanes=BOTH)
    assert r.lane == "llamacpp"
    why = _why(r)
    assert why["llamacpp"] == (True, "the first lane that runs gguf models")
    assert why["mistralrs"] == (False, "llamacpp comes first for gguf models")
    # a lane that is not installed says so only where it would load the model
    assert why["vllm"] == (False, "does not load gguf models (and is not installed)")
    assert _why(route("safetensors", needs=frozenset(), pin=None, lanes=BOTH))["vllm"][1].startswith(
        "not installed (install vLLM"
    )
    pinned = route("gguf", needs=frozenset(), pin="mistralrs", lanes=BOTH)
    assert pinned.lane == "mistralrs"
    assert _why(pinned)["llamacpp"] == (False, "the model is pinned to mistralrs")
    assert _why(pinned)["mistralrs"] == (True, "pinned in the model's settings")


def test_a_lane_that_cannot_run_the_model_says_why() -> None:
    absent = route("gguf", needs=frozenset(), pin="mistralrs", lanes={"llamacpp": LLAMA, "mistralrs": None})
    assert absent.lane is None and "pip install 'blazar[mistralrs]'" in _why(absent)["mistralrs"][1]
    vision = route("gguf", needs=frozenset({"vision"}), pin="mistralrs", lanes=BOTH)
    assert vision.lane is None and _why(vision)["mistralrs"] == (False, "cannot serve vision")
    # without the pin, the lane that can serve it is taken
    assert route("gguf", needs=frozenset({"vision"}), pin=None, lanes=BOTH).lane == "llamacpp"
    other = route("safetensors", needs=frozenset(), pin=None, lanes=BOTH)
    assert other.lane is None and _why(other)["llamacpp"] == (False, "does not load safetensors models")


def test_a_pin_reaches_the_launch_spec_and_its_explanation() -> None:
    config = RuntimeConfig.in_home("/h", models={"tiny": ModelOverride(engine="mistralrs")})
    resolved = _resolve(config, lanes=BOTH)
    assert resolved.spec.lane == "mistralrs" and resolved.spec.llguidance is True
    assert resolved.spec.slots == 1  # one sequence at a time on the CPU: the rest queue in admission
    (engine,) = [s for s in resolved.settings if s.name == "engine"]
    assert (engine.value, engine.source, engine.key) == ("mistralrs-host", "override", 'models."tiny".engine')
    assert _resolve(RuntimeConfig.in_home("/h"), lanes=BOTH).spec.lane == "llamacpp"
    # engine.extra_args are llama.cpp's flags: another lane gets only the model's own
    flags = RuntimeConfig.in_home(
        "/h",
        engine=EngineConfig(extra_args=["--mlock"]),
        models={"tiny": ModelOverride(engine="mistralrs", extra_args=["--x"])},
    )
    assert _resolve(flags, lanes=BOTH).spec.extra_args == ["--x"]
    flags = msgspec.structs.replace(flags, models={"tiny": ModelOverride(extra_args=["--x"])})
    assert _resolve(flags, lanes=BOTH).spec.extra_args == ["--mlock", "--x"]


def test_a_pin_to_a_lane_not_installed_is_refused_with_the_fix() -> None:
    config = RuntimeConfig.in_home("/h", models={"tiny": ModelOverride(engine="mistralrs")})
    with pytest.raises(UnsupportedEngine) as info:
        _resolve(config, lanes={"llamacpp": LLAMA, "mistralrs": None}, record=_record())
    assert info.value.code == "MODEL_UNSUPPORTED_ENGINE"
    assert 'models."tiny".engine' in info.value.message and "pip install" in info.value.message


def test_the_engine_actor_gets_the_lane_its_spec_names() -> None:
    spec = LaunchSpec(model="m", path="/m.gguf", ctx_per_slot=512, slots=1, lane="mistralrs")
    lane = lane_for(spec, EngineConfig())
    assert mistralrs.lane(EngineConfig()) is not None, "make install installs the mistralrs wheel"
    assert lane.name == "mistral.rs" and lane.kind == "mistralrs-host"
    assert lane.argv(spec, 4000, "k")[1:3] == ["-m", "actors.engines.mistralrs_host"]
    assert (
        lane_for(LaunchSpec(model="m", path="/m", ctx_per_slot=512, slots=1), EngineConfig()).name
        == "llama.cpp"
    )
