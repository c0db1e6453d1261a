"""What a worker's counter row records for calls and fan-outs: in flight, busy time over the
window's buckets, whole fan-outs equal to one call at a time, and input it refuses."""

import math

import numpy as np
import pytest

from lbcore.outlier import FAIL_TIMEOUT
from shm import CounterInputError
from shm.counters import bucket_weights
from tests.shm_tests.window import MS, OPEN_PARTS, T0, S, W, block, raw


def test_a_fan_out_counts_in_flight_then_busy_time(store):
    rec = store.claim()
    reader = store.reader()
    slots = np.array([1, 2, 2, 5])
    rec.record_start(slots, T0)
    loads = reader.read(T0 + 100 * MS, 8)
    assert loads.in_flight.tolist() == [0, 1, 2, 0, 0, 1, 0, 0]
    # Open requests count as busy from their start: 100 ms of a 2 s window each.
    assert np.allclose(loads.occupancy, [0, 0.05, 0.1, 0, 0, 0.05, 0, 0])
    durations = np.array([50, 100, 100, 10]) * MS
    rec.record_end(slots, T0, durations, T0 + 100 * MS, failed=[False, True, False, False])
    loads = reader.read(T0 + 100 * MS, 8)
    assert loads.in_flight.tolist() == [0] * 8
    assert np.allclose(loads.occupancy, [0, 0.025, 0.1, 0, 0, 0.005, 0, 0])
    assert loads.completed.tolist() == [0, 1, 2, 0, 0, 1, 0, 0]
    assert np.allclose(loads.mean_latency_s[[1, 2, 5]], [0.05, 0.1, 0.01])
    assert np.isnan(loads.mean_latency_s[[0, 3, 4]]).all()
    assert np.allclose(loads.failure_rate[[1, 2, 5]], [0, 0.5, 0])
    assert math.isclose(loads.global_latency_s, (50 + 200 + 10) / 4 / 1000)


def test_busy_time_spreads_over_buckets_and_ages_out(store):
    rec = store.claim()
    reader = store.reader()
    rec.record_start([3], T0)
    rec.record_end([3], T0, [900 * MS], T0 + 900 * MS)  # spans 5 buckets of 200 ms
    busy = block(store, rec.row, "busy_ns")[:, 3]
    assert sorted(busy.tolist(), reverse=True)[:5] == [200 * MS] * 4 + [100 * MS]
    assert block(store, rec.row, "completed")[:, 3].sum() == 1  # once, where it ended
    for now, occ in [(T0 + 900 * MS, 0.45), (T0 + 2 * S, 0.45), (T0 + 2500 * MS, 0.2)]:
        assert math.isclose(reader.read(now, 4).occupancy[3], occ), now
    late = reader.read(T0 + 3 * S, 4)
    assert late.occupancy[3] == 0 and late.completed[3] == 0 and np.isnan(late.mean_latency_s[3])


@pytest.mark.parametrize("spans", [False, True])
def test_a_complete_call_is_recorded_without_its_start(store, spans):
    """``opened=False`` (a batching caller's call that started and ended between two of
    its writes): the same busy time, completions and failures as start + end, and the
    in-flight words never touched, in one bucket and across buckets."""
    both, alone = store.claim(), store.claim()
    slots = np.array([1, 2, 2])
    started = np.array([T0, T0 + MS, T0 + 2 * MS])
    d = np.array([900 if spans else 10, 20, 30]) * MS
    now = T0 + (S if spans else 100 * MS)  # (not spanning: all in T0's bucket)
    both.record_start(slots, started)
    both.record_end(slots, started, d, now, failed=[0, FAIL_TIMEOUT, 0])
    alone.record_end(slots, started, d, now, failed=[0, FAIL_TIMEOUT, 0], opened=False)
    for name in ("busy_ns", "completed", "latency_ns", "failures", *OPEN_PARTS):
        assert (block(store, both.row, name) == block(store, alone.row, name)).all(), name
    assert not any(block(store, alone.row, name).any() for name in OPEN_PARTS)
    totals = store.matrix_view().totals
    assert (totals[both.row] == totals[alone.row]).all()
    # Abandoned (the caller's deadline cut them): busy time only, with or without starts.
    for opened, cut in ((True, store.claim()), (False, store.claim())):
        if opened:
            cut.record_start(slots, started)
        cut.record_end(
            slots, started, d, now, failed=[0, FAIL_TIMEOUT, 0], opened=opened, completed=False
        )
        assert (block(store, cut.row, "busy_ns") == block(store, both.row, "busy_ns")).all()
        for name in ("completed", "latency_ns", "failures", *OPEN_PARTS):
            assert not block(store, cut.row, name).any(), (opened, name)
        assert not store.matrix_view().totals[cut.row].any()


