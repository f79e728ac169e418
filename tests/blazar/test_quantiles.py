"""The sliding-window quantiles behind /api/quantiles."""

from __future__ import annotations

import pytest

from blazar.telemetry.quantiles import QuantileWindow, Sample, quantile


def _s(at: float, e2e: float, *, ttft: float | None = None, tpot: float | None = None) -> Sample:
    return Sample(at_s=at, ttft_s=ttft, tpot_s=tpot, queue_s=0.0, e2e_s=e2e)


def test_quantile_interpolates_like_numpy_linear() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert quantile(values, 0.0) == 1.0
    assert quantile(values, 1.0) == 4.0
    assert quantile(values, 0.5) == 2.5
    assert quantile(values, 0.95) == pytest.approx(3.85)
    assert quantile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile(values, 1.5)


def test_summary_per_model_and_temperature() -> None:
    w = QuantileWindow(max_requests=100, max_age_s=60)
    for i in range(1, 101):
        w.add("m", _s(10.0, i / 1000, ttft=i / 1000, tpot=0.01), cold=False)
    w.add("m", _s(10.0, 2.0, ttft=1.5), cold=True)
    out = w.summary(now_s=20.0)
    warm = out["m"]["warm"]
    assert warm["count"] == 100
    assert warm["e2e_ms"] == {"p50": 50.5, "p95": 95.05, "p99": 99.01}
    assert warm["tpot_ms"] == {"p50": 10.0, "p95": 10.0, "p99": 10.0}
    cold = out["m"]["cold"]
    assert cold["count"] == 1 and cold["ttft_ms"] == {"p50": 1500.0, "p95": 1500.0, "p99": 1500.0}
    assert cold["tpot_ms"] is None  # no token timing in that sample


def test_window_drops_old_and_keeps_newest_n() -> None:
    w = QuantileWindow(max_requests=3, max_age_s=10)
    for at, e2e in [(0.0, 9.0), (5.0, 1.0), (6.0, 2.0), (7.0, 3.0)]:
        w.add("m", _s(at, e2e), cold=False)
    assert w.summary(now_s=8.0)["m"]["warm"]["count"] == 3  # the first fell out of the newest 3
    assert w.summary(now_s=16.5)["m"]["warm"]["count"] == 1  # 5.0 and 6.0 are older than 10 s
    assert w.summary(now_s=100.0) == {}
