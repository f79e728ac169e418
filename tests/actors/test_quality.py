"""``actors.quality``'s decisions: a perplexity from log-probabilities, and the verdict on two."""

from __future__ import annotations

import math

import pytest

from actors.quality import Quality, judge, perplexity_of


def test_perplexity_is_the_exponential_of_the_mean_surprise() -> None:
    assert perplexity_of([math.log(0.5)] * 4) == pytest.approx(2.0)
    assert perplexity_of([math.log(0.5), math.log(0.125)]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        perplexity_of([])


@pytest.mark.parametrize(
    ("after", "limit", "change", "kept"),
    [(20.0, 10.0, 0.0, True), (21.0, 10.0, 5.0, True), (22.0, 10.0, 10.0, True), (22.2, 10.0, 11.0, False),
     (19.0, 0.0, -5.0, True), (20.01, 0.0, 0.05, False)],
)  # fmt: skip
def test_judge(after: float, limit: float, change: float, kept: bool) -> None:
    verdict = judge(
        Quality(model="a", perplexity=20.0, tokens=9), Quality(model="b", perplexity=after, tokens=9), limit
    )
    assert verdict.degradation_pct == pytest.approx(change) and verdict.kept is kept