def test_batch_equals_one_call_at_a_time(store):
    """One vectorized call per fan-out records exactly what per-call recording does,
    with repeated slots, per-call start times and calls spanning buckets."""
    rng = np.random.default_rng(7)
    batch, single = store.claim(), store.claim()
    now = T0
    for _ in range(60):
        n = int(rng.integers(1, 40))
        slots = rng.integers(0, 16, n)
        if rng.random() < 0.5:
            starts = now  # one start time for the whole fan-out
            batch.record_start(slots, now)
            for s in slots:
                single.record_start([s], now)
        else:
            starts = now + rng.integers(0, 5 * MS, n)
            for s, st in zip(slots, starts.tolist(), strict=True):
                batch.record_start([s], st)
                single.record_start([s], st)
        dur = rng.integers(0, 700 * MS, n)
        end = now + 700 * MS + 5 * MS
        failed = rng.random(n) < 0.2
        batch.record_end(slots, starts, dur, end, failed=failed)
        for i in range(n):
            st = starts if np.ndim(starts) == 0 else int(starts[i])
            single.record_end(slots[i : i + 1], st, dur[i : i + 1], end, failed=failed[i : i + 1])
        now = end + int(rng.integers(0, 300 * MS))
    a, b = raw(store, batch.row), raw(store, single.row)
    assert np.array_equal(a, b)
    for part in OPEN_PARTS:  # nothing left in flight
        assert not block(store, batch.row, part).any(), part
    assert block(store, batch.row, "busy_ns").sum() > 0


def test_start_times_per_call_in_one_step_equal_one_call_at_a_time(store):
    """record_start with a start time per call (calls that started apart, recorded in
    one step) writes what one record_start per call writes: in one bucket, across
    buckets, and older than every bucket kept; ends with those times release them."""
    rng = np.random.default_rng(11)
    batch, single = store.claim(), store.claim()
    reader = store.reader()
    now = T0
    for spread in (3 * MS, 450 * MS, 30 * S):  # one bucket, several, some far too old
        n = 24
        slots = rng.integers(0, 16, n)
        starts = now - rng.integers(0, spread, n)
        batch.record_start(slots, starts)
        for sl, st in zip(slots.tolist(), starts.tolist(), strict=True):
            single.record_start([sl], st)
        assert np.array_equal(raw(store, batch.row), raw(store, single.row)), spread
        assert reader.read(now, 16).in_flight.sum() == 2 * n
        end = now + 5 * MS
        dur = end - starts
        batch.record_end(slots, starts, dur, end)
        for i in range(n):
            single.record_end(slots[i : i + 1], int(starts[i]), dur[i : i + 1], end)
        assert np.array_equal(raw(store, batch.row), raw(store, single.row)), spread
        for part in OPEN_PARTS:
            assert not block(store, batch.row, part).any(), (spread, part)
        now = end + 1 * S
    with pytest.raises(CounterInputError, match="one integer per call"):
        batch.record_start([1, 2], [T0])
    with pytest.raises(CounterInputError, match="one integer per call"):
        batch.record_start([1], [1.5])


