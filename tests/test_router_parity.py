"""Router.route against an independent composition of lbcore, on random tables and loads."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore import route_ring_set
from lbcore.draws import unit_interval
from lbcore.fade import fadein_scores
from tests import router_harness as harness
from tests.router_harness import D_NS, endpoints
from workers.routing.router import SKIPPER_SALT

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept

FAR = (1 << 62) - 1


def _expected(rs, h, now, mode, load, bf, hops, cand, attempt):
    """(answer, plain) per key by lbcore alone; plain = same walk without bounded load."""
    if not rs.rings:
        m = np.full(h.size, -1, np.int32)
        return m, m
    if mode == "skipper":
        ring = rs.newest
        ages = [None if tier == 0 else now - rs.starts_ns[tier - 1] for tier in rs.tiers.tolist()]
        scores = fadein_scores(ages, rs.duration_ns, rs.exponent)
        thr = unit_interval(h, SKIPPER_SALT)
        elig = np.ones(len(rs.endpoints), bool) if cand is None else cand
        out = np.empty(h.size, np.int32)
        plain = np.empty(h.size, np.int32)
        for i in range(h.size):  # per key, Skipper's filter over the non-ejected list
            m = elig & (thr[i] < scores)
            if not m.any():
                m = elig.copy()
            hh = h[i : i + 1]
            plain[i] = ring.lookup(None, candidates=m, attempt=attempt, hashes=hh)[0]
            if bf is None:
                out[i] = plain[i]
            else:
                out[i] = ring.lookup_bounded(
                    None, load, bf, candidates=m, max_hops=hops, attempt=attempt, hashes=hh
                )[0]
        return out, plain
    when = FAR if mode == "off" else now
    kw = {"candidates": cand, "max_hops": hops, "attempt": attempt, "hashes": h}
    plain = route_ring_set(rs, None, when, **kw)
    if bf is None:
        return plain, plain
    return route_ring_set(rs, None, when, loads=load, balance_factor=bf, **kw), plain


def _routing_load(loads: shm.HostLoads, sig: str) -> np.ndarray:
    """The signal in routed-call units, by lbcore alone: for occupancy the bar adds the
    host's mean call latency over the window as a share of the window, not 1.0."""
    load = loads.signal(sig)
    if sig != "occupancy":
        return load
    # The host's mean latency from the per-endpoint means and completions (one table on
    # the host: its slots are every slot read), as lbcore.signals.mean_latency defines it.
    done = loads.completed
    sums = np.where(done > 0, np.nan_to_num(loads.mean_latency_s) * done, 0.0)
    mean = float(lbcore.signals.mean_latency(sums.sum(), done.sum()))
    if np.isnan(mean):
        assert np.isnan(loads.global_latency_s)
    else:
        assert loads.global_latency_s == pytest.approx(mean, rel=1e-12)
    inc = lbcore.bounded.routed_call_load(sig, loads.global_latency_s, loads.window_ns / 1e9)
    assert inc == (1.0 if np.isnan(mean) else pytest.approx(mean / 10.0, rel=1e-12))
    return lbcore.bounded.in_call_units(load, inc)


