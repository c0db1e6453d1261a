"""workers.Router following new tables off the routing thread: a new generation is
mapped by shm's background reader and answer tables are built in a thread, while
batches keep routing on what they had (real shared memory, real threads and fork)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import lbcore
from shm.segment import set_seam_hook
from tests import test_router as base
from tests.background_harness import held_background_map, run_forked
from tests.test_router import D_NS, KEYS, _followed, _load_up, endpoints, knobs
from workers import router as router_mod
from workers.router import Router

# The router tests' fixtures: a namespace cleaned up afterwards, its counters and writer.
namespace = base.namespace
clock = base.clock
host = base.host
_no_leftovers = base._no_leftovers


@pytest.fixture
def held_map():
    """Holds shm's background mapping thread at its first seam until the event is set."""
    with held_background_map() as gate:
        yield gate


@pytest.fixture
def held_build(monkeypatch):
    """Holds every background answer-table build (the real one) until the event is set."""
    gate = threading.Event()
    started = threading.Event()
    build = router_mod._Snapshot._build

    def held(snap):
        if threading.current_thread().name == "cslb-answer-build":
            started.set()
            assert gate.wait(10), "answer build held too long"
        return build(snap)

    monkeypatch.setattr(router_mod._Snapshot, "_build", held)
    try:
        yield gate, started
    finally:
        gate.set()


