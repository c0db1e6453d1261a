"""Failure kinds in the counters: what each call's failure code adds, and what readers see."""

import time

import numpy as np
import pytest

from lbcore.outlier import (
    FAIL_CONNECT,
    FAIL_NONE,
    FAIL_OTHER,
    FAIL_STATUS,
    FAIL_TIMEOUT,
    FAILURE_KINDS,
)
from shm import CounterInputError, CounterStore, LockedRecorder, ThreadRecorder
from shm.layout import KIND_FIELDS, KIND_TOTAL_FIELDS, LAYOUT_VERSION, TOTAL_FIELDS
from tests.shm_tests.window import MS, T0, S, W, row_words


@pytest.fixture
def store_rows() -> int:
    return 6


def kinds_of(store, row):
    """(kind, bucket, slot) failures per kind of one row, and (kind, slot) totals."""
    m = store.matrix_view()
    per_bucket = np.stack([m.block(row, f) for f in KIND_FIELDS])
    return per_bucket, m.totals[row, 2:].copy()


def test_codes_and_field_names_line_up():
    assert (FAIL_NONE, FAIL_CONNECT, FAIL_TIMEOUT, FAIL_STATUS, FAIL_OTHER) == (0, 1, 2, 3, 4)
    assert FAILURE_KINDS == ("connect", "timeout", "status", "other")
    assert KIND_FIELDS == tuple(f"failures_{k}" for k in FAILURE_KINDS)
    assert TOTAL_FIELDS == ("requests_total", "failures_total", *KIND_TOTAL_FIELDS)
    assert LAYOUT_VERSION >= 5  # kinds arrived with version 5


def _random_fan_outs(rng, rounds, *, long_every=0):
    """(slots, start, durations, end, codes) fan-outs: one bucket, spanning ones, long ones."""
    now = T0
    out = []
    for r in range(rounds):
        long_ = long_every and r % long_every == 0
        n = 600 if long_ else int(rng.integers(1, 40))
        slots = rng.integers(0, 16, n).astype(np.intp)
        start = now + int(rng.integers(0, 50 * MS))
        if long_ or rng.random() < 0.4:
            d: int | np.ndarray = int(rng.integers(0, 20 * MS))  # one duration for all
        else:
            d = rng.integers(0, 700 * MS, n)  # some span buckets
        end = start + int(np.max(d)) + int(rng.integers(0, 5 * MS))
        codes = np.where(rng.random(n) < 0.3, rng.integers(1, 5, n), 0)
        out.append((slots, start, d, end, codes))
        now = end + int(rng.integers(0, 300 * MS))
    return out


@pytest.mark.parametrize("path", ["lists", "arrays"])
def test_kinds_and_booleans_record_the_same_load_and_the_kinds_split_the_failures(store, path):
    """Recording kind codes or their booleans gives the same busy time, latency,
    completions, in-flight and failure totals; the kind codes also split them by kind."""
    rng = np.random.default_rng(3)
    by_kind, by_bool, single = store.claim(), store.claim(), store.claim()
    want_bucket_total = np.zeros((4, 16), np.int64)
    for slots, start, d, end, codes in _random_fan_outs(rng, 80, long_every=9):
        n = slots.size
        durs = np.full(n, d, np.int64) if isinstance(d, int) else d
        for rec, failed in ((by_kind, codes), (by_bool, codes > 0)):
            if path == "arrays":  # int64 slots, one int duration: the fast path
                rec.record_start(slots.astype(np.int64), start)
                rec.record_end(slots.astype(np.int64), start, d, end, failed)
            else:
                rec.record_start(slots.tolist(), start)
                rec.record_end(slots.tolist(), start, durs.tolist(), end, failed=failed.tolist())
        for i in range(n):  # the reference: one call at a time
            single.record_start(slots[i : i + 1], start)
            one = slice(i, i + 1)
            single.record_end(slots[one], start, durs[one], end, failed=codes[one])
        np.add.at(want_bucket_total, (codes[codes > 0] - 1, slots[codes > 0]), 1)
        # Batch == one call at a time, kinds included (checked every round: buckets recycle).
        assert np.array_equal(row_words(store, by_kind.row), row_words(store, single.row))
    a, b = row_words(store, by_kind.row), row_words(store, by_bool.row)
    _, kind_totals = kinds_of(store, by_kind.row)
    _, bool_totals = kinds_of(store, by_bool.row)
    assert kind_totals.tolist() == want_bucket_total.tolist()
    assert bool_totals[:3].sum() == 0  # booleans are all "other"
    assert bool_totals[3].tolist() == want_bucket_total.sum(axis=0).tolist()
    m = store.matrix_view()
    # Everything but the kind split is the same for booleans and kinds.
    lay = m.layout
    kind_words = np.zeros(a.size, bool)
    for f in KIND_FIELDS:
        kind_words[lay[f] : lay[f] + store.buckets * m.columns] = True
    for f in KIND_TOTAL_FIELDS:
        kind_words[lay[f] : lay[f] + m.columns] = True
    assert np.array_equal(a[~kind_words], b[~kind_words])
    assert not np.array_equal(a[kind_words], b[kind_words])
    # Per bucket, the kinds sum to the failures.
    for rec in (by_kind, by_bool):
        per_bucket, totals = kinds_of(store, rec.row)
        assert np.array_equal(per_bucket.sum(axis=0), m.block(rec.row, "failures"))
        assert np.array_equal(totals.sum(axis=0), m.totals[rec.row, 1])


