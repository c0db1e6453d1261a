"""The router while tables change under it: new generations followed, load snapshots on their
cadence, republishes by another process, replaced and corrupt generations, torn refreshes,
foreign segments, tables created after attach."""

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
from tests import router_harness as harness
from tests.router_harness import KEYS, Host, endpoints, followed, knobs, load_up
from workers.routing import router as workers_router
from workers.routing.router import Router

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


def test_gthread_refresh_and_republish_under_threads(namespace):
    """Threads route + track with the real clock, refreshing every batch, while tables churn."""
    import time

    store = shm.CounterStore.create(namespace, rows=8)
    writer = shm.TableWriter(namespace, counters=store)
    variants = [lbcore.RingSet(endpoints(4 + v, net=v)) for v in range(3)]
    writer.publish(variants[0], knobs=shm.Knobs(load_signal="in-flight"))
    r = workers_router.Router(namespace, threads=True, refresh_s=0.0)
    errors: list[BaseException] = []
    stop = threading.Event()
    per_thread, nthreads = 200, 4
    start = threading.Barrier(nthreads + 1)

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                keys = [f"k{t}-{i}-{j}" for j in range(5)]
                idx, table = r.route_table(keys)
                assert idx.shape == (5,) and (idx >= 0).all()
                assert set(idx.tolist()) <= set(range(len(table.endpoints)))
                with r.track(idx, table, keys=keys) as tr:
                    if i % 7 == 0:
                        tr.fail(0)
        except BaseException as exc:
            errors.append(exc)

    def churn() -> None:
        start.wait()
        g = 0
        while not stop.is_set() and g < 300:
            g += 1
            writer.publish(variants[g % 3], knobs=shm.Knobs(load_signal="in-flight"))
            time.sleep(0.002)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    pub = threading.Thread(target=churn)
    try:
        for th in [*ts, pub]:
            th.start()
        for th in ts:
            th.join(60)
        stop.set()
        pub.join(10)
        assert not errors, errors[:3]
        loads = store.reader().read(time.monotonic_ns())
        total = nthreads * per_thread * 5
        assert loads.in_flight.sum() == 0
        assert 0.5 * total <= loads.requests_total.sum() <= total
        assert store.reader().stats()["decisions"] == total
    finally:
        r.close()
        writer.close()
        store.close()


def test_fail_and_done_on_a_replaced_table_do_not_raise(host, caplog):
    host.publish(lbcore.RingSet(endpoints(4)))
    r = host.router()
    keys = ["a", "b", "c"]
    idx1, t1 = r.route_table(keys)
    host.publish(lbcore.RingSet(endpoints(6)))
    host.publish(lbcore.RingSet(endpoints(7)))  # t1's buffer is rewritten
    r.route(["x"])
    with r.track(idx1, t1, keys=keys) as t:
        t.done(0)
        t.fail(1)  # IndexError today
    assert any('"product_id": "b"' in m for m in caplog.messages)  # evidence still logged


def test_done_after_the_table_was_replaced_keeps_its_own_end_time(host, caplog):
    """Blocker 1: done(i)/fail(i) on an unrecordable fan-out are bookkept, not IndexError."""
    host.publish(lbcore.RingSet(endpoints(4)))
    r = host.router()
    idx1, t1 = r.route_table(["a", "b", "c", "d"])
    idx1[0] = -1
    host.publish(lbcore.RingSet(endpoints(6)))
    host.publish(lbcore.RingSet(endpoints(7)))
    r.route(["x"])
    with r.track(idx1, t1) as t:
        t.done(3)
        t.fail(3)
        t.fail(0)  # a fallback call: nothing
    assert r.stats()["failures"] == 1
    assert host.loads().completed.sum() == 0  # nothing recorded on a reused buffer


def test_route_then_map_and_track_without_table_survive_a_publish(host, caplog):
    """The usage (no table, no keys) maps onto the generation routed on."""
    import logging

    eps = endpoints(6)
    host.publish(lbcore.RingSet(eps), knobs=shm.Knobs(balance_factor=None))
    r = host.router()
    keys = [f"SKU-{i}" for i in range(40)]
    idx = r.route(keys)
    slots = np.asarray(r.table().slots).take(idx)
    expected = [eps[i] for i in idx.tolist()]
    # A new generation orders the endpoints differently (and has fewer of them).
    host.publish(lbcore.RingSet(eps[::-1][:3]), knobs=shm.Knobs(balance_factor=None))
    assert r.table().generation == 2
    assert r.endpoints_of(idx) == expected
    assert r.endpoints_of(idx[:5]) == expected[:5]  # a slice: same table
    with caplog.at_level(logging.WARNING, logger="cslb.router"), r.track(idx) as t:
        loads = host.store.reader().read(host.clock())
        np.testing.assert_array_equal(
            loads.in_flight[: slots.max() + 1], np.bincount(slots, minlength=slots.max() + 1)
        )
        t.fail(7)
    (line,) = [json.loads(m) for m in caplog.messages if "cslb_call_failed" in m]
    assert line["product_id"] == "SKU-7" and line["endpoint"] == expected[7]
    assert line["generation"] == 1
    # Another array (a copy) is not recognised: the current table, by the rule.
    with pytest.raises(workers_router.RouterInputError):
        r.endpoints_of(idx.copy())  # indices up to 5 on a table of 3 endpoints


