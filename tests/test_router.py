"""workers.Router on real shared memory: a TableWriter and a CounterStore in the test
process (the discovery process and the gunicorn master's part), routers reading them."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import lbcore
import shm
from lbcore import route_ring_set
from lbcore.draws import unit_interval
from lbcore.fade import skipper_fadein_route
from tests.shm_names import Namespaces
from workers.fanout.failurelog import LINES_PER_S
from workers.routing import router as router_mod
from workers.routing.router import SKIPPER_SALT, Router, RouterInputError, RouterStateError

D_NS = 30_000_000_000
KEYS = [f"SKU-{i:06d}" for i in range(4000)]
_NAMES = Namespaces("r")

ZERO_STATS = dict.fromkeys(shm.layout.STATS_FIELDS, 0)


@pytest.fixture
def namespace():
    with _NAMES.one() as ns:
        yield ns


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers():
    yield
    _NAMES.sweep()


class Clock:
    """An injectable CLOCK_MONOTONIC (ns) that only moves when told."""

    def __init__(self) -> None:
        import time

        self.now = time.monotonic_ns()

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


class Host:
    """The host's shared state: counters (master) and a table writer (discovery)."""

    def __init__(self, namespace: str, clock: Clock, rows: int = 8) -> None:
        self.ns = namespace
        self.clock = clock
        self.store = shm.CounterStore.create(namespace, rows=rows, clock=clock)
        self.writer = shm.TableWriter(namespace, counters=self.store, clock=clock)
        self.routers: list[Router] = []

    def publish(self, rs: lbcore.RingSet, **kw) -> int:
        n = len(rs.endpoints)
        kw.setdefault("nodes", [f"node-{i}" for i in range(n)])
        kw.setdefault("zones", [f"zone-{i % 3}" for i in range(n)])
        return self.writer.publish(rs, **kw)

    def router(self, **kw) -> Router:
        kw.setdefault("clock", self.clock)
        r = Router(self.ns, **kw)
        self.routers.append(r)
        return r

    def loads(self) -> shm.HostLoads:
        return self.store.reader().read(self.clock())

    def close(self) -> None:
        for r in self.routers:
            r.close()
        self.writer.close()
        self.store.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def host(namespace, clock):
    h = Host(namespace, clock)
    yield h
    h.close()


def endpoints(n: int, net: int = 0) -> list[str]:
    return [f"http://10.{net}.0.{i + 1}:8080" for i in range(n)]


def knobs(**kw) -> shm.Knobs:
    return shm.Knobs(**kw)


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


def _followed(r: Router, generation: int, keys=KEYS, timeout_s: float = 10.0):
    """``r.route_table(keys)`` once ``r`` routes on ``generation`` (waiting at most
    ``timeout_s``: a router maps a new generation in the background unless it is small).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        idx, t = r.route_table(keys)
        assert t.valid()
        if t.generation >= generation:
            return idx, t
        assert time.monotonic() < deadline, (
            f"still on generation {t.generation} after {timeout_s} s"
        )
        time.sleep(0.002)


def _load_up(host: Host, table: shm.Table, per_endpoint: dict[int, int]) -> shm.Recorder:
    """Open calls on some endpoints from another worker's row (host-wide in-flight)."""
    rec = host.store.claim()
    slots = [int(table.slots[e]) for e, c in per_endpoint.items() for _ in range(c)]
    rec.record_start(slots, host.clock())
    return rec