@pytest.mark.parametrize("seed", range(120))
def test_random_parity_with_lbcore(seed, kernel, clock, host):
    rng = np.random.default_rng(seed)
    n0 = int(rng.integers(1, 25))
    vn = int(rng.choice([5, 20, 100]))
    rs = lbcore.RingSet(endpoints(n0), duration_ns=D_NS, vnodes=vn)
    t = clock()
    for ev in range(int(rng.integers(0, 3))):
        t += int(rng.integers(0, 10_000_000_000))
        rs = rs.scale_up(endpoints(int(rng.integers(1, 6)), net=ev + 1), t)
    n = len(rs.endpoints)
    ej = rng.random(n) < rng.choice([0.0, 0.2, 0.5, 1.0])
    mode = str(rng.choice(["n-ring", "off", "skipper"]))
    bf = None if rng.random() < 0.25 else float(rng.choice([1.0, 1.1, 1.25, 2.0]))
    hops = None if rng.random() < 0.3 else int(rng.integers(1, 12))
    sig = str(rng.choice(list(lbcore.signals.LOAD_SIGNALS)))
    enabled = bool(rng.random() > 0.1)
    pct = float(rng.choice([100.0, 100.0, 50.0, 0.0, 3.0]))
    k = shm.Knobs(
        enabled=enabled,
        percentage=pct,
        balance_factor=bf,
        max_hops=hops,
        load_signal=sig,
        fade_mode=mode,
    )
    host.publish(rs, ejected=ej, knobs=k)
    r = host.router(refresh_s=3600.0)
    table = r.table()
    other = host.store.claim()
    slots = np.asarray(table.slots, dtype=np.intp)
    now = clock()
    for _ in range(int(rng.integers(0, 6))):
        e = rng.integers(0, n, int(rng.integers(1, 30)))
        start = now - int(rng.integers(1, 5_000_000_000))
        other.record_start(slots[e], start)
        if rng.random() < 0.7:
            d = rng.integers(1_000_000, 2_000_000_000, e.size)
            other.record_end(slots[e], start, d, now)
    clock.now = int(t + rng.integers(0, 2 * D_NS))
    r.refresh()  # a fresh snapshot at this instant: it sees the load
    keys = [f"K{seed}-{i}" for i in range(int(rng.choice([1, 7, 300, 3000])))]
    h = lbcore.hash_keys(keys)
    before = r.stats()
    attempt = int(rng.integers(0, 2))
    got = r.route(keys, attempt=attempt)
    small = np.concatenate(
        [r.route(keys[i : i + 7], attempt=attempt) for i in range(0, len(keys), 7)]
    )
    big = r.route(keys, attempt=attempt)  # again after the small ones: no state between calls
    load = _routing_load(r.loads(), sig)
    now = clock()
    cand = None if not ej.any() else ~ej
    exp, plain = _expected(rs, h, now, mode, load, bf, hops, cand, attempt)
    if not enabled or pct <= 0:
        exp = np.full(h.size, -1, np.int32)
    else:
        exp = lbcore.Gate(True, pct).apply(exp, h)
    ctx = (
        f"seed={seed} n={n} ej={int(ej.sum())} mode={mode} bf={bf} hops={hops} "
        f"sig={sig} pct={pct} en={enabled} att={attempt}"
    )
    np.testing.assert_array_equal(got, exp, err_msg=ctx)
    np.testing.assert_array_equal(small, exp, err_msg=ctx)
    np.testing.assert_array_equal(big, exp, err_msg=ctx)
    if ej.any():
        assert not np.isin(exp, np.flatnonzero(ej)).any()
    st = r.stats()
    moved = int(((exp != plain) & (exp >= 0)).sum())
    assert st["decisions"] - before["decisions"] == 3 * len(keys), ctx
    assert st["fallbacks"] - before["fallbacks"] == 3 * int((exp < 0).sum()), ctx
    assert st["moves"] - before["moves"] == 3 * moved, ctx
    other.release()


def test_a_load_change_on_the_same_table_is_routed_on(host):
    rs = lbcore.RingSet(endpoints(10))
    host.publish(rs, knobs=shm.Knobs(load_signal="in-flight", max_hops=None))
    r = host.router(refresh_s=1.0)
    keys = [f"SKU-{i}" for i in range(3000)]
    idle = r.route(keys)
    np.testing.assert_array_equal(idle, route_ring_set(rs, keys, host.clock()))
    rec = host.store.claim()
    rec.record_start([int(r.table().slots[0])] * 20, host.clock())
    host.clock.advance(1.5)  # due: same table, new loads
    got = r.route(keys)
    load = r.loads().signal("in-flight")
    np.testing.assert_array_equal(
        got, route_ring_set(rs, keys, host.clock(), loads=load, balance_factor=1.25)
    )
    assert not (got == 0).any()
    rec.release()


def test_skipper_mode_with_every_established_pod_ejected_routes_to_the_new_ones(host, kernel):
    t0 = host.clock()
    rs = lbcore.RingSet(endpoints(4), duration_ns=D_NS).scale_up(endpoints(3, net=1), t0)
    ej = np.array([True] * 4 + [False] * 3)
    host.publish(rs, ejected=ej, knobs=shm.Knobs(fade_mode="skipper", balance_factor=None))
    r = host.router()
    host.clock.now = t0 + D_NS // 2  # new pods score 0.18: most thresholds are above
    idx = r.route([f"SKU-{i}" for i in range(500)])
    assert (idx >= 4).all(), np.unique(idx)


def test_answers_change_only_when_a_bar_decision_does(host):
    """Load moving on the same table while every endpoint stays on its side of the bar
    changes no answer; an endpoint going over it does (each refresh is a new plan)."""
    rs = lbcore.RingSet(endpoints(10))
    host.publish(rs, knobs=shm.Knobs(load_signal="in-flight"))
    r = host.router(refresh_s=0.1)
    keys = [f"SKU-{i}" for i in range(3000)]
    rec = host.store.claim()
    slots = [int(s) for s in r.table().slots]
    rec.record_start([slots[0]] * 30 + [slots[1]] * 2, host.clock())
    host.clock.advance(0.2)
    first = r.route(keys)
    assert not (first == 0).any()  # endpoint 0 is over the bar
    rec.record_start([slots[1]], host.clock())  # 3 in flight on 1: still under the bar
    host.clock.advance(0.2)
    got = r.route(keys)
    assert r.loads().in_flight[1] == 3
    np.testing.assert_array_equal(got, first)
    load = r.loads().signal("in-flight")
    np.testing.assert_array_equal(
        got, route_ring_set(rs, keys, host.clock(), loads=load, balance_factor=1.25, max_hops=10)
    )
    rec.record_start([slots[1]] * 40, host.clock())  # now 1 is over the bar too
    host.clock.advance(0.2)
    got = r.route(keys)
    assert not np.isin(got, [0, 1]).any()
    rec.release()
