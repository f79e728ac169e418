"""Certificates and receipts: their ledger rows, the in-memory book, percentiles, engine tags."""

from __future__ import annotations

from pathlib import Path

import trio

from actors.certificates import (
    Certificate,
    CertificateBook,
    Probe,
    Receipt,
    certificate_statement,
    engine_tag,
    percentile,
    read_certificate,
    read_certificates,
    read_receipts,
    receipt_statement,
    truncate,
)
from actors.engines.versions import bundled_version
from actors.ledger import LedgerActor, Write


def _cert(model: str, at: float, tools: str = "PASS") -> Certificate:
    return Certificate(
        model=model,
        engine="llamacpp-host 0.0.1",
        created_at=at,
        job_id=f"job-{at}",
        probes=[
            Probe(
                capability="chat", status="PASS", detail="a non-empty answer", request="{}", answer="Hello!"
            ),
            Probe(capability="tools", status=tools, detail="no tool call in the answer", answer="I cannot"),  # type: ignore[arg-type]
            Probe(capability="vision", status="N/A", detail="no vision projector"),
        ],
    )


async def test_certificates_and_receipts_round_trip_through_the_ledger(tmp_path: Path) -> None:
    db = tmp_path / "blazar.db"
    old, new, other = _cert("m", 1.0, "FAIL"), _cert("m", 2.0, "PASS"), _cert("o", 1.5, "FAIL")
    receipts = [
        Receipt(id=f"bench_{i}", model="m", engine="e 1", created_at=float(i),
                settings={"launch": {"slots": 4}}, levels=[{"concurrency": 1, "decode_tps": 100.0 + i}])
        for i in range(3)
    ]  # fmt: skip
    with trio.fail_after(10):
        ledger = LedgerActor(db)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            statements = tuple(certificate_statement(c) for c in (old, new, other))
            await ledger.ask(Write(statements=statements + tuple(receipt_statement(r) for r in receipts)))
            nursery.cancel_scope.cancel()
    assert read_certificate(db, "m") == new
    assert read_certificate(db, "nope") is None
    assert read_certificates(db) == {"m": new, "o": other}
    assert [r.id for r in read_receipts(db, "m")] == ["bench_2", "bench_1", "bench_0"]
    assert read_receipts(db, "m", limit=1) == [receipts[2]]
    assert read_receipts(db, "o") == []
    book = CertificateBook.load(db)
    assert book.failed("m", "tools") is None  # the newest passed
    failed = book.failed("o", "tools")
    assert failed is not None and failed.answer == "I cannot"
    assert book.failed("o", "vision") is None and book.failed("o", "chat") is None
    book.put(_cert("m", 3.0, "FAIL"))
    assert book.failed("m", "tools") is not None


def test_a_ledger_not_yet_made_reads_as_empty(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    assert read_certificate(db, "m") is None and read_receipts(db) == []
    assert CertificateBook.load(db).get("m") is None


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 100.0
    assert abs((percentile(values, 99) or 0) - 99.01) < 1e-9
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order does not matter


def test_engine_tag_names_the_version() -> None:
    assert engine_tag({"engine": "llamacpp-host", "engine_version": "b5000"}) == "llamacpp-host b5000"
    bundled = bundled_version("llamacpp")
    assert (
        engine_tag({"engine": "llamacpp-host", "engine_version": None})
        == f"llamacpp-host {bundled or 'bundled'}"
    )
    assert engine_tag({}) == "unknown bundled"


def test_truncate_keeps_short_text() -> None:
    assert truncate("abc", 5) == "abc"
    assert truncate("abcdef", 4) == "abc…"
