"""The router's process and counter row: one router per process (attach, fork, a row the master
reserved, a row reclaimed, refused or shared by threads) and the indices it tracks (per
thread, copied, checked), with the product ID in failure lines."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import threading

import numpy as np
import pytest

import lbcore
import shm
from tests import router_harness as harness
from tests.router_harness import KEYS, Host, endpoints, knobs
from workers.routing import router as router_mod
from workers.routing import router as workers_router
from workers.routing.router import Router, RouterInputError, RouterStateError

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


def test_fail_logs_the_product_id_of_the_failed_call_after_fallbacks(host, caplog):
    import logging

    host.publish(lbcore.RingSet(endpoints(4)))
    r = host.router()
    keys = ["p0", "p1", "p2", "p3"]
    idx, table = r.route_table(keys)
    idx[[0, 1]] = -1  # the first two went through the ingress
    with (
        caplog.at_level(logging.WARNING, logger="cslb.router"),
        r.track(idx, table, keys=keys) as t,
    ):
        t.fail(3)
    (line,) = [json.loads(m) for m in caplog.messages if "cslb_call_failed" in m]
    assert line["product_id"] == "p3" and line["call"] == 3


def test_a_row_not_reserved_for_us_still_gets_a_row(host, monkeypatch):
    host.publish(lbcore.RingSet(endpoints(3)))
    other = host.store.claim()
    monkeypatch.setenv("CSLB_COUNTER_ROW", str(other.row))
    r = host.router(row=other.row)
    assert r.row is not None and r.row != other.row and not r.adopted
    other.release()


def test_last_routed_is_per_thread(host):

    eps = endpoints(5)
    host.publish(lbcore.RingSet(eps), knobs=shm.Knobs(balance_factor=None))
    r = host.router()
    idx = r.route(["k1", "k2"])
    # A newer table lists other endpoints: only the thread that routed idx maps it
    # on its table; another thread's last call is not this one (the current table).
    newer = [f"http://10.9.9.{i}:80" for i in range(5)]
    host.publish(lbcore.RingSet(newer), knobs=shm.Knobs(balance_factor=None))
    r.refresh()
    assert r.table().endpoints == tuple(newer)
    got: list = []
    th = threading.Thread(target=lambda: got.append(r.endpoints_of(idx)))
    th.start()
    th.join(10)
    assert got == [[newer[i] for i in idx]]
    assert r.endpoints_of(idx) == [eps[i] for i in idx]
    assert r.endpoints_of(idx[1:]) == [eps[idx[1]]]  # a view of it too


def test_tracker_copies_the_indices(host, caplog):
    """Nit: mutating the caller's array inside the block does not change fail(i)."""
    import logging

    eps = endpoints(4)
    host.publish(lbcore.RingSet(eps))
    r = host.router()
    keys = ["p0", "p1"]
    idx, table = r.route_table(keys)
    want = eps[int(idx[1])]
    with (
        caplog.at_level(logging.WARNING, logger="cslb.router"),
        r.track(idx, table, keys=keys) as t,
    ):
        idx[:] = (idx + 1) % 4
        t.fail(1)
    (line,) = [json.loads(m) for m in caplog.messages if "cslb_call_failed" in m]
    assert line["endpoint"] == want


def test_unsigned_indices_beyond_the_table_are_rejected(host):
    host.publish(lbcore.RingSet(endpoints(3)))
    r = host.router()
    t = r.table()
    for bad in (np.array([2**64 - 1], np.uint64), np.array([3], np.uint8)):
        with pytest.raises(workers_router.RouterInputError, match=r"-1\.\.2"):
            r.endpoints_of(bad, t)
    assert r.endpoints_of(np.array([2], np.uint64), t) == [t.endpoints[2]]


def test_a_refused_row_is_asked_for_once(namespace, clock, caplog):
    """Nit: while no row is free, the refusal of the env row is not logged every second."""
    import logging

    one_row = Host(namespace, clock, rows=1)
    try:
        one_row.publish(lbcore.RingSet(endpoints(3)))
        other = one_row.store.claim()
        with caplog.at_level(logging.WARNING, logger="cslb.router"):
            r = one_row.router(row=other.row)
            for _ in range(4):
                clock.advance(1.1)
                r.route(["a"])
            assert r.row is None
            other.release()
            clock.advance(1.1)
            r.route(["a"])
        assert caplog.text.count("counter row 0 is not reserved") == 1
        assert caplog.text.count("no counter row") == 1
        assert r.row == other.row and not r.adopted
    finally:
        one_row.close()


def test_threads_share_the_row_through_a_locked_recorder(host):
    host.publish(lbcore.RingSet(endpoints(3)))
    assert isinstance(host.router(threads=True).recorder, shm.LockedRecorder)
    assert isinstance(host.router().recorder, shm.LockedRecorder)  # the default: gthread-safe
    assert not isinstance(host.router(threads=False).recorder, shm.LockedRecorder)


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