def _damage_current(ns: str, how: str) -> int:
    """Damage the current generation's buffer in shared memory; returns its generation."""
    from shm.layout import BUFFER_HEADER_BYTES
    from shm.segment import Segment

    with shm.TableReader(ns) as reader:
        t = reader.table()
        seg = Segment.attach(t.segment, writable=True)
        off = t.buffer_offset
        if how == "payload":
            seg.buf[off + BUFFER_HEADER_BYTES + 200] ^= 0x40  # checksum mismatch
        else:
            seg.words[off // 8] += 1  # an odd seq that never settles
        seg.close()
        return t.generation


@pytest.mark.parametrize("how", ["payload", "seq"])
def test_a_corrupt_generation_is_read_once_per_recheck_and_logged_once(
    namespace, host, caplog, how
):
    """No 1 s stall, no WARNING per call, no re-read of a known-bad generation."""
    import logging

    from shm.seams import set_seam_hook

    reads: list[str] = []
    try:
        rs = lbcore.RingSet(endpoints(5))
        host.publish(rs)
        host.publish(rs)
        _damage_current(namespace, how)
        set_seam_hook(lambda p: reads.append(p) if p == "tables.read.mapped" else None)
        with caplog.at_level(logging.WARNING, logger="cslb.router"):
            r = host.router()
            assert r.tables.timeout_s <= 0.1  # a damaged buffer costs a worker little
            for _ in range(30):
                assert (r.route(["a", "b"]) == -1).all()
                host.clock.advance(0.01)
            first = len(reads)
            for _ in range(30):
                r.route(["a"])
                host.clock.advance(0.01)
            assert len(reads) == first  # not read again within the recheck interval
            host.clock.advance(1.0)
            r.route(["a"])
            assert len(reads) > first  # ... and read again after it
        warnings = [m for m in caplog.messages if "no usable routing table" in m]
        assert len(warnings) == 1, caplog.messages
        host.publish(rs)  # a good generation: used at once, without waiting for a recheck
        np.testing.assert_array_equal(r.route(["a", "b"]), route_ring_set(rs, ["a", "b"], 0))
    finally:
        set_seam_hook(None)


def test_a_corrupt_new_generation_keeps_the_last_good_one(namespace, host, caplog):
    import logging

    rs = lbcore.RingSet(endpoints(5))
    host.publish(rs, knobs=shm.Knobs(load_signal="in-flight"))
    r = host.router(refresh_s=0.1)
    keys = [f"K{i}" for i in range(50)]
    expect = r.route(keys)
    host.publish(lbcore.RingSet(endpoints(7)))
    _damage_current(namespace, "payload")
    rec = host.store.claim()
    rec.record_start([int(r.table().slots[2])] * 9, host.clock())
    with caplog.at_level(logging.WARNING, logger="cslb.router"):
        for _ in range(20):
            host.clock.advance(0.2)
            np.testing.assert_array_equal(r.route(keys)[expect != 2], expect[expect != 2])
    assert r.table().generation == 1
    assert r.loads().in_flight[2] == 9  # the last good table's loads still refresh
    assert sum("unusable, routing on generation 1" in m for m in caplog.messages) == 1
    rec.release()


@pytest.mark.parametrize("kind", ["tables", "counters"])
def test_foreign_segments_at_attach_warn_once_missing_ones_do_not(namespace, clock, caplog, kind):
    """A segment that is not ours is a WARNING (once); a missing one is DEBUG."""
    import logging
    import os

    from shm.names import SHM_DIR

    path = os.path.join(SHM_DIR, f"cslb.{namespace}.{kind}")
    with open(path, "wb") as f:
        f.write(b"\xfe" * (1 << 20))  # someone else's segment under our name
    try:
        with caplog.at_level(logging.DEBUG, logger="cslb.router"):
            r = workers_router.Router(namespace, clock=clock)
            for _ in range(4):
                clock.advance(1.1)
                assert (r.route(["a"]) == -1).all()
            r.close()
        # (The no-table notice, an event of its own, is tested in test_no_table_notice.py.)
        records = [rec for rec in caplog.records if not hasattr(rec.msg, "event")]
        warned = [rec for rec in records if rec.levelno == logging.WARNING and kind in rec.message]
        assert len(warned) == 1, [rec.message for rec in caplog.records]
        assert "cannot be used" in warned[0].message and "magic" in warned[0].message.lower()
        other = "counters" if kind == "tables" else "tables"
        missing = [rec for rec in records if other in rec.message]
        assert missing and all(rec.levelno == logging.DEBUG for rec in missing)
    finally:
        os.unlink(path)


def test_a_refresh_torn_by_the_writer_is_retried_on_the_new_generation(host, monkeypatch):
    host.publish(lbcore.RingSet(endpoints(4)))
    r = host.router(refresh_s=0.0)
    r.route(["warm"])
    final = lbcore.RingSet(endpoints(6, net=3))
    real = shm.CounterReader.read
    torn = []

    def read_while_the_writer_publishes(self, now, columns=None, **kw):
        if not torn:  # the writer rewrites the buffer this refresh is reading
            torn.append(host.publish(lbcore.RingSet(endpoints(5, net=2))))
            torn.append(host.publish(final))
        return real(self, now, columns=columns, **kw)

    monkeypatch.setattr(shm.CounterReader, "read", read_while_the_writer_publishes)
    keys = [f"SKU-{i}" for i in range(200)]
    host.publish(lbcore.RingSet(endpoints(4, net=1)))  # due: the next route refreshes
    idx, t = r.route_table(keys)
    assert torn == [3, 4] and t.generation == 4
    np.testing.assert_array_equal(
        idx,
        route_ring_set(
            final, keys, host.clock(), loads=np.zeros(6), balance_factor=1.25, max_hops=10
        ),
    )


def test_tracking_on_a_rewritten_table_with_slots_in_range_records_nothing(host):
    """The valid() check, not the slot range check, must stop recording on a reused buffer."""
    eps = endpoints(4)
    host.publish(lbcore.RingSet(eps))
    r = host.router()
    idx1, t1 = r.route_table([f"k{i}" for i in range(40)])
    host.publish(lbcore.RingSet(eps[::-1]))  # the same slots, in another order
    host.publish(lbcore.RingSet(eps[1:] + eps[:1]))  # rewrites t1's buffer
    r.route(["x"])
    assert not t1.valid()
    assert int(np.asarray(t1.slots).max()) < t1.n_slots  # in range: garbage that fits
    with r.track(idx1, t1):
        assert host.loads().in_flight.sum() == 0


# ------------------------------------------------------------------------------------
# Generations and the load snapshot cadence.


@pytest.mark.parametrize("background", [None, True])
def test_new_generation_is_followed_and_refreshes_loads_at_once(host, background):
    host.publish(lbcore.RingSet(endpoints(5)), knobs=knobs(load_signal="in-flight"))
    r = host.router(refresh_s=60.0, background=background)
    idx1, t1 = r.route_table(KEYS)
    rec = load_up(host, t1, {2: 3})
    assert r.loads().in_flight.sum() == 0  # cached snapshot, not due for a minute
    eps2 = endpoints(7, net=2)
    rs2 = lbcore.RingSet(eps2)
    host.publish(rs2, knobs=knobs(balance_factor=None))
    if background is None:  # a small table: followed by the very next batch
        assert r.table().generation == 2
    idx2, t2 = followed(r, 2)
    assert t2.generation == 2 and t2.endpoints == tuple(eps2)
    np.testing.assert_array_equal(idx2, route_ring_set(rs2, KEYS, 0))
    assert r.endpoints_of(idx1[:2], t1) != r.endpoints_of(idx2[:2], t2)
    # The new generation's endpoints got new counter slots: still idle.
    assert r.loads().in_flight.sum() == 0
    host.publish(lbcore.RingSet(endpoints(5)), knobs=knobs(load_signal="in-flight"))
    followed(r, 3)
    assert r.loads().in_flight.tolist() == [0, 0, 3, 0, 0]  # endpoint kept its slot
    rec.release()


def test_load_snapshot_refreshes_on_its_cadence(host, clock):
    host.publish(lbcore.RingSet(endpoints(4)), knobs=knobs(load_signal="in-flight"))
    r = host.router(refresh_s=0.5)
    t = r.table()
    first = r.loads()
    assert first.in_flight.sum() == 0
    rec = load_up(host, t, {1: 2})
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


def _variant(g: int) -> lbcore.RingSet:
    v = g % 3
    return lbcore.RingSet(endpoints(3 + 3 * v, net=v), vnodes=20)


def _churn(ns: str, publishes: int) -> None:

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