def _wait(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def test_batches_route_on_the_previous_generation_while_the_new_one_is_mapped(host, held_map):
    rs1 = lbcore.RingSet(endpoints(6))
    host.publish(rs1, knobs=knobs(balance_factor=None))
    r = host.router(background=True)
    idx, t = r.route_table(KEYS)
    assert t.generation == 1  # the first table is mapped at once: nothing to route on before
    rs2 = lbcore.RingSet(endpoints(9, net=1))
    host.publish(rs2, knobs=knobs(balance_factor=None))
    for _ in range(20):  # the map is held: every batch is generation 1, and right for it
        idx, t = r.route_table(KEYS)
        assert t.generation == 1 and t.valid()
        np.testing.assert_array_equal(idx, rs1.route(KEYS, 0))
        assert r.endpoints_of(idx[:3]) == [rs1.endpoints[i] for i in idx[:3]]
    held_map.set()
    idx, t = _followed(r, 2)
    assert t.endpoints == rs2.endpoints
    np.testing.assert_array_equal(idx, rs2.route(KEYS, 0))
    assert r._reader.mapped_in_background == 1


def test_small_tables_are_followed_at_once_larger_ones_in_the_background(host, held_map):
    r = None
    for g, n in enumerate((3, 5, 8, 4), start=1):
        rs = lbcore.RingSet(endpoints(n, net=g))
        host.publish(rs, knobs=knobs(balance_factor=None))
        if r is None:
            r = host.router()  # background=None: by the size of the work
        idx, t = r.route_table(KEYS)  # the very next batch is on the new generation
        assert t.generation == g
        np.testing.assert_array_equal(idx, rs.route(KEYS, 0))
    assert r._reader.mapped_in_background == 0
    big = lbcore.RingSet(endpoints(120, net=9))  # 12,000 nodes, bucket tables: > 2 MiB
    host.publish(big, knobs=knobs(balance_factor=None))
    assert r.route_table(KEYS)[1].generation == 4  # held in the background map
    held_map.set()
    idx, t = _followed(r, 5)
    np.testing.assert_array_equal(idx, big.route(KEYS, 0))
    assert r._reader.mapped_in_background == 1


def test_answer_tables_are_built_in_the_background_stale_ones_serve_meanwhile(
    host, clock, held_build
):
    gate, started = held_build
    eps = endpoints(30)
    rs = lbcore.RingSet(eps[:25], duration_ns=D_NS).scale_up(eps[25:], clock())
    bf, hops = 1.25, 4
    host.publish(rs, knobs=knobs(load_signal="in-flight", balance_factor=bf, max_hops=hops))
    r = host.router(refresh_s=5.0, background=True)
    t = r.table()
    rec = _load_up(host, t, {0: 9, 1: 7, 3: 5, 27: 6})
    clock.advance(D_NS / 2e9)  # due: the next snapshot sees the load (mid-fade)
    keys = KEYS[:800]

    def routed() -> np.ndarray:
        return np.concatenate([r.route(keys[i : i + 10]) for i in range(0, len(keys), 10)])

    def expect(load: np.ndarray) -> np.ndarray:
        return rs.route(keys, clock(), loads=load, balance_factor=bf, max_hops=hops)

    load1 = r.loads().signal("in-flight")
    got = routed()  # builds pay on the way: one starts, held; keys are walked meanwhile
    assert started.wait(10) and r._snap._answer is None
    np.testing.assert_array_equal(got, expect(load1))
    gate.set()
    _wait(lambda: r._snap._answer is not None)
    np.testing.assert_array_equal(routed(), expect(load1))  # now on the answer tables
    snap1 = r._snap

    # New loads, other bar decisions: the build is held again, and the first snapshot's
    # tables serve until it is done (bounded load one refresh behind).
    gate.clear()
    started.clear()
    rec2 = _load_up(host, t, {5: 8, 6: 8, 28: 9})
    clock.advance(5.0)
    load2 = r.loads().signal("in-flight")
    assert not np.array_equal(load1, load2) and r._snap is not snap1
    got = routed()
    assert started.wait(10) and r._snap._answer is None and r._snap.stale is snap1._answer
    np.testing.assert_array_equal(got, expect(load1))
    assert not np.array_equal(expect(load1), expect(load2))
    gate.set()
    _wait(lambda: r._snap._answer is not None)
    np.testing.assert_array_equal(routed(), expect(load2))
    assert r._snap.stale is None  # dropped once its own are built
    rec.release()
    rec2.release()


def test_a_failed_background_build_is_reported_once_and_keys_are_walked(
    host, clock, monkeypatch, caplog
):
    eps = endpoints(30)
    rs = lbcore.RingSet(eps)
    host.publish(rs, knobs=knobs(load_signal="in-flight", balance_factor=1.25))
    r = host.router(refresh_s=5.0, background=True)
    rec = _load_up(host, r.table(), {0: 9, 1: 7})
    clock.advance(5.0)
    calls = []

    def broken(snap):
        calls.append(threading.current_thread().name)
        raise MemoryError("no room for answer tables")

    monkeypatch.setattr(router_mod._Snapshot, "_build", broken)
    keys = KEYS[:1000]
    load = r.loads().signal("in-flight")
    with caplog.at_level("WARNING", logger="cslb.router"):
        for _ in range(3):
            got = np.concatenate([r.route(keys[i : i + 10]) for i in range(0, len(keys), 10)])
            np.testing.assert_array_equal(got, rs.route(keys, 0, loads=load, balance_factor=1.25))
            _wait(lambda: r._building is None or r._building[0].done())
    assert calls == ["cslb-answer-build"]  # not retried on every batch
    said = [m for m in caplog.messages if "answer tables of generation 1" in m]
    assert len(said) == 1 and "no room for answer tables" in said[0]
    rec.release()


def _child(ns: str, conn) -> None:
    try:
        set_seam_hook(None)  # the parent's hook came along; its gate is the parent's
        r = Router(ns, background=True)  # the child's own router, after the fork
        idx, t = _followed(r, 2, KEYS[:200])
        conn.send((t.generation, idx.tolist()))
        r.close()
    except BaseException as exc:  # reported to the parent
        conn.send(repr(exc))


def test_a_child_forked_during_a_background_map_attaches_and_follows_on_its_own(
    host, namespace, held_map
):
    rs1 = lbcore.RingSet(endpoints(6))
    host.publish(rs1, knobs=knobs(balance_factor=None))
    r = host.router(background=True)
    assert r.route_table(KEYS)[1].generation == 1
    rs2 = lbcore.RingSet(endpoints(9, net=1))
    host.publish(rs2, knobs=knobs(balance_factor=None))
    assert r.route_table(KEYS)[1].generation == 1  # its map thread is held now

    def release() -> None:
        # The parent's held thread does not exist in the child: the child maps its own
        # (its seam hook is the inherited one, whose gate the parent opens here).
        time.sleep(0.05)
        held_map.set()

    got, _ = run_forked(_child, namespace, while_running=release)
    assert got == (2, rs2.route(KEYS[:200], 0).tolist())
    assert _followed(r, 2)[1].generation == 2


def test_routers_dropped_without_close_leave_no_threads(host):
    import gc

    host.publish(lbcore.RingSet(endpoints(4)), knobs=knobs(balance_factor=None))
    gc.collect()
    before = threading.active_count()
    for _ in range(5):
        r = Router(host.ns, background=True)
        assert r.route_table(KEYS[:10])[1].generation == 1
        r._rec.release()  # its counter row (close() would; this router is only dropped)
        del r
    gc.collect()
    _wait(lambda: threading.active_count() == before)


def test_an_idle_worker_finds_new_generations_mapped_when_a_request_comes(host):
    reads: list[str] = []

    def hook(point: str) -> None:
        if point == "tables.read.mapped":
            reads.append(threading.current_thread().name)

    rs1 = lbcore.RingSet(endpoints(6))
    host.publish(rs1, knobs=knobs(balance_factor=None))
    r = host.router(background=True)
    assert r.route_table(KEYS)[1].generation == 1
    set_seam_hook(hook)
    try:
        rs3 = lbcore.RingSet(endpoints(8, net=3))
        host.publish(lbcore.RingSet(endpoints(7, net=2)), knobs=knobs(balance_factor=None))
        host.publish(rs3, knobs=knobs(balance_factor=None))  # generation 1's buffer reused
        # No request meanwhile: the router's map thread looks ahead on its own.
        _wait(lambda: "cslb-table-map" in reads and r._reader._bg[0].done())
        _wait(lambda: r._reader._bg[0].result[1].generation == 3)
        idx, t = r.route_table(KEYS)  # the first request after idling: no map, no wait
        assert t.generation == 3
        np.testing.assert_array_equal(idx, rs3.route(KEYS, 0))
        assert "MainThread" not in reads
    finally:
        set_seam_hook(None)
