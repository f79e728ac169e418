"""The admission decisions: pure functions, no trio."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.scheduling import (
    Effect,
    Expire,
    Grant,
    ModelQueue,
    Tier,
    Waiter,
    admit,
    assign,
    effective_tier,
    grant_at_once,
    order,
    parse_tier,
    position,
    predicted_wait_s,
    release,
    starvation_limit,
    update_service,
    withdraw,
)

HIGH, NORMAL, LOW = Tier.HIGH, Tier.NORMAL, Tier.LOW
BIG = 1e9


def q(
    capacity: int = 1,
    running: int = 0,
    waiters: tuple[Waiter, ...] = (),
    *,
    service_s: float | None = None,
    recent_clients: tuple[str, ...] = (),
    starvation_limit: int | None = None,
) -> ModelQueue:
    return ModelQueue(
        model="m",
        capacity=capacity,
        running=running,
        waiters=waiters,
        service_s=service_s,
        recent_clients=recent_clients,
        starvation_limit=starvation_limit,
    )


def w(
    id: int,
    tier: Tier = NORMAL,
    client: str = "a",
    arrived: float = 0.0,
    deadline: float | None = None,
    **kw: int,
) -> Waiter:
    return Waiter(id=id, model="m", tier=tier, client=client, arrived_s=arrived, deadline_s=deadline, **kw)


def ids(waiters: list[Waiter]) -> list[int]:
    return [x.id for x in waiters]


def grants(effects: list[Effect]) -> list[int]:
    return [e.waiter_id for e in effects if isinstance(e, Grant)]


def drain_one_at_a_time(queue: ModelQueue, n: int) -> list[int]:
    """Grant ``n`` times through a single slot, releasing after each grant."""
    out: list[int] = []
    for _ in range(n):
        queue, effects = assign(queue, now_s=0.0, queue_timeout_s=BIG)
        out += grants(effects)
        queue = release(queue)
    return out


# ------------------------------------------------------------------------- tiers


@pytest.mark.parametrize(
    ("header", "tier"),
    [
        ("high", HIGH),
        ("HIGH", HIGH),
        (" High ", HIGH),
        ("low", LOW),
        ("Low", LOW),
        ("normal", NORMAL),
        ("urgent", NORMAL),
        ("", NORMAL),
        (None, NORMAL),
    ],
)
def test_parse_tier(header: str | None, tier: Tier) -> None:
    assert parse_tier(header) is tier


def test_tiers_come_first_by_urgency() -> None:
    queue = q(waiters=(w(1, LOW), w(2, NORMAL), w(3, HIGH), w(4, LOW), w(5, HIGH)))
    assert ids(order(queue)) == [3, 5, 2, 1, 4]


def test_deadlines_first_inside_a_tier_earliest_first() -> None:
    queue = q(
        waiters=(
            w(1, NORMAL),
            w(2, NORMAL, deadline=50.0),
            w(3, NORMAL, deadline=20.0),
            w(4, HIGH),
            w(5, NORMAL, deadline=20.0),
            w(6, LOW, deadline=1.0),
        )
    )
    # A deadline never lifts a request above a more urgent tier.
    assert ids(order(queue)) == [4, 3, 5, 2, 1, 6]


def test_fairness_does_not_delay_deadlines() -> None:
    burst = tuple(w(i, client="a") for i in range(1, 11))
    queue = q(waiters=(*burst, w(11, client="a", deadline=100.0)), recent_clients=("b",))
    assert order(queue)[0].id == 11


def test_a_burst_does_not_starve_a_single_request() -> None:
    burst = tuple(w(i, client="burst") for i in range(1, 51))
    queue = q(capacity=1, waiters=(*burst, w(51, client="single")))
    assert 51 in drain_one_at_a_time(queue, 2)
    # Same with every slot free at once.
    _, effects = assign(q(capacity=4, waiters=queue.waiters), now_s=0.0, queue_timeout_s=BIG)
    assert grants(effects) == [1, 51, 2, 3]


def test_round_robin_between_clients_fifo_inside_a_client() -> None:
    queue = q(
        waiters=(w(1, client="a"), w(2, client="a"), w(3, client="b"), w(4, client="c"), w(5, client="b"))
    )
    assert ids(order(queue)) == [1, 3, 4, 2, 5]
    assert drain_one_at_a_time(queue, 5) == [1, 3, 4, 2, 5]


def test_most_recently_served_client_goes_last() -> None:
    queue = q(waiters=(w(1, client="a"), w(2, client="b"), w(3, client="c")), recent_clients=("c", "a"))
    # b was never served, then c (served longest ago), then a (served last).
    assert ids(order(queue)) == [2, 3, 1]
    queue, effects = assign(queue, now_s=0.0, queue_timeout_s=BIG)
    assert grants(effects) == [2]
    assert queue.recent_clients == ("c", "a", "b")


def test_recent_clients_are_distinct_and_bounded() -> None:
    queue = q(capacity=200, waiters=tuple(w(i, client=f"c{i % 100}") for i in range(300)))
    queue, _ = assign(queue, now_s=0.0, queue_timeout_s=BIG)
    assert len(queue.recent_clients) == 64
    assert len(set(queue.recent_clients)) == 64


# ------------------------------------------------------------------------- starvation guards


def test_default_starvation_limit() -> None:
    assert starvation_limit(q(capacity=4)) == 32
    assert starvation_limit(q(capacity=0)) == 8
    assert starvation_limit(q(capacity=4, starvation_limit=3)) == 3
    assert starvation_limit(q(capacity=4, starvation_limit=0)) == 0


def test_promotion_one_tier_per_limit() -> None:
    queue = q(starvation_limit=2)
    assert effective_tier(queue, w(1, LOW, skipped_by_higher=1)) is LOW
    assert effective_tier(queue, w(1, LOW, skipped_by_higher=2)) is NORMAL
    assert effective_tier(queue, w(1, LOW, skipped_by_higher=4)) is HIGH
    assert effective_tier(queue, w(1, NORMAL, skipped_by_higher=2)) is HIGH
    assert effective_tier(q(starvation_limit=0), w(1, LOW, skipped_by_higher=99)) is LOW
    promoted = q(starvation_limit=2, waiters=(w(1, NORMAL), w(2, LOW, client="b", skipped_by_higher=2)))
    assert ids(order(promoted)) == [1, 2]  # ordered as NORMAL: fair queuing, 1 is older


def test_higher_grants_count_and_promote() -> None:
    queue = q(capacity=1, starvation_limit=2, waiters=(w(1, LOW, client="low"),))
    for i in range(2, 6):
        queue = msgspec.structs.replace(queue, waiters=(*queue.waiters, w(i, HIGH, client="hi")))
    # HIGH 2, 3 pass LOW while LOW; NORMAL-effective LOW is passed by HIGH 4, 5; then LOW.
    got = drain_one_at_a_time(queue, 5)
    assert got == [2, 3, 4, 5, 1]
    queue = q(capacity=1, starvation_limit=2, waiters=(w(1, LOW, client="low"), w(2, HIGH), w(3, HIGH)))
    queue, _ = assign(queue, now_s=0.0, queue_timeout_s=BIG)
    assert queue.waiters[0].skipped_by_higher == 1
    assert queue.waiters[1].skipped_by_higher == 0  # same tier: no skip


def test_a_high_waiter_is_passed_by_at_most_capacity_promoted_grants() -> None:
    # Four LOW waiters from four clients already promoted to HIGH, older than h.
    promoted = tuple(w(i, LOW, client=f"c{i}", skipped_by_higher=4) for i in range(1, 5))
    for capacity in (1, 2, 3):
        queue = q(capacity=capacity, starvation_limit=2, waiters=(*promoted, w(9, HIGH, client="h")))
        queue = msgspec.structs.replace(queue, running=capacity)
        out: list[int] = []
        for _ in range(5):
            queue = release(queue)
            queue, effects = assign(queue, now_s=0.0, queue_timeout_s=BIG)
            out += grants(effects)
        assert out.index(9) == capacity, (capacity, out)


def test_guarded_waiter_goes_before_promoted_ones() -> None:
    queue = q(
        capacity=2,
        starvation_limit=1,
        waiters=(w(1, LOW, client="x", skipped_by_higher=2), w(2, HIGH, client="y", skipped_by_lower=2)),
    )
    assert ids(order(queue)) == [2, 1]
    unguarded = q(
        capacity=2,
        starvation_limit=1,
        waiters=(w(1, LOW, client="x", skipped_by_higher=2), w(2, HIGH, client="y", skipped_by_lower=1)),
    )
    assert ids(order(unguarded)) == [1, 2]


def _low_under_high_stream(capacity: int, limit: int | None, per_round: int, rounds: int) -> int | None:
    """Number of grants before the LOW waiter's grant, or None if never granted."""
    queue = q(capacity=capacity, starvation_limit=limit, waiters=(w(0, LOW, client="low"),))
    next_id = 1
    granted: list[int] = []
    for r in range(rounds):
        for _ in range(per_round):
            queue, rej = admit(queue, w(next_id, HIGH, client="hi", arrived=r), max_queue=10**6, now_s=r)
            assert rej is None
            next_id += 1
        queue, effects = assign(queue, now_s=float(r), queue_timeout_s=BIG)
        granted += grants(effects)
        if 0 in granted:
            return granted.index(0)
        for _ in range(capacity):
            queue = release(queue)
    return None