@pytest.mark.parametrize("signal_name", ["in-flight", "occupancy", "effective"])
def test_bounded_load_parity_with_lbcore_and_moves(host, signal_name, kernel):
    eps = endpoints(12)
    rs = lbcore.RingSet(eps)
    k = knobs(balance_factor=1.25, max_hops=3, load_signal=signal_name)
    host.publish(rs, knobs=k)
    r = host.router(refresh_s=0.5)
    table = r.table()
    rec = _load_up(host, table, {0: 9, 1: 5, 4: 2})
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
    rec = _load_up(host, table, {0: 4, 3: 2})
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
    rec = _load_up(host, r.table(), {0: 8, 5: 8})
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
    rec = _load_up(host, r.table(), {0: 7, 9: 5, 3: 2})
    clock.now = t0 + D_NS // 2
    idx = r.route(KEYS)
    h = lbcore.hash_keys(KEYS)
    ages = [None] * 8 + [clock.now - t0] * 4
    kw = {} if bf is None else {"loads": r.loads().signal("in-flight"), "balance_factor": bf}
    expect = skipper_fadein_route(
        rs.master, KEYS, ages, D_NS, rs.exponent, unit_interval(h, SKIPPER_SALT), max_hops=10, **kw
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
    assert (_followed(r, 2)[0] == -1).all()
    host.publish(rs, knobs=knobs(percentage=0.0))
    assert (_followed(r, 3, KEYS[:3])[0] == -1).all()


@pytest.mark.parametrize("bf", [None, 1.1])
def test_ejected_endpoints_are_never_chosen(host, bf, kernel):
    eps = endpoints(10)
    rs = lbcore.RingSet(eps)
    ejected = np.zeros(10, dtype=bool)
    ejected[[1, 4, 7]] = True
    host.publish(rs, ejected=ejected, knobs=knobs(balance_factor=bf, load_signal="in-flight"))
    r = host.router()
    rec = _load_up(host, r.table(), {0: 6, 2: 3})
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
    rec = _load_up(host, r.table(), {3: 4})
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


# ------------------------------------------------------------------------------------
# Generations and the load snapshot cadence.


@pytest.mark.parametrize("background", [None, True])
def test_new_generation_is_followed_and_refreshes_loads_at_once(host, background):
    host.publish(lbcore.RingSet(endpoints(5)), knobs=knobs(load_signal="in-flight"))
    r = host.router(refresh_s=60.0, background=background)
    idx1, t1 = r.route_table(KEYS)
    rec = _load_up(host, t1, {2: 3})
    assert r.loads().in_flight.sum() == 0  # cached snapshot, not due for a minute
    eps2 = endpoints(7, net=2)
    rs2 = lbcore.RingSet(eps2)
    host.publish(rs2, knobs=knobs(balance_factor=None))
    if background is None:  # a small table: followed by the very next batch
        assert r.table().generation == 2
    idx2, t2 = _followed(r, 2)
    assert t2.generation == 2 and t2.endpoints == tuple(eps2)
    np.testing.assert_array_equal(idx2, route_ring_set(rs2, KEYS, 0))
    assert r.endpoints_of(idx1[:2], t1) != r.endpoints_of(idx2[:2], t2)
    # The new generation's endpoints got new counter slots: still idle.
    assert r.loads().in_flight.sum() == 0
    host.publish(lbcore.RingSet(endpoints(5)), knobs=knobs(load_signal="in-flight"))
    _followed(r, 3)
    assert r.loads().in_flight.tolist() == [0, 0, 3, 0, 0]  # endpoint kept its slot
    rec.release()


def test_load_snapshot_refreshes_on_its_cadence(host, clock):
    host.publish(lbcore.RingSet(endpoints(4)), knobs=knobs(load_signal="in-flight"))
    r = host.router(refresh_s=0.5)
    t = r.table()
    first = r.loads()
    assert first.in_flight.sum() == 0
    rec = _load_up(host, t, {1: 2})
    clock.advance(0.49)
    assert r.loads() is first  # still within the cadence
    clock.advance(0.02)
    fresh = r.loads()
    assert fresh is not first and fresh.in_flight.tolist() == [0, 2, 0, 0]
    assert fresh.now_ns == clock()
    rec.release()
    r0 = host.router(refresh_s=0.0)  # every batch
    r0.route(KEYS[:1])
    a = r0.loads()
    assert r0.loads() is not a


# ------------------------------------------------------------------------------------
# Recording.


def test_track_records_in_flight_and_occupancy_host_wide(host, clock):
    host.publish(lbcore.RingSet(endpoints(6)))
    r = host.router()
    idx, table = r.route_table(KEYS[:50])
    idx[[3, 9]] = -1  # two keys went to fallback
    with r.track(idx, table, keys=KEYS[:50]):
        during = host.loads().take(table.slots)
        assert during.in_flight.sum() == 48
        np.testing.assert_array_equal(during.in_flight, np.bincount(idx[idx >= 0], minlength=6))
        clock.advance(2.0)
    after = host.loads().take(table.slots)
    assert after.in_flight.sum() == 0
    # 48 calls x 2 s over a 10 s window = 9.6 busy-seconds per second, host-wide.
    assert after.occupancy.sum() == pytest.approx(48 * 2.0 / 10.0)
    assert after.completed.sum() == 48


def test_track_done_and_exception_still_records_the_end(host, clock):
    host.publish(lbcore.RingSet(endpoints(3)))
    r = host.router()
    idx, table = r.route_table(["a", "b"])
    with pytest.raises(RuntimeError), r.track(idx, table) as t:
        clock.advance(1.0)
        t.done(0)
        clock.advance(1.0)
        raise RuntimeError("the fan-out blew up")
    loads = host.loads().take(table.slots)
    assert loads.in_flight.sum() == 0 and loads.completed.sum() == 2
    assert loads.occupancy.sum() == pytest.approx((1.0 + 2.0) / 10.0)
    with pytest.raises(RouterStateError):
        t.fail(0)  # the tracker is finished


def test_a_tracked_fan_out_writes_the_summary_of_failures_left_out(host, clock, caplog):
    """Failures past the per-endpoint rate are counted; the exit of a later fan-out
    (no failures of its own) writes their summary once their second is over."""
    host.publish(lbcore.RingSet(endpoints(1)))
    r = host.router()
    keys = [f"SKU-{i}" for i in range(10)]
    idx, table = r.route_table(keys)

    def summaries():
        got = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "cslb.router"]
        return [x["suppressed"] for x in got if x["event"] == "cslb_call_failures_suppressed"]

    with caplog.at_level(logging.WARNING, logger="cslb.router"):
        with r.track(idx, table, keys=keys) as t:
            for i in range(10):
                t.fail(i)
        assert summaries() == []  # (its second is not over)
        clock.advance(1.5)
        idx, table = r.route_table(keys)
        with r.track(idx, table, keys=keys):
            pass
        assert summaries() == [10 - LINES_PER_S]


