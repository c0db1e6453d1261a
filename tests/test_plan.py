"""lbcore.Plan on both kernels: the same answers as lbcore's ring-set routing, and safety."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
from lbcore import Gate, Plan, RingSet
from lbcore.draws import unit_interval
from lbcore.fade import SKIPPER_SALT, fadein_scores, skipper_fadein_route
from lbcore.route import route_ring_set

D = 30_000_000_000
FAR = (1 << 62) - 1


def ring_set(n: int = 60, vnodes: int = 100) -> RingSet:
    eps = [f"http://10.1.{i // 200}.{i % 200}:8080" for i in range(n)]
    a, b = int(n * 0.6), int(n * 0.85)
    return (
        RingSet(eps[:a], duration_ns=D, vnodes=vnodes)
        .scale_up(eps[a:b], 0)
        .scale_up(eps[b:], D // 3)
    )


def keys(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"AD{v:09d}-K{v % 7}" for v in rng.integers(10**9, size=n)]


def old_route(rs, now, mode, *, loads, bf, hops, ejected, attempt, gate, h):
    """What the router composes from lbcore today (workers/router.py, walk and Skipper paths)."""
    cand = None if ejected is None or not ejected.any() else ~ejected
    if mode == "skipper":
        ages = [None, *(now - s for s in rs.starts_ns)]
        scores = fadein_scores(ages, rs.duration_ns, rs.exponent).take(rs.tiers)
        kw = {"candidates": cand, "attempt": attempt, "hashes": h, "scores": scores}
        args = (rs.newest, None, None, rs.duration_ns, rs.exponent, unit_interval(h, SKIPPER_SALT))
        plain = skipper_fadein_route(*args, **kw)
        idx = (
            plain
            if bf is None
            else skipper_fadein_route(*args, loads=loads, balance_factor=bf, max_hops=hops, **kw)
        )
    else:
        when = now if mode != "off" else FAR
        kw = {"candidates": cand, "max_hops": hops, "attempt": attempt, "hashes": h}
        plain = route_ring_set(rs, None, when, **kw)
        idx = (
            plain
            if bf is None
            else route_ring_set(rs, None, when, loads=loads, balance_factor=bf, **kw)
        )
    moved = (idx != plain) & (idx >= 0)
    keep = gate.mask(h)
    idx = idx.copy()
    idx[~keep] = -1
    moved &= keep
    return idx, int(np.count_nonzero(idx < 0)), int(np.count_nonzero(moved))


CASES = [
    # mode, balance factor, hops, ejected, attempt, gate percentage
    ("n-ring", None, None, (), 0, 100),
    ("n-ring", 1.25, 10, (), 0, 100),
    ("n-ring", 1.25, 10, (3, 40), 0, 60),
    ("n-ring", 1.1, None, (5,), 1, 100),
    ("n-ring", 1.25, 3, (5, 55), 1, 100),
    ("n-ring", None, None, (0, 1, 2), 2, 30),
    ("n-ring", 1.5, 2, (), 3, 100),
    ("off", 1.25, 10, (7,), 0, 100),
    ("off", None, None, (), 1, 100),
    ("skipper", None, None, (), 0, 100),
    ("skipper", 1.25, 10, (9,), 0, 100),
    ("skipper", 1.25, None, (9, 50), 1, 80),
]


@pytest.mark.parametrize(("mode", "bf", "hops", "ejected", "attempt", "pct"), CASES)
def test_plan_routes_as_lbcore_ring_set_routing(kernel, mode, bf, hops, ejected, attempt, pct):
    rs = ring_set()
    rng = np.random.default_rng(len(ejected) + attempt)
    loads = rng.random(60) * 4
    loads[[4, 11, 45]] = 30.0  # three hot pods over the bar
    ej = np.zeros(60, dtype=np.bool_)
    ej[list(ejected)] = True
    gate = Gate(percentage=pct)
    batch = keys(3000)
    h = lbcore.hash_keys(batch)
    for now in (D // 2, D // 3 + D // 2, 2 * D):
        plan = Plan(
            rs,
            now,
            ejected=ej,
            loads=loads,
            balance_factor=bf,
            max_hops=hops,
            gate=gate,
            fade_mode=mode,
        )
        assert plan.kernel == kernel
        want = old_route(
            rs,
            now,
            mode,
            loads=loads,
            bf=bf,
            hops=hops,
            ejected=ej,
            attempt=attempt,
            gate=gate,
            h=h,
        )
        idx, fallbacks, moves, valid = plan.route(batch, attempt=attempt)
        assert valid and idx.dtype == np.int32
        assert idx.tolist() == want[0].tolist()
        assert (fallbacks, moves) == want[1:]
        # Key by key (batch 1) and from precomputed hashes: the same answers.
        assert [int(plan.route([k], attempt=attempt)[0][0]) for k in batch[:40]] == want[0][
            :40
        ].tolist()
        assert plan.route_hashes(h, attempt)[0].tolist() == want[0].tolist()


def test_answers_are_what_each_ring_gives_a_key_at_each_position(kernel):
    rs = ring_set(40, vnodes=20)
    loads = np.linspace(0, 5, 40)
    ej = np.zeros(40, dtype=np.bool_)
    ej[[2, 30]] = True
    now = D // 2
    plain = Plan(rs, now)
    answer, moved = plain.answers()
    at_nodes = rs.rings[-1].hashes
    owners = [ring.lookup(None, hashes=at_nodes).tolist() for ring in rs.rings]
    assert answer.tolist() == owners and not moved.any()
    plan = Plan(rs, now, ejected=ej, loads=loads, balance_factor=1.2, max_hops=10)
    answer, moved = plan.answers()
    at_nodes = rs.newest.hashes  # a key equal to a node's hash lands on that position
    want = np.stack(
        [
            r.lookup_bounded(None, loads, 1.2, candidates=~ej, max_hops=10, hashes=at_nodes)
            for r in rs.rings
        ]
    )
    unbounded = np.stack([r.lookup(None, candidates=~ej, hashes=at_nodes) for r in rs.rings])
    assert answer.tolist() == want.tolist()
    assert moved.tolist() == (want != unbounded).tolist()
    assert moved.any()


def test_a_retry_never_lands_on_the_first_attempts_endpoint(kernel):
    rs = ring_set()
    loads = np.random.default_rng(3).random(60)
    for bf, hops in ((None, None), (1.25, 10), (1.1, None), (1.0, 2)):
        plan = Plan(rs, D // 2, loads=loads, balance_factor=bf, max_hops=hops)
        batch = keys(2000, seed=5)
        first = plan.route(batch)[0]
        second = plan.route(batch, attempt=1)[0]
        assert (first >= 0).all() and (second >= 0).all()
        assert not (first == second).any()


def test_the_gate_and_the_empty_set_send_keys_to_fallback(kernel):
    batch = keys(500)
    closed = Plan(ring_set(), 0, gate=Gate(enabled=False))
    idx, fallbacks, moves, valid = closed.route(batch)
    assert (idx == -1).all() and fallbacks == 500 and moves == 0 and valid and closed.closed
    assert Plan(ring_set(), 0, gate=Gate(percentage=0)).route(batch)[1] == 500
    empty = Plan(RingSet(()), 0)
    assert empty.route(batch)[0].tolist() == [-1] * 500
    assert empty.route([])[0].size == 0
    half = Plan(ring_set(), 0, gate=Gate(percentage=50)).route(batch)
    assert 150 < half[1] < 350 and half[1] == int((half[0] < 0).sum())
    # Every endpoint ejected: fallback, never an exception.
    none_left = Plan(ring_set(), 0, ejected=np.ones(60, dtype=np.bool_))
    assert none_left.route(batch)[1] == 500


def test_one_candidate_left_takes_every_key(kernel):
    ej = np.ones(60, dtype=np.bool_)
    ej[17] = False
    plan = Plan(
        RingSet([f"http://10.1.0.{i}:80" for i in range(60)]),
        0,
        ejected=ej,
        loads=np.ones(60),
        balance_factor=1.25,
    )
    assert set(plan.route(keys(300))[0].tolist()) == {17}
    assert set(plan.route(keys(300), attempt=1)[0].tolist()) == {-1}


def test_bad_keys_and_arguments_raise_before_anything_is_routed(kernel):
    plan = Plan(ring_set(), 0)
    with pytest.raises(lbcore.KeyTypeError, match="key 1 has type float"):
        plan.route(["a", 1.5])
    with pytest.raises(lbcore.KeyTooLongError, match="at most 4096 bytes"):
        plan.route(["a", "b" * 4097])
    unlimited = Plan(ring_set(), 0, max_key_bytes=None)
    assert unlimited.route(["b" * 5000])[0].size == 1
    with pytest.raises(lbcore.KeyEncodingError):
        plan.route(["\ud800"])
    with pytest.raises(lbcore.ArgumentError, match="attempt"):
        plan.route(["a"], attempt=-1)
    with pytest.raises(lbcore.ArgumentError, match="attempt"):
        plan.route(["a"], attempt=True)
    with pytest.raises(lbcore.ArgumentError, match="loads"):
        Plan(ring_set(), 0, balance_factor=1.25)
    with pytest.raises(lbcore.LoadError):
        Plan(ring_set(), 0, loads=np.full(60, np.nan), balance_factor=1.25)
    with pytest.raises(lbcore.ArgumentError, match="fade_mode"):
        Plan(ring_set(), 0, fade_mode="fast")
    huge = plan.route(["a"], attempt=10**30)
    assert huge[0].tolist() == [-1]


def test_the_guard_says_whether_the_table_stayed_valid(kernel):
    words = np.zeros(4, dtype=np.uint64)
    words[2] = 7
    plan = Plan(ring_set(), 0, guard=(words, 2, 7))
    assert plan.route(keys(10))[3] is True
    words[2] = 8  # the writer began rewriting the buffer
    idx, _, _, valid = plan.route(keys(10))
    assert valid is False and idx.size == 10


def _damage(ring: lbcore.Ring, kind: str) -> None:
    """Rewrite a ring's arrays in place, as a writer reusing a shared buffer would."""
    for a in (ring.owners, ring.buckets):
        a.flags.writeable = True
    if kind == "owners":
        ring.owners[::3] = 1_000_000
    elif kind == "buckets":
        ring.buckets[ring.buckets >= 0] = 2**30
    else:
        ring.buckets[ring.buckets < -1] = -(2**30)