def test_low_is_granted_under_a_continuous_high_stream() -> None:
    for capacity in (1, 2, 4):
        limit = 8 * capacity
        before = _low_under_high_stream(capacity, None, per_round=capacity + 1, rounds=200)
        assert before == 2 * limit
        assert _low_under_high_stream(capacity, 0, per_round=capacity, rounds=200) is None


# ------------------------------------------------------------------------- assign


def test_assign_fills_free_slots_only() -> None:
    queue = q(capacity=3, running=1, waiters=tuple(w(i, client=f"c{i}") for i in range(1, 6)))
    queue, effects = assign(queue, now_s=0.0, queue_timeout_s=BIG)
    assert grants(effects) == [1, 2]
    assert queue.running == 3
    assert ids(list(queue.waiters)) == [3, 4, 5]
    queue, effects = assign(queue, now_s=0.0, queue_timeout_s=BIG)
    assert effects == []
    over = q(capacity=2, running=5, waiters=(w(1),))
    assert assign(over, now_s=0.0, queue_timeout_s=BIG)[1] == []
    assert assign(q(capacity=0, waiters=(w(1),)), now_s=0.0, queue_timeout_s=BIG)[1] == []


def test_expiry_by_deadline_and_timeout_before_grants() -> None:
    queue = q(
        capacity=2,
        waiters=(
            w(1, arrived=0.0, deadline=10.0),
            w(2, arrived=0.0),
            w(3, arrived=5.0),
            w(4, arrived=6.0, deadline=11.0),
            w(5, arrived=9.0),
        ),
    )
    queue, effects = assign(queue, now_s=10.0, queue_timeout_s=5.0)
    assert effects == [
        Expire(waiter_id=1, reason="deadline"),  # deadline_s <= now_s
        Expire(waiter_id=2, reason="timeout"),  # waited 10 s > 5 s
        Grant(waiter_id=4, model="m"),
        Grant(waiter_id=3, model="m"),  # waited exactly 5 s: not longer than the timeout
    ]
    assert ids(list(queue.waiters)) == [5]
    assert queue.running == 2