def test_fail_logs_one_structured_line_and_counts(host, caplog):
    eps = endpoints(4)
    host.publish(lbcore.RingSet(eps), nodes=["n-a", "n-b", "n-c", "n-d"], zones=["z1"] * 4)
    r = host.router()
    keys = ["SKU-1", b"SKU-\xff", 77]
    idx, table = r.route_table(keys, attempt=1)
    with (
        caplog.at_level(logging.WARNING, logger="cslb.router"),
        r.track(idx, table, keys=keys, attempt=1) as t,
    ):
        t.fail(1)
        t.fail(1)  # once per call
        t.fail(2)
    lines = [rec for rec in caplog.records if rec.name == "cslb.router"]
    assert len(lines) == 2
    first = json.loads(lines[0].getMessage())
    e = int(idx[1])
    assert first == {
        "event": "cslb_call_failed",
        "product_id": "SKU-\\xff",
        "endpoint": eps[e],
        "pod_ip": f"10.0.0.{e + 1}",
        "node": "n-abcd"[0] + "-" + "abcd"[e],
        "zone": "z1",
        "attempt": 1,
        "generation": 1,
        "call": 1,
        "pid": os.getpid(),
    }
    assert lines[0].cslb["product_id"] == "SKU-\\xff"
    assert json.loads(lines[1].getMessage())["product_id"] == "77"
    assert "\n" not in lines[0].getMessage()
    assert r.stats()["failures"] == 2
    loads = host.loads().take(table.slots)
    assert loads.completed.sum() == 3
    failed_eps = {int(idx[1]), int(idx[2])}
    got = {i for i, fr in enumerate(loads.failure_rate.tolist()) if fr > 0}
    assert got == failed_eps
    assert loads.requests_total.sum() == 3
    assert loads.failures_total.sum() == 2
    assert {i for i, f in enumerate(loads.failures_total.tolist()) if f} == failed_eps


def test_gthread_threads_record_concurrently_with_exact_totals(host):
    host.publish(lbcore.RingSet(endpoints(8)))
    r = host.router(threads=True)
    calls_per_thread, threads = 300, 6
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(calls_per_thread):
                idx, table = r.route_table([f"k{t}-{i}-{j}" for j in range(3)])
                with r.track(idx, table) as tr:
                    if i % 10 == 0:
                        tr.fail(0)
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join(timeout=60)
    assert not errors
    loads = host.loads()
    assert loads.in_flight.sum() == 0
    assert loads.completed.sum() == threads * calls_per_thread * 3
    assert loads.requests_total.sum() == threads * calls_per_thread * 3
    assert loads.failures_total.sum() == threads * calls_per_thread // 10
    st = r.stats()
    assert st["decisions"] == threads * calls_per_thread * 3
    assert st["failures"] == threads * calls_per_thread // 10
    assert host.store.reader().stats()["decisions"] == st["decisions"]