def test_readers_see_window_failures_per_kind_and_lifetime_totals(store):
    rec = store.claim()
    other = store.claim()
    slots = np.array([1, 1, 1, 2, 2, 3, 5])
    codes = np.array([FAIL_CONNECT, FAIL_CONNECT, 0, FAIL_TIMEOUT, FAIL_STATUS, 0, FAIL_OTHER])
    rec.record_start(slots, T0)
    rec.record_end(slots, T0, [MS] * 7, T0 + MS, failed=codes)
    other.record_start([1, 5], T0)
    other.record_end([1, 5], T0, [MS, MS], T0 + MS, failed=[True, False])
    loads = store.reader().read(T0 + 2 * MS, 8)
    assert loads.failures_by_kind.shape == (8, 4)
    assert loads.failures_by_kind[1].tolist() == [2, 0, 0, 1]
    assert loads.failures_by_kind[2].tolist() == [0, 1, 1, 0]
    assert loads.failures_by_kind[5].tolist() == [0, 0, 0, 1]
    assert loads.failures.tolist() == [0, 3, 2, 0, 0, 1, 0, 0]
    assert loads.completed.tolist() == [0, 4, 2, 1, 0, 2, 0, 0]
    assert np.allclose(loads.failure_rate[[1, 2, 3, 5]], [0.75, 1.0, 0.0, 0.5])
    assert loads.failures_total_by_kind.dtype == np.int64
    assert loads.failures_total_by_kind[1].tolist() == [2, 0, 0, 1]
    assert loads.failures_total.tolist() == loads.failures_total_by_kind.sum(axis=1).tolist()
    # The window forgets; the lifetime totals do not.
    later = store.reader().read(T0 + 5 * S, 8)
    assert later.failures.sum() == 0 and later.failures_by_kind.sum() == 0
    assert later.failures_total_by_kind[1].tolist() == [2, 0, 0, 1]
    # take() keeps the kind columns per endpoint; slots it does not cover are idle.
    taken = loads.take([2, 1, 40])
    assert taken.failures_by_kind.tolist() == [[0, 1, 1, 0], [2, 0, 0, 1], [0, 0, 0, 0]]
    assert taken.failures_total_by_kind[2].tolist() == [0, 0, 0, 0]
    assert taken.failures.tolist() == [2, 3, 0]


def test_recycled_buckets_forget_their_kinds(store):
    rec = store.claim()
    rec.record_start([4], T0)
    rec.record_end([4], T0, [MS], T0 + MS, failed=[FAIL_TIMEOUT])
    b = store.bucket_ns
    later = T0 + store.buckets * b  # the same bucket column, a new period
    rec.record_start([4], later)
    rec.record_end([4], later, [MS], later + MS, failed=[FAIL_CONNECT])
    per_bucket, totals = kinds_of(store, rec.row)
    assert per_bucket[:, :, 4].sum(axis=1).tolist() == [1, 0, 0, 0]
    assert totals[:, 4].tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize(
    "failed, match",
    [
        ([0, 5], r"unknown failure kinds \[5\]"),
        ([-1, 2], r"unknown failure kinds \[-1\]"),
        ([7, 9], r"unknown failure kinds \[7, 9\]: expected 0 \(success\) or 1 connect"),
        ([0.0, 1.0], "booleans or integer failure kinds"),
        (["x", "y"], "booleans or integer failure kinds"),
        ([1, 2, 3], r"failure flags have shape \(3,\), expected \(2,\)"),
    ],
)
@pytest.mark.parametrize("path", ["checked", "arrays", "locked", "thread"])
def test_bad_failure_kinds_record_nothing(store, failed, match, path):
    base = store.claim()
    rec = {
        "checked": base,
        "arrays": base,
        "locked": LockedRecorder(base),
        "thread": ThreadRecorder(store),
    }[path]
    rec.record_start([1, 2], T0)
    rows = [base.row] if path != "thread" else rec.rows
    before = [row_words(store, r) for r in rows]
    with pytest.raises(CounterInputError, match=match):
        if path == "arrays":
            rec.record_end(np.array([1, 2], np.int64), T0, MS, T0 + MS, failed)
        else:
            rec.record_end([1, 2], T0, [MS, MS], T0 + MS, failed=failed)
    assert all(np.array_equal(row_words(store, r), b) for r, b in zip(rows, before, strict=True))
    rec.record_end([1, 2], T0, [MS, MS], T0 + MS, failed=[FAIL_STATUS, 0])  # still usable
    assert store.reader().read(T0 + 2 * MS, 4).failures_by_kind[1].tolist() == [0, 0, 1, 0]


