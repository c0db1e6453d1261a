"""Invariants of the routing simulator (perf/sim): conservation, cache bounds, determinism.

Small, fast configurations; the simulator's routing must be lbcore's.
"""

import heapq
from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest

import lbcore
from lbcore.route import route_ring_set
from perf.sim import model as sim_model
from perf.sim.cache import TickLRU
from perf.sim.model import ScaleDown, ScaleUp, SimConfig, SimConfigError, SlowPod, run
from perf.sim.pods import PodQueues
from perf.sim.routing import SimRoutingError, endpoint_name, make_router
from perf.sim.workload import Batches, Catalogue

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

# Global pod numbers that are not ring indices: the routers must translate both ways.
PODS = [3, 7, 1, 9, 4, 11]
NEW = [12, 8]
NS = 1_000_000_000


def _router(mode, pods, *, bf=1.1, exponent=2.5, seed=0):
    return make_router(
        mode,
        pods,
        balance_factor=bf,
        max_hops=10,
        vnodes=100,
        fade_s=30.0,
        fade_exponent=exponent,
        rng=np.random.default_rng(seed),
    )


def _names(pods):
    return [endpoint_name(p) for p in pods]


@pytest.fixture(scope="module")
def hashes():
    return Catalogue(20_000, 1.0).hashes


@pytest.fixture(scope="module")
def loads():
    # Indexed by global pod number; uneven, so any mix-up of pod <-> ring index shows.
    return np.random.default_rng(5).uniform(0.0, 4.0, 16)


def test_loads_reach_lbcore_in_ring_order(hashes, loads):
    # The test below is only as strong as this: mapping loads by position instead of by
    # pod number gives lbcore another answer.
    ring = lbcore.Ring(_names(PODS))
    right = ring.lookup_bounded(None, loads[PODS], 1.1, max_hops=10, hashes=hashes)
    wrong = ring.lookup_bounded(None, loads[: len(PODS)], 1.1, max_hops=10, hashes=hashes)
    assert (right != wrong).mean() > 0.05


def test_plain_router_is_lbcore_ring_with_pods_renumbered(hashes, loads):
    for bf in (None, 1.1):
        r = _router("off", PODS, bf=bf)
        ring = lbcore.Ring(_names(PODS))
        want = (
            ring.lookup(None, hashes=hashes)
            if bf is None
            else ring.lookup_bounded(None, loads[PODS], bf, max_hops=10, hashes=hashes)
        )
        np.testing.assert_array_equal(r.route(hashes, 0.0, loads), np.array(PODS)[want])
    # a pod in the middle leaves, two join
    r = _router("off", PODS)
    r.remove([9], 1.0)
    r.publish(NEW, 2.0)
    now = [3, 7, 1, 4, 11, *NEW]
    assert r.members.tolist() == now
    want = lbcore.Ring(_names(now)).lookup_bounded(
        None, loads[now], 1.1, max_hops=10, hashes=hashes
    )
    np.testing.assert_array_equal(r.route(hashes, 3.0, loads), np.array(now)[want])


def test_nring_router_is_lbcore_ringset_with_pods_renumbered(hashes, loads):
    r = _router("n-ring", PODS)
    r.publish(NEW, 1.0)
    rs = lbcore.RingSet(_names(PODS), duration_ns=30 * NS).scale_up(_names(NEW), 1 * NS)
    order = [PODS[i] for i in range(len(PODS))] + NEW
    assert r.members.tolist() == order
    want = route_ring_set(
        rs, None, 16 * NS, loads=loads[order], balance_factor=1.1, max_hops=10, hashes=hashes
    )
    got = r.route(hashes, 16.0, loads)
    np.testing.assert_array_equal(got, np.array(order)[want])
    assert np.isin(got, NEW).any() and not np.isin(got, NEW).all()  # mid-fade
    # a pod in the middle of the established ring is deleted while the new ring fades
    r.remove([1], 17.0)
    rs = rs.remove([endpoint_name(1)])
    order = [p for p in order if p != 1]
    assert r.members.tolist() == order
    want = route_ring_set(
        rs, None, 20 * NS, loads=loads[order], balance_factor=1.1, max_hops=10, hashes=hashes
    )
    np.testing.assert_array_equal(r.route(hashes, 20.0, loads), np.array(order)[want])