# ------------------------------------------------------------------------------------
# Lifecycle: attach, fork, reserved rows, replaced counters.


def test_attach_is_one_per_process_and_reads_the_environment(host, monkeypatch):
    host.publish(lbcore.RingSet(endpoints(3)))
    monkeypatch.setenv("CSLB_SHM_NAMESPACE", host.ns)
    monkeypatch.setenv("CSLB_LOAD_REFRESH", "0.25")
    assert Router.current() is None
    r = Router.attach()
    try:
        assert Router.current() is r and Router.attach() is r
        assert r.namespace == host.ns and r.refresh_ns == 250_000_000
        assert r.row is not None and not r.adopted
        with pytest.raises(RouterStateError, match="close it"):
            Router.attach(f"{host.ns}-other")
    finally:
        r.close()
    assert Router.current() is None
    with pytest.raises(RouterStateError, match="closed"):
        r.route(["a"])
    monkeypatch.setenv("CSLB_COUNTER_ROW", "x")
    with pytest.raises(RouterInputError, match="CSLB_COUNTER_ROW"):
        Router.attach(host.ns)
    monkeypatch.setenv("CSLB_COUNTER_ROW", "")
    monkeypatch.setenv("CSLB_LOAD_REFRESH", "soon")
    with pytest.raises(lbcore.knobs.KnobError, match="CSLB_LOAD_REFRESH"):
        Router.attach(host.ns)


def _child_checks(ns: str, parent_router: Router, conn) -> None:
    try:
        out = {"current": Router.current() is None}
        try:
            parent_router.route(["a"])
            out["parent_usable"] = True
        except RouterStateError:
            out["parent_usable"] = False
        own = Router.attach(ns)
        out["own_row"] = own.row
        out["route"] = own.route(KEYS[:20]).tolist()
        own.close()
        conn.send(out)
    except BaseException as exc:
        conn.send({"error": repr(exc)})
    finally:
        conn.close()
        os._exit(0)


def test_forked_child_does_not_reuse_the_parents_router(host, namespace):
    host.publish(lbcore.RingSet(endpoints(5)))
    parent = Router.attach(namespace)
    try:
        ctx = multiprocessing.get_context("fork")
        a, b = ctx.Pipe()
        p = ctx.Process(target=_child_checks, args=(namespace, parent, b), daemon=True)
        p.start()
        try:
            assert a.poll(30), "the child did not answer"
            got = a.recv()
        finally:
            p.join(10)
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        assert "error" not in got, got
        assert got["current"] is True and got["parent_usable"] is False
        assert got["own_row"] is not None and got["own_row"] != parent.row
        assert got["route"] == parent.route(KEYS[:20]).tolist()
        assert Router.current() is parent
    finally:
        parent.close()


def test_forked_worker_adopts_the_row_its_master_reserved(host, namespace):
    host.publish(lbcore.RingSet(endpoints(5)))
    row = host.store.reserve()
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()

    def child(conn) -> None:
        try:
            os.environ["CSLB_COUNTER_ROW"] = str(row)
            r = Router.attach(namespace)
            conn.send((r.row, r.adopted))
            r.close()
        finally:
            conn.close()
            os._exit(0)

    p = ctx.Process(target=child, args=(b,), daemon=True)
    p.start()
    try:
        assert a.poll(30)
        assert a.recv() == (row, True)
    finally:
        p.join(10)
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)


def test_reclaims_a_row_after_the_counters_were_replaced(host, namespace, clock):
    host.publish(lbcore.RingSet(endpoints(4)))
    r = host.router()
    first_row = r.row
    assert first_row is not None
    idx, table = r.route_table(KEYS[:10])
    host.writer.close(unlink=False)
    host.store.close()  # the owner removes the counters ...
    host.store = shm.CounterStore.create(namespace, rows=8, clock=clock)  # ... and restarts
    host.writer = shm.TableWriter(namespace, counters=host.store, clock=clock)
    host.writer.publish(lbcore.RingSet(endpoints(4)))
    clock.advance(0.5)
    r.route(KEYS[:1])
    assert r.reattached == 0  # polled about once a second, not per batch
    clock.advance(0.6)
    idx, table = r.route_table(KEYS[:10])
    assert r.reattached == 1
    mine = [s for s in host.store.slots() if s.claimed and s.pid == os.getpid()]
    assert [s.row for s in mine] == [r.row]
    with r.track(idx, table):
        assert host.loads().in_flight.sum() == 10  # recorded into the new counters
    assert host.loads().in_flight.sum() == 0


