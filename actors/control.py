"""Control vectors on a request: the engine that runs a model steered by a set of them.

llama.cpp applies control vectors when its engine starts (``--control-vector-scaled FILE
STRENGTH``, ``--control-vector-layer-range START END``); its server has no way to choose
them per request. So a request that asks for a set runs on an engine of its own for that
set: the model's launch spec with the vectors, kept beside the model's own engine under the
key ``NAME+steer-<hash of the set>``. The first request with a set starts that engine (a
model load); later ones with the same set reuse it, and it goes idle and is stopped like any
engine (keep-alive, eviction). Requests without vectors never see it.

The bundled llama.cpp host cannot pass vectors to the wheel and bakes them into a copy of the
model (``actors/engines/control_bake.py``), which works for ``llama``-architecture models; a
``llama-server`` binary takes the flags for any.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import msgspec
import trio

from actors.engine import EngineActor
from actors.engines.control_bake import STEERABLE
from actors.engines.routing import lane_for
from actors.engines.spec import ControlLoad, LaunchSpec
from actors.errors import BlazarRuntimeError
from actors.runtime import Runtime
from registry.control import check_vector, find_vector, model_layers, read_vector
from registry.errors import RegistryError
from registry.gguf import GGUFHeader, read_header
from registry.store import ModelRecord

__all__ = ["MAX_STRENGTH", "Choice", "ControlRefused", "steered_engine"]

MAX_STRENGTH = 100.0
"""The largest strength (either sign) a request may give a vector."""


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    """One vector a request asks for: by its name in the model's store or by a file's path."""

    name: str | None = None
    path: str | None = None
    strength: float = 1.0


class ControlRefused(BlazarRuntimeError):
    """A request's control vectors cannot run: ``code`` says why, ``param`` names the field."""

    def __init__(self, code: str, message: str, *, param: str) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


def _resolve(
    runtime: Runtime, record: ModelRecord, choice: Choice, i: int, header: GGUFHeader
) -> ControlLoad:
    field = f"control_vectors[{i}].{'name' if choice.name is not None else 'path'}"
    try:
        if choice.name is not None:
            vector = find_vector(record, choice.name)
            path = runtime.store.blob_path(vector.digest.removeprefix("sha256:"))
            facts = read_vector(path, shown=f"control vector '{vector.name}'")
            what, name = f"control vector '{vector.name}'", vector.name
        else:
            assert choice.path is not None
            if not Path(choice.path).is_absolute():
                raise ControlRefused(
                    "CONTROL_VECTOR_INVALID", f"`{field}` must be an absolute path", param=field
                )
            path = Path(choice.path)
            facts = read_vector(path, shown=f"the file of `{field}`")
            what, name = f"the file of `{field}`", "path"
        check_vector(facts, record.name, header, what=what)
    except RegistryError as exc:
        raise ControlRefused(exc.code, exc.message, param=field) from None
    return ControlLoad(name=name, path=str(path), strength=choice.strength)


def _plan(
    runtime: Runtime, model: str, choices: Sequence[Choice], layers: tuple[int, int] | None
) -> tuple[str, LaunchSpec]:
    """The engine's key and launch spec for ``choices`` on ``model`` (blocking: a thread)."""
    record = runtime.store.get(model)
    header = read_header(record.path)
    spec = runtime.launch_spec(record)
    if spec.lane != "llamacpp":
        raise ControlRefused(
            "CONTROL_VECTOR_UNSUPPORTED",
            f"model '{record.name}' runs on the {spec.lane} lane, which applies no control vectors: "
            "they need llama.cpp",
            param="control_vectors",
        )
    _, blocks = model_layers(header)
    if layers is not None and not 1 <= layers[0] <= layers[1] <= blocks - 1:
        raise ControlRefused(
            "CONTROL_VECTOR_MISMATCH",
            f"`control_vector_layers` {list(layers)} is outside model '{record.name}': its layers run "
            f"from 1 to {blocks - 1}",
            param="control_vector_layers",
        )
    lane = lane_for(spec, runtime.config.engine, runtime.config.home)
    arch = header.values.get("general.architecture")
    if lane.binary is None and arch not in STEERABLE:
        raise ControlRefused(
            "CONTROL_VECTOR_UNSUPPORTED",
            f"model '{record.name}' is a {arch!r} model, and the bundled llama.cpp engine steers "
            f"{', '.join(sorted(STEERABLE))} models only — install a llama-server binary "
            "([engine] llama_server in config.toml) to steer it",
            param="control_vectors",
        )
    loads = [_resolve(runtime, record, c, i, header) for i, c in enumerate(choices)]
    said = repr(([(v.path, v.strength) for v in loads], layers)).encode()
    key = f"{record.name}+steer-{hashlib.sha256(said).hexdigest()[:12]}"
    steered = msgspec.structs.replace(
        spec, model=key, alias=record.name, control_vectors=loads, control_layers=layers
    )
    return key, steered


async def steered_engine(
    runtime: Runtime, model: str, choices: Sequence[Choice], layers: tuple[int, int] | None = None
) -> EngineActor:
    """The engine that runs ``model`` steered by ``choices`` over ``layers`` (made, not started,
    on first use). Raises ``ModelNotFound`` and ``ControlRefused`` (a vector the model does not
    have, a file that is not one, one that does not fit, an engine that cannot apply them)."""
    for i, c in enumerate(choices):
        if (c.name is None) == (c.path is None):
            raise ControlRefused(
                "BAD_REQUEST",
                f"`control_vectors[{i}]` names a vector by `name` or by `path` (one of them)",
                param=f"control_vectors[{i}]",
            )
        if not -MAX_STRENGTH <= c.strength <= MAX_STRENGTH:
            raise ControlRefused(
                "BAD_REQUEST",
                f"`control_vectors[{i}].strength` {c.strength:g} is out of range "
                f"[-{MAX_STRENGTH:g}, {MAX_STRENGTH:g}]",
                param=f"control_vectors[{i}].strength",
            )
    key, spec = await trio.to_thread.run_sync(_plan, runtime, model, choices, layers)
    existing = runtime.engine_named(key)
    if existing is not None:
        return existing
    return await runtime.side_engine(key, spec)
