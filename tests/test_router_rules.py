"""Router.route on real shared memory follows lbcore's rules: the plain ring, bounded load on
each signal, both fade-in modes, the gate, ejection, fallbacks, retries and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore import route_ring_set
from lbcore.draws import unit_interval
from lbcore.fade import skipper_fadein_route
from tests import router_harness as harness
from tests.router_harness import D_NS, KEYS, ZERO_STATS, endpoints, followed, knobs, load_up
from workers.routing.router import SKIPPER_SALT, Router, RouterInputError

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


# ------------------------------------------------------------------------------------
# Parity with lbcore.


def test_plain_ring_parity_with_lbcore(host, kernel):
    rs = lbcore.RingSet(endpoints(20))
    host.publish(rs, knobs=knobs(balance_factor=None))
    r = host.router()
    idx, table = r.route_table(KEYS)
    assert r.snapshot().plan.kernel == kernel  # (the parity tests run on both kernels)
    assert idx.dtype == np.int32
    assert table.generation == 1
    np.testing.assert_array_equal(idx, lbcore.Ring(endpoints(20)).lookup(KEYS))
    # Tiny batches take the same answer as the big one.
    for i in (0, 17, 3999):
        assert r.route([KEYS[i]])[0] == idx[i]
    assert r.endpoints_of(idx[:3], table) == [table.endpoints[i] for i in idx[:3]]
    assert r.stats() == {"decisions": 4003, "fallbacks": 0, "moves": 0, "failures": 0}


@pytest.mark.parametrize("signal_name", ["in-flight", "occupancy", "effective"])
def test_bounded_load_parity_with_lbcore_and_moves(host, signal_name, kernel):
    eps = endpoints(12)
    rs = lbcore.RingSet(eps)
    k = knobs(balance_factor=1.25, max_hops=3, load_signal=signal_name)
    host.publish(rs, knobs=k)
    r = host.router(refresh_s=0.5)
    table = r.table()
    rec = load_up(host, table, {0: 9, 1: 5, 4: 2})
    host.clock.advance(2.0)  # occupancy builds up; the router's snapshot is due again
    idx = r.route(KEYS)
    snap_loads = r.loads()
    assert snap_loads.in_flight.tolist()[:2] == [9, 5]
    load = snap_loads.signal(signal_name)
    expect = route_ring_set(rs, KEYS, host.clock(), loads=load, balance_factor=1.25, max_hops=3)
    np.testing.assert_array_equal(idx, expect)
    plain = route_ring_set(rs, KEYS, host.clock())
    moved = int((idx != plain).sum())
    assert moved > 100  # endpoint 0 is far over the bar
    assert not (idx == 0).any()
    st = r.stats()
    assert st["moves"] == moved and st["decisions"] == len(KEYS)
    assert host.store.reader().stats() == {
        **ZERO_STATS,
        "decisions": len(KEYS),
        "fallbacks": 0,
        "moves": moved,
    }
    rec.release()


def test_occupancy_bar_binds_at_balance_factor_times_the_mean(host):
    """Occupancy counts the routed call as its latency's share of the window, not 1.0.

    Ten pods with occupancy 0.15, 0.125 and eight at 0.1 (50 ms calls, 10 s window): the
    mean is 0.1075 and the bar 1.25 x (0.005 + 1.075) / 10 = 0.135, so the 0.15 pod
    (1.4x the mean) is over it and the 0.125 pod (1.16x) is not. With Skipper's 1.0 the
    bar would be 1.25 x 2.075 / 10 = 0.259 (2.4x the mean): nobody over, nothing moved.
    """
    eps = endpoints(10)
    rs = lbcore.RingSet(eps)
    host.publish(rs, knobs=knobs(balance_factor=1.25, max_hops=None, load_signal="occupancy"))
    r = host.router(refresh_s=0.5)
    table = r.table()
    rec = host.store.claim()
    calls = np.repeat(np.asarray(table.slots, dtype=np.int64), [30, 25] + [20] * 8)
    start = host.clock() - 3_000_000_000
    rec.record_start(calls, start)
    rec.record_end(calls, start, np.full(calls.size, 50_000_000, np.int64), start + 50_000_000)
    host.clock.advance(1.0)  # the router's snapshot is due again: it sees these loads
    idx = r.route(KEYS)
    loads = r.loads()
    occ = loads.occupancy
    np.testing.assert_allclose(occ, [0.15, 0.125] + [0.1] * 8, rtol=1e-9)
    assert loads.global_latency_s == pytest.approx(0.05)
    inc = loads.bar_increment("occupancy")
    assert inc == pytest.approx(0.05 / 10.0)
    everyone = np.ones(occ.size, dtype=np.bool_)
    bar = lbcore.bounded.target_load(occ, everyone, 1.25, increment=inc)
    assert bar == pytest.approx(1.25 * (0.005 + 1.075) / 10)
    assert bar / occ.mean() == pytest.approx(1.25 * (1 + inc / occ.sum()))  # ~1.256 x mean
    assert occ[1] < bar < occ[0]
    assert lbcore.bounded.target_load(occ, everyone, 1.25) > 2.4 * occ.mean()  # Skipper's
    # Every key of the hot pod moved; the 1.16x pod keeps all of its own keys.
    plain = route_ring_set(rs, KEYS, host.clock())
    assert not (idx == 0).any()
    assert (idx[plain == 1] == 1).all()
    moved = int((idx != plain).sum())
    assert moved == int((plain == 0).sum()) > 200
    assert r.stats()["moves"] == moved
    # The same walk by lbcore on the occupancy in routed-call units.
    expect = route_ring_set(
        rs, KEYS, host.clock(), loads=lbcore.bounded.in_call_units(occ, inc), balance_factor=1.25
    )
    np.testing.assert_array_equal(idx, expect)
    rec.release()


def test_occupancy_bar_follows_a_latency_change_at_equal_occupancy(host):
    """The same occupancy from shorter calls lowers the bar (a routed call adds less):
    the plan of the first snapshot must not be kept for the second."""
    eps = endpoints(4)
    rs = lbcore.RingSet(eps)
    host.publish(rs, knobs=knobs(balance_factor=1.25, max_hops=None, load_signal="occupancy"))
    r = host.router(refresh_s=0.5, background=False)
    table = r.table()
    rec = host.store.claim()
    slots = np.asarray(table.slots, dtype=np.int64)

    def busy(calls: list[int], seconds: float) -> None:
        c = np.repeat(slots, calls)
        start = host.clock() - 3_000_000_000
        d = int(seconds * 1e9)
        rec.record_start(c, start)
        rec.record_end(c, start, np.full(c.size, d, np.int64), start + d)

    plain = route_ring_set(rs, KEYS, host.clock())
    busy([3, 2, 2, 2], 1.0)  # occupancy 0.3, 0.2, 0.2, 0.2 from 1-s calls
    host.clock.advance(1.0)
    first = r.route(KEYS)
    occ1 = r.loads().occupancy
    # bar 1.25 x (0.1 + 0.9) / 4 = 0.3125: nobody over it
    np.testing.assert_array_equal(first, plain)
    host.clock.advance(12.0)  # those calls leave the 10-s window
    busy([30, 20, 20, 20], 0.1)  # the same occupancy from 0.1-s calls
    host.clock.advance(1.0)
    second = r.route(KEYS)
    loads = r.loads()
    np.testing.assert_array_equal(loads.occupancy, occ1)
    # bar 1.25 x (0.01 + 0.9) / 4 = 0.284: endpoint 0 (0.3) is over it now
    assert loads.bar_increment("occupancy") == pytest.approx(0.01)
    assert not (second == 0).any()
    expect = route_ring_set(
        rs,
        KEYS,
        host.clock(),
        loads=lbcore.bounded.in_call_units(loads.occupancy, 0.01),
        balance_factor=1.25,
    )
    np.testing.assert_array_equal(second, expect)
    rec.release()


@pytest.mark.parametrize("signal_name", ["in-flight", "effective"])
def test_count_signals_route_on_the_very_signal_array(host, signal_name):
    """In-flight and effective loads keep Skipper's 1.0: the router's vector is the
    signal itself, bit for bit, even with completions in the window."""
    eps = endpoints(8)
    rs = lbcore.RingSet(eps)
    host.publish(rs, knobs=knobs(balance_factor=1.1, load_signal=signal_name))
    r = host.router(refresh_s=0.5)
    table = r.table()
    rec = load_up(host, table, {0: 4, 3: 2})
    done = np.asarray(table.slots, dtype=np.int64)[[1, 2, 2]]
    start = host.clock() - 1_000_000_000
    rec.record_start(done, start)
    rec.record_end(done, start, np.full(3, 30_000_000, np.int64), start + 30_000_000)
    host.clock.advance(1.0)
    r.route(KEYS[:10])
    loads = r.loads()
    assert loads.bar_increment(signal_name) == 1.0
    assert loads.bar_increment("occupancy") == pytest.approx(0.003)
    with pytest.raises(shm.CounterInputError, match="unknown load signal"):
        loads.bar_increment("queue-length")
    snap = r.snapshot()
    assert snap is not None and snap.loads is loads
    assert snap.plan.loads.tobytes() == loads.signal(signal_name).tobytes()
    rec.release()


def test_moves_count_only_keys_the_gate_lets_through(host, kernel):
    rs = lbcore.RingSet(endpoints(8))
    host.publish(rs, knobs=knobs(percentage=50.0, load_signal="in-flight", max_hops=None))
    r = host.router()
    rec = load_up(host, r.table(), {0: 8, 5: 8})
    host.clock.advance(1.0)
    idx = r.route(KEYS)
    gate = lbcore.Gate(True, 50.0).mask(lbcore.hash_keys(KEYS))
    plain = route_ring_set(rs, KEYS, 0)
    assert (idx[~gate] == -1).all()
    moved = int(((idx != plain) & gate).sum())
    assert (
        0
        < moved
        < int(
            (
                route_ring_set(
                    rs, KEYS, 0, loads=r.loads().signal("in-flight"), balance_factor=1.25
                )
                != plain
            ).sum()
        )
    )
    assert host.store.reader().stats() == {
        **ZERO_STATS,
        "decisions": len(KEYS),
        "fallbacks": int((~gate).sum()),
        "moves": moved,
    }
    rec.release()


def test_nring_fade_in_shares_over_time_follow_lbcore(host, clock, kernel):
    old, new = endpoints(10), endpoints(5, net=1)
    t0 = clock()
    rs = lbcore.RingSet(old, duration_ns=D_NS).scale_up(new, t0)
    host.publish(rs, knobs=knobs(balance_factor=None))
    r = host.router()
    new_idx = set(range(10, 15))
    shares = []
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        clock.now = t0 + int(frac * D_NS)
        idx = r.route(KEYS)
        np.testing.assert_array_equal(idx, route_ring_set(rs, KEYS, clock.now))
        shares.append(float(np.isin(idx, list(new_idx)).mean()))
    assert shares[0] == 0.0
    assert shares == sorted(shares) and shares[2] > 0.0
    # Fully faded in: exactly the ring of all 15 endpoints.
    np.testing.assert_array_equal(idx, lbcore.Ring(old + new).lookup(KEYS))
    assert 0.25 < shares[-1] < 0.42  # a third of the endpoints


def test_fade_mode_off_routes_on_the_newest_ring(host, clock, kernel):
    old, new = endpoints(6), endpoints(3, net=1)
    rs = lbcore.RingSet(old, duration_ns=D_NS).scale_up(new, clock())
    host.publish(rs, knobs=knobs(balance_factor=None, fade_mode="off"))
    r = host.router()
    np.testing.assert_array_equal(r.route(KEYS), lbcore.Ring(old + new).lookup(KEYS))


@pytest.mark.parametrize("bf", [None, 1.25])
def test_skipper_fade_mode_matches_lbcore_skipper_route(host, clock, bf, kernel):
    old, new = endpoints(8), endpoints(4, net=1)
    t0 = clock()
    rs = lbcore.RingSet(old, duration_ns=D_NS).scale_up(new, t0)
    host.publish(rs, knobs=knobs(balance_factor=bf, fade_mode="skipper", load_signal="in-flight"))
    r = host.router()
    rec = load_up(host, r.table(), {0: 7, 9: 5, 3: 2})
    clock.now = t0 + D_NS // 2
    idx = r.route(KEYS)
    h = lbcore.hash_keys(KEYS)
    ages = [None] * 8 + [clock.now - t0] * 4
    kw = {} if bf is None else {"loads": r.loads().signal("in-flight"), "balance_factor": bf}
    expect = skipper_fadein_route(
        rs.newest, KEYS, ages, D_NS, rs.exponent, unit_interval(h, SKIPPER_SALT), max_hops=10, **kw
    )
    np.testing.assert_array_equal(idx, expect)
    share_new = float((idx >= 8).mean())
    assert 0.0 < share_new < 1 / 3  # fading in: below the new pods' full third
    if bf is not None:
        assert r.stats()["moves"] > 0 and not (idx == 0).any()
    rec.release()


# ------------------------------------------------------------------------------------
# Gate, ejected endpoints, retries, fallbacks.


@pytest.mark.parametrize("background", [None, True])
def test_gate_kill_switch_and_percentage(host, background, kernel):
    eps = endpoints(10)
    rs = lbcore.RingSet(eps)
    host.publish(rs, knobs=knobs(percentage=30.0, balance_factor=None))
    r = host.router(background=background)
    idx = r.route(KEYS)
    expect = lbcore.Gate(True, 30.0).apply(route_ring_set(rs, KEYS, 0), lbcore.hash_keys(KEYS))
    np.testing.assert_array_equal(idx, expect)
    assert 0.25 < float((idx >= 0).mean()) < 0.35
    assert r.stats()["fallbacks"] == int((idx < 0).sum())
    host.publish(rs, knobs=knobs(enabled=False))
    if background is None:  # a small table: followed by the very next batch
        assert r.route_table(KEYS)[1].generation == 2
    else:  # mapped in the background: the old gate until then
        idx, t = r.route_table(KEYS)
        if t.generation == 1:
            np.testing.assert_array_equal(idx, expect)
    assert (followed(r, 2)[0] == -1).all()
    host.publish(rs, knobs=knobs(percentage=0.0))
    assert (followed(r, 3, KEYS[:3])[0] == -1).all()


@pytest.mark.parametrize("bf", [None, 1.1])
def test_ejected_endpoints_are_never_chosen(host, bf, kernel):
    eps = endpoints(10)
    rs = lbcore.RingSet(eps)
    ejected = np.zeros(10, dtype=bool)
    ejected[[1, 4, 7]] = True
    host.publish(rs, ejected=ejected, knobs=knobs(balance_factor=bf, load_signal="in-flight"))
    r = host.router()
    rec = load_up(host, r.table(), {0: 6, 2: 3})
    host.clock.advance(1.0)
    for attempt in (0, 1):
        idx = r.route(KEYS, attempt=attempt)
        assert (idx >= 0).all()
        assert not np.isin(idx, [1, 4, 7]).any()
        kw = {} if bf is None else {"loads": r.loads().signal("in-flight"), "balance_factor": bf}
        expect = route_ring_set(rs, KEYS, host.clock(), candidates=~ejected, attempt=attempt, **kw)
        np.testing.assert_array_equal(idx, expect)
    rec.release()


def test_ejected_never_chosen_in_skipper_mode(host, clock, kernel):
    rs = lbcore.RingSet(endpoints(6), duration_ns=D_NS).scale_up(endpoints(3, net=1), clock())
    ejected = np.zeros(9, dtype=bool)
    ejected[[0, 7]] = True
    host.publish(rs, ejected=ejected, knobs=knobs(fade_mode="skipper"))
    r = host.router()
    clock.advance(10)
    for attempt in (0, 1):
        idx = r.route(KEYS, attempt=attempt)
        assert (idx >= 0).all() and not np.isin(idx, [0, 7]).any()


def test_all_ejected_empty_and_missing_tables_give_fallback(host, namespace):
    r = host.router()
    assert (r.route(KEYS[:5]) == -1).all()  # nothing published yet: generation 0
    assert r.table().generation == 0
    rs = lbcore.RingSet(endpoints(4))
    host.publish(rs, ejected=np.ones(4, dtype=bool))
    for bf in (None, 1.25):
        host.publish(rs, ejected=np.ones(4, dtype=bool), knobs=knobs(balance_factor=bf))
        assert (r.route(KEYS) == -1).all()
        assert (r.route(KEYS, attempt=1) == -1).all()
    host.publish(lbcore.RingSet(()))
    idx, t = r.route_table(KEYS[:7])
    assert (idx == -1).all() and len(t.endpoints) == 0
    assert r.endpoints_of(idx, t) == [None] * 7
    # A namespace without any segments: fallback, never an exception.
    lonely = Router(f"{namespace}-none")
    try:
        assert (lonely.route(KEYS[:3]) == -1).all()
        assert lonely.row is None
        with lonely.track(np.array([-1, -1])) as t:
            t.fail(0)
    finally:
        lonely.close()


@pytest.mark.parametrize("bf", [None, 1.25])
def test_retry_attempt_differs_from_first_attempt(host, bf, kernel):
    rs = lbcore.RingSet(endpoints(8))
    host.publish(rs, knobs=knobs(balance_factor=bf, load_signal="in-flight"))
    r = host.router()
    rec = load_up(host, r.table(), {3: 4})
    host.clock.advance(1.0)
    first = r.route(KEYS)
    retry = r.route(KEYS, attempt=1)
    assert (retry >= 0).all() and (first >= 0).all()
    assert (retry != first).all()
    np.testing.assert_array_equal(r.route(KEYS, attempt=1), retry)  # deterministic
    rec.release()


def test_bad_input_raises_lbcore_errors_and_counts_nothing(host):
    host.publish(lbcore.RingSet(endpoints(3)))
    r = host.router()
    with pytest.raises(lbcore.KeyTypeError):
        r.route(["ok", 1.5])
    with pytest.raises(lbcore.KeyTypeError):
        r.route(np.array([1.0, 2.0]))
    with pytest.raises(lbcore.KeyTooLongError, match="4096"):
        r.route(["x" * 4097])
    with pytest.raises(lbcore.ArgumentError):
        r.route(["a"], attempt=-1)
    assert r.stats()["decisions"] == 0
    assert r.route(["y" * 4096, "", " \n", "ünï"]).shape == (4,)
    assert r.route([123])[0] == r.route(["123"])[0]
    table = r.table()
    with pytest.raises(RouterInputError, match=r"-1\.\.2"):
        r.endpoints_of([0, 3], table)
    with pytest.raises(RouterInputError, match="integer"):
        r.track(np.array([0.5]))
    with pytest.raises(RouterInputError, match="2 keys for 1 calls"):
        r.track([0], table, keys=["a", "b"])
    with pytest.raises(RouterInputError):
        Router(host.ns, refresh_s=-1)


@pytest.mark.parametrize("ejected", [False, True])
def test_small_batches_agree_with_lbcore_on_the_whole_batch(host, clock, ejected, kernel):
    eps = endpoints(30)
    t0 = clock()
    rs = lbcore.RingSet(eps[:25], duration_ns=D_NS).scale_up(eps[25:], t0)
    ej = np.zeros(30, dtype=bool)
    if ejected:
        ej[[2, 26]] = True
    host.publish(rs, ejected=ej, knobs=knobs(load_signal="in-flight", max_hops=4))
    r = host.router(refresh_s=5.0)
    rec = load_up(host, r.table(), {0: 9, 1: 7, 3: 5, 27: 6})
    clock.advance(D_NS / 2e9)  # the snapshot is due again: it sees the load
    keys = KEYS[:800]
    got = np.concatenate([r.route(keys[i : i + 10]) for i in range(0, len(keys), 10)])
    load = r.loads().signal("in-flight")
    cand = ~ej if ejected else None
    expect = route_ring_set(
        rs, keys, clock(), loads=load, balance_factor=1.25, max_hops=4, candidates=cand
    )
    np.testing.assert_array_equal(got, expect)
    plain = route_ring_set(rs, keys, clock(), candidates=cand)
    assert r.stats()["moves"] == int((got != plain).sum()) > 0
    rec.release()
