"""The federation's decision and the reading of what peers publish (pure, no trio), and the
decision's inputs from peers' views."""

from __future__ import annotations

import msgspec
import pytest

from actors.config import Remote, Tunables
from actors.errors import PeerIsSelf, PeerNotFound, PeerUnavailable
from actors.federation import (
    LOCAL,
    Candidate,
    SnapshotError,
    decide,
    expected_wait_s,
    parse_capacity,
    parse_models,
    peer_candidate,
    peer_targets,
)
from actors.peer import PeerActor
from actors.peers import Peers

GIB = 2**30

CAPACITY = {
    "daemon": "blazar",
    "version": "0.1.0",
    "census": {"source": "system", "ram_available": 9 * GIB},
    "memory_budget_bytes": 12 * GIB,
    "free_bytes": 8 * GIB,
    "models": [
        {
            "model": "qwen",
            "state": "ready",
            "pid": 42,
            "in_flight": 4,
            "estimated_bytes": GIB,
            "rss_bytes": None,
            "slots": 4,
            "queued": 2,
            "expected_wait_s": 1.5,
        }
    ],
    "installed": [{"name": "qwen", "size_bytes": GIB, "kind": "chat"}, {"name": "smol", "size_bytes": 10}],
    "lanes": ["llamacpp-host"],
}


def test_a_capacity_document_reads_as_a_blazar_snapshot() -> None:
    snap = parse_capacity(msgspec.json.encode(CAPACITY))
    assert snap.kind == "blazar"
    assert snap.free_bytes == 8 * GIB
    assert snap.has("qwen") and snap.has("qwen:latest") and snap.has("smol") and not snap.has("other")
    loaded = snap.loaded_model("qwen")
    assert loaded is not None and loaded.slots == 4 and loaded.queued == 2 and loaded.expected_wait_s == 1.5
    assert snap.loaded_model("smol") is None
    assert snap.size_of("smol") == 10
    assert snap.lanes == ["llamacpp-host"]


def test_an_older_daemon_without_the_routing_fields_still_reads() -> None:
    old = {"census": {"ram_available": 3 * GIB}, "memory_budget_bytes": None, "models": []}
    snap = parse_capacity(msgspec.json.encode(old))
    assert snap.kind == "blazar" and snap.free_bytes == 3 * GIB and snap.installed == []


def test_a_model_list_reads_as_a_pass_through_snapshot() -> None:
    snap = parse_models(b'{"object": "list", "data": [{"id": "instant", "object": "model"}]}')
    assert snap.kind == "openai" and snap.has("instant") and snap.free_bytes is None


@pytest.mark.parametrize("body", [b"<html>", b'{"models": []}', b"[]"])
def test_what_is_not_capacity_is_refused(body: bytes) -> None:
    with pytest.raises(SnapshotError):
        parse_capacity(body)
    with pytest.raises(SnapshotError):
        parse_models(body)


def test_expected_wait_is_zero_while_a_slot_is_free_and_grows_with_the_queue() -> None:
    assert expected_wait_s(slots=4, running=3, queued=0, service_s=2.0) == 0.0
    assert expected_wait_s(slots=4, running=4, queued=0, service_s=2.0) == 0.5
    assert expected_wait_s(slots=4, running=4, queued=3, service_s=2.0) == 2.0
    assert expected_wait_s(slots=2, running=2, queued=1, service_s=None) == 1.0


def test_warm_wins_over_cold_whatever_the_memory() -> None:
    d = decide(
        "m",
        [
            Candidate(where=LOCAL, has_model=False),
            Candidate(where="big", free_bytes=100 * GIB, fit_bytes=GIB),
            Candidate(where="warm", warm=True, expected_wait_s=3.0, free_bytes=GIB, fit_bytes=GIB),
        ],
    )
    assert d.winner == "warm"
    assert "warm there" in d.why
    ranks = {c.where: c.rank for c in d.candidates}
    assert ranks == {"warm": 1, "big": 2, LOCAL: None}
    assert next(c for c in d.candidates if c.where == LOCAL).skipped == "does not have the model"


def test_local_is_preferred_when_warm_here_even_with_a_longer_queue() -> None:
    d = decide(
        "m",
        [
            Candidate(where=LOCAL, warm=True, expected_wait_s=5.0),
            Candidate(where="b", warm=True, expected_wait_s=0.0),
        ],
    )
    assert d.winner == LOCAL and "warm here" in d.why


def test_between_warm_peers_the_shortest_expected_wait_wins() -> None:
    d = decide(
        "m",
        [
            Candidate(where=LOCAL, has_model=False),
            Candidate(where="b", warm=True, expected_wait_s=2.0),
            Candidate(where="c", warm=True, expected_wait_s=0.5),
        ],
    )
    assert d.winner == "c" and "shortest expected queue wait" in d.why and "2.0 s on 'b'" in d.why


def test_between_cold_machines_the_most_memory_left_after_the_model_wins() -> None:
    d = decide(
        "m",
        [
            Candidate(where=LOCAL, free_bytes=4 * GIB, fit_bytes=3 * GIB),
            Candidate(where="b", free_bytes=6 * GIB, fit_bytes=GIB),
            Candidate(where="pass", pass_through=True),
        ],
    )
    assert d.winner == "b" and "most free memory" in d.why
    rows = {c.where: c for c in d.candidates}
    assert rows["b"].headroom_bytes == 5 * GIB and rows[LOCAL].headroom_bytes == GIB
    assert rows["pass"].rank == 3  # nothing known about it: last


