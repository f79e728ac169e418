"""A lane: everything the engine actor needs to know about one family of engines.

The engine actor is the same for every lane; what differs is data: the command
line that starts the engine for a model, what the child's environment adds, the
version of what runs it, how to read back the context it serves, what it can do
and which model formats it takes. Each lane module (``actors.engines.llamacpp``,
``actors.engines.mistralrs``) makes its ``Lane`` from the engine config;
``actors.engines.routing`` picks one for a model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from actors.engines.spec import LaunchSpec

if TYPE_CHECKING:
    import httpx

    from actors.process import ChildProcess

__all__ = ["Lane", "Spawn", "spawn_child", "unknown_context"]


class Spawn(Protocol):
    """Starts a lane's child: ``(spec, argv, port, name=, env=, pidfile=)`` → the child."""

    def __call__(
        self, spec: LaunchSpec, argv: list[str], port: int, *, name: str, env: dict[str, str],
        pidfile: Path | None,
    ) -> Awaitable[ChildProcess]: ...  # fmt: skip


async def spawn_child(
    spec: LaunchSpec, argv: list[str], port: int, *, name: str, env: dict[str, str], pidfile: Path | None
) -> ChildProcess:
    """The child alone (every lane but a multi-node head, which starts its workers' parts first)."""
    from actors.process import ChildProcess

    return await ChildProcess.spawn(argv, name=name, env=env, pidfile=pidfile)


async def unknown_context(client: httpx.AsyncClient) -> int | None:
    return None


def _no_env(spec: LaunchSpec) -> dict[str, str]:
    return {}


def _no_rpc() -> str | None:
    return "this lane has no llama.cpp RPC backend"


@dataclass(frozen=True, slots=True)
class Lane:
    name: str
    """The engine family: ``llama.cpp``, ``mistral.rs``."""
    kind: str
    """What runs it here: ``llamacpp-host``, ``llama-server``, ``mistralrs-host``, …"""
    binary: str | None
    """The engine's own executable; None when our host module runs it from a wheel."""
    argv: Callable[[LaunchSpec, int, str], list[str]]
    """``(spec, port, api_key)`` → the child's argv. The child serves OpenAI HTTP on ``port``
    on loopback and answers ``GET /health`` with 200 once it is ready."""
    version: Callable[[], str | None]
    """What runs the lane, with its version; blocking (call it off the event loop)."""
    capabilities: frozenset[str]
    """What it serves: ``chat``, ``completions``, ``embeddings``, ``tools``, ``json_schema``, ``vision``;
    ``stt`` and ``tts`` for the speech lanes."""
    formats: frozenset[str]
    """Model formats it loads: ``gguf``, ``safetensors``, …"""
    env: Callable[[LaunchSpec], dict[str, str]] = _no_env
    """What the child's environment adds to the daemon's."""
    served_context: Callable[[httpx.AsyncClient], Awaitable[int | None]] = unknown_context
    """Reads back the per-slot context a healthy child serves; None when it will not say."""
    llguidance: bool = True
    """The child reads llguidance grammars (the gateway's tool-call emulation uses them)."""
    cpu_sequences: int | None = None
    """Sequences the engine can run at once on the CPU, when fewer than any slot count (the
    mistral.rs wheel: one): admission then gives it that many slots, so its queue, priorities
    and deadlines stay the gateway's rather than the engine's."""
    sequences: int | None = None
    """Requests the engine runs at once on any hardware, when fewer than any slot count
    (sd-server: one image at a time): admission gives it that many slots, as above."""
    health: str = "/health"
    """The path that answers 200 once the child is ready."""
    start_timeout_s: float | None = None
    """How long a start may take before it counts as failed; None: ``engine.start_timeout_s``
    (a GPU engine that compiles kernels at start takes minutes)."""
    release: str | None = None
    """The installed version it runs (``blazar engine``); None: what the daemon was installed with."""
    rpc_problem: Callable[[], str | None] = _no_rpc
    """Why the engine cannot split a model over llama.cpp ``rpc-server`` workers (``--rpc``),
    or None when it can; blocking (it may ask the binary)."""
    request_model: str | None = None
    """The name a request's ``model`` must carry for this engine (MLX's server loads whatever
    model a request names; ``default_model`` is the one it was started with), which its
    replies then carry too: the gateway renames it both ways. None: the engine takes any."""
    spawn: Spawn = spawn_child
    """Starts the child; an ``OSError`` it raises fails the start with its message (a
    multi-node head: ``actors.multinode_head``, whose child also stops its workers' parts)."""