def test_close_releases_the_row(host):
    host.publish(lbcore.RingSet(endpoints(3)))
    r = host.router()
    row = r.row
    assert host.store.slots()[row].claimed
    r.close()
    r.close()
    assert not host.store.slots()[row].claimed


def test_module_declares_its_knob():
    assert router_mod.LOAD_REFRESH.env == "CSLB_LOAD_REFRESH"
    assert router_mod.LOAD_REFRESH.convert("0.2s", "test") == pytest.approx(0.2)


def test_a_row_not_reserved_for_us_falls_back_to_a_free_row(host, monkeypatch):
    host.publish(lbcore.RingSet(endpoints(3)))
    other = host.store.claim()  # row held by this process, not reserved
    monkeypatch.setenv("CSLB_COUNTER_ROW", str(other.row))
    r = Router.attach(host.ns)
    try:
        assert r.row is not None and r.row != other.row and not r.adopted
    finally:
        r.close()
        other.release()


def _variant(g: int) -> lbcore.RingSet:
    v = g % 3
    return lbcore.RingSet(endpoints(3 + 3 * v, net=v), vnodes=20)


def _churn(ns: str, publishes: int) -> None:
    import time

    writer = shm.TableWriter(ns)
    deadline = time.monotonic() + 10
    for _ in range(publishes):
        writer.publish(_variant(writer.generation + 1), knobs=shm.Knobs(balance_factor=None))
        # A new table every 2 ms (a real writer publishes at most once per debounce):
        # back to back, each publish can spoil a slow reader's read on a loaded machine,
        # and the reader keeps the last good table throughout (seen in CI: 7 of 400).
        time.sleep(0.002)
        if time.monotonic() > deadline:
            break
    writer.close(unlink=False)
    os._exit(0)


def test_routes_are_consistent_while_a_writer_process_republishes(host, namespace):
    keys = KEYS[:64]
    expected = {v: route_ring_set(_variant(v), keys, 0) for v in range(3)}
    host.writer.publish(_variant(1), knobs=shm.Knobs(balance_factor=None))
    host.writer.close(unlink=False)
    r = host.router()
    # The first table is read before the churn starts: with nothing to fall back on, a
    # reader that cannot get a consistent read within its limit routes everything to
    # fallback (measured on a loaded host). From then on it keeps the last good table.
    idx, t = r.route_table(keys)
    assert t.generation == 1
    np.testing.assert_array_equal(idx, expected[1])
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_churn, args=(namespace, 400), daemon=True)
    p.start()
    seen = set()
    try:
        for _ in range(20_000):
            idx, t = r.route_table(keys)
            assert t.generation >= 1
            np.testing.assert_array_equal(idx, expected[t.generation % 3])
            assert len(t.endpoints) == 3 + 3 * (t.generation % 3)
            seen.add(t.generation)
            if p.exitcode is not None:
                break
    finally:
        p.join(15)
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)
    assert len(seen) > 10  # the router followed the churn
    host.writer = shm.TableWriter(namespace, counters=host.store, clock=host.clock)


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
    rec = _load_up(host, r.table(), {0: 9, 1: 7, 3: 5, 27: 6})
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


def test_tables_and_counters_created_after_attach_are_picked_up(namespace, clock):
    r = Router(namespace, clock=clock)  # a worker that started before discovery
    try:
        assert r.row is None and (r.route(KEYS[:4]) == -1).all()
        h = Host(namespace, clock)
        try:
            rs = lbcore.RingSet(endpoints(5))
            h.publish(rs, knobs=knobs(balance_factor=None))
            assert (r.route(KEYS[:4]) == -1).all()  # checked about once a second
            clock.advance(1.01)
            np.testing.assert_array_equal(r.route(KEYS), route_ring_set(rs, KEYS, 0))
            assert r.row is not None
            idx, t = r.route_table(KEYS[:6])
            with r.track(idx, t):
                assert h.loads().in_flight.sum() == 6
        finally:
            r.close()
            h.close()
    finally:
        r.close()