def test_deadline_wins_over_timeout_as_the_reason() -> None:
    _, effects = assign(q(waiters=(w(1, arrived=0.0, deadline=3.0),)), now_s=10.0, queue_timeout_s=1.0)
    assert effects == [Expire(waiter_id=1, reason="deadline")]


def test_effects_are_encodable() -> None:
    _, effects = assign(q(waiters=(w(1, deadline=1.0), w(2))), now_s=1.0, queue_timeout_s=BIG)
    data = msgspec.json.encode(effects)
    assert msgspec.json.decode(data, type=list[Effect]) == effects


# ------------------------------------------------------------------------- admit


def test_admit_appends() -> None:
    queue, rej = admit(q(waiters=(w(1),)), w(2), max_queue=2, now_s=0.0)
    assert rej is None
    assert ids(list(queue.waiters)) == [1, 2]


def test_queue_full_with_retry_after_from_predicted_wait() -> None:
    queue = q(capacity=1, running=1, waiters=(w(1), w(2)), service_s=3.0)
    same, rej = admit(queue, w(3), max_queue=2, now_s=0.0)
    assert same is queue
    assert rej is not None and rej.code == "QUEUE_FULL"
    assert rej.retry_after_s == 6.0  # 2 ahead / 1 slot * 3 s
    assert "full" in rej.message
    _, rej = admit(msgspec.structs.replace(queue, service_s=None), w(3), max_queue=2, now_s=0.0)
    assert rej is not None and rej.retry_after_s == 1.0  # at least 1 s
    _, rej = admit(q(), w(1), max_queue=0, now_s=0.0)
    assert rej is not None and rej.code == "QUEUE_FULL" and rej.retry_after_s == 1.0