def test_skipper_router_is_lbcore_skipper_fadein_route(hashes, loads):
    exponent = 1.7  # not lbcore's default: a router that drops it fails
    r = _router("skipper", PODS, exponent=exponent, seed=42)
    thresholds = np.random.default_rng(42)  # the same stream the router draws from
    r.publish(NEW, 1.0)
    r.publish([5], 4.0)
    order = [*PODS, *NEW, 5]
    assert r.members.tolist() == order

    def want(now_s, members):
        now = round(now_s * NS)
        # detected 1 ns before the publish instant (see SkipperRouter.publish)
        detected = {**dict.fromkeys(PODS), 12: NS - 1, 8: NS - 1, 5: 4 * NS - 1}
        ages = [None if detected[p] is None else now - detected[p] for p in members]
        idx = lbcore.fade.skipper_fadein_route(
            lbcore.Ring(_names(members)),
            None,
            ages,
            30 * NS,
            exponent,
            thresholds.random(hashes.size),
            loads=loads[members],
            balance_factor=1.1,
            max_hops=10,
            hashes=hashes,
        )
        return np.array(members)[idx]

    got = r.route(hashes, 16.0, loads)
    np.testing.assert_array_equal(got, want(16.0, order))
    assert np.isin(got, [*NEW, 5]).any()
    r.remove([9], 17.0)  # from the middle
    order.remove(9)
    np.testing.assert_array_equal(r.route(hashes, 20.0, loads), want(20.0, order))


@pytest.mark.parametrize("exponent", [1.0, 3.0])
def test_skipper_router_sends_a_young_pod_score_times_its_keys(hashes, exponent):
    # One new pod at half the fade window: Skipper keeps it as a candidate for a call
    # with probability (1/2) ** exponent, so it gets that share of the keys it owns.
    r = _router("skipper", PODS, bf=None, exponent=exponent)
    r.publish([12], 0.0)
    owned = lbcore.Ring(_names([*PODS, 12])).lookup(None, hashes=hashes) == len(PODS)
    got = (r.route(hashes, 15.0, None) == 12).sum() / owned.sum()
    assert got == pytest.approx(0.5**exponent, abs=0.03)


def test_skipper_pod_published_this_instant_gets_no_traffic_yet(hashes):
    # Skipper's requests come after the detection, so a pod starts at score ~0; lbcore's
    # fadein_score reads an age of exactly 0 as "fully in".
    r = _router("skipper", PODS, bf=None)
    r.publish([12], 5.0)
    assert (r.route(hashes, 5.0, None) == 12).sum() == 0
    assert (r.route(hashes, 20.0, None) == 12).sum() > 100


def test_a_fallback_from_lbcore_is_never_taken_for_a_pod():
    r = _router("off", PODS)
    with pytest.raises(SimRoutingError, match="fallback"):
        r.to_pods(np.array([0, lbcore.FALLBACK, 2], dtype=np.int32))


def test_unknown_fade_mode_is_named():
    with pytest.raises(ValueError, match="expected one of n-ring, skipper, off"):
        _router("nring", PODS)


# ------------------------------------------------------------------------------------
# Load snapshot: lbcore's signals from the simulated counters.


# 2 client hosts x 3 pods over a 10 s window; pod 2 is five times slower per call for
# host 0. Per host and pod: calls completed, seconds per call, busy ns, calls in flight.
WINDOW = 10 * NS
COMPLETED = np.array([[100.0, 100.0, 20.0], [50.0, 50.0, 50.0]])
PER_CALL_S = np.array([[0.002, 0.002, 0.010], [0.004, 0.004, 0.004]])
BUSY_NS = COMPLETED * PER_CALL_S * 1e9
IN_FLIGHT = np.array([[0, 1, 0], [2, 0, 0]])


