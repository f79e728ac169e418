"""The runtime's exception tree. Each error carries the stable ``blazar_code`` it maps to."""

from __future__ import annotations

__all__ = [
    "ActorStopped",
    "BlazarRuntimeError",
    "ContextTooLarge",
    "EngineCircuitOpen",
    "EngineCrashed",
    "EngineStartTimeout",
    "EngineUnavailable",
    "SupervisorEscalation",
]


class BlazarRuntimeError(Exception):
    """Base of every error the runtime raises on purpose."""

    code: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ActorStopped(BlazarRuntimeError):
    """A message was sent to an actor that is not running (never started, or stopped)."""

    code = "UNAVAILABLE"


class SupervisorEscalation(BlazarRuntimeError):
    """A child restarted more often than its supervisor allows; the supervisor gives up."""


class EngineCrashed(BlazarRuntimeError):
    """The engine child process died or answered with a broken connection."""

    code = "ENGINE_CRASHED"

    def __init__(self, message: str, *, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.stderr_tail = stderr_tail


class EngineStartTimeout(BlazarRuntimeError):
    code = "MODEL_LOAD_TIMEOUT"

    def __init__(self, message: str, *, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.stderr_tail = stderr_tail


class EngineCircuitOpen(BlazarRuntimeError):
    """The engine crashed too often recently; starts are refused until the window passes."""

    code = "ENGINE_CIRCUIT_OPEN"


class EngineUnavailable(BlazarRuntimeError):
    """The engine cannot be started (no binary, bad model file, breaker open)."""

    code = "UNAVAILABLE"


class ContextTooLarge(BlazarRuntimeError):
    """A context above what the model can serve, refused in strict mode."""

    code = "CONTEXT_TOO_LARGE"