def test_tracking_on_a_table_rewritten_since_records_nothing(host, caplog):
    rs = lbcore.RingSet(endpoints(4))
    host.publish(rs)
    r = host.router()
    idx1, t1 = r.route_table(KEYS[:8])
    host.publish(lbcore.RingSet(endpoints(6)))
    host.publish(lbcore.RingSet(endpoints(7)))  # reuses t1's buffer
    r.route(KEYS[:1])
    assert not t1.valid()
    with caplog.at_level(logging.WARNING, logger="cslb.router"), r.track(idx1, t1):
        assert host.loads().in_flight.sum() == 0
    assert "not recorded" in caplog.text
    idx, t = r.route_table(KEYS[:8])
    with r.track(idx, t):  # the current generation records as usual
        assert host.loads().in_flight.sum() == 8


def test_no_free_counter_row_still_routes(namespace, clock, caplog):
    h = Host(namespace, clock, rows=1)
    taken = h.store.claim()
    try:
        h.publish(lbcore.RingSet(endpoints(3)), knobs=knobs(balance_factor=None))
        with caplog.at_level(logging.WARNING, logger="cslb.router"):
            r = h.router()
            assert r.row is None
            clock.advance(1.1)
            np.testing.assert_array_equal(r.route(KEYS), lbcore.Ring(endpoints(3)).lookup(KEYS))
        assert caplog.text.count("no counter row") == 1
        assert r.stats()["decisions"] == len(KEYS)
    finally:
        taken.release()
        h.close()


def test_track_maps_the_routers_own_arrays_and_still_checks_them(host, clock):
    """track() maps int32/int64 arrays with one bounds-checked take on the snapshot:
    fallbacks set by the caller after routing are left out, bad indices are refused
    (nothing recorded), and every dtype records the same counts."""
    host.publish(lbcore.RingSet(endpoints(5)))
    r = host.router()
    idx, table = r.route_table(KEYS[:40])
    want = np.bincount(idx, minlength=5)
    for arr in (idx, idx.astype(np.int64), idx.astype(np.int16), idx.tolist()):
        with r.track(arr, table):
            during = host.loads().take(table.slots)
            assert during.in_flight.tolist() == want.tolist()
        assert host.loads().take(table.slots).in_flight.sum() == 0
    idx[[0, 5, 6]] = -1  # the caller sent these through the ingress after all
    with r.track(idx, table):
        during = host.loads().take(table.slots).in_flight
        assert during.tolist() == np.bincount(idx[idx >= 0], minlength=5).tolist()
    before = host.loads().take(table.slots).requests_total.copy()
    for bad in (5, -2, np.iinfo(np.int32).max, np.iinfo(np.int32).min):
        wrong = idx.copy()
        wrong[7] = bad
        with pytest.raises(RouterInputError, match=r"-1\.\.4"):
            r.track(wrong, table)
        with pytest.raises(RouterInputError, match=r"-1\.\.4"):
            r.track(wrong.astype(np.int64), table)
    with pytest.raises(RouterInputError, match="integer"):
        r.track(idx.reshape(5, 8), table)
    assert host.loads().take(table.slots).in_flight.sum() == 0
    assert host.loads().take(table.slots).requests_total.tolist() == before.tolist()
    with r.track(np.empty(0, np.int32), table):
        pass
    assert r.stats()["failures"] == 0


def test_track_refuses_its_own_batch_changed_to_bad_indices(host, clock):
    """The router's own array is mapped by the kernel on enter: changed since routing to
    indices outside the table, the block is refused (nothing recorded); fallbacks set
    since are left out, and done()/fail() still name the right calls."""
    host.publish(lbcore.RingSet(endpoints(5)))
    r = host.router()
    before = host.loads().take(r.table().slots).requests_total.copy()
    for bad in (5, -2, np.iinfo(np.int32).max):
        idx, table = r.route_table(KEYS[:40])
        idx[7] = bad
        tr = r.track(idx, table)
        with pytest.raises(RouterInputError, match=r"-1\.\.4"):
            tr.__enter__()
        assert host.loads().take(table.slots).in_flight.sum() == 0
    assert host.loads().take(table.slots).requests_total.tolist() == before.tolist()
    idx, table = r.route_table(KEYS[:40])
    idx[[0, 5]] = -1
    with r.track(idx, table) as tr:
        during = host.loads().take(table.slots).in_flight
        assert during.tolist() == np.bincount(idx[idx >= 0], minlength=5).tolist()
        tr.fail(6)
        tr.done(8)
    after = host.loads().take(table.slots)
    assert after.in_flight.sum() == 0
    assert after.requests_total.sum() - before.sum() == 38
    assert after.failures_total[int(idx[6])] == 1
    assert r.stats()["failures"] == 1
