"""A fan-out's start and end in the row's newest bucket (Recorder.record_newest) and a
routed batch's decision counts (lbcore.Plan.route_counted), each one kernel call: the
cells the recorder's own paths write for them, and nothing at all when the call is not
theirs to make (another bucket, a matrix that moved, an endpoint outside the map, a
released row)."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
from tests.shm_tests.window import COLS, T0, B, W, row_words, window_store

pytestmark = pytest.mark.skipif(
    lbcore.kernel.load_native() is None, reason="the native kernel is not built here"
)


@pytest.fixture
def native():
    old = lbcore.use_kernel("native")
    try:
        yield
    finally:
        lbcore.use_kernel(old)


@pytest.fixture
def stores(namespace, native):
    a = window_store(namespace + "a", rows=2)
    b = window_store(namespace + "b", rows=2)
    yield a, b
    a.close()
    b.close()


def _start(rec, slot_map, idx, now):
    """A fan-out's start as the tracker writes it: the kernel call, else the recorder."""
    n = rec.record_newest(rec.newest_sink, memoryview(slot_map), idx, now)
    if n >= 0:
        return n, True
    return rec.record_start(idx, now, COLS, slot_map), False


def _end(rec, slot_map, idx, start, now):
    d = now - start if now > start else 0
    if rec.record_newest(rec.newest_sink, memoryview(slot_map), idx, start, d, now) >= 0:
        return True
    rec.record_end(idx, start, d, now, None, COLS, slot_map)
    return False