def test_a_down_peer_is_skipped_and_said_so() -> None:
    d = decide(
        "m",
        [
            Candidate(where=LOCAL, has_model=False),
            Candidate(where="b", up=False, reason="cannot connect"),
            Candidate(where="c", free_bytes=GIB),
        ],
    )
    assert d.winner == "c" and "only candidate" in d.why
    assert next(c for c in d.candidates if c.where == "b").skipped == "down: cannot connect"


def test_nowhere_when_every_peer_with_it_is_down() -> None:
    d = decide("m", [Candidate(where=LOCAL, has_model=False), Candidate(where="b", up=False, reason="x")])
    assert d.winner is None and "down: b" in d.why


def test_ties_go_to_this_machine_then_by_name() -> None:
    d = decide("m", [Candidate(where="z"), Candidate(where="a"), Candidate(where=LOCAL)])
    assert [c.where for c in d.candidates] == [LOCAL, "a", "z"]
    assert "picked by order" in d.why


# -- configuration --------------------------------------------------------------------------


def _tunables(toml: str) -> Tunables:
    return msgspec.toml.decode(toml.encode(), type=Tunables)


def test_remotes_by_url_and_by_dns_are_accepted() -> None:
    t = _tunables(
        """
[[remotes]]
name = "gpu-box"
url = "https://gpu.lan:11435"
key = "blz-secret"
ca_file = "/etc/ssl/lan.pem"

[[remotes]]
name = "pool"
dns = "blazar.pool.svc.cluster.local"
port = 11435
"""
    )
    assert [r.name for r in t.remotes] == ["gpu-box", "pool"]
    assert t.remotes[1].poll_s == 2.0 and t.remotes[1].scheme == "http"


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('name = "a"', "exactly one of url or dns"),
        ('name = "a"\nurl = "http://x"\ndns = "x"', "exactly one of url or dns"),
        ('name = "a"\nurl = "x:1"', "must start with http"),
        ('name = "a"\ndns = "x"', "dns needs port"),
        ('name = "a"\nurl = "http://x"\nport = 1', "port goes with dns"),
        ('name = "a/b"\nurl = "http://x"', r"remotes\[0\].name"),
        ('name = "a"\nurl = "http://x"\nsecret = 1', "unknown field"),
        ('name = "a"\nurl = "http://x"\npoll_s = 5\npoll_max_s = 1', "poll_max_s"),
        ('name = "a"\nurl = "http://x"\nkey = "k"\nkey_file = "/f"', "key or key_file, not both"),
    ],
)
def test_a_bad_remote_is_refused_with_what_to_fix(toml: str, said: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=said):
        _tunables("[[remotes]]\n" + toml)


def test_remote_names_are_unique() -> None:
    with pytest.raises(msgspec.ValidationError, match="unique"):
        _tunables('[[remotes]]\nname = "a"\nurl = "http://x"\n[[remotes]]\nname = "a"\nurl = "http://y"\n')


def test_no_remotes_by_default() -> None:
    assert Tunables().remotes == []
    assert Remote(name="a", url="http://x").key is None


# -- the decision's inputs: a peer's view, and where remote:PEER/MODEL goes ----------------------


def _peers(**states: str) -> Peers:
    """Peers (not running) named as given, each in the given state with the CAPACITY snapshot."""
    peers = Peers([Remote(name=n, url=f"http://{n}", poll_s=60, poll_max_s=60) for n in states])
    for name, state in states.items():
        actor = PeerActor(name, f"http://{name}", peers.remotes[0])
        actor.state = state  # type: ignore[assignment]
        actor.snapshot = parse_capacity(msgspec.json.encode(CAPACITY)) if state == "up" else None
        actor.last_error = "cannot connect" if state == "down" else None
        peers.actors[name] = actor
    return peers


def test_a_peer_candidate_comes_from_its_last_snapshot() -> None:
    views = {v.name: v for v in _peers(a="up", b="down").views()}
    warm = peer_candidate(views["a"], "qwen")
    assert (warm.warm, warm.expected_wait_s, warm.free_bytes, warm.fit_bytes) == (True, 1.5, 8 * GIB, GIB)
    assert peer_candidate(views["a"], "ghost").has_model is False
    down = peer_candidate(views["b"], "qwen")
    assert (down.up, down.reason) == (False, "cannot connect")


def test_remote_targets_name_the_peer_or_say_why_not() -> None:
    peers = _peers(a="up", b="down", c="self")
    assert [t.peer for t in peer_targets(peers, "a", "qwen")] == ["a"]
    with pytest.raises(PeerUnavailable, match="peer 'b' is down \\(cannot connect\\)"):
        peer_targets(peers, "b", "qwen")
    with pytest.raises(PeerIsSelf, match="peer 'c' is this daemon itself"):
        peer_targets(peers, "c", "qwen")
    with pytest.raises(PeerNotFound, match="no peer named 'd' \\(peers: a, b, c\\)"):
        peer_targets(peers, "d", "qwen")
