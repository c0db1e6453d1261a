"""The native kernel's shortcuts answer as the rule does, on both kernels.

The native kernel answers most keys from one state byte, walks without distinct-endpoint
bookkeeping unless the hop cap can bind, hands out result arrays again once nothing
refers to them, and parses ``attempt`` itself: each is checked here against the NumPy
reference or lbcore's ring-set routing, where a wrong shortcut would show.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

import lbcore
from lbcore import Gate, Plan, RingSet
from tests.kernel_harness import on

D = 30_000_000_000


def skus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"AD{v:09d}-K{v % 7}" for v in rng.integers(10**9, size=n)]


def repeats_before_good(owners: np.ndarray, good: np.ndarray, width: int) -> int:
    """Positions whose walk meets ``width`` over-the-bar positions, one endpoint twice, first."""
    size, count = owners.size, 0
    for s in range(size):
        seen: list[int] = []
        for step in range(size):
            e = int(owners[(s + step) % size])
            if good[e]:
                break
            seen.append(e)
            if len(seen) == width:
                count += len(set(seen)) < width
                break
    return count


@pytest.mark.parametrize("hops", [1, 2, 3, 5])
def test_a_walk_that_meets_one_hot_endpoint_twice_counts_it_once(kernel, hops):
    # Three endpoints with many nodes each: a walk often meets the same hot endpoint on
    # consecutive nodes, so the first `hops` hot positions are fewer distinct endpoints
    # and the walk must go on to the cool one (the hop cap counts distinct endpoints).
    rs = RingSet([f"http://10.2.0.{i}:80" for i in range(4)], vnodes=60)
    loads = np.array([9.0, 8.0, 0.1, 7.0])
    plan = Plan(rs, 0, loads=loads, balance_factor=1.0, max_hops=hops)
    good = plan.good[0]
    answer, _ = plan.answers()
    at_nodes = rs.newest.hashes  # a key equal to a node's hash lands on that position
    want = np.stack(
        [r.lookup_bounded(None, loads, 1.0, max_hops=hops, hashes=at_nodes) for r in rs.rings]
    )
    assert answer.tolist() == want.tolist()
    if hops == 1:  # a walk of one endpoint stays on a hot first endpoint
        assert not good.take(want[0]).all()
    else:
        assert repeats_before_good(rs.newest.owners, good, hops) > 10  # the case is exercised
    h = rs.newest.hashes
    assert plan.route_hashes(h)[0].tolist() == want[0].tolist()


def test_a_plan_of_20000_endpoints_routes_alike_on_both_kernels():
    eps = [f"http://10.{i // 62500}.{(i // 250) % 250}.{i % 250 + 1}:8080" for i in range(20_000)]
    rs = RingSet(eps[:18_000], duration_ns=D).scale_up(eps[18_000:], 0)
    rng = np.random.default_rng(7)
    loads = rng.uniform(0.5, 1.0, 20_000)
    loads[rng.random(20_000) < 0.37] = 3.0  # over the bar
    ejected = np.zeros(20_000, dtype=np.bool_)
    ejected[rng.choice(20_000, 50, replace=False)] = True
    batch = skus(30_000, seed=8)
    ids = rng.integers(1, 10**12, 30_000)

    def routed():
        plan = Plan(
            rs,
            D // 2,
            ejected=ejected,
            loads=loads,
            balance_factor=1.25,
            max_hops=10,
            gate=Gate(percentage=90.0),
        )
        first = plan.route(batch)
        retry = plan.route(ids, attempt=1)
        return (plan.views, first[0].tolist(), first[1:], retry[0].tolist(), retry[1:])

    native = on("native", routed)
    assert native[0] == 2 and native[2][1] > 1000  # two rings, and bounded load moved keys
    assert native == on("numpy", routed)


def test_results_are_never_shared_and_reused_ones_are_whole(kernel):
    plan = Plan(RingSet([f"http://10.3.0.{i}:80" for i in range(30)]), 0)
    batches = [skus(n, seed) for seed, n in enumerate((5, 5, 5, 1, 100))]
    want = [plan.route(b)[0].copy() for b in batches]
    a = plan.route(batches[0])[0]
    b = plan.route(batches[1])[0]
    assert a is not b and not np.shares_memory(a, b)
    assert a.tolist() == want[0].tolist() and b.tolist() == want[1].tolist()
    del b
    c = plan.route(batches[2])[0]
    assert c.tolist() == want[2].tolist() and a.tolist() == want[0].tolist()
    # A dropped result changed in place is never handed out in its changed form.
    mutations = [
        lambda r: setattr(r, "dtype", np.float32),
        lambda r: setattr(r, "shape", (5, 1)),
        lambda r: setattr(r.flags, "writeable", False),
        lambda r: r.resize(2, refcheck=False),
    ]
    for mutate in mutations:
        r = plan.route(batches[2])[0]
        mutate(r)
        del r
        got = plan.route(batches[2])[0]
        assert got.dtype == np.int32 and got.shape == (5,) and got.flags.writeable
        assert got.tolist() == want[2].tolist()
        del got
    # A result someone still holds weakly is not rewritten by later calls.
    r = plan.route(batches[0])[0]
    ref = weakref.ref(r)
    del r
    for i in range(12):
        plan.route(batches[i % 3])
    if ref() is not None:
        assert ref().tolist() == want[0].tolist()


def test_threads_routing_on_one_plan_get_their_own_answers(kernel):
    rs = RingSet([f"http://10.4.0.{i}:80" for i in range(50)], vnodes=50)
    plan = Plan(rs, 0, loads=np.linspace(0, 3, 50), balance_factor=1.2, max_hops=5)
    rng = np.random.default_rng(9)
    # Small lists and arrays long enough to be routed without the GIL.
    batches = [skus(3, 10), skus(200, 11), rng.integers(0, 10**12, 20_000), skus(9000, 12)]
    want = [plan.route(b)[0].tolist() for b in batches]
    errors: list[str] = []

    def worker(t: int) -> None:
        for i in range(40):
            j = (t + i) % len(batches)
            got = plan.route(batches[j])[0]
            if got.tolist() != want[j]:
                errors.append(f"thread {t} call {i}: batch {j} routed differently")
                return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads) and errors == []


ATTEMPTS = [0, 1, np.int64(2), np.uint8(1), 2**70, True, -1, -(2**70), 1.5, "1", None]


def test_attempt_is_judged_alike_on_both_kernels():
    plan_args = {"ring_set": RingSet([f"http://10.5.0.{i}:80" for i in range(8)]), "now_ns": 0}
    batch = skus(50, seed=13)

    def each():
        plan = Plan(**plan_args)
        out = []
        for a in ATTEMPTS:
            try:
                r = plan.route(batch, a)
                out.append((r[0].tolist(), r[1:], plan.route(batch, attempt=a)[0].tolist()))
            except lbcore.ArgumentError as exc:
                out.append(("error", str(exc)))
        for call in (lambda: plan.route(), lambda: plan.route(batch, 1, 2)):
            try:
                call()
            except TypeError:
                out.append("TypeError")
        try:
            plan.route(batch, attempts=1)
        except TypeError:
            out.append("TypeError")
        return out

    native = on("native", each)
    assert native == on("numpy", each)
    by_value = dict(zip(map(repr, ATTEMPTS), native, strict=False))
    assert by_value["True"] == ("error", "attempt must be a non-negative integer, got True")
    assert by_value["1.5"] == ("error", "attempt must be a non-negative integer, got 1.5")
    assert by_value[repr(2**70)][0] == [-1] * 50  # beyond every endpoint: fallback
    assert by_value["np.int64(2)"][0] != by_value["0"][0]
    assert native[-3:] == ["TypeError"] * 3
