"""workers.Router following new tables off the routing thread: a new generation is
mapped (and its endpoints' hosts parsed, when routing on it needs them) by shm's
background reader while batches keep routing on what they had (real shared memory,
real threads and fork)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import lbcore
from lbcore.route import route_ring_set
from shm.seams import set_seam_hook
from tests import router_harness as harness
from tests.background_harness import held_background_map, run_forked
from tests.router_harness import KEYS, endpoints, followed, knobs
from workers.routing.router import Router

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


@pytest.fixture
def held_map():
    """Holds shm's background mapping thread at its first seam until the event is set."""
    with held_background_map() as gate:
        yield gate


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
        np.testing.assert_array_equal(idx, route_ring_set(rs1, KEYS, 0))
        assert r.endpoints_of(idx[:3]) == [rs1.endpoints[i] for i in idx[:3]]
    held_map.set()
    idx, t = followed(r, 2)
    assert t.endpoints == rs2.endpoints
    np.testing.assert_array_equal(idx, route_ring_set(rs2, KEYS, 0))
    assert r.tables.mapped_in_background == 1


def test_small_tables_are_followed_at_once_larger_ones_in_the_background(host, held_map):
    r = None
    for g, n in enumerate((3, 5, 8, 4), start=1):
        rs = lbcore.RingSet(endpoints(n, net=g))
        host.publish(rs, knobs=knobs(balance_factor=None))
        if r is None:
            r = host.router()  # background=None: by the size of the work
        idx, t = r.route_table(KEYS)  # the very next batch is on the new generation
        assert t.generation == g
        np.testing.assert_array_equal(idx, route_ring_set(rs, KEYS, 0))
    assert r.tables.mapped_in_background == 0
    big = lbcore.RingSet(endpoints(120, net=9))  # 12,000 nodes, bucket tables: > 2 MiB
    host.publish(big, knobs=knobs(balance_factor=None))
    assert r.route_table(KEYS)[1].generation == 4  # held in the background map
    held_map.set()
    idx, t = followed(r, 5)
    np.testing.assert_array_equal(idx, route_ring_set(big, KEYS, 0))
    assert r.tables.mapped_in_background == 1


def test_hosts_of_a_large_table_with_ejections_are_parsed_off_the_routing_thread(host, monkeypatch):
    """Ejected endpoints are skipped by host (Skipper's rule), so the first plan on such
    a table needs every endpoint's host: for a large table the map thread parses them
    (~0.1 s at 20,000 endpoints), never the batch that first routes on it."""
    import shm.tables.codec

    parsed: list[str] = []
    real = shm.tables.codec.host_key

    def host_key(ep: str) -> str:
        parsed.append(threading.current_thread().name)
        return real(ep)

    monkeypatch.setattr(shm.tables.codec, "host_key", host_key)
    rs1 = lbcore.RingSet(endpoints(6))
    host.publish(rs1, knobs=knobs(balance_factor=None))
    r = host.router(background=True)
    assert r.route_table(KEYS)[1].generation == 1
    parsed.clear()  # the first table is decoded (hosts and all) by the first call
    big = lbcore.RingSet(endpoints(150, net=4))
    ejected = np.zeros(150, dtype=bool)
    ejected[[3, 77]] = True
    host.publish(big, ejected=ejected, knobs=knobs(balance_factor=None))
    idx, _ = followed(r, 2)
    assert not np.isin(idx, [3, 77]).any()
    np.testing.assert_array_equal(idx, route_ring_set(big, KEYS, 0, candidates=~ejected))
    assert len(parsed) == 150 and set(parsed) == {"cslb-table-map"}


def _child(ns: str, conn) -> None:
    try:
        set_seam_hook(None)  # the parent's hook came along; its gate is the parent's
        r = Router(ns, background=True)  # the child's own router, after the fork
        idx, t = followed(r, 2, KEYS[:200])
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
    assert got == (2, route_ring_set(rs2, KEYS[:200], 0).tolist())
    assert followed(r, 2)[1].generation == 2


def test_routers_dropped_without_close_leave_no_threads(host):
    import gc

    host.publish(lbcore.RingSet(endpoints(4)), knobs=knobs(balance_factor=None))
    gc.collect()
    before = threading.active_count()
    for _ in range(5):
        r = Router(host.ns, background=True)
        assert r.route_table(KEYS[:10])[1].generation == 1
        r.recorder.release()  # its counter row (close() would; this router is only dropped)
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
        _wait(lambda: "cslb-table-map" in reads and r.tables.mapped_ahead() == 3)
        idx, t = r.route_table(KEYS)  # the first request after idling: no map, no wait
        assert t.generation == 3
        np.testing.assert_array_equal(idx, route_ring_set(rs3, KEYS, 0))
        assert "MainThread" not in reads
    finally:
        set_seam_hook(None)
