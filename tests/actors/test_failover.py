"""Failover chains: the config's checks, the bench schedule, the order a request tries
targets in, and the record ``FailoverChains`` keeps (pure: no trio, times passed in)."""

from __future__ import annotations

import msgspec
import pytest

from actors.config import FailoverChain, Tunables, parse_target
from actors.failover import REMOTE_REASON, FailoverChains, TargetState, bench_for, plan


def _chain(*targets: str, **kw: object) -> FailoverChain:
    return FailoverChain(name="smart", targets=list(targets), **kw)  # type: ignore[arg-type]


def _decode(toml: str) -> Tunables:
    return msgspec.toml.decode(toml.encode(), type=Tunables)


def test_target_forms() -> None:
    t = parse_target("qwen3-8b")
    assert (t.model, t.lane, t.peer, t.key) == ("qwen3-8b", None, None, "qwen3-8b")
    t = parse_target("smollm2-135m@mistralrs")
    assert (t.model, t.lane, t.key) == ("smollm2-135m", "mistralrs", "smollm2-135m@mistralrs")
    t = parse_target("remote:peer/qwen3-8b")
    assert (t.model, t.peer) == ("qwen3-8b", "peer")
    for bad in ("", "a@", "a@gpu", "remote:", "remote:peer", "remote:/m", " a", "a b"):
        with pytest.raises(ValueError):
            parse_target(bad)


def test_config_is_strict_about_chains() -> None:
    ok = _decode('[[failover]]\nname = "smart"\ntargets = ["a", "b@mistralrs", "remote:peer/c"]\n')
    assert ok.failover[0].targets == ["a", "b@mistralrs", "remote:peer/c"]
    bad = [
        '[[failover]]\nname = "smart"\ntargets = []\n',  # nothing to try
        '[[failover]]\nname = "smart"\ntargets = ["a"]\nretries = 3\n',  # unknown key
        '[[failover]]\nname = "a:tag"\ntargets = ["b"]\n',  # reads as name:tag
        '[[failover]]\nname = "smart"\ntargets = ["a@gpu"]\n',  # no such lane
        '[[failover]]\nname = "smart"\ntargets = ["a", "a"]\n',
        '[[failover]]\nname = "smart"\ntargets = ["smart"]\n',  # itself
        '[[failover]]\nname = "smart"\ntargets = ["a"]\nbench_s = 10\nbench_max_s = 5\n',
        '[[failover]]\nname = "x"\ntargets = ["a"]\n[[failover]]\nname = "x"\ntargets = ["b"]\n',
        '[[failover]]\nname = "x"\ntargets = ["y"]\n[[failover]]\nname = "y"\ntargets = ["b"]\n',  # nested
    ]
    for text in bad:
        with pytest.raises(msgspec.ValidationError):
            _decode(text)


def test_the_bench_doubles_up_to_its_ceiling() -> None:
    assert [bench_for(n, 5.0, 300.0) for n in range(0, 9)] == [0, 5, 10, 20, 40, 80, 160, 300, 300]
    assert bench_for(10_000, 1.0, 60.0) == 60.0


def test_the_order_skips_benched_and_remote_targets_and_probes_expired_ones() -> None:
    chain = _chain("a", "b", "remote:peer/c", "d")
    states = {
        "a": TargetState(failures=2, benched_until=110.0, last_error="crashed"),
        "b": TargetState(failures=1, benched_until=90.0, last_error="timed out"),
    }
    steps = plan(chain, states, 100.0)
    assert [(s.target.text, s.action) for s in steps] == [
        ("a", "skip"),
        ("b", "probe"),
        ("remote:peer/c", "skip"),
        ("d", "try"),
    ]
    assert steps[0].reason is not None and "10.0 s more" in steps[0].reason and "crashed" in steps[0].reason
    assert steps[2].reason == REMOTE_REASON


def test_with_every_local_target_benched_they_are_all_tried_as_a_last_resort() -> None:
    chain = _chain("a", "remote:peer/c", "b")
    states = {t: TargetState(failures=1, benched_until=200.0, last_error="x") for t in ("a", "b")}
    steps = plan(chain, states, 100.0)
    assert [(s.target.text, s.action) for s in steps] == [
        ("a", "last-resort"),
        ("remote:peer/c", "skip"),
        ("b", "last-resort"),
    ]