def test_deadline_unmeetable() -> None:
    queue = q(capacity=2, running=2, waiters=(w(1, HIGH), w(2, HIGH), w(3, HIGH)), service_s=10.0)
    # 3 ahead / 2 slots → 2 rounds * 10 s = 20 s.
    same, rej = admit(queue, w(4, deadline=115.0), max_queue=10, now_s=100.0)
    assert same is queue
    assert rej is not None and rej.code == "DEADLINE_UNMEETABLE"
    assert rej.retry_after_s == 20.0
    assert "deadline" in rej.message
    _, rej = admit(queue, w(4, deadline=121.0), max_queue=10, now_s=100.0)
    assert rej is None
    # A HIGH request is ordered first: nothing ahead, no predicted wait.
    _, rej = admit(queue, w(4, HIGH, deadline=101.0), max_queue=10, now_s=100.0)
    assert rej is None
    # A deadline that has already passed is never meetable.
    _, rej = admit(q(), w(1, deadline=5.0), max_queue=10, now_s=5.0)
    assert rej is not None and rej.code == "DEADLINE_UNMEETABLE" and rej.retry_after_s == 1.0


def test_no_predicted_wait_with_a_free_slot_or_unknown_service() -> None:
    queue = q(capacity=4, running=2, waiters=(w(1, HIGH),), service_s=10.0)
    _, rej = admit(queue, w(2, deadline=0.5), max_queue=10, now_s=0.0)
    assert rej is None  # one slot is still free for it
    unknown = q(capacity=1, running=1, waiters=(w(1, HIGH), w(2, HIGH)))
    _, rej = admit(unknown, w(3, deadline=0.5), max_queue=10, now_s=0.0)
    assert rej is None


# ------------------------------------------------------------------------- withdraw, release, position


def test_withdraw() -> None:
    queue = q(waiters=(w(1), w(2), w(3)))
    assert ids(list(withdraw(queue, 2).waiters)) == [1, 3]
    assert withdraw(queue, 9) is queue


def test_release_floor_at_zero() -> None:
    assert release(q(capacity=2, running=2)).running == 1
    assert release(q(capacity=2, running=0)).running == 0


def test_position_and_predicted_wait() -> None:
    queue = q(
        capacity=2,
        running=2,
        service_s=4.0,
        waiters=(w(1, LOW), w(2, client="a"), w(3, client="a"), w(4, client="b"), w(5, HIGH)),
    )
    assert ids(order(queue)) == [5, 2, 4, 3, 1]
    assert [position(queue, i) for i in (5, 2, 4, 3, 1)] == [1, 2, 3, 4, 5]
    assert position(queue, 99) is None
    # ceil(ahead / 2) * 4 s
    assert [predicted_wait_s(queue, i) for i in (5, 2, 4, 3, 1)] == [0.0, 4.0, 4.0, 8.0, 8.0]
    with pytest.raises(KeyError):
        predicted_wait_s(queue, 99)
    free = msgspec.structs.replace(queue, running=0)
    assert [predicted_wait_s(free, i) for i in (5, 2, 4)] == [0.0, 0.0, 4.0]


