"""Reviewer's randomized parity checks: Router.route against an independent lbcore composition."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore.draws import unit_interval
from lbcore.fade import fadein_scores
from lbcore.route import route_ring_set
from tests.test_router import Clock, Host, _no_leftovers, endpoints, namespace  # noqa: F401
from workers import router as workers_router
from workers.router import SKIPPER_SALT

D_NS = 30_000_000_000
FAR = (1 << 62) - 1


def _expected(rs, h, now, mode, load, bf, hops, cand, attempt):
    """(answer, plain) per key by lbcore alone; plain = same walk without bounded load."""
    if not rs.rings:
        m = np.full(h.size, -1, np.int32)
        return m, m
    if mode == "skipper":
        ring = rs.master
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
def test_random_parity_with_lbcore(namespace, seed, kernel):  # noqa: F811
    rng = np.random.default_rng(seed)
    clock = Clock()
    host = Host(namespace, clock)
    try:
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
        big = r.route(keys, attempt=attempt)  # maybe on answer tables by now
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
    finally:
        host.close()


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


def _host(namespace, **kw):  # noqa: F811
    return Host(namespace, Clock(), **kw)


def test_fail_and_done_on_a_replaced_table_do_not_raise(namespace, caplog):  # noqa: F811
    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_a_load_change_on_the_same_table_is_routed_on(namespace):  # noqa: F811
    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_fail_logs_the_product_id_of_the_failed_call_after_fallbacks(namespace, caplog):  # noqa: F811
    import json
    import logging

    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_a_row_not_reserved_for_us_still_gets_a_row(namespace, monkeypatch):  # noqa: F811
    host = _host(namespace)
    try:
        host.publish(lbcore.RingSet(endpoints(3)))
        other = host.store.claim()
        monkeypatch.setenv("CSLB_COUNTER_ROW", str(other.row))
        r = host.router(row=other.row)
        assert r.row is not None and r.row != other.row and not r.adopted
        other.release()
    finally:
        host.close()


def test_skipper_mode_with_every_established_pod_ejected_routes_to_the_new_ones(namespace, kernel):  # noqa: F811
    host = _host(namespace)
    try:
        t0 = host.clock()
        rs = lbcore.RingSet(endpoints(4), duration_ns=D_NS).scale_up(endpoints(3, net=1), t0)
        ej = np.array([True] * 4 + [False] * 3)
        host.publish(rs, ejected=ej, knobs=shm.Knobs(fade_mode="skipper", balance_factor=None))
        r = host.router()
        host.clock.now = t0 + D_NS // 2  # new pods score 0.18: most thresholds are above
        idx = r.route([f"SKU-{i}" for i in range(500)])
        assert (idx >= 4).all(), np.unique(idx)
    finally:
        host.close()


# ------------------------------------------------------------------------------------
# The review's findings, one test each (each fails without its fix).


def test_done_after_the_table_was_replaced_keeps_its_own_end_time(namespace, caplog):  # noqa: F811
    """Blocker 1: done(i)/fail(i) on an unrecordable fan-out are bookkept, not IndexError."""
    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_route_then_map_and_track_without_table_survive_a_publish(namespace, caplog):  # noqa: F811
    """Finding 2: the issue's usage (no table, no keys) maps onto the generation routed on."""
    import json
    import logging

    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_last_routed_is_per_thread(namespace):  # noqa: F811
    import threading

    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_tracker_copies_the_indices(namespace, caplog):  # noqa: F811
    """Nit: mutating the caller's array inside the block does not change fail(i)."""
    import json
    import logging

    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_unsigned_indices_beyond_the_table_are_rejected(namespace):  # noqa: F811
    host = _host(namespace)
    try:
        host.publish(lbcore.RingSet(endpoints(3)))
        r = host.router()
        t = r.table()
        for bad in (np.array([2**64 - 1], np.uint64), np.array([3], np.uint8)):
            with pytest.raises(workers_router.RouterInputError, match=r"-1\.\.2"):
                r.endpoints_of(bad, t)
        assert r.endpoints_of(np.array([2], np.uint64), t) == [t.endpoints[2]]
    finally:
        host.close()


def test_a_refused_row_is_asked_for_once(namespace, caplog):  # noqa: F811
    """Nit: while no row is free, the refusal of the env row is not logged every second."""
    import logging

    clock = Clock()
    host = Host(namespace, clock, rows=1)
    try:
        host.publish(lbcore.RingSet(endpoints(3)))
        other = host.store.claim()
        with caplog.at_level(logging.WARNING, logger="cslb.router"):
            r = host.router(row=other.row)
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
        host.close()


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
def test_a_corrupt_generation_is_read_once_per_recheck_and_logged_once(namespace, caplog, how):  # noqa: F811
    """Finding 3: no 1 s stall, no WARNING per call, no re-read of a known-bad generation."""
    import logging

    from shm.segment import set_seam_hook

    host = _host(namespace)
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
        host.close()


def test_a_corrupt_new_generation_keeps_the_last_good_one(namespace, caplog):  # noqa: F811
    import logging

    host = _host(namespace)
    try:
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
    finally:
        host.close()


@pytest.mark.parametrize("kind", ["tables", "counters"])
def test_foreign_segments_at_attach_warn_once_missing_ones_do_not(namespace, caplog, kind):  # noqa: F811
    """Finding 4: a segment that is not ours is a WARNING (once); a missing one is DEBUG."""
    import logging
    import os

    from shm.segment import SHM_DIR

    clock = Clock()
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


# ------------------------------------------------------------------------------------
# Finding 8: the gaps mutations survived.


def test_threads_share_the_row_through_a_locked_recorder(namespace):  # noqa: F811
    host = _host(namespace)
    try:
        host.publish(lbcore.RingSet(endpoints(3)))
        assert isinstance(host.router(threads=True).recorder, shm.LockedRecorder)
        assert isinstance(host.router().recorder, shm.LockedRecorder)  # the default: gthread-safe
        assert not isinstance(host.router(threads=False).recorder, shm.LockedRecorder)
    finally:
        host.close()


def test_a_refresh_torn_by_the_writer_is_retried_on_the_new_generation(namespace, monkeypatch):  # noqa: F811
    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_tracking_on_a_rewritten_table_with_slots_in_range_records_nothing(namespace):  # noqa: F811
    """The valid() check, not the slot range check, must stop recording on a reused buffer."""
    host = _host(namespace)
    try:
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
    finally:
        host.close()


def test_answers_change_only_when_a_bar_decision_does(namespace):  # noqa: F811
    """Load moving on the same table while every endpoint stays on its side of the bar
    changes no answer; an endpoint going over it does (each refresh is a new plan)."""
    host = _host(namespace)
    try:
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
            got,
            route_ring_set(rs, keys, host.clock(), loads=load, balance_factor=1.25, max_hops=10),
        )
        rec.record_start([slots[1]] * 40, host.clock())  # now 1 is over the bar too
        host.clock.advance(0.2)
        got = r.route(keys)
        assert not np.isin(got, [0, 1]).any()
        rec.release()
    finally:
        host.close()
