"""What ``blazar doctor`` gathers (``gather``) and what it concludes (``judge``).

Facts are plain data read from the machine and the home; findings are the
verdicts, each with a stable ``code`` (docs/operations.md lists them all).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from actors.census import Census

__all__ = [
    "BlobFact",
    "DaemonFact",
    "DiskFact",
    "EngineFact",
    "Facts",
    "Finding",
    "Fixed",
    "LedgerFact",
    "PartialFact",
    "PidFact",
    "PortFact",
    "ProcFact",
    "Report",
    "Severity",
]

Severity = Literal["ok", "warn", "error"]


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    severity: Severity
    code: str
    """Stable: scripts may match on it."""
    message: str
    hint: str | None = None
    """What to do next."""
    fixable: bool = False
    """``--fix`` repairs it (only safe repairs: nothing stored is lost)."""
    path: str | None = None
    pid: int | None = None
    argv: str | None = None
    """The command line a fix must still find before it kills ``pid``."""


class Fixed(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    done: str
    """What the repair did, or why it did nothing."""
    ok: bool


class Report(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    """No error remains."""
    errors: int
    warnings: int
    findings: list[Finding]
    fixed: list[Fixed] = []


class EngineFact(msgspec.Struct, frozen=True, kw_only=True):
    configured: str | None
    """``engine.llama_server`` from the config."""
    binary: str | None
    """The ``llama-server`` the daemon would run (configured or on PATH)."""
    runnable: bool = False
    version: str | None = None
    gpu_backend: str | None = None
    xllamacpp: str | None = None
    """The xllamacpp wheel's version; None: not installed."""
    active: dict[str, str] = {}
    """Lane → its active version (``bundled``: what Blazar was installed with)."""
    stale_receipts: dict[str, str] = {}
    """Model → the version its newest speed receipt was measured on, where that is not the
    lane's active version (``blazar engine use`` measured it before a later switch)."""


class BlobFact(msgspec.Struct, frozen=True, kw_only=True):
    """One stored file, and what its models' manifests and its format's header say of it
    (``registry.integrity``)."""

    digest: str
    path: str
    models: list[str]
    expected_size: int | None
    """This file's own size as the manifest records it (a multi-file model's file, an adapter,
    a one-file GGUF); None where it records none (a split GGUF's parts, a projector)."""
    size: int | None
    """None: the file is missing (or a link whose target is gone)."""
    link_target: str | None = None
    names: list[str] = []
    """What the file is to its models: ``model.bin``, ``en_US-joe-medium.onnx.json``, ``model
    file``, ``part 2 of 3``, ``projector``, ``LoRA adapter 'NAME'``."""
    check: str | None = None
    """The header check its format has (``gguf``, ``safetensors``, ``zip``, ``ggml-whisper``,
    ``ctranslate2``, ``onnx``, ``json``); None: size and digest only."""
    incomplete: str | None = None
    """Why its own header says the file is cut short; None: it holds what its header declares."""
    invalid: str | None = None
    """Why its header is not its format's (replaced or damaged); None: it is."""
    sha256: str | None = None
    """With ``--deep``: the hash of the bytes."""


class PartialFact(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int
    modified_at: float
    in_use: bool
    """A pull holds its lock now."""


class PidFact(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    pid: int | None
    parent: int | None
    argv: str
    child_runs: bool
    """``pid`` still runs the command line the file names."""
    parent_alive: bool


class ProcFact(msgspec.Struct, frozen=True, kw_only=True):
    """An engine process serving a model of this home, found in /proc."""

    pid: int
    ppid: int
    argv: str
    parent_is_daemon: bool


class DaemonFact(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    exists: bool
    pid: int | None = None
    alive: bool = False
    """The pid runs and is a Blazar process."""
    url: str | None = None
    port: int | None = None
    answers: bool = False


class PortFact(msgspec.Struct, frozen=True, kw_only=True):
    host: str
    port: int
    free: bool
    error: str | None = None
    blazar_version: str | None = None
    """What answers there says it is a Blazar daemon of this version."""


class LedgerFact(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    exists: bool
    result: list[str] = []
    """``quick_check`` (or ``integrity_check`` with ``--deep``): ``["ok"]`` when sound."""
    error: str | None = None
    schema_version: int | None = None


class DiskFact(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    free: int
    total: int


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    deep: bool
    census: Census
    config_file: str
    config_error: str | None
    unknown_models: list[str]
    """Models the config names (overrides, preload) that are not installed."""
    engine: EngineFact
    models: list[str]
    bad_manifests: list[str]
    blobs: list[BlobFact]
    orphan_files: int
    orphan_bytes: int
    partials: list[PartialFact]
    pidfiles: list[PidFact]
    engine_procs: list[ProcFact]
    daemon: DaemonFact
    port: PortFact | None
    ledger: LedgerFact
    disk: DiskFact
