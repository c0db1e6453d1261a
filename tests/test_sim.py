"""Invariants of the routing simulator (perf/sim): conservation, cache bounds, determinism.

Small, fast configurations; the simulator's routing must be lbcore's.
"""

import heapq
from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest

import lbcore
from perf.sim import model as sim_model
from perf.sim.cache import TickLRU
from perf.sim.model import ScaleDown, ScaleUp, SimConfig, SlowPod, run
from perf.sim.pods import PodQueues
from perf.sim.routing import endpoint_name, make_router
from perf.sim.workload import Catalogue

SMALL = SimConfig(
    pods=6,
    catalogue=20_000,
    cache_size=400,
    rate_per_pod=600.0,
    window_s=2.0,
    warmup_s=0.0,
    seconds=8.0,
    fade_s=3.0,
    clients=3,
)


# ------------------------------------------------------------------------------------
# Caches.


def test_tick_lru_equals_exact_lru_with_one_access_per_tick():
    rng = np.random.default_rng(7)
    cache = TickLRU(pods=1, catalogue=50, size=8, stamps=3000)
    ref: OrderedDict[int, None] = OrderedDict()
    for tick in range(2500):
        key = int(rng.zipf(1.3) % 50)
        hit = cache.access(np.array([0]), np.array([key]), stamp=tick + 1)[0]
        want = key in ref
        if want:
            ref.move_to_end(key)
        else:
            ref[key] = None
            if len(ref) > 8:
                ref.popitem(last=False)
        assert hit == want, tick
        assert sorted(cache.contents(0).tolist()) == sorted(ref)


def test_tick_lru_never_exceeds_its_size_and_counts_match_contents():
    rng = np.random.default_rng(3)
    pods, size = 4, 30
    cache = TickLRU(pods=pods, catalogue=400, size=size, stamps=400)
    seen_full = False
    for tick in range(1, 400):
        n = int(rng.integers(0, 60))
        p = rng.integers(0, pods, n)
        k = rng.integers(0, 400, n)
        hit = cache.access(p, k, tick)
        for q in range(pods):
            held = cache.contents(q)
            assert held.size == cache.size[q] <= size
            seen_full |= held.size >= size - 20
        # every key accessed in this tick is cached now unless its whole tick was evicted
        assert hit.dtype == np.bool_ and hit.size == n
    assert seen_full


def test_tick_lru_repeats_within_a_tick_ride_on_the_first_fetch():
    cache = TickLRU(pods=2, catalogue=10, size=5, stamps=10)
    hit = cache.access(np.array([0, 0, 1, 0]), np.array([3, 3, 3, 4]), 1)
    assert hit.tolist() == [False, True, False, False]
    hit = cache.access(np.array([0, 1]), np.array([3, 3]), 2)
    assert hit.tolist() == [True, True]


def test_cache_size_must_be_positive():
    with pytest.raises(ValueError, match="cache size must be >= 1"):
        TickLRU(pods=1, catalogue=10, size=0, stamps=10)


def test_simulation_caches_stay_within_size_every_tick(monkeypatch):
    checks = []

    class CheckedLRU(TickLRU):
        def access(self, pods, keys, stamp):
            hit = super().access(pods, keys, stamp)
            assert int(self.size.max()) <= self.capacity
            checks.append(int(self.size.max()))
            return hit

    monkeypatch.setattr(sim_model, "TickLRU", CheckedLRU)
    cfg = replace(SMALL, events=(ScaleUp(2.0, 6, 1.0),), fade="skipper", balance_factor=1.25)
    r = run(cfg)
    assert len(checks) > 300
    assert max(checks) == cfg.cache_size  # caches did fill up, and no further
    assert r.totals["cache_max_size"] <= cfg.cache_size


# ------------------------------------------------------------------------------------
# Pods.


def _mgc_reference(pods, arrival, service, concurrency, n_pods):
    free = [[0.0] * concurrency for _ in range(n_pods)]
    for f in free:
        heapq.heapify(f)
    done = []
    for p, a, s in zip(pods, arrival, service, strict=True):
        start = max(a, heapq.heappop(free[p]))
        heapq.heappush(free[p], start + s)
        done.append(start + s)
    return np.array(done)