# ------------------------------------------------------------------------- service time


def test_update_service() -> None:
    assert update_service(None, 2.0) == 2.0
    assert update_service(2.0, 2.1) == 2.1  # within one step: takes the sample
    assert update_service(2.0, 100.0) == pytest.approx(2.25)  # an outlier moves it 12.5 % at most
    assert update_service(2.0, 0.0) == pytest.approx(2.0 / 1.125)
    assert update_service(0.0, 3.0) == 3.0
    assert update_service(None, -1.0) == 0.0
    est: float | None = None
    for _ in range(60):
        est = update_service(est, 1.0)
        est = update_service(est, 8.0)
        est = update_service(est, 3.0)  # median of the stream
    assert est is not None and 3.0 / 1.3 <= est <= 3.0 * 1.3


@given(st.lists(st.floats(min_value=0.0, max_value=1e4), min_size=1, max_size=50))
@settings(max_examples=200, deadline=None)
def test_update_service_stays_within_the_samples(samples: list[float]) -> None:
    est: float | None = None
    for s in samples:
        est = update_service(est, s)
        assert est is not None and min(samples) <= est <= max(samples)


# ------------------------------------------------------------------------- properties

tiers = st.sampled_from(list(Tier))
op = st.one_of(
    st.tuples(
        st.just("admit"),
        tiers,
        st.integers(0, 3),  # client
        st.one_of(st.none(), st.floats(0.0, 30.0)),  # deadline offset
        st.floats(0.0, 5.0),  # time step
    ),
    st.tuples(st.just("assign"), st.floats(0.0, 5.0)),
    st.tuples(st.just("withdraw"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(1, 3)),
)


@given(
    capacity=st.integers(1, 4),
    limit=st.one_of(st.none(), st.integers(0, 3)),
    max_queue=st.integers(1, 12),
    timeout=st.floats(1.0, 40.0),
    service=st.one_of(st.none(), st.floats(0.1, 10.0)),
    ops=st.lists(op, max_size=60),
)
@settings(max_examples=200, deadline=None)
def test_random_operations_keep_the_invariants(
    capacity: int,
    limit: int | None,
    max_queue: int,
    timeout: float,
    service: float | None,
    ops: list[tuple[Any, ...]],
) -> None:
    queue = q(capacity=capacity, starvation_limit=limit, service_s=service)
    now = 0.0
    next_id = 0
    tier_of: dict[int, Tier] = {}
    queued: list[int] = []  # the reference model, in arrival order
    ended: dict[int, str] = {}
    passed_high: dict[int, int] = {}  # HIGH waiter → lower-tier grants that passed it

    def end(wid: int, how: str) -> None:
        assert wid in queued, (wid, how)
        assert wid not in ended, (wid, how, ended.get(wid))
        queued.remove(wid)
        ended[wid] = how

    def check_assign(before: ModelQueue, after: ModelQueue, effects: list[Effect], at: float) -> None:
        kinds = [isinstance(e, Grant) for e in effects]
        assert kinds == sorted(kinds)  # expiries first, then grants
        by_id = {x.id: x for x in before.waiters}
        for e in effects:
            if isinstance(e, Expire):
                x = by_id[e.waiter_id]
                if e.reason == "deadline":
                    assert x.deadline_s is not None and x.deadline_s <= at
                else:
                    assert at - x.arrived_s > timeout
                end(e.waiter_id, "expired")
                continue
            g = tier_of[e.waiter_id]
            end(e.waiter_id, "granted")
            for other in queued:
                if g > tier_of[other]:
                    # Without promotion tier priority is strict.
                    assert starvation_limit(before) > 0, (e, other)
                    if tier_of[other] is HIGH:
                        passed_high[other] = passed_high.get(other, 0) + 1
                        assert passed_high[other] <= capacity
        n_granted = sum(kinds)
        assert n_granted <= max(0, before.capacity - before.running)
        assert after.running == before.running + n_granted
        for x in after.waiters:  # nothing left that should have expired
            assert not (x.deadline_s is not None and x.deadline_s <= at)
            assert at - x.arrived_s <= timeout
        # Work conserving: a free slot is left only when no waiter is.
        assert after.running >= after.capacity or not after.waiters

    for o in ops:
        kind = o[0]
        if kind == "admit":
            _, tier, client, dl, dt = o
            now += dt
            waiter = w(next_id, tier, f"c{client}", arrived=now, deadline=None if dl is None else now + dl)
            next_id += 1
            new, rej = admit(queue, waiter, max_queue=max_queue, now_s=now)
            if rej is None:
                assert new.waiters[-1] == waiter
                queued.append(waiter.id)
                tier_of[waiter.id] = tier
            else:
                assert new is queue
                assert rej.retry_after_s >= 1.0
                if rej.code == "QUEUE_FULL":
                    assert len(queue.waiters) >= max_queue
                else:
                    assert waiter.deadline_s is not None
            queue = new
        elif kind == "assign":
            now += o[1]
            new, effects = assign(queue, now_s=now, queue_timeout_s=timeout)
            check_assign(queue, new, effects, now)
            queue = new
        elif kind == "withdraw":
            if queued:
                wid = queued[o[1] % len(queued)]
                queue = withdraw(queue, wid)
                end(wid, "withdrawn")
            else:
                assert withdraw(queue, o[1]) is queue
        else:
            for _ in range(o[1]):
                queue = release(queue)
        assert 0 <= queue.running <= queue.capacity
        assert [x.id for x in queue.waiters] == queued
        assert len(queue.waiters) <= max_queue
        assert sorted(ids(order(queue))) == queued
        assert [position(queue, x.id) for x in order(queue)] == list(range(1, len(queued) + 1))

    # Finish: free every slot and assign until the queue is empty.
    for _ in range(len(queued) + 1):
        if not queue.waiters:
            break
        for _ in range(queue.running):
            queue = release(queue)
        new, effects = assign(queue, now_s=now, queue_timeout_s=timeout)
        check_assign(queue, new, effects, now)
        queue = new
    assert not queue.waiters and not queued
    assert set(ended) == set(tier_of)  # every admitted waiter ended exactly once


@given(
    capacity=st.integers(1, 4),
    limit=st.integers(1, 3),
    backlog=st.lists(
        st.tuples(st.sampled_from([NORMAL, LOW]), st.integers(0, 5), st.integers(0, 6)), max_size=12
    ),
    rounds=st.lists(
        st.tuples(st.lists(st.tuples(tiers, st.integers(0, 5)), max_size=4), st.integers(0, 4)),
        max_size=30,
    ),
)
@settings(max_examples=200, deadline=None)
def test_a_high_waiter_is_passed_by_at_most_capacity_lower_grants(
    capacity: int,
    limit: int,
    backlog: list[tuple[Tier, int, int]],
    rounds: list[tuple[list[tuple[Tier, int]], int]],
) -> None:
    """Lower-tier waiters, some already promoted, meet HIGH arrivals from many clients:
    each HIGH waiter sees at most ``capacity`` lower-tier grants while it is queued,
    and every such grant is of a waiter promoted to HIGH."""
    waiters = tuple(
        w(i, tier, f"c{c}", skipped_by_higher=skips) for i, (tier, c, skips) in enumerate(backlog)
    )
    queue = q(capacity=capacity, running=capacity, waiters=waiters, starvation_limit=limit)
    next_id = len(waiters)
    passed: dict[int, int] = {}
    for arrivals, releases in rounds:
        for tier, c in arrivals:
            queue, rej = admit(queue, w(next_id, tier, f"c{c}"), max_queue=10**6, now_s=0.0)
            assert rej is None
            next_id += 1
        for _ in range(releases):
            queue = release(queue)
        for _ in range(max(0, queue.capacity - queue.running)):
            # One grant at a time, to see the effective tier of each granted waiter.
            before = {x.id: x for x in queue.waiters}
            running = queue.running
            queue, effects = assign(
                msgspec.structs.replace(queue, running=capacity - 1), now_s=0.0, queue_timeout_s=BIG
            )
            queue = msgspec.structs.replace(queue, running=running + len(effects))
            if not effects:
                break
            (g,) = effects
            assert isinstance(g, Grant)
            granted = before[g.waiter_id]
            for x in queue.waiters:
                if x.tier is HIGH and granted.tier is not HIGH:
                    assert effective_tier(queue, granted) is HIGH
                    passed[x.id] = passed.get(x.id, 0) + 1
                    assert passed[x.id] <= capacity, (x.id, passed[x.id])


@given(
    capacity=st.integers(1, 4),
    limit=st.one_of(st.none(), st.integers(1, 4)),
    rounds=st.lists(
        st.tuples(st.integers(0, 4), st.lists(st.integers(0, 2), min_size=0, max_size=6)), max_size=40
    ),
    low_client=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_low_waiter_is_eventually_granted_under_high_arrivals(
    capacity: int, limit: int | None, rounds: list[tuple[int, list[int]]], low_client: int
) -> None:
    """HIGH requests without deadlines keep arriving (random clients, at least enough
    to fill every slot each round); the LOW waiter, the oldest, is granted after at
    most 2 * starvation_limit HIGH grants plus one round-robin turn of the clients."""
    queue = q(capacity=capacity, starvation_limit=limit, waiters=(w(0, LOW, client=f"c{low_client}"),))
    lim = starvation_limit(queue)
    clients = {f"c{low_client}"}
    next_id = 1
    granted: list[int] = []
    extra: list[tuple[int, list[int]]] = [(0, [])] * (2 * lim + 8)  # keep the stream going long enough
    for r, (more, who) in enumerate(rounds + extra):
        arrivals = list(who) + [0] * max(0, capacity + more - len(who))
        for c in arrivals:
            clients.add(f"c{c}")
            queue, rej = admit(queue, w(next_id, HIGH, f"c{c}", arrived=r), max_queue=10**6, now_s=r)
            assert rej is None
            next_id += 1
        queue, effects = assign(queue, now_s=float(r), queue_timeout_s=BIG)
        granted += grants(effects)
        if 0 in granted:
            break
        for _ in range(capacity):
            queue = release(queue)
    assert 0 in granted
    assert granted.index(0) <= 2 * lim + len(clients) - 1


def test_expected_wait_formula_matches_ceil() -> None:
    queue = q(capacity=3, running=3, service_s=2.0, waiters=tuple(w(i, client=f"c{i}") for i in range(7)))
    for i in range(7):
        assert predicted_wait_s(queue, i) == math.ceil(i / 3) * 2.0


def test_grant_at_once_only_when_uncontended() -> None:
    def waiter(i: int, deadline_s: float | None = None) -> Waiter:
        return Waiter(id=i, model="m", tier=Tier.NORMAL, client="c", arrived_s=0.0, deadline_s=deadline_s)

    free = ModelQueue(model="m", capacity=2, running=1)
    granted = grant_at_once(free, waiter(1), now_s=0.0)
    assert granted is not None and granted.running == 2 and granted.recent_clients == ("c",)
    assert grant_at_once(granted, waiter(2), now_s=0.0) is None  # full
    queued = ModelQueue(model="m", capacity=2, running=0, waiters=(waiter(3),))
    assert grant_at_once(queued, waiter(4), now_s=0.0) is None  # someone waits: queue behind them
    assert grant_at_once(free, waiter(5, deadline_s=1.0), now_s=1.0) is None  # admit refuses it
