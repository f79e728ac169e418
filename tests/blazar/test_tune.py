"""``blazar tune``'s search (blazar/serve/jobs/tune.py): what it tries, in what order, within its budget,
and which values it keeps; speeds come from a fixed function of the settings so that each
decision is known in advance."""

from __future__ import annotations

from typing import Any

import trio

from blazar.serve.jobs.tune import Facts, dimensions, search, winner_profile

NOW = {
    "slots": 4, "gpu_layers": None, "threads": None, "flash_attn": None, "kv_cache": "f16",
    "prompt_batch": 256, "micro_batch": None,
}  # fmt: skip


def _speed(values: dict[str, Any]) -> float:
    """Fewer slots, two threads, flash attention on and a 512 batch are each faster."""
    speed = 10.0
    speed *= {1: 3.0, 2: 2.0}.get(values["slots"], 1.0)
    speed *= 1.5 if values["threads"] == 2 else 1.0
    speed *= 1.2 if values["flash_attn"] == "on" else 1.0
    speed *= 1.02 if values["kv_cache"] == "q8_0" else 1.0  # under the 5 % a value must gain
    speed *= 1.3 if values["prompt_batch"] == 512 else 1.0
    return speed


def _run(facts: Facts, budget: int, speed=_speed, fits=None):  # type: ignore[no-untyped-def]
    async def measure(values: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
        score = speed(values)
        return (score, {"aggregate_tps": score}) if score is not None else (None, {"error": "boom"})

    async def fits_(values: dict[str, Any]) -> str | None:
        return fits(values) if fits else None

    return trio.run(lambda: search(facts, measure, fits_, budget=budget))


def test_the_dimensions_follow_the_hardware_and_the_pins() -> None:
    tried, skipped = dimensions(
        Facts(cpus=8, concurrency=1, current=NOW, pinned={"kv_cache": 'models."m".kv_cache'})
    )
    names = [n for n, _ in tried]
    assert names == ["threads", "flash_attn", "prompt_batch", "micro_batch"]
    assert dict(tried)["threads"] == [8, 7, 4]
    assert skipped["slots"].startswith("one request at a time")
    assert skipped["gpu_layers"] == "no GPU build of llama-server runs this model here"
    assert skipped["kv_cache"] == 'pinned by models."m".kv_cache in config.toml'
    gpu, _ = dimensions(Facts(cpus=2, concurrency=8, current=NOW, gpu_layers=32))
    assert dict(gpu)["slots"] == [1, 4, 8] and dict(gpu)["gpu_layers"] == [32, 24, 16]
    assert dict(gpu)["prompt_batch"] == [512, 1024, 2048]


def test_the_search_keeps_each_faster_value_and_the_winner_is_confirmed() -> None:
    facts = Facts(cpus=2, concurrency=4, current=NOW)
    trials, best, skipped = _run(facts, budget=20)
    assert best == {**NOW, "slots": 1, "threads": 2, "flash_attn": "on", "prompt_batch": 512}
    assert trials[0].verdict == "baseline" and trials[0].score == 10.0
    changed = [(t.changed, t.values.get(t.changed or "slots")) for t in trials[1:]]
    assert changed[:3] == [("slots", 1), ("slots", 2), ("threads", 2)]  # 4 is the baseline's: not again
    assert ("kv_cache", "q8_0") in changed and ("kv_cache", "f16") not in changed
    q8 = next(t for t in trials if t.changed == "kv_cache")
    assert q8.verdict == "not kept (+2%)"  # faster, but not by the 5 % a value must gain
    assert ("micro_batch", 256) in changed and ("micro_batch", 128) in changed  # half, quarter of 512
    assert [t.changed for t in trials[-2:]] == ["confirm baseline", "confirm best"]
    assert trials[-1].verdict.startswith("confirmed") and skipped["gpu_layers"]
    assert winner_profile(best, NOW) == {"slots": 1, "threads": 2, "flash_attn": "on", "prompt_batch": 512}


def test_the_budget_bounds_the_trials_and_says_what_was_left() -> None:
    trials, best, skipped = _run(Facts(cpus=2, concurrency=4, current=NOW), budget=3)
    searched = [t for t in trials if not (t.changed or "").startswith("confirm")]
    assert len(searched) == 3 and best["slots"] == 1
    assert skipped["threads"] == "the budget of 3 trials was spent"


def test_a_winner_that_does_not_win_again_is_dropped() -> None:
    calls = {"n": 0}

    def fickle(values: dict[str, Any]) -> float:
        calls["n"] += 1
        if calls["n"] == 2:
            return 100.0  # one lucky run of slots=1
        return 10.0 if values["slots"] == 4 else 9.0

    trials, best, _ = _run(Facts(cpus=1, concurrency=2, current=NOW), budget=2, speed=fickle)
    assert trials[1].verdict.startswith("kept")
    assert trials[-1].verdict.startswith("not confirmed") and best == NOW


def test_values_that_do_not_fit_or_conflict_are_skipped_unmeasured() -> None:
    current = {**NOW, "flash_attn": "off"}
    facts = Facts(cpus=1, concurrency=1, current=current, pinned={"flash_attn": "x", "threads": "y"})
    trials, _, _ = _run(
        facts, budget=20, fits=lambda v: "needs 9 GiB; 4 GiB free" if v["prompt_batch"] == 512 else None
    )
    by = {(t.changed, t.values.get(t.changed or "slots")): t for t in trials}
    assert by[("kv_cache", "q8_0")].verdict == "skipped: a quantized KV cache needs flash attention"
    assert by[("prompt_batch", 512)].verdict == "skipped: needs 9 GiB; 4 GiB free"
    assert by[("kv_cache", "q8_0")].score is None


def test_a_failing_baseline_ends_the_search() -> None:
    trials, best, _ = _run(Facts(cpus=2, concurrency=1, current=NOW), budget=5, speed=lambda v: None)
    assert len(trials) == 1 and trials[0].verdict == "failed: boom" and best == NOW


def test_another_lane_than_llama_cpp_s_is_searched_for_slots_only() -> None:
    tried, skipped = dimensions(Facts(cpus=4, concurrency=4, current=NOW, lane="mistralrs"))
    assert [n for n, _ in tried] == ["slots"]
    assert skipped["threads"] == "a llama.cpp setting: this model runs on the mistralrs lane"