def test_out_of_order_times_in_one_row_keep_every_count(store):
    """Threads sharing a row record with times taken before they got the lock."""
    rec = store.claim()
    b = store.bucket_ns
    late, early = T0 + b + 10 * MS, T0 + b - 10 * MS  # on both sides of a bucket edge
    rec.record_start([1, 1], early - 5 * MS)
    rec.record_end([1], early - 5 * MS, [5 * MS], late)
    rec.record_end([1], early - 5 * MS, [5 * MS], early)  # older than the row's bucket
    rec.record_start([2], T0 - 10 * S)  # far older than any bucket kept
    rec.record_end([2], T0 - 10 * S, [MS], late)
    loads = store.reader().read(late, 4)
    assert loads.in_flight.tolist() == [0, 0, 0, 0]
    # Slot 2's call ended long before the window: released, but not counted in it.
    assert loads.completed.tolist() == [0, 2, 0, 0]
    assert math.isclose(loads.occupancy[1], 10 * MS / W)


def test_rows_of_all_workers_are_summed(store):
    recs = [store.claim() for _ in range(3)]
    for i, rec in enumerate(recs):
        rec.record_start([0] * (i + 1), T0)
    loads = store.reader().read(T0 + 10 * MS, 2)
    assert loads.in_flight.tolist() == [6, 0]
    assert [r.row for r in recs] == [0, 1, 2]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda r: r.record_start([16], T0), r"endpoint slots must be in 0\.\.15"),
        (lambda r: r.record_start([-1], T0), "got values from -1"),
        (lambda r: r.record_start([1.5], T0), "must be integers"),
        (lambda r: r.record_start([[1]], T0), "one-dimensional"),
        (lambda r: r.record_end([1, 2], T0, [5], T0 + 10), r"durations have shape \(1,\)"),
        (lambda r: r.record_end([1], T0, [-5], T0 + 10), "durations must be >= 0 ns"),
        (lambda r: r.record_end([1], T0, [5.5], T0 + 10), "integer nanoseconds"),
        (lambda r: r.record_end([1], T0, [5], T0 + 10, failed=[1, 0]), "failure flags"),
        (lambda r: r.record_end([1], [T0, T0], [5], T0 + 10), "start times"),
    ],
)
def test_bad_recording_input_records_nothing(store, call, match):
    rec = store.claim()
    rec.record_start([1, 2], T0)
    before = raw(store, rec.row)
    with pytest.raises(CounterInputError, match=match):
        call(rec)
    assert np.array_equal(raw(store, rec.row), before)


def test_bucket_weights():
    b = 100
    periods = np.array([[9, 10, 11, 12, 7, -1]])
    w = bucket_weights(periods, b, 1250, 300)
    # Window (950, 1250]: bucket 12 is in progress (all of its counts are in the window),
    # 11 and 10 are inside, 9 is half inside, 7 is out, -1 is empty.
    assert w.tolist() == [[0.5, 1.0, 1.0, 1.0, 0.0, 0.0]]
    assert bucket_weights(np.array([12]), b, 1200, 300).tolist() == [0.0]  # starts at now


def test_an_empty_fan_out_records_nothing_and_raises_nothing(store):
    rec = store.claim()
    before = raw(store, rec.row)
    rec.record_start([], T0)  # every key of the batch went to fallback
    rec.record_end([], T0, [], T0 + MS)
    rec.record_end(np.array([], np.int32), [], np.array([], np.int64), T0 + MS, failed=[])
    assert np.array_equal(raw(store, rec.row), before)


