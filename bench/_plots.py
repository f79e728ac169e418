"""PNG plots with matplotlib (the ``bench`` extra); without it, results carry no plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["available", "bars", "cdf", "lines", "timeseries"]

Series = Mapping[str, Sequence[dict[str, Any]]]
"""Label → one run summary (median/min/max) per x value."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def available() -> bool:
    return _pyplot() is not None


def _errors(points: Sequence[dict[str, Any]]) -> tuple[list[float], list[list[float]]]:
    """Medians, and their distances to min and max (a missing figure plots as 0)."""
    med: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for p in points:
        m = float(p.get("median") or 0.0)
        med.append(m)
        lo.append(m - float(p["min"]) if p.get("min") is not None else 0.0)
        hi.append(float(p["max"]) - m if p.get("max") is not None else 0.0)
    return med, [lo, hi]


def lines(path: Path, *, title: str, xlabel: str, ylabel: str, xs: Sequence[float], series: Series) -> bool:
    """Medians joined by lines, min-max as error bars."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, points in series.items():
        med, err = _errors(points)
        ax.errorbar(list(xs), med, yerr=err, marker="o", capsize=3, label=label)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_xticks(list(xs))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(plt, fig, path)
    return True


def bars(
    path: Path, *, title: str, ylabel: str, groups: Sequence[str], series: Series, log: bool = False
) -> bool:
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (label, points) in enumerate(series.items()):
        med, err = _errors(points)
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, med, width, yerr=err, capsize=3, label=label)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set(title=title, ylabel=ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    _save(plt, fig, path)
    return True


def cdf(path: Path, *, title: str, xlabel: str, series: Mapping[str, Sequence[float]]) -> bool:
    """The empirical distribution of each series' values."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, values in series.items():
        data = sorted(values)
        if data:
            ax.step(data, [(i + 1) / len(data) for i in range(len(data))], where="post", label=label)
    ax.set(title=title, xlabel=xlabel, ylabel="fraction of trials")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(plt, fig, path)
    return True


def timeseries(
    path: Path, *, title: str, xlabel: str, ylabel: str, xs: Sequence[float], ys: Sequence[float]
) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.plot(list(xs), list(ys))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _save(plt, fig, path)
    return True
