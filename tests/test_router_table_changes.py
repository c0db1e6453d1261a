"""The router while tables change under it: republishes, replaced and corrupt generations,
torn refreshes, foreign segments."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore import route_ring_set
from tests.test_router import (  # noqa: F401
    _no_leftovers,
    clock,
    endpoints,
    host,
    namespace,
)
from workers.routing import router as workers_router


def test_gthread_refresh_and_republish_under_threads(namespace):  # noqa: F811
    """Threads route + track with the real clock, refreshing every batch, while tables churn."""
    import threading
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


def test_fail_and_done_on_a_replaced_table_do_not_raise(host, caplog):  # noqa: F811
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


def test_done_after_the_table_was_replaced_keeps_its_own_end_time(host, caplog):  # noqa: F811
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


def test_route_then_map_and_track_without_table_survive_a_publish(host, caplog):  # noqa: F811
    """The usage (no table, no keys) maps onto the generation routed on."""
    import json
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
    namespace, host, caplog, how  # noqa: F811
):
    """No 1 s stall, no WARNING per call, no re-read of a known-bad generation."""
    import logging

    from shm.segment import set_seam_hook

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


def test_a_corrupt_new_generation_keeps_the_last_good_one(namespace, host, caplog):  # noqa: F811
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
def test_foreign_segments_at_attach_warn_once_missing_ones_do_not(namespace, clock, caplog, kind):  # noqa: F811
    """A segment that is not ours is a WARNING (once); a missing one is DEBUG."""
    import logging
    import os

    from shm.segment import SHM_DIR

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
        warned = [
            rec for rec in caplog.records if rec.levelno == logging.WARNING and kind in rec.message
        ]
        assert len(warned) == 1, [rec.message for rec in caplog.records]
        assert "cannot be used" in warned[0].message and "magic" in warned[0].message.lower()
        other = "counters" if kind == "tables" else "tables"
        missing = [rec for rec in caplog.records if other in rec.message]
        assert missing and all(rec.levelno == logging.DEBUG for rec in missing)
    finally:
        os.unlink(path)


def test_a_refresh_torn_by_the_writer_is_retried_on_the_new_generation(host, monkeypatch):  # noqa: F811
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


def test_tracking_on_a_rewritten_table_with_slots_in_range_records_nothing(host):  # noqa: F811
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