def test_client_loads_weigh_occupancy_by_latency_for_the_effective_signal():
    occ = sim_model.client_loads(
        "occupancy", IN_FLIGHT, BUSY_NS, COMPLETED, WINDOW, bar_increment="skipper"
    )
    np.testing.assert_allclose(occ, BUSY_NS / WINDOW)
    eff = sim_model.client_loads("effective", IN_FLIGHT, BUSY_NS, COMPLETED, WINDOW)
    host0_mean = BUSY_NS[0].sum() * 1e-9 / COMPLETED[0].sum()
    np.testing.assert_allclose(
        eff[0], np.maximum(IN_FLIGHT[0], occ[0]) * PER_CALL_S[0] / host0_mean
    )
    assert eff[0, 2] > 2.5 * occ[0, 2]  # the slow pod weighs more ...
    assert eff[0, 0] < occ[0, 0]  # ... and fast ones less
    np.testing.assert_allclose(eff[1], np.maximum(IN_FLIGHT[1], occ[1]))  # all alike: factor 1
    fl = sim_model.client_loads("in-flight", IN_FLIGHT, BUSY_NS, COMPLETED, WINDOW)
    np.testing.assert_array_equal(fl, IN_FLIGHT)


def test_client_loads_in_routed_call_units():
    # bar_increment="routed-call" (the default, as cslb's router): each host's occupancy
    # is divided by what one call of the host's mean latency adds to it (latency /
    # window), so lbcore's 1.0 for the routed call is that call; counts are left alone.
    # "skipper" leaves the signal as it reads.
    args = (IN_FLIGHT, BUSY_NS, COMPLETED, WINDOW)
    occ = sim_model.client_loads("occupancy", *args, bar_increment="skipper")
    np.testing.assert_allclose(occ, BUSY_NS / WINDOW)
    units = sim_model.client_loads("occupancy", *args)
    for c in range(2):
        inc = (BUSY_NS[c].sum() * 1e-9 / COMPLETED[c].sum()) / 10.0
        assert 0 < inc < 0.001
        np.testing.assert_allclose(units[c], occ[c] / inc)
    # in routed-call units a pod's occupancy is the number of mean-latency calls of work
    # it did in the window
    np.testing.assert_allclose(units[1], COMPLETED[1])
    for signal in ("in-flight", "effective"):
        np.testing.assert_array_equal(
            sim_model.client_loads(signal, *args),
            sim_model.client_loads(signal, *args, bar_increment="skipper"),
        )


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


@pytest.mark.parametrize("fade", ["off", "skipper", "n-ring"])
def test_scale_down_takes_the_newest_pods_out_of_routing_at_once(fade):
    # 6 pods, 4 added (ready 1-1.75 s), the 2 newest deleted at 6 s, while N-ring's fade
    # (published 3.75 s, 3 s long) is still running: they got calls before, none after.
    cfg = replace(SMALL, fade=fade, events=(ScaleUp(1.0, 4, 1.0), ScaleDown(6.0, 2)))
    r = run(cfg)
    assert r.new_pods.tolist() == [6, 7, 8, 9]
    assert r.members.tolist() == list(range(8))
    gone, kept = r.pod_calls[[8, 9]], r.pod_calls[[6, 7]]
    assert (gone[:, 4:6] > 0).all()  # interval i covers [i, i + 1) s
    assert (gone[:, 6:] == 0).all()
    assert (kept[:, 6:] > 0).all()
    assert int(r.pod_calls[:, 6:].sum()) == int(r.series["calls"][6:].sum())


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
    def bad(match, **changes):
        with pytest.raises(SimConfigError, match=match):
            run(replace(SMALL, **changes))

    bad("fade must be one of", fade="nring")
    bad("bar_increment must be one of", bar_increment="zero")
    bad(r"report_s .* whole multiple of tick_s", report_s=0.015)
    bad("slow pod 99 is not a starting pod", events=(SlowPod(1.0, 2.0, 99, 2.0),))
    bad("removes 6 of 6 pods; at least one must stay", events=(ScaleDown(1.0, 6),))
    bad(r"seconds must be a finite number >= report_s", seconds=0.001)
    bad("seconds must be a finite number", seconds=float("inf"))
    bad("rate must be a finite number > 0", rate=float("inf"))
    bad("fade_s must be a finite number", fade_s=float("inf"))
    bad("max_batch must be 1..catalogue", catalogue=50)
    bad(r"would need about .* GiB of arrays", seconds=1e9)
    bad("pod_speed_sigma must be a finite number >= 0", pod_speed_sigma=-0.1)
    bad("pod_speed_sigma must be a finite number >= 0", pod_speed_sigma=float("nan"))
    with pytest.raises(lbcore.BalanceFactorError):
        run(replace(SMALL, balance_factor=0.9))