@pytest.mark.parametrize("kind", ["owners", "buckets", "one-node buckets"])
def test_a_table_rewritten_under_a_plan_raises_or_is_voided_never_crashes(kernel, kind):
    rs = RingSet([f"http://10.1.0.{i}:80" for i in range(8)], vnodes=10)
    words = np.ones(1, dtype=np.uint64)
    plan = Plan(rs, 0, loads=np.ones(8), balance_factor=1.25, guard=(words, 0, 1))
    _damage(rs.newest, kind)
    # Native checks every index read from the table, NumPy every owner (a negative one
    # would index from the end): an owner out of range is refused alike. NumPy's bucket
    # lookups check their own indexing: an IndexError or a wrong answer, no crash.
    if kernel == "native" or kind == "owners":
        with pytest.raises(lbcore.TableDataError, match="out of range"):
            plan.route(keys(2000))
    else:
        try:
            plan.route(keys(2000))
        except IndexError:
            pass
    words[0] = 2  # and the writer's sequence word moved on: the answer is void, not an error
    if kernel == "native" or kind == "owners":
        assert plan.route(keys(2000))[3] is False


def test_counter_slots_map_routed_calls(kernel):
    slots = np.arange(60, dtype=np.int64)[::-1] * 2
    plan = Plan(ring_set(), 0, slots=slots, n_slots=200)
    idx = np.array([0, -1, 59, 3, -1], dtype=np.int32)
    got, where = plan.counter_slots(idx)
    assert got.tolist() == [118, 0, 112] and where.tolist() == [0, 2, 3]
    got, where = plan.counter_slots(np.array([1, 2], dtype=np.int64))
    assert got.tolist() == [116, 114] and where is None
    for bad in (np.array([60], dtype=np.int32), np.array([-2], dtype=np.int32), [0, 99]):
        with pytest.raises(lbcore.ArgumentError, match=r"not in -1\.\.59"):
            plan.counter_slots(bad)
    with pytest.raises(lbcore.ArgumentError, match="slots"):
        Plan(ring_set(), 0, slots=np.arange(60), n_slots=10)