def test_one_call_start_and_end_write_the_cells_of_the_recorders_paths(stores):
    a, b = stores
    ra, rb = a.claim(), b.claim()
    rng = np.random.default_rng(7)
    slot_map = rng.permutation(COLS).astype(np.int64)
    now, fast = T0, 0
    for step in range(400):
        idx = rng.integers(-1, COLS, size=int(rng.integers(0, 6))).astype(np.int32)
        slots = slot_map[idx[idx >= 0]]
        # Mostly within one bucket (the one call), sometimes across one or many.
        now += int(rng.choice([rng.integers(0, B // 50), rng.integers(0, 2 * B), 3 * W]))
        start = now
        n, kernel = _start(ra, slot_map, idx, start)
        fast += kernel
        assert n == slots.size
        rb.record_start(slots, start)
        now += int(rng.choice([0, rng.integers(0, B // 20), rng.integers(0, 3 * B)]))
        if n:
            fast += _end(ra, slot_map, idx, start, now)
            rb.record_end(slots, start, now - start, now)
        assert np.array_equal(row_words(a, ra.row), row_words(b, rb.row)), step
    assert fast > 300  # the newest bucket's calls did take the one call


def test_the_one_call_declines_what_is_not_the_newest_buckets(stores):
    a, _ = stores
    rec = a.claim()
    slot_map = np.arange(COLS, dtype=np.int64)
    view = memoryview(slot_map)
    idx = np.array([0, 3, -1], np.int32)
    rec.record_start(idx[:0], T0 + B // 2, COLS, slot_map)  # the newest bucket: T0's
    sink = rec.newest_sink
    lo, hi = sink[5], sink[6]
    assert (lo, hi) == (T0, T0 + B)
    before = row_words(a, rec.row)
    assert rec.record_newest(sink, view, idx, lo - 1) == -1  # an older bucket
    assert rec.record_newest(sink, view, idx, hi) == -1  # a newer one: rotate first
    assert rec.record_newest(sink, view, idx, lo - 1, 10, lo + 9) == -1  # started before
    assert rec.record_newest(sink, view, idx, lo, hi - lo, hi) == -1  # ended after
    assert rec.record_newest(sink, view, idx, lo, -1, lo) == -1  # a negative duration
    outside = np.array([0, COLS], np.int32)
    assert rec.record_newest(sink, memoryview(slot_map[:COLS]), outside, lo) == -1
    wide = np.arange(COLS + 1, dtype=np.int64)  # a slot beyond the row's columns
    assert rec.record_newest(sink, memoryview(wide), np.array([COLS], np.int32), lo) == -1
    assert rec.record_newest(sink, view, idx, float(lo)) == -1  # not an int
    assert np.array_equal(row_words(a, rec.row), before)
    assert rec.record_newest(sink, view, idx, lo) == 2
    assert rec.record_newest(sink, view, idx, lo, 5, lo + 5) == 2
    with pytest.raises(TypeError):
        rec.record_newest(sink[:3], view, idx, lo)


def test_a_matrix_that_moved_is_not_written_by_the_one_call(stores):
    a, _ = stores
    rec = a.claim()
    slot_map = np.arange(COLS, dtype=np.int64)
    idx = np.array([1, 2], np.int32)
    rec.record_start(idx, T0, COLS, slot_map)
    old_sink, old_count = rec.newest_sink, rec.count_sink
    a.ensure_columns(2 * COLS)  # a new matrix: the row is copied when followed
    before = row_words(a, rec.row)
    assert rec.record_newest(old_sink, memoryview(slot_map), idx, T0 + 1) == -1
    plan = lbcore.Plan(lbcore.RingSet([f"10.0.0.{i}:80" for i in range(4)]), 0)
    totals = np.zeros(3, np.int64)
    *_, counted = plan.route_counted(["a", "b"], 0, old_count, memoryview(totals))
    assert not counted and not totals.any()
    assert np.array_equal(row_words(a, rec.row), before)
    # The recorder's own path follows the new matrix, and the one call works there.
    rec.record_end(idx, T0, 5, T0 + 5, None, COLS, slot_map)
    assert rec.newest_sink is not old_sink
    assert rec.record_newest(rec.newest_sink, memoryview(slot_map), idx, T0 + 6) == 2


def test_route_counted_adds_the_counts_count_adds(stores):
    a, _ = stores
    ra, rb = a.claim(), a.claim()
    rs = lbcore.RingSet([f"10.0.0.{i}:80" for i in range(8)])
    plan = lbcore.Plan(rs, 0, gate=lbcore.Gate(percentage=50.0))  # some keys: fallback
    totals = np.zeros(3, np.int64)
    rng = np.random.default_rng(3)
    expect = np.zeros(3, np.int64)
    for _ in range(50):
        keys = [f"sku-{x}" for x in rng.integers(0, 10**9, size=int(rng.integers(0, 20)))]
        idx, fallbacks, moves, valid, counted = plan.route_counted(
            keys, 0, ra.count_sink, memoryview(totals)
        )
        ref = plan.route(keys)
        assert np.array_equal(idx, ref[0]) and (fallbacks, moves, valid) == ref[1:]
        assert counted == bool(keys)  # an empty batch counts nothing
        if keys:
            rb.count(len(keys), fallbacks, moves)
            expect += (len(keys), fallbacks, moves)
    assert np.array_equal(totals, expect) and expect[1] > 0
    # Two rows that recorded nothing else: the same words.
    assert np.array_equal(row_words(a, ra.row), row_words(a, rb.row))
    assert row_words(a, ra.row).sum() > 0
    # No row: routed, not counted.
    *_, counted = plan.route_counted(["x"], 0, None, memoryview(totals))
    assert not counted and np.array_equal(totals, expect)


def test_a_released_row_has_no_sinks(stores):
    a, _ = stores
    rec = a.claim()
    assert rec.count_sink is not None and rec.newest_sink is not None
    rec.release()
    assert rec.count_sink is None and rec.newest_sink is None


def test_the_numpy_kernel_counts_nothing_itself(namespace):
    old = lbcore.use_kernel("numpy")
    try:
        with window_store(namespace, rows=1) as st:
            rec = st.claim()
            assert rec.count_sink is None and rec.newest_sink is None
            plan = lbcore.Plan(lbcore.RingSet(["10.0.0.1:80", "10.0.0.2:80"]), 0)
            totals = np.zeros(3, np.int64)
            *_, counted = plan.route_counted(["a"], 0, None, memoryview(totals))
            assert not counted and not totals.any()
    finally:
        lbcore.use_kernel(old)