def test_pod_queues_are_an_exact_fifo_multi_server_queue():
    rng = np.random.default_rng(11)
    q = PodQueues(pods=5, concurrency=3)
    pods_all, arr_all, svc_all, got = [], [], [], []
    t = 0.0
    for _ in range(50):  # 50 ticks, state carried over between them
        n = int(rng.integers(0, 40))
        pods = rng.integers(0, 5, n)
        arrival = np.sort(t + rng.random(n) * 0.01)
        service = np.where(rng.random(n) < 0.8, 0.001, 0.015) * rng.choice([1.0, 5.0], n)
        got.append(q.serve(pods, arrival, service))
        pods_all += pods.tolist()
        arr_all += arrival.tolist()
        svc_all += service.tolist()
        t += 0.01
    want = _mgc_reference(pods_all, arr_all, svc_all, 3, 5)
    np.testing.assert_allclose(np.concatenate(got), want, rtol=0, atol=1e-12)
    assert (np.concatenate(got) - np.array(arr_all) > np.array(svc_all) + 1e-6).any()  # queued


# ------------------------------------------------------------------------------------
# Routing is lbcore's.


def test_routers_answer_exactly_what_lbcore_answers():
    cat = Catalogue(5_000, 1.0)
    h = cat.hashes[np.arange(5_000)]
    pods = list(range(8))
    names = [endpoint_name(p) for p in pods]
    rng = np.random.default_rng(0)
    plain = make_router(
        "off",
        pods,
        balance_factor=None,
        max_hops=10,
        vnodes=100,
        fade_s=30.0,
        fade_exponent=2.5,
        rng=rng,
    )
    np.testing.assert_array_equal(
        plain.route(h, 0.0, None), lbcore.Ring(names).lookup(None, hashes=h)
    )

    nring = make_router(
        "n-ring",
        pods[:5],
        balance_factor=1.25,
        max_hops=10,
        vnodes=100,
        fade_s=30.0,
        fade_exponent=2.5,
        rng=rng,
    )
    nring.publish(pods[5:], 1.0)
    loads = np.linspace(0.0, 2.0, 8)
    rs = lbcore.RingSet(names[:5], duration_ns=30_000_000_000).scale_up(names[5:], 1_000_000_000)
    want = rs.route(None, 16_000_000_000, loads=loads, balance_factor=1.25, max_hops=10, hashes=h)
    np.testing.assert_array_equal(nring.route(h, 16.0, loads), want)


# ------------------------------------------------------------------------------------
# Whole runs: conservation and determinism.


@pytest.mark.parametrize("fade", ["off", "skipper", "n-ring"])
def test_every_request_is_counted_once(fade):
    cfg = replace(
        SMALL,
        fade=fade,
        balance_factor=1.25,
        signal="effective",
        events=(ScaleUp(1.0, 4, 1.0), SlowPod(2.0, 5.0, 1, 4.0), ScaleDown(6.0, 2)),
    )
    r = run(cfg)
    t, s = r.totals, r.series
    assert t["calls"] > 20_000
    assert t["routed"] == t["calls"] == int(s["calls"].sum())  # no warm-up: all measured
    assert t["completed"] + t["in_flight_end"] == t["routed"]
    assert 0 <= t["in_flight_end"] < 200
    assert int(s["hits"].sum()) + t["db_reads"] == t["calls"]
    assert int(r.pod_calls.sum()) == t["calls"]
    assert (r.pod_calls.sum(axis=0) == s["calls"]).all()
    assert int(s["new_pod_calls"].sum()) == int(r.pod_calls[r.new_pods].sum())
    # Busy time booked = latency of every completed call, spread over the pods.
    assert r.pod_busy_s.sum() > 0.5 * t["completed"] * cfg.hit_s


def test_same_seed_same_result_other_seed_other_result():
    cfg = replace(
        SMALL,
        fade="skipper",
        balance_factor=1.1,
        signal="in-flight",
        events=(ScaleUp(2.0, 3, 1.0),),
    )
    a, b = run(cfg).to_dict(per_pod=True), run(cfg).to_dict(per_pod=True)
    c = run(replace(cfg, seed=2)).to_dict(per_pod=True)
    for d in (a, b, c):
        d.pop("wall_s")
    assert a == b
    assert a["totals"] != c["totals"]


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="fade must be one of"):
        run(replace(SMALL, fade="linear"))
    with pytest.raises(ValueError, match=r"report_s .* whole multiple of tick_s"):
        run(replace(SMALL, report_s=0.015))
    with pytest.raises(lbcore.BalanceFactorError):
        run(replace(SMALL, balance_factor=0.9))
    with pytest.raises(ValueError, match="slow pod 99 is not a starting pod"):
        run(replace(SMALL, events=(SlowPod(1.0, 2.0, 99, 2.0),)))