def test_growth_and_reset_keep_and_clear_kind_totals(store):
    rec = store.claim()
    rec.record_start([3, 9], T0)
    rec.record_end([3, 9], T0, [MS, MS], T0 + MS, failed=[FAIL_CONNECT, FAIL_STATUS])
    store.ensure_columns(100)
    rec.record_start([3], T0 + 2 * MS)  # follows the new matrix
    rec.record_end([3], T0 + 2 * MS, [MS], T0 + 3 * MS, failed=[FAIL_CONNECT])
    loads = store.reader().read(T0 + 4 * MS)
    assert loads.failures_total_by_kind[3].tolist() == [2, 0, 0, 0]
    assert loads.failures_total_by_kind[9].tolist() == [0, 0, 1, 0]
    assert loads.failures_by_kind[3].tolist() == [2, 0, 0, 0]
    store.reset_totals([9])
    after = store.reader().read(T0 + 4 * MS)
    assert after.failures_total_by_kind[9].tolist() == [0, 0, 0, 0]
    assert after.failures_total[9] == 0
    assert after.failures_total_by_kind[3].tolist() == [2, 0, 0, 0]


def _failing_worker(ns, slot, kind, calls, conn):
    """A worker process recording ``calls`` calls to ``slot``, every other one failing."""
    rec = CounterStore.attach(ns).claim()
    t = time.monotonic_ns()
    slots = np.full(calls, slot)
    every_other = np.arange(calls) % 2 == 0
    codes = every_other if kind is True else np.where(every_other, kind, 0)
    rec.record_start(slots, t)
    rec.record_end(slots, t, np.full(calls, MS), t + MS, failed=codes)
    conn.send(rec.row)
    conn.recv()  # stay alive (holding the row) until the parent has read


def test_rows_of_real_worker_processes_are_summed_per_kind(namespace, procs):
    store = CounterStore.create(namespace, rows=6, columns=8, window_ns=W, window_buckets=10)
    try:
        plan = [(1, FAIL_CONNECT, 10), (1, FAIL_TIMEOUT, 6), (2, FAIL_STATUS, 4), (2, True, 2)]
        pipes = []
        for slot, kind, calls in plan:
            a, b = procs.ctx.Pipe()
            procs.start(_failing_worker, namespace, slot, kind, calls, b)
            pipes.append(a)
        rows = []
        for a in pipes:
            assert a.poll(30)
            rows.append(a.recv())
        assert len(set(rows)) == 4
        loads = store.reader().read(time.monotonic_ns(), 8)
        for a in pipes:
            a.send(None)
        assert loads.failures_by_kind[1].tolist() == [5, 3, 0, 0]
        assert loads.failures_by_kind[2].tolist() == [0, 0, 2, 1]
        assert loads.failures_total_by_kind[:3].tolist() == [
            [0, 0, 0, 0],
            [5, 3, 0, 0],
            [0, 0, 2, 1],
        ]
        assert loads.completed[[1, 2]].tolist() == [16, 6]
        assert loads.requests_total[[1, 2]].tolist() == [16, 6]
    finally:
        store.close()


def test_routing_reads_may_skip_the_window_kinds_and_get_the_rest_the_same(store):
    rec = store.claim()
    rec.record_start([1, 2, 2], T0)
    rec.record_end([1, 2, 2], T0, [MS] * 3, T0 + MS, failed=[FAIL_CONNECT, 0, FAIL_STATUS])
    reader = store.reader()
    full = reader.read(T0 + 2 * MS, 8)
    lean = reader.read(T0 + 2 * MS, 8, failure_kinds=False)
    assert np.isnan(lean.failures_by_kind).all() and lean.failures_by_kind.shape == (8, 4)
    for name in ("in_flight", "occupancy", "completed", "failures", "requests_total"):
        assert np.array_equal(getattr(full, name), getattr(lean, name)), name
    assert np.array_equal(full.failures_total_by_kind, lean.failures_total_by_kind)
    assert np.allclose(full.signal("occupancy"), lean.signal("occupancy"))
