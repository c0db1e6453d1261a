"""What Router.track records for a fan-out (in-flight, occupancy, ends, failures) and the
failure lines it writes, under threads too."""

from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np
import pytest

import lbcore
from tests import router_harness as harness
from tests.router_harness import KEYS, endpoints
from workers.fanout.failurelog import LINES_PER_S
from workers.routing.router import RouterInputError, RouterStateError

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


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
