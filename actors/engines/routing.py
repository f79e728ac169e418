"""Which lane runs a model: by its format, what it needs, and a per-model pin.

``route`` is the pure decision, with the reason each lane was or was not taken
(``blazar plan`` and ``blazar explain`` show them); ``installed`` makes the lanes
this machine has from the engine config; ``lane_for`` gives the engine actor the
lane a launch spec names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from actors.config import EngineConfig
from actors.engines import llamacpp, mistralrs, mlx, piper, sdcpp, sglang, vllm, whisper
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec
from actors.engines.versions import BUNDLED, EngineVersion, Versions
from actors.errors import UnsupportedEngine

__all__ = ["LANES", "LOADS", "Considered", "Route", "installed", "lane_for", "not_installed", "route"]

LANES = ("llamacpp", "mistralrs", "vllm", "sglang", "mlx", "sdcpp", "whisper", "whispercpp", "piper")
"""The lanes a model can be pinned to (``[models."NAME"] engine = …``), in default order."""
_INSTALL = {
    "mistralrs": "pip install 'blazar[mistralrs]', or put a mistralrs binary on PATH",
    "vllm": "install vLLM on a machine with a GPU and set [engine] vllm (docs/engines.md)",
    "sglang": "install SGLang on a machine with a GPU and set [engine] sglang (docs/engines.md)",
    "mlx": "pip install mlx-lm on Apple silicon and set [engine] mlx (docs/engines.md)",
    "sdcpp": "build stable-diffusion.cpp's sd-server and set [engine] sd_server (docs/engines.md)",
    "whisper": "pip install 'blazar[speech]' (faster-whisper; docs/speech.md)",
    "whispercpp": "build whisper.cpp and put its whisper-server on PATH (docs/speech.md)",
    "piper": "pip install 'blazar[speech]' (piper-tts; docs/speech.md)",
}

LOADS: dict[str, frozenset[str]] = {
    "llamacpp": frozenset({"gguf"}),
    "mistralrs": frozenset(mistralrs.FORMATS),
    "vllm": vllm.FORMATS,
    "sglang": sglang.FORMATS,
    "mlx": mlx.FORMATS,
    "sdcpp": sdcpp.FORMATS,
    "whisper": whisper.HOST_FORMATS,
    "whispercpp": whisper.SERVER_FORMATS,
    "piper": piper.FORMATS,
}
"""The formats each lane loads as shipped: what a lane that is not installed would take, so
that a plan says which missing lane would run a model (an installed lane says its own)."""


class Considered(msgspec.Struct, frozen=True, kw_only=True):
    lane: str
    kind: str | None
    """What would run it here (``llamacpp-host``, ``mistralrs-host``, …); None: not installed."""
    taken: bool
    why: str


class Route(msgspec.Struct, frozen=True, kw_only=True):
    lane: str | None
    """The lane chosen; None when none can run the model (``considered`` says why)."""
    considered: list[Considered]


def route(fmt: str, *, needs: frozenset[str], pin: str | None, lanes: Mapping[str, Lane | None]) -> Route:
    """The lane for a model of format ``fmt`` that needs the capabilities ``needs``: the pinned
    lane when it can run it, else the first of ``LANES`` that can; each with its reason."""
    usable: dict[str, str | None] = {}  # lane → why it cannot run the model (None: it can)
    for name in LANES:
        lane = lanes.get(name)
        if lane is None and fmt not in LOADS.get(name, frozenset({fmt})):
            usable[name] = f"does not load {fmt} models (and is not installed)"
        elif lane is None:
            usable[name] = f"not installed ({_INSTALL.get(name, 'install it')})"
        elif fmt not in lane.formats:
            usable[name] = f"does not load {fmt} models"
        elif missing := sorted(needs - lane.capabilities):
            usable[name] = f"cannot serve {', '.join(missing)}"
        else:
            usable[name] = None
    if pin is not None:
        chosen = pin if usable.get(pin) is None else None
    else:
        chosen = next((name for name in LANES if usable[name] is None), None)
    considered = []
    for name in LANES:
        lane = lanes.get(name)
        kind = lane.kind if lane is not None else None
        if name == chosen:
            why = "pinned in the model's settings" if pin else f"the first lane that runs {fmt} models"
        elif usable[name] is not None:
            why = usable[name] or ""
        elif pin is not None:
            why = f"the model is pinned to {pin}"
        else:
            why = f"{chosen} comes first for {fmt} models"
        considered.append(Considered(lane=name, kind=kind, taken=name == chosen, why=why))
    return Route(lane=chosen, considered=considered)


def not_installed(chosen: Route, pin: str | None = None) -> str:
    """Why no lane runs a model, for a refusal: the pinned lane's reason, then the lanes that
    would load its format but are not installed here, each with how to install it; with
    neither, every lane's reason."""
    parts = [f"{c.lane}: {c.why}" for c in chosen.considered if c.lane == pin]
    missing = [
        c for c in chosen.considered if c.kind is None and c.why.startswith("not installed") and c.lane != pin
    ]
    if missing:
        names = " or ".join(c.lane for c in missing)
        how = "; ".join(f"{c.lane}: {_INSTALL.get(c.lane, 'install it')}" for c in missing)
        parts.append(f"it runs on {names}, not installed here — {how}")
    if not parts:
        parts = [f"{c.lane}: {c.why}" for c in chosen.considered]
    return "; ".join(parts)


def _gpu(make: Callable[[EngineConfig, str | None], Lane | None], path: str) -> _Maker:
    """A GPU lane: the program configured at ``[engine] <path>`` (no installed versions yet)."""

    def lane(config: EngineConfig, release: EngineVersion | None) -> Lane | None:
        return None if release is not None else make(config, getattr(config, path))

    return lane


_Maker = Callable[[EngineConfig, EngineVersion | None], Lane | None]
_MAKERS: dict[str, _Maker] = {
    "llamacpp": llamacpp.lane,
    "mistralrs": mistralrs.lane,
    "vllm": _gpu(vllm.lane, "vllm"),
    "sglang": _gpu(sglang.lane, "sglang"),
    "mlx": _gpu(mlx.lane, "mlx"),
    "sdcpp": _gpu(sdcpp.lane, "sd_server"),
    "whisper": whisper.host_lane,
    "whispercpp": whisper.server_lane,
    "piper": piper.lane,
}


def installed(config: EngineConfig, home: str | None = None) -> dict[str, Lane | None]:
    """Every lane this machine can run under ``config`` (None: not installed), each at its
    active version when ``home`` has one (``blazar engine use``)."""
    versions = Versions(home) if home else None
    return {name: make(config, versions.active(name) if versions else None) for name, make in _MAKERS.items()}


def lane_for(spec: LaunchSpec, config: EngineConfig, home: str | None = None) -> Lane:
    """The lane ``spec`` names at the version it names, as this machine runs it."""
    release = None
    if spec.engine_version is not None and spec.engine_version != BUNDLED:
        release = Versions(home).get(spec.lane, spec.engine_version) if home else None
        if release is None:
            raise UnsupportedEngine(
                f"model '{spec.model}' runs on {spec.lane}@{spec.engine_version}, which is not installed "
                f"here — `blazar engine install {spec.lane}@{spec.engine_version}`, or change its pin"
            )
    make = _MAKERS.get(spec.lane)
    lane = make(config, release) if make is not None else None
    if lane is None:
        raise UnsupportedEngine(
            f"model '{spec.model}' runs on the {spec.lane} lane, which is not installed here — "
            f"{_INSTALL.get(spec.lane, 'install it')}, or remove its `engine` pin"
        )
    return lane
