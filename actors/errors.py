"""The runtime's exception tree: every error the runtime raises on purpose lives here.

Each carries the stable ``code`` (a ``blazar_code``) it answers with, its
``message`` (what went wrong and what to do next) and, when retrying later can
help, ``retry_after_s``. The gateway, the CLI and an embedding program read
those three and nothing else.
"""

from __future__ import annotations

__all__ = [
    "ActorStopped",
    "AdmissionRejected",
    "BlazarRuntimeError",
    "ContextTooLarge",
    "EngineCircuitOpen",
    "EngineCrashed",
    "EngineStartTimeout",
    "EngineUnavailable",
    "InsufficientMemory",
    "JobNotFound",
    "JobNotRunnable",
    "LedgerError",
    "MaxLoadedModels",
    "ModelBusy",
    "ModelTooLarge",
    "PartNotFound",
    "PeerIsSelf",
    "PeerNotFound",
    "PeerRefused",
    "PeerUnavailable",
    "Preempted",
    "QuantizeDegraded",
    "RpcWorkerUnavailable",
    "SessionError",
    "SupervisorEscalation",
    "UnsupportedEngine",
    "VisionProjectorMissing",
]


class BlazarRuntimeError(Exception):
    """Base of every error the runtime raises on purpose."""

    code: str = "INTERNAL"
    retry_after_s: float | None = None

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class ActorStopped(BlazarRuntimeError):
    """A message was sent to an actor that is not running (never started, or stopped)."""

    code = "UNAVAILABLE"


class SupervisorEscalation(BlazarRuntimeError):
    """A child restarted more often than its supervisor allows; the supervisor gives up."""


# -- engines ----------------------------------------------------------------------


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


class RpcWorkerUnavailable(BlazarRuntimeError):
    """A worker a split model's layers go to does not answer, and the model may not (or
    cannot) run without it (``rpc_fallback``)."""

    code = "RPC_WORKER_UNAVAILABLE"


class UnsupportedEngine(BlazarRuntimeError):
    """No lane here can run the model: its pinned lane is not installed, or none takes its format."""

    code = "MODEL_UNSUPPORTED_ENGINE"


class VisionProjectorMissing(BlazarRuntimeError):
    """Images asked of a model that has no vision projector."""

    code = "VISION_PROJECTOR_MISSING"


class ContextTooLarge(BlazarRuntimeError):
    """A context above what the model can serve, refused in strict mode."""

    code = "CONTEXT_TOO_LARGE"


# -- admission --------------------------------------------------------------------


class AdmissionRejected(BlazarRuntimeError):
    """Refused or expired before a slot was free: the queue is full, the deadline
    cannot be met or has passed, every slot stayed busy, or the daemon shuts down."""

    def __init__(self, code: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.code = code


class Preempted(BlazarRuntimeError):
    """A batch or background request gave its slot to an interactive one before its first
    output (``Slot.preemptible``): whoever holds it releases the slot and asks again with
    ``requeue=slot.requeue()`` — never an answer to a client."""

    code = "PREEMPTED"

    def __init__(self, model: str) -> None:
        super().__init__(f"preempted on '{model}' by an interactive request before its first output")
        self.model = model


# -- lifecycle --------------------------------------------------------------------


class MaxLoadedModels(BlazarRuntimeError):
    """Loading one more model would exceed ``max_loaded_models`` and every loaded model is busy."""

    code = "MAX_LOADED_MODELS"


class ModelTooLarge(BlazarRuntimeError):
    """The model's estimated footprint exceeds the memory budget even with nothing else loaded."""

    code = "MODEL_TOO_LARGE"


class InsufficientMemory(BlazarRuntimeError):
    """The model fits the budget, but not beside the models that are busy now."""

    code = "INSUFFICIENT_MEMORY"


class ModelBusy(BlazarRuntimeError):
    """An unload that only takes idle models found this one serving requests."""

    code = "MODEL_BUSY"


class QuantizeDegraded(BlazarRuntimeError):
    """``blazar quantize --verify``: the quantized model's perplexity rose more than allowed
    over the original's; the result was not kept."""

    code = "QUANTIZE_DEGRADED"


# -- peers ------------------------------------------------------------------------


class PeerNotFound(BlazarRuntimeError):
    """No ``[[remotes]]`` peer (nor ``dns`` remote) has this name."""

    code = "PEER_NOT_FOUND"


class PeerIsSelf(BlazarRuntimeError):
    """The peer named is this daemon itself (its own address in a ``dns`` remote's answer)."""

    code = "BAD_REQUEST"


class PeerUnavailable(BlazarRuntimeError):
    """The peer cannot be reached now (down, no connection, the connection broke)."""

    code = "PEER_UNAVAILABLE"


class PeerRefused(BlazarRuntimeError):
    """The peer answered with an error: ``code`` is the one it gave (another Blazar daemon's
    ``blazar_code``), or ``fallback`` where it gave none; a caller that serves a catalog of
    codes answers ``fallback`` for a code it does not list (a newer peer's)."""

    def __init__(self, code: str | None, message: str, *, fallback: str) -> None:
        super().__init__(message)
        self.code = code or fallback
        self.fallback = fallback


# -- sessions ---------------------------------------------------------------------


class SessionError(BlazarRuntimeError):
    """A saved prompt cache that cannot be saved, found or restored (``actors/sessions.py``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- ledger -----------------------------------------------------------------------


class LedgerError(BlazarRuntimeError):
    """The ledger file cannot be opened, migrated or written; ``code`` is ``DISK_FULL`` when
    the disk holding it is full (an answer, 507), else ``INTERNAL``."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


# -- jobs -------------------------------------------------------------------------


class PartNotFound(BlazarRuntimeError):
    """No part of a multi-node engine runs here under this id (stopped and forgotten, or this
    daemon restarted since)."""

    code = "NOT_FOUND"


class JobNotFound(BlazarRuntimeError):
    """No job has this id (never submitted, or pruned after its retention time)."""

    code = "JOB_NOT_FOUND"


class JobNotRunnable(BlazarRuntimeError):
    """The job cannot do what was asked in its state (cancel a job that has ended)."""

    code = "JOB_FINISHED"