@pytest.mark.parametrize("seed", [11, 12])
def test_a_whole_fan_out_records_what_one_call_at_a_time_records(store, seed, kernel):
    """One record_start/record_end of a fan-out (int64 slots the caller vouches for with
    ``bound``: one scatter-add each) records exactly what checked per-call recording
    does: repeated slots, one duration for all calls or one each, failures or none,
    calls spanning buckets and ending in later ones."""
    rng = np.random.default_rng(seed)
    fast, single = store.claim(), store.claim()
    calls = np.zeros(16, np.int64)
    fails = np.zeros(16, np.int64)
    now = T0
    for _ in range(80):
        n = int(rng.integers(0, 30))
        slots = rng.integers(0, 4 if rng.random() < 0.5 else 16, n).astype(np.int64)
        start = now + int(rng.integers(0, 150 * MS))
        fast.record_start(slots, start, bound=16)
        for s in slots.tolist():
            single.record_start([s], start)
        if rng.random() < 0.5:  # Tracker without done(): one int for every call
            d: int | np.ndarray = int(rng.integers(0, 500 * MS))
            durs = np.full(n, d, dtype=np.int64)
        else:
            d = durs = rng.integers(0, 500 * MS, n)
        end = start + int(durs.max(initial=0)) + int(rng.integers(0, 5 * MS))
        failed = rng.random(n) < 0.3 if rng.random() < 0.5 else None
        fast.record_end(slots, start, d, end, failed, bound=16)
        for i in range(n):
            f = None if failed is None else failed[i : i + 1]
            single.record_end(slots[i : i + 1].tolist(), start, durs[i : i + 1], end, failed=f)
        np.add.at(calls, slots, 1)
        if failed is not None:
            np.add.at(fails, slots, failed)
        now = end + int(rng.integers(0, 300 * MS))
    assert np.array_equal(raw(store, fast.row), raw(store, single.row))
    totals = store.matrix_view().totals
    assert totals[fast.row, 0, :16].tolist() == calls.tolist()
    assert totals[fast.row, 1, :16].tolist() == fails.tolist()
    assert np.array_equal(totals[fast.row], totals[single.row])
    for part in OPEN_PARTS:  # nothing left in flight
        assert not block(store, fast.row, part).any(), part