def test_defaults_are_lbcore_production_defaults_except_bounded_load():
    cfg = SimConfig()
    knobs = lbcore.knobs.defaults()
    assert cfg.fade == knobs["fade_mode"] == "n-ring"
    assert (cfg.fade_s, cfg.fade_exponent) == (knobs["fade_duration_s"], knobs["fade_exponent"])
    assert (cfg.max_hops, cfg.vnodes, cfg.signal) == (
        knobs["max_hops"],
        knobs["vnodes"],
        knobs["load_signal"],
    )
    assert cfg.window_s * 1e9 == lbcore.signals.DEFAULT_WINDOW_NS
    assert cfg.balance_factor is None  # documented: scenarios switch bounded load on


def test_pods_on_unequal_nodes_serve_at_their_own_fixed_speed():
    # sigma 0: identical pods, and the run is exactly the one without the setting
    assert (sim_model.pod_speed_factors(5, 0.0, 1) == 1.0).all()
    f = sim_model.pod_speed_factors(20_000, 0.3, 1)
    assert f.mean() == pytest.approx(1.0, abs=0.01)  # mean 1: the fleet's work is kept
    assert np.log(f).std() == pytest.approx(0.3, abs=0.01)
    assert (f == sim_model.pod_speed_factors(20_000, 0.3, 1)).all()  # seeded
    assert (f != sim_model.pod_speed_factors(20_000, 0.3, 2)).any()
    # in a run without bounded load the same calls reach the same pods and caches, and
    # each pod's busy time is its busy time on equal nodes times its factor (plus a
    # little queueing)
    cfg = replace(SMALL, pods=6, rate_per_pod=100.0, pod_speed_sigma=0.5, seconds=4.0)
    r, plain = run(cfg), run(replace(cfg, pod_speed_sigma=0.0))
    assert (r.pod_calls == plain.pod_calls).all()
    ratio = r.pod_busy_s.sum(axis=1) / plain.pod_busy_s.sum(axis=1)
    factors = sim_model.pod_speed_factors(6, 0.5, cfg.seed)
    assert factors.max() / factors.min() > 2
    np.testing.assert_allclose(ratio, factors, rtol=0.05)


# ------------------------------------------------------------------------------------
# Workload and overload.


def test_batches_carry_distinct_ids_in_popularity_order():
    cat = Catalogue(1_000, 1.0)
    rng = np.random.default_rng(3)
    b = Batches.draw(rng, cat, 200_000.0, 100, 0.0, 0.05, clients=4)
    sizes = np.diff(np.append(b.starts, b.keys.size))
    assert b.keys.size > 5_000 and sizes.max() <= 100
    for lo, n in zip(b.starts.tolist(), sizes.tolist(), strict=True):
        assert np.unique(b.keys[lo : lo + n]).size == n
    # still popularity-driven: the head is in almost every big batch, the tail rarely
    big = sizes >= 80
    has0 = [0 in b.keys[lo : lo + n] for lo, n in zip(b.starts[big], sizes[big], strict=True)]
    assert np.mean(has0) > 0.9
    assert np.mean(b.keys >= 500) < 0.2


def test_overload_is_reported_not_hidden(monkeypatch):
    assert run(SMALL).warnings == []
    monkeypatch.setattr(sim_model, "HORIZON_S", 0.5)
    # one slot of 1-15 ms per pod cannot serve 600 calls/s
    r = run(replace(SMALL, concurrency=1, seconds=3.0, clients=1))
    text = " ".join(r.warnings)
    assert "overloaded" in text and "calls still queued" in text
    assert "booked at 0.5 s" in text and r.totals["calls_booked_at_horizon"] > 0
    assert r.totals["backlog_end_s_max"] > 1.0
