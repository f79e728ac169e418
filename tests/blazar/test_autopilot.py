"""The autopilot's rules over request records: what each kind of traffic leads to, and what
leads to nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.ledger import RequestRecord
from blazar.cli.autopilot import write_recommendations
from blazar.config import resolve_paths
from blazar.ops.autopilot import Current, recommend
from tests.tomlkit_versions import Scenario

NOW = Current(slots=2, ctx=1024, keep_alive_s=60.0, training_ctx=8192)


def rec(t: float, *, model: str = "m", queue_ms: float | None = 0.0, load_ms: float | None = None,
        duration_ms: float = 500.0, error: str | None = None) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        trace_id=f"t{t}",
        started_at=t,
        method="POST",
        path="/v1/chat/completions",
        model=model,
        status=200 if error is None else 400,
        duration_ms=duration_ms,
        ttft_ms=None,
        blazar_code=None if error is None else "PROMPT_TOO_LONG",
        bytes_out=10,
        client=None,
        queue_ms=queue_ms,
        load_ms=load_ms,
        error=error,
    )


def test_a_model_that_queues_gets_twice_the_slots() -> None:
    rows = [rec(i, queue_ms=900.0 if i % 2 else 10.0) for i in range(8)]
    (r,) = recommend(rows, {"m": NOW})
    assert (r.rule, r.key, r.value, r.now) == ("queueing", 'models."m".slots', 4, 2)
    assert "4 of 8 requests waited over 0.5 s" in r.evidence and "with 2 slots" in r.evidence


def test_little_or_short_waiting_changes_nothing() -> None:
    assert recommend([rec(i, queue_ms=2000.0) for i in range(4)], {"m": NOW}) == []  # too few
    assert recommend([rec(i, queue_ms=900.0 if i == 0 else 0.0) for i in range(8)], {"m": NOW}) == []
    full = Current(slots=16, ctx=1024, keep_alive_s=60.0)
    assert recommend([rec(i, queue_ms=2000.0) for i in range(8)], {"m": full}) == []


def test_prompts_refused_for_length_get_a_context_that_holds_them() -> None:
    said = "the prompt has 1500 tokens but the context holds 1024 per slot — shorten it"
    rows = [rec(0), rec(1, error=said), rec(2, error=said.replace("1500", "1300"))]
    (r,) = recommend(rows, {"m": NOW})
    assert (r.rule, r.key, r.value, r.now) == ("context", 'models."m".ctx', 2048, 1024)
    assert "2 requests refused" in r.evidence and "longest prompt 1500 tokens" in r.evidence
    # never past what the model was trained for
    small = Current(slots=2, ctx=1024, keep_alive_s=60.0, training_ctx=1536)
    (capped,) = recommend(rows, {"m": small})
    assert capped.value == 1536 and "capped" in capped.evidence


def test_reloads_after_idle_gaps_get_a_longer_keep_alive() -> None:
    # loaded at 0, then idle 100 s (keep-alive 60 s) twice: each use loads it again
    rows = [rec(0, load_ms=800.0), rec(100.5, load_ms=700.0), rec(250, load_ms=750.0), rec(251)]
    (r,) = recommend(rows, {"m": NOW})
    assert (r.rule, r.key, r.now) == ("reloads", 'models."m".keep_alive_s', 60.0)
    assert r.value == 240.0  # 149.5 s gap times 1.5, rounded up to minutes
    assert "loaded 3 times" in r.evidence and "2 reloads came after it was unloaded idle" in r.evidence


def test_reloads_within_the_keep_alive_are_evictions_with_advice_and_no_key() -> None:
    rows = [rec(0, load_ms=800.0), rec(10, load_ms=700.0), rec(20, load_ms=750.0)]
    (r,) = recommend(rows, {"m": NOW})
    assert (
        r.rule == "reloads"
        and r.key is None
        and "evicted" in r.evidence
        and "max_loaded_models" in r.evidence
    )


def test_models_no_longer_installed_and_quiet_traffic_give_nothing() -> None:
    rows = [rec(i, model="gone", queue_ms=5000.0) for i in range(10)] + [rec(1), rec(2)]
    assert recommend(rows, {"m": NOW}) == []


TUNED = """\
# tuned by hand
slots = 2

[models."m"]
slots = 2  # two at once for now
# the context, halved to fit
ctx = 1024

# the others
[models."other"]
ctx = 4096
"""


def apply_all_rules(home: Path) -> str:
    """A scenario (tests.tomlkit_versions): ``autopilot --apply`` over traffic that queues, is
    refused for length and reloads."""
    said = "the prompt has 1500 tokens but the context holds 1024 per slot — shorten it"
    rows = [rec(i, queue_ms=900.0 if i % 2 else 10.0) for i in range(8)]
    rows += [rec(8, error=said), rec(9, load_ms=800.0), rec(110, load_ms=700.0), rec(260, load_ms=750.0)]
    recs = recommend(rows, {"m": NOW})
    assert [r.rule for r in recs] == ["queueing", "context", "reloads"]
    path = home / "config.toml"
    path.write_text(TUNED)
    write_recommendations(resolve_paths(), recs)
    return path.read_text()


def test_apply_keeps_comments_and_order(on_tomlkit: Callable[[Scenario], Any]) -> None:
    """--apply writes as `blazar config set` does, the same on every tomlkit version allowed: the
    replaced values keep their lines and comments, the new key follows the table's last key."""
    assert on_tomlkit(apply_all_rules) == (
        "# tuned by hand\n"
        "slots = 2\n"
        "\n"
        '[models."m"]\n'
        "slots = 4  # two at once for now\n"
        "# the context, halved to fit\n"
        "ctx = 2048\n"
        "keep_alive_s = 240.0\n"
        "\n"
        "# the others\n"
        '[models."other"]\n'
        "ctx = 4096\n"
    )
