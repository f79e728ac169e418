"""The connection caps' bookkeeping: who holds a place, and who gives way past a cap."""

from __future__ import annotations

from blazar.web.asgi.conn_limits import Admitted, ConnectionLimits, Refused


def _admit(limits: ConnectionLimits[str], key: str, client: str) -> tuple[str, ...]:
    decision = limits.admit(key, client)
    assert isinstance(decision, Admitted), decision
    return decision.shed


def _refused(limits: ConnectionLimits[str], key: str, client: str) -> str:
    decision = limits.admit(key, client)
    assert isinstance(decision, Refused), decision
    return decision.reason


def test_requests_in_flight_are_never_shed_and_a_full_house_refuses() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(total=3, per_client=2)
    for key, client in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        assert _admit(limits, key, client) == ()
        limits.busy(key)
    assert "max_connections_per_client" in _refused(limits, "a3", "a")
    assert "(max_connections)" in _refused(limits, "c1", "c")
    assert limits.release("a1")
    assert _admit(limits, "c1", "c") == ()
    for key in ("a2", "b1", "c1"):
        assert limits.release(key)
    assert (limits.open, limits.by_client, limits.refused, limits.sheddable()) == (0, {}, 2, (0, 0))


def test_past_the_address_cap_that_address_oldest_fresh_connection_gives_way() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(total=10, per_client=3)
    _admit(limits, "b1", "b")  # older, but another address's
    for key in ("a1", "a2", "a3"):
        _admit(limits, key, "a")
    limits.busy("a1")  # a request in flight: not a candidate
    assert _admit(limits, "a4", "a") == ("a2",)
    assert _admit(limits, "a5", "a") == ("a3",)
    assert _admit(limits, "a6", "a") == ("a4",)
    assert limits.by_client == {"a": 3, "b": 1} and limits.open == 4
    assert limits.shed_fresh == 3 and limits.refused == 0
    assert not limits.release("a2")  # its place was given back when it was shed: not twice
    assert limits.open == 4


def test_past_the_total_cap_the_oldest_fresh_connection_of_any_address_gives_way() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(total=4, per_client=4)
    for key, client in (("x1", "x"), ("y1", "y"), ("x2", "x"), ("z1", "z")):
        _admit(limits, key, client)
    limits.busy("x1")
    assert _admit(limits, "n1", "n") == ("y1",)
    assert _admit(limits, "n2", "n") == ("x2",)
    assert limits.by_client == {"x": 1, "z": 1, "n": 2}


def test_idle_keep_alive_connections_give_way_after_fresh_ones_oldest_idle_first() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(total=4, per_client=4)
    for key in ("k1", "k2", "k3"):
        _admit(limits, key, "a")
        limits.busy(key)
    limits.idle("k2")
    limits.idle("k1")  # idle since later than k2
    _admit(limits, "f1", "b")  # fresh, newer than every idle one: still first to go
    assert _admit(limits, "n1", "c") == ("f1",)
    limits.busy("n1")
    assert _admit(limits, "n2", "c") == ("k2",)
    limits.busy("n2")
    assert _admit(limits, "n3", "c") == ("k1",)
    assert (limits.shed_fresh, limits.shed_idle) == (1, 2)
    # k3, n1 and n2 are mid-request, n3 has sent nothing yet: it goes, then nothing can.
    assert _admit(limits, "n4", "c") == ("n3",)
    limits.busy("n4")
    assert "(max_connections)" in _refused(limits, "n5", "c")


def test_a_connection_that_starts_a_request_leaves_the_candidates_and_returns_when_idle() -> None:
    limits: ConnectionLimits[str] = ConnectionLimits(total=2, per_client=2)
    _admit(limits, "a1", "a")
    _admit(limits, "a2", "a")
    limits.busy("a1")
    limits.busy("a2")
    assert limits.sheddable() == (0, 0)
    assert _refused(limits, "a3", "a")
    limits.idle("a2")
    limits.idle("a2")  # twice idle is once idle
    assert limits.sheddable() == (0, 1)
    assert _admit(limits, "a3", "a") == ("a2",)
    assert limits.sheddable() == (1, 0)  # a3, fresh
    limits.busy("a3")
    limits.idle("a3")
    limits.busy("a3")  # the next request on the same connection
    assert _refused(limits, "a4", "a")
    limits.busy("gone")  # an unknown (already released) connection changes nothing
    limits.idle("gone")
    assert limits.release("a1") and limits.release("a3") and not limits.release("a3")
    assert (limits.open, limits.by_client, limits.sheddable()) == (0, {}, (0, 0))