def test_a_pin_sends_everything_to_its_target_benched_or_not() -> None:
    chain = _chain("a", "b")
    states = {"b": TargetState(failures=3, benched_until=500.0)}
    (step,) = plan(chain, states, 100.0, pinned="b")
    assert (step.target.text, step.action) == ("b", "pinned")


def test_the_record_benches_a_failed_target_and_a_success_clears_it() -> None:
    chains = FailoverChains([_chain("a", "b", bench_s=5.0, bench_max_s=12.0)])
    assert chains.failed("smart", "a", "ENGINE_CRASHED", "exited with -9", 100.0, crashes=1) == 5.0
    assert [s.action for s in chains.plan("smart", 101.0)] == ["skip", "try"]
    assert [s.action for s in chains.plan("smart", 105.5)] == ["probe", "try"]
    # The probe fails: benched twice as long, then capped.
    assert chains.failed("smart", "a", "ENGINE_CRASHED", "again", 106.0) == 10.0
    assert chains.failed("smart", "a", "ENGINE_CRASHED", "again", 117.0) == 12.0
    (a, b) = chains.report(120.0)[0].targets
    assert (a.state, a.failures, a.failed, a.last_code) == ("benched", 3, 3, "ENGINE_CRASHED")
    assert a.benched_for_s == pytest.approx(9.0) and a.reason is not None and "again" in a.reason
    assert (b.state, b.failures) == ("healthy", 0)
    chains.served("smart", "a", crashes=2)
    (a, _) = chains.report(121.0)[0].targets
    assert (a.state, a.failures, a.served, a.benched_for_s) == ("healthy", 0, 1, None)
    assert chains.statistics().failovers == {"smart/a": 3}


def test_a_crash_is_charged_once_and_only_to_a_healthy_target() -> None:
    chains = FailoverChains([_chain("a", "b")])
    assert chains.fresh_crash("smart", "a", 1)  # its engine died since the chain last saw it
    chains.failed("smart", "a", "ENGINE_CRASHED", "died", 0.0, crashes=1)
    # Benched and then probed: the probe tries it for real, even if more crashes were counted.
    assert not chains.fresh_crash("smart", "a", 2)
    chains.served("smart", "a", crashes=2)
    assert not chains.fresh_crash("smart", "a", 2)
    assert chains.fresh_crash("smart", "a", 3)


def test_pins_and_what_the_report_says_of_remote_targets_and_shadowed_models() -> None:
    chains = FailoverChains([_chain("a", "remote:peer/c")])
    chains.pin("smart", "a")
    with pytest.raises(KeyError):
        chains.pin("smart", "nowhere")
    (report,) = chains.report(0.0, installed=frozenset({"smart"}))
    assert report.pinned == "a" and report.shadows_model
    a, c = report.targets
    assert a.pinned and not c.pinned
    assert (c.state, c.peer, c.reason) == ("unavailable", "peer", REMOTE_REASON)
    assert chains.unpin("smart") and not chains.unpin("smart")
    assert chains.report(0.0)[0].pinned is None


def test_with_the_federation_remote_targets_are_tried_benched_and_probed_like_local_ones() -> None:
    chains = FailoverChains([_chain("remote:peer/c", "a")], federated=True)
    assert [(s.target.text, s.action) for s in chains.plan("smart", 0.0)] == [
        ("remote:peer/c", "try"),
        ("a", "try"),
    ]
    chains.failed("smart", "remote:peer/c", "PEER_UNAVAILABLE", "peer 'peer' is down", 0.0)
    assert [(s.target.text, s.action) for s in chains.plan("smart", 1.0)] == [
        ("remote:peer/c", "skip"),
        ("a", "try"),
    ]
    (report,) = chains.report(1.0)
    c = report.targets[0]
    assert (c.state, c.last_code) == ("benched", "PEER_UNAVAILABLE")
    chains.pin("smart", "remote:peer/c")  # a remote target may be pinned once it is served
    assert chains.plan("smart", 1.0)[0].action == "pinned"
