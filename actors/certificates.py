"""Capability certificates and benchmark receipts: what a model was seen to do, and how fast.

A certificate records, per capability (chat, streaming, tools, JSON schema, embeddings,
vision, thinking), whether a probe through the gateway passed, failed or did not apply,
with the request and answer that show it and the engine version that gave it. A receipt
records one benchmark run: speeds and latency percentiles per concurrency level, with the
engine version and launch settings it ran under. Both are ledger rows; the newest
certificate per model is what admission trusts (``CertificateBook``).

Pure data and SQL here: the probes and benchmarks themselves run in the gateway layer,
which knows HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from actors.ledger import read_rows

__all__ = [
    "CAPABILITIES",
    "Certificate",
    "CertificateBook",
    "Probe",
    "Receipt",
    "Status",
    "certificate_statement",
    "engine_tag",
    "percentile",
    "read_certificate",
    "read_certificates",
    "read_receipts",
    "receipt_statement",
    "truncate",
]

Status = Literal["PASS", "FAIL", "N/A"]

CAPABILITIES: tuple[str, ...] = ("chat", "stream", "tools", "json_schema", "embeddings", "vision", "thinking")
"""Every capability a certificate speaks of, in the order it is shown."""

EVIDENCE_CHARS = 600
"""How much of a probe's request and answer a certificate keeps."""


class Probe(msgspec.Struct, frozen=True, kw_only=True):
    """One capability's verdict and what shows it."""

    capability: str
    status: Status
    detail: str
    """Why, in a sentence (what was wrong, or why it does not apply)."""
    request: str = ""
    answer: str = ""
    ms: float | None = None


class Certificate(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    engine: str
    """The engine and its version (``engine_tag``) that answered the probes."""
    created_at: float
    probes: list[Probe]
    job_id: str | None = None

    def status(self, capability: str) -> Status | None:
        for probe in self.probes:
            if probe.capability == capability:
                return probe.status
        return None

    def probe(self, capability: str) -> Probe | None:
        return next((p for p in self.probes if p.capability == capability), None)

    def summary(self) -> dict[str, Status]:
        return {p.capability: p.status for p in self.probes}


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """One ``blazar bench`` run."""

    id: str
    model: str
    engine: str
    created_at: float
    settings: dict[str, Any]
    """The launch settings it ran under (lane, slots, per-slot context, …) and the run's own."""
    levels: list[dict[str, Any]]
    """Per concurrency level: prefill and decode tokens/s, TTFT and inter-token percentiles."""


def truncate(text: str, limit: int = EVIDENCE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


_LANE_OF_KIND = {"llamacpp-host": "llamacpp", "llama-server": "llamacpp", "mistralrs-host": "mistralrs"}


def engine_tag(settings: Mapping[str, Any]) -> str:
    """``kind version`` of the engine a model runs on, from its explained settings
    (``engine``, ``engine_version``): an installed version by its name, the bundled one by
    its package's version."""
    kind = str(settings.get("engine") or "unknown")
    release = settings.get("engine_version")
    if release:
        return f"{kind} {release}"
    from actors.engines.versions import bundled_version

    lane = _LANE_OF_KIND.get(kind, kind)
    version = bundled_version(lane)
    return f"{kind} {version}" if version else f"{kind} bundled"


# -- the ledger ---------------------------------------------------------------


def certificate_statement(cert: Certificate) -> tuple[str, tuple[Any, ...]]:
    return (
        "INSERT INTO certificates (model, engine, created_at, job_id, probes) VALUES (?, ?, ?, ?, ?)",
        (cert.model, cert.engine, cert.created_at, cert.job_id, msgspec.json.encode(cert.probes)),
    )


def receipt_statement(receipt: Receipt) -> tuple[str, tuple[Any, ...]]:
    return (
        "INSERT INTO bench_receipts (id, model, engine, created_at, settings, levels) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            receipt.id,
            receipt.model,
            receipt.engine,
            receipt.created_at,
            msgspec.json.encode(receipt.settings),
            msgspec.json.encode(receipt.levels),
        ),
    )


def _certificate(row: tuple[Any, ...]) -> Certificate:
    model, engine, created_at, job_id, probes = row
    return Certificate(
        model=model,
        engine=engine,
        created_at=created_at,
        job_id=job_id,
        probes=msgspec.json.decode(probes, type=list[Probe]),
    )


_CERT_SELECT = "SELECT model, engine, created_at, job_id, probes FROM certificates"


def read_certificate(path: Path, model: str) -> Certificate | None:
    """The newest certificate of ``model``. Synchronous (a worker thread in async code)."""
    rows = read_rows(
        path, f"{_CERT_SELECT} WHERE model = ? ORDER BY created_at DESC, id DESC LIMIT 1", (model,)
    )
    return _certificate(rows[0]) if rows else None


def read_certificates(path: Path) -> dict[str, Certificate]:
    """The newest certificate of each model."""
    rows = read_rows(
        path,
        f"{_CERT_SELECT} WHERE id IN (SELECT MAX(id) FROM certificates GROUP BY model)",
    )
    return {row[0]: _certificate(row) for row in rows}


def read_receipts(path: Path, model: str | None = None, *, limit: int = 50) -> list[Receipt]:
    """Receipts, newest first; only ``model``'s when given."""
    sql = "SELECT id, model, engine, created_at, settings, levels FROM bench_receipts"
    params: tuple[Any, ...] = ()
    if model is not None:
        sql += " WHERE model = ?"
        params = (model,)
    sql += " ORDER BY created_at DESC LIMIT ?"
    rows = read_rows(path, sql, (*params, limit))
    return [
        Receipt(
            id=r[0],
            model=r[1],
            engine=r[2],
            created_at=r[3],
            settings=msgspec.json.decode(r[4]),
            levels=msgspec.json.decode(r[5]),
        )
        for r in rows
    ]


class CertificateBook:
    """The newest certificate of each model, in memory, for admission's checks (which run
    on every request and must not read the disk). Loaded once from the ledger; each new
    certificate is put here once it is committed."""

    def __init__(self, certificates: Mapping[str, Certificate] | None = None) -> None:
        self._certs: dict[str, Certificate] = dict(certificates or {})

    @classmethod
    def load(cls, path: Path) -> CertificateBook:
        return cls(read_certificates(path))

    def get(self, model: str) -> Certificate | None:
        return self._certs.get(model)

    def put(self, cert: Certificate) -> None:
        self._certs[cert.model] = cert

    def failed(self, model: str, capability: str) -> Probe | None:
        """The probe that failed ``capability`` for ``model``, or None (passed, not applicable,
        or never certified)."""
        cert = self._certs.get(model)
        probe = cert.probe(capability) if cert is not None else None
        return probe if probe is not None and probe.status == "FAIL" else None