def test_the_end_of_a_fan_out_in_one_bucket_adds_to_every_field(store, kernel):
    rec = store.claim()
    slots = np.array([3, 3, 7, 3], dtype=np.int64)
    start = T0 + 20 * MS
    rec.record_start(slots, start, bound=16)
    k = (start // store.bucket_ns) % (store.buckets)
    assert block(store, rec.row, "open")[k, [3, 7]].tolist() == [3, 1]
    assert block(store, rec.row, "open_start_sum")[k, [3, 7]].tolist() == [60 * MS, 20 * MS]
    failed = np.array([1, 0, 1, 1], bool)
    rec.record_end(slots, start, 5 * MS, start + 5 * MS, failed)
    totals = store.matrix_view().totals[rec.row]
    assert totals[0, [3, 7]].tolist() == [3, 1] and totals[0].sum() == 4
    assert totals[1, [3, 7]].tolist() == [2, 1] and totals[1].sum() == 3
    # And the same fan-out again without failures (the end path without them).
    rec.record_start(slots, start)
    rec.record_end(slots, start, 5 * MS, start + 5 * MS, None)
    for part in OPEN_PARTS:
        assert not block(store, rec.row, part).any(), part
    # (slot 3, slot 7): twice three calls and one; two and one of them failed
    expect = {
        "busy_ns": (30 * MS, 10 * MS),
        "completed": (6, 2),
        "latency_ns": (30 * MS, 10 * MS),
        "failures": (2, 1),
    }
    for name, (v3, v7) in expect.items():
        got = block(store, rec.row, name)
        assert got[k, [3, 7]].tolist() == [v3, v7], name
        assert got.sum() == v3 + v7, name  # nothing anywhere else
    totals = store.matrix_view().totals[rec.row]
    assert totals[0, [3, 7]].tolist() == [6, 2] and totals[0].sum() == 8
    assert totals[1, [3, 7]].tolist() == [2, 1] and totals[1].sum() == 3


@pytest.mark.parametrize("with_failures", [False, True])
def test_a_long_fan_out_in_one_step_equals_short_ones(store, with_failures, kernel):
    """Thousands of calls with repeated slots in one record_start/record_end (repeats add
    up in the kernel's scatter-add) record, field by field, what the same calls recorded
    as fan-outs of 100 do."""
    rng = np.random.default_rng(5)
    long_rec, short_rec = store.claim(), store.claim()
    n = 4_037
    for rnd in range(3):
        slots = rng.integers(0, 11, n)  # repeats; slots 11-15 untouched
        start = T0 + rnd * S + int(rng.integers(0, 50 * MS))
        failed = rng.random(n) < 0.25 if with_failures else None
        d = int(rng.integers(0, 40 * MS))
        long_rec.record_start(slots, start, bound=16)
        for a in range(0, n, 100):
            short_rec.record_start(slots[a : a + 100], start)
        # Mid-flight: the open counts agree too.
        assert np.array_equal(raw(store, long_rec.row), raw(store, short_rec.row))
        long_rec.record_end(slots, start, d, start + d, failed, bound=16)
        for a in range(0, n, 100):
            f = None if failed is None else failed[a : a + 100]
            short_rec.record_end(slots[a : a + 100], start, d, start + d, f)
        assert np.array_equal(raw(store, long_rec.row), raw(store, short_rec.row))
    totals = store.matrix_view().totals
    assert np.array_equal(totals[long_rec.row], totals[short_rec.row])
    assert totals[long_rec.row, 0].sum() == 3 * n
    assert (totals[long_rec.row, 1].sum() > 0) == with_failures
    assert block(store, long_rec.row, "busy_ns").sum() > 0
    for part in OPEN_PARTS:
        assert not block(store, long_rec.row, part).any(), part


def test_a_fan_out_ending_after_the_counters_grew_ends_in_the_grown_row(store, kernel):
    rec = store.claim()
    slots = np.arange(600, dtype=np.int64) % 16
    start = T0 + 10 * MS
    rec.record_start(slots, start)
    store.ensure_columns(40)  # another process grew the counters meanwhile
    rec.record_end(slots, start, MS, start + MS, None)
    for part in OPEN_PARTS:
        assert not block(store, rec.row, part).any(), part
    k = (start // store.bucket_ns) % store.buckets
    completed = block(store, rec.row, "completed")[k]
    counts = np.bincount(slots, minlength=16)
    assert completed.size >= 40 and completed[:16].tolist() == counts.tolist()
    assert not completed[16:].any()
    assert block(store, rec.row, "busy_ns")[k, :16].tolist() == (counts * MS).tolist()


@pytest.mark.parametrize("bad", [[50], [-1], [3, 40], [2**62]])
def test_slots_beyond_the_columns_record_nothing_unless_vouched_for_within_them(store, kernel, bad):
    """Slots are checked (after following a grown matrix) unless the caller vouches for
    them with a bound within the row's columns; a bound beyond them is checked too."""
    rec = store.claim()
    store.ensure_columns(40)  # another process grew the counters: rec has 16 columns
    rec.record_start(np.array([30], dtype=np.int64), T0, bound=40)  # followed, then trusted
    rec.record_end(np.array([30], dtype=np.int64), T0, MS, T0 + MS, None, bound=40)
    loads = store.reader().read(T0 + MS)
    assert loads.completed[30] == 1 and loads.in_flight.sum() == 0
    before = raw(store, rec.row)
    arr = np.array(bad, dtype=np.int64)
    for bound in (None, 64):
        with pytest.raises(CounterInputError, match=r"0\.\.39"):
            rec.record_start(arr, T0, bound=bound)
        with pytest.raises(CounterInputError, match=r"0\.\.39"):
            rec.record_end(arr, T0, MS, T0 + MS, np.ones(arr.size, bool), bound=bound)
        with pytest.raises(CounterInputError, match=r"0\.\.39"):
            rec.record_end(arr, T0 - 3 * S, np.full(arr.size, MS), T0 + MS, bound=bound)
    assert np.array_equal(raw(store, rec.row), before)