def test_a_plan_reads_shared_arrays_without_copying_them(kernel):
    rs = ring_set()
    plan = Plan(rs, 0)
    if kernel == "native":
        ro = rs.newest.hashes.copy()
        ro.flags.writeable = False  # shared-memory views are read-only: accepted as they are
        ring = lbcore.Ring.from_arrays(
            rs.newest.endpoints, ro, rs.newest.owners, buckets=rs.newest.buckets
        )
        assert ring.hashes is ro
    assert plan.newest is rs.newest


def _array_attributes(plan: Plan) -> dict[str, np.ndarray]:
    """The plan's public attributes that are arrays, by name."""
    names = [n for n in dir(plan) if not n.startswith("_")]
    got = {n: getattr(plan, n) for n in names}
    return {n: a for n, a in got.items() if isinstance(a, np.ndarray)}


@pytest.mark.parametrize("mode", ["n-ring", "skipper"])
def test_a_plan_keeps_its_own_read_only_arrays(kernel, mode):
    rs, now, ks = ring_set(), D // 2, keys(3000, seed=4)
    n = len(rs.endpoints)
    loads = np.random.default_rng(4).uniform(0, 10, n)  # float64: kept as given before
    slots = np.arange(n, dtype=np.int64)[::-1].copy()
    ejected = np.zeros(n, dtype=np.bool_)
    ejected[[3, 40]] = True
    words = np.array([0, 7], dtype=np.uint64)
    kw = {"loads": loads, "balance_factor": 1.25, "max_hops": 10, "fade_mode": mode}
    plan = Plan(rs, now, slots=slots, ejected=ejected, guard=(words, 1, 7), **kw)
    before = plan.route(ks)
    routed = before[0]
    want_slots = plan.counter_slots(routed)[0].tolist()
    answers = [a.copy() for a in plan.answers()]

    loads[:] = loads[::-1] * 3  # the caller's arrays change after the build
    slots[:] = 0
    ejected[:] = ~ejected
    after = plan.route(ks)
    assert after[0].tolist() == routed.tolist() and after[1:] == before[1:]
    assert plan.counter_slots(routed)[0].tolist() == want_slots
    assert all((a == b).all() for a, b in zip(plan.answers(), answers, strict=True))
    # (A plan built on the changed arrays routes otherwise: the change would show.)
    again = Plan(rs, now, slots=slots, ejected=ejected, guard=(words, 1, 7), **kw)
    assert again.route(ks)[0].tolist() != routed.tolist()

    # Every array a plan exposes is read-only (a zone plan with bounded load has the most).
    zoned = Plan(rs, now, zone=lbcore.ZoneSplit(np.arange(n) % 3 == 0, 0.5), **kw)
    for p in (plan, zoned):
        arrays = _array_attributes(p)
        assert {"loads", "eligible", "good", "fade_thresholds"} <= set(arrays)
        for name, arr in arrays.items():
            assert not arr.flags.writeable, name
            with pytest.raises(ValueError, match="read-only"):
                arr[...] = 0
    assert "under" in _array_attributes(zoned)
    assert not plan.guard[0].flags.writeable
    assert words.flags.writeable  # the caller's guard words stay the caller's
    words[1] = 8  # and stay live: the plan sees the sequence change
    assert plan.route(ks)[3] is False
