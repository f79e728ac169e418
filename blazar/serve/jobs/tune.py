"""``blazar tune``'s search: which launch settings to try, in what order, and which won.

A coordinate search from the settings the model runs with now (the baseline): one setting
at a time, each of its candidate values is measured with the others at their best so far,
and a value is kept only when it is faster than the best by more than ``min_gain`` (on a
shared machine smaller differences are noise). The settings searched are the ones that
matter to llama.cpp's speed here — slots (only when more than one request runs at a
time), GPU layers (only with a GPU), threads, flash attention, the KV cache's type, the
prompt batch and the micro-batch — except those the model's own table in config.toml
pins, which are left as they are. When the search ends on other values than the
baseline's, both are measured once more and the winner is kept only if it wins again.

Pure: the caller measures (``measure``) and checks memory (``fits``); the search itself
is unit-tested with a deterministic speed function.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DIMENSIONS", "Facts", "Trial", "dimensions", "search", "winner_profile"]

DIMENSIONS = ("slots", "gpu_layers", "threads", "flash_attn", "kv_cache", "prompt_batch", "micro_batch")
"""The tuned settings (``actors.config.Profile``'s fields), in the order they are searched:
the largest levers first, so that a small budget spends its trials where they matter."""

Values = dict[str, Any]


@dataclass(frozen=True)
class Facts:
    cpus: int
    """CPU cores the engine may use."""
    concurrency: int
    """Requests the workload runs at once."""
    current: Values
    """Each tuned setting as the model runs now (None: the engine's own choice)."""
    pinned: dict[str, str] = field(default_factory=dict)
    """Settings config.toml fixes for this model → the key that fixes them."""
    gpu_layers: int | None = None
    """All the model's layers, when a GPU build of llama-server runs it; None: the CPU lane."""
    lane: str = "llamacpp"
    """The lane that runs the model: other lanes than llama.cpp's take only ``slots``."""


@dataclass
class Trial:
    values: Values
    changed: str | None
    """The setting this trial changed from the best so far; None for the baseline;
    ``confirm baseline`` and ``confirm best`` for the runs that check the winner."""
    score: float | None = None
    """The workload's tokens per second; None when it was not measured."""
    figures: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""


def _threads(cpus: int) -> list[int]:
    return sorted({cpus, max(1, cpus // 2), max(1, cpus - 1)}, reverse=True)


def _batches(gpu: bool) -> list[int]:
    return [512, 1024, 2048] if gpu else [128, 256, 512]


def dimensions(facts: Facts) -> tuple[list[tuple[str, list[Any]]], dict[str, str]]:
    """Each searched setting with the values to try, and each skipped one with why."""
    tried: list[tuple[str, list[Any]]] = []
    skipped: dict[str, str] = {}
    gpu = facts.gpu_layers is not None
    for name in DIMENSIONS:
        if facts.lane != "llamacpp" and name != "slots":
            skipped[name] = f"a llama.cpp setting: this model runs on the {facts.lane} lane"
            continue
        if name in facts.pinned:
            skipped[name] = f"pinned by {facts.pinned[name]} in config.toml"
            continue
        values: list[Any]
        if name == "threads":
            values = _threads(facts.cpus)
        elif name == "flash_attn":
            values = ["on", "off"]
        elif name == "kv_cache":
            values = ["f16", "q8_0"]
        elif name == "prompt_batch":
            values = _batches(gpu)
        elif name == "micro_batch":
            values = ["half", "quarter"]  # of the prompt batch the search has chosen by then
        elif name == "slots":
            if facts.concurrency <= 1:
                skipped[name] = "one request at a time (tune with --concurrency N for a parallel workload)"
                continue
            values = sorted({1, max(1, facts.concurrency // 2), facts.concurrency})
        else:  # gpu_layers
            if facts.gpu_layers is None:
                skipped[name] = "no GPU build of llama-server runs this model here"
                continue
            n = facts.gpu_layers
            values = sorted({n, (n * 3) // 4, n // 2}, reverse=True)
        tried.append((name, values))
    return tried, skipped


def _concrete(name: str, value: Any, best: Values) -> Any:
    if name != "micro_batch":
        return value
    batch = best.get("prompt_batch") or 512
    return max(16, batch // (2 if value == "half" else 4))


def _conflict(values: Values) -> str | None:
    if values.get("kv_cache") not in (None, "f16") and values.get("flash_attn") == "off":
        return "a quantized KV cache needs flash attention"
    batch, micro = values.get("prompt_batch"), values.get("micro_batch")
    if batch is not None and micro is not None and micro > batch:
        return "the micro-batch exceeds the prompt batch"
    return None


async def search(
    facts: Facts,
    measure: Callable[[Values], Awaitable[tuple[float | None, dict[str, Any]]]],
    fits: Callable[[Values], Awaitable[str | None]],
    *,
    budget: int,
    min_gain: float = 0.05,
) -> tuple[list[Trial], Values, dict[str, str]]:
    """Measure the baseline, then each candidate value until ``budget`` trials are spent.

    ``measure(values)`` returns the workload's tokens per second (None: the run failed)
    and its figures; ``fits(values)`` returns why the values do not fit in memory, or None.
    Returns every trial, the best values and the settings not searched (with why)."""
    tried, skipped = dimensions(facts)
    best = dict(facts.current)
    baseline = Trial(values=dict(best), changed=None)
    baseline.score, baseline.figures = await measure(best)
    trials = [baseline]
    if baseline.score is None:
        baseline.verdict = "failed: " + str(baseline.figures.get("error", "no answer"))
        return trials, best, skipped
    baseline.verdict = "baseline"
    best_score = baseline.score
    for name, values in tried:
        start = best.get(name)  # measured already, as part of the best so far
        for raw in values:
            value = _concrete(name, raw, best)
            if value == start or value == best.get(name):
                continue
            if len(trials) >= budget:
                skipped.setdefault(name, f"the budget of {budget} trials was spent")
                break
            candidate = {**best, name: value}
            trial = Trial(values=candidate, changed=name)
            trials.append(trial)
            why = _conflict(candidate) or await fits(candidate)
            if why is not None:
                trial.verdict = f"skipped: {why}"
                continue
            trial.score, trial.figures = await measure(candidate)
            if trial.score is None:
                trial.verdict = "failed: " + str(trial.figures.get("error", "no answer"))
            elif trial.score > best_score * (1 + min_gain):
                trial.verdict = f"kept ({trial.score / best_score - 1:+.0%})"
                best, best_score = candidate, trial.score
            else:
                trial.verdict = f"not kept ({trial.score / best_score - 1:+.0%})"
    if best != facts.current:
        best = await _confirm(facts.current, best, measure, trials, min_gain)
    return trials, best, skipped


async def _confirm(
    baseline: Values,
    best: Values,
    measure: Callable[[Values], Awaitable[tuple[float | None, dict[str, Any]]]],
    trials: list[Trial],
    min_gain: float,
) -> Values:
    """Measure the baseline and the winner once more, side by side: the winner of a search
    over noisy runs is biased towards a lucky run, so it is kept only if it wins again."""
    again = []
    for values, role in ((baseline, "baseline"), (best, "best")):
        trial = Trial(values=dict(values), changed=f"confirm {role}")
        trial.score, trial.figures = await measure(values)
        trials.append(trial)
        again.append(trial)
    base, win = again
    if base.score is None or win.score is None:
        failed = base if base.score is None else win
        failed.verdict = "failed: " + str(failed.figures.get("error", "no answer"))
        win.verdict += "; the baseline stays"
        return baseline
    gain = win.score / base.score - 1
    base.verdict = "re-measured"
    if win.score > base.score * (1 + min_gain):
        win.verdict = f"confirmed ({gain:+.0%} over the baseline)"
        return best
    win.verdict = f"not confirmed ({gain:+.0%}): the baseline stays"
    return baseline


def winner_profile(best: Values, plain: Values) -> Values:
    """The settings of ``best`` that differ from ``plain`` (what the model runs with without a
    profile): what the stored profile sets."""
    return {k: v for k, v in best.items() if v is not None and v != plain.get(k)}
