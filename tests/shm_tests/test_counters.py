import math
import os
import threading

import numpy as np
import pytest

from lbcore.outlier import FAIL_TIMEOUT
from shm import (
    CounterInputError,
    CounterReader,
    CounterStore,
    LockedRecorder,
    NoFreeSlotError,
    SegmentLayoutError,
    SegmentMagicError,
    SegmentMissingError,
    SegmentSizeError,
    SlotOwnershipError,
    ThreadRecorder,
    list_segments,
    segment_name,
)
from shm.counters import bucket_weights
from shm.segment import SHM_DIR, Segment
from tests.shm_tests.seams import second_waits_for_first
from tests.shm_tests.window import MS, T0, S, W, window_store


@pytest.fixture
def store(namespace):
    with window_store(namespace, rows=4) as st:
        yield st


def raw(store, row):
    return store.matrix_view().fields[row].copy()


def block(store, row, name):
    """A copy of one part of a row: ``open_old`` or a per-bucket field."""
    return store.matrix_view().block(row, name).copy()


OPEN_PARTS = ("open_old", "open", "open_start_sum")


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


def test_growth_keeps_rows_and_recorders_follow(store, namespace):
    rec = store.claim()
    reader = CounterReader(namespace)
    rec.record_start([3, 3, 15], T0)
    rec.record_end([15], T0, [10 * MS], T0 + 10 * MS)
    first = segment_name(namespace, "counters", 1)
    assert store.columns == 16 and first in list_segments(namespace)
    assert store.ensure_columns(10) == 16  # fits: nothing happens
    assert store.ensure_columns(17) == 24  # at least 25 % more (in steps of 8)
    assert store.ensure_columns(1000) == 1000  # or what is needed
    assert store.ensure_columns(1001) == 1256
    assert list_segments(namespace) == [
        segment_name(namespace, "counters"),
        segment_name(namespace, "counters", 4),
    ]
    rec.record_start([999], T0 + 20 * MS)  # the recorder follows on its next call
    rec.record_end([3], T0, [30 * MS], T0 + 30 * MS)
    loads = reader.read(T0 + 40 * MS)
    assert reader.columns == 1256 and loads.in_flight.size == 1256
    assert loads.in_flight[[3, 15, 999]].tolist() == [1, 0, 1]
    assert loads.completed[[3, 15]].tolist() == [1, 1]


def test_slot_exhaustion_release_and_reuse(store):
    recs = [store.claim() for _ in range(4)]
    with pytest.raises(
        NoFreeSlotError, match=f"all 4 worker slots are held by live.*{os.getpid()}"
    ):
        store.claim()
    recs[2].record_start([5], T0)
    recs[2].release()
    with pytest.raises(SlotOwnershipError, match="was released"):
        recs[2].record_start([5], T0)
    info = store.slots()
    assert [s.claimed for s in info] == [True, True, False, True]
    assert all(s.alive for s in info if s.claimed) and all(s.used for s in info)
    again = store.claim()
    assert again.row == 2 and store.slots()[2].claims == 2
    assert store.reader().read(T0, 8).in_flight[5] == 0  # released with the slot


def test_a_forked_child_cannot_use_its_parents_recorder(store, procs):
    rec = store.claim()
    r, w = os.pipe()

    def child():
        try:
            rec.record_start([1], T0)
            os.write(w, b"recorded")
        except SlotOwnershipError as exc:
            os.write(w, str(exc).encode()[:300])
        mine = store.claim()
        os.write(w, f"|row {mine.row}".encode())

    p = procs.start(child)
    p.join(10)
    msg = os.read(r, 400).decode()
    assert "a forked child must claim its own slot" in msg and msg.endswith("|row 1")
    assert store.reader().read(T0, 4).in_flight[1] == 0


def test_create_takes_over_same_geometry_and_refuses_another(namespace):
    a = CounterStore.create(namespace, rows=4, columns=8, window_ns=W, window_buckets=10)
    a.claim().record_start([2], T0)
    b = CounterStore.create(namespace, rows=4, columns=8, window_ns=W, window_buckets=10)
    assert b.reader().read(T0, 8).in_flight[2] == 1  # history kept
    with pytest.raises(SegmentLayoutError, match=r"exists with 4 rows.*asked for 8 rows"):
        CounterStore.create(namespace, rows=8, columns=8, window_ns=W, window_buckets=10)
    c = CounterStore.create(namespace, rows=8, window_ns=W, window_buckets=10, replace_invalid=True)
    assert c.rows == 8 and c.reader().read(T0).in_flight.sum() == 0
    c.close()
    assert list_segments(namespace) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rows": 0}, "rows must be an integer from 1"),
        ({"window_buckets": 0}, "window_buckets"),
        ({"window_ns": 5, "window_buckets": 10}, "window_ns"),
        ({"columns": 0}, "columns"),
    ],
)
def test_bad_geometry(namespace, kwargs, match):
    with pytest.raises(CounterInputError, match=match):
        CounterStore.create(namespace, **kwargs)
    assert list_segments(namespace) == []


def test_corrupted_counter_segments(namespace):
    with pytest.raises(SegmentMissingError, match="counters: does not exist"):
        CounterStore.attach(namespace)
    st = CounterStore.create(namespace, rows=2, columns=8)
    data = segment_name(namespace, "counters", 1)
    os.truncate(SHM_DIR + data, 4096)
    with pytest.raises(SegmentSizeError, match=f"{data}: header says"):
        CounterStore.attach(namespace)
    ctl = Segment.attach(segment_name(namespace, "counters"), writable=True)
    ctl.words[0] ^= 1
    with pytest.raises(SegmentMagicError, match="not a cslb segment"):
        CounterReader(namespace)
    st.close()


@pytest.mark.parametrize("kind", ["locked", "per-thread"])
def test_gthread_style_threads_lose_no_update(store, kind):
    """Threads of one process record fan-outs whose calls span several buckets, with the
    row rotating to new buckets every other round and times slightly out of order
    between threads (taken before the lock, as in a gthread worker). Nothing may be
    lost: in-flight ends at 0, no cell goes negative, and every retained bucket holds
    exactly the completions and latency recorded for it. (Under the GIL each NumPy
    call is indivisible; the race a lock prevents is pinned deterministically by
    test_a_thread_recording_during_another_threads_rotation_loses_nothing.)"""
    import sys

    rec = LockedRecorder(store.claim()) if kind == "locked" else ThreadRecorder(store)
    rounds, threads, fan = 200, 4, 12
    b = store.bucket_ns
    errors = []
    ends: list[tuple[int, int, int]] = []  # (end time, duration, slot) of every call
    # Rounds in lockstep keep the threads' times within the row's retained buckets
    # (a call ending before them would be folded into the oldest one, by design).
    lockstep = threading.Barrier(threads)

    def work(seed):
        rng = np.random.default_rng(seed)
        mine = []
        try:
            for i in range(rounds):
                lockstep.wait(10)
                slots = rng.integers(0, 16, fan)
                # Each thread's call of a round starts in a bucket of its own, newer
                # than the last round's: the row rotates several times per round.
                start = T0 + (i * threads + seed) * b + int(rng.integers(0, b // 4))
                durations = rng.integers(b, 3 * b, fan)  # each call spans 2-4 buckets
                now = start + int(durations.max())
                rec.record_start(slots, start)
                rec.record_end(slots, start, durations, now)
                mine += [
                    (start + int(d), int(d), int(s)) for d, s in zip(durations, slots, strict=True)
                ]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
            lockstep.abort()
        ends.extend(mine)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    rows = [rec.recorder.row] if kind == "locked" else rec.rows
    if kind == "per-thread":
        assert sorted(rows) == [0, 1, 2, 3]
    m = store.matrix_view()
    completed = np.zeros((store.buckets, 16), np.int64)
    latency = np.zeros((store.buckets, 16), np.int64)
    newest = max(int(p) for r in rows for p in m.periods[r])
    for r in rows:
        for part in OPEN_PARTS:
            assert not block(store, r, part).any(), (r, part)  # nothing left in flight
        for name in ("busy_ns", "completed", "latency_ns", "failures"):
            assert (block(store, r, name) >= 0).all(), (r, name)
        for j, period in enumerate(m.periods[r].tolist()):
            if period > newest - store.buckets:  # a bucket of the final retained range
                completed[period % store.buckets] += block(store, r, "completed")[j]
                latency[period % store.buckets] += block(store, r, "latency_ns")[j]
    want_completed = np.zeros_like(completed)
    want_latency = np.zeros_like(latency)
    for end, d, s in ends:
        q = end // b
        if q > newest - store.buckets:
            want_completed[q % store.buckets, s] += 1
            want_latency[q % store.buckets, s] += d
    assert np.array_equal(completed, want_completed)
    assert np.array_equal(latency, want_latency)
    rec.release()
    assert all(not s.claimed for s in store.slots())


def test_bucket_weights():
    b = 100
    periods = np.array([[9, 10, 11, 12, 7, -1]])
    w = bucket_weights(periods, b, 1250, 300)
    # Window (950, 1250]: bucket 12 is in progress (all of its counts are in the window),
    # 11 and 10 are inside, 9 is half inside, 7 is out, -1 is empty.
    assert w.tolist() == [[0.5, 1.0, 1.0, 1.0, 0.0, 0.0]]
    assert bucket_weights(np.array([12]), b, 1200, 300).tolist() == [0.0]  # starts at now


def test_host_loads_per_endpoint_and_signals(store):
    rec = store.claim()
    rec.record_start([4, 4, 4], T0)
    rec.record_end([4], T0, [100 * MS], T0 + 100 * MS)
    rec.record_start([7], T0)
    rec.record_end([7], T0, [20 * MS], T0 + 20 * MS)
    loads = store.reader().read(T0 + 100 * MS, 8)
    per_endpoint = loads.take([7, 4])  # e.g. Table.slots: endpoint order
    assert per_endpoint.in_flight.tolist() == [0, 2]
    assert np.allclose(per_endpoint.signal("in-flight"), [0, 2])
    assert np.allclose(per_endpoint.signal("occupancy"), per_endpoint.occupancy)
    eff = per_endpoint.signal("effective")
    assert eff[1] == pytest.approx(2 * min(0.1 / loads.global_latency_s, 5))
    with pytest.raises(CounterInputError, match="unknown load signal"):
        loads.signal("cpu")


def test_the_table_writer_grows_the_counters_before_publishing(namespace):
    import lbcore
    from shm import TableReader, TableWriter

    store = CounterStore.create(namespace, rows=2, columns=8)
    with TableWriter(namespace, counters=store) as w:
        w.publish(lbcore.RingSet([f"http://10.5.0.{i}:80" for i in range(1, 101)]))
        assert store.columns >= 100
        t = TableReader(namespace).table()
        worker = CounterStore.attach(namespace).claim()
        worker.record_start(t.slots, T0)  # every slot of the table has a column
        assert store.reader().read(T0, t.n_slots).in_flight.sum() == 100
    store.close()
    assert list_segments(namespace) == []


def test_a_missing_counter_matrix_is_named(namespace):
    st = CounterStore.create(namespace, rows=2, columns=8)
    os.unlink(SHM_DIR + segment_name(namespace, "counters", 1))
    with pytest.raises(SegmentMissingError, match=r"counters\.1: does not exist"):
        CounterReader(namespace)
    st.close()


def test_counters_too_big_for_dev_shm_leave_nothing_behind(namespace):
    from shm import SegmentFullError

    st = os.statvfs(SHM_DIR)
    rows = 4096
    # Columns such that the matrix needs more than the whole of /dev/shm.
    cols = (st.f_blocks * st.f_frsize) // (rows * 8 * (2 + 4 * 12)) + 1024
    with pytest.raises(SegmentFullError, match="is full or too small"):
        CounterStore.create(namespace, rows=rows, columns=min(cols, (1 << 22)))
    assert list_segments(namespace) == []


def test_freed_slots_wait_for_the_counters_window(namespace):
    import lbcore
    from shm import TableReader, TableWriter

    store = CounterStore.create(namespace, rows=2, columns=8, window_ns=W, window_buckets=10)
    clock = [T0]
    eps = [f"http://10.6.0.{i}:80" for i in range(1, 6)]
    with TableWriter(namespace, counters=store, clock=lambda: clock[0]) as w:
        reader = TableReader(namespace)
        w.publish(lbcore.RingSet(eps[:4]))
        w.publish(lbcore.RingSet(eps[1:4]))  # eps[0] leaves: slot 0 is freed
        clock[0] += W + 2 * store.bucket_ns - 1
        w.publish(lbcore.RingSet(eps[1:5]))
        assert reader.table().slots[-1] == 4  # slot 0 is not old enough yet
        clock[0] += 1
        w.publish(lbcore.RingSet([*eps[1:5], "http://10.6.0.9:80"]))
        assert reader.table().slots[-1] == 0  # aged out of the 2 s window: reused
    store.close()


def test_an_old_open_request_counts_the_window_not_its_age(store):
    """open requests are clipped to the window one by one, not as a cell's
    sum. W = 2 s here; a request open 100 s counts 2 s, one open 1 s counts 1 s."""
    rec, other = store.claim(), store.claim()
    reader = store.reader()
    # Slot 1: the old request's bucket is recycled when time moves on (-> open_old).
    rec.record_start([1], T0 - 100 * S)
    rec.record_start([1], T0 - 1 * S)
    # Slot 2: a worker that recorded nothing since: its bucket column is stale.
    other.record_start([2], T0 - 100 * S)
    rec.record_start([2], T0 - 1 * S)
    # Slot 3: a start older than every kept bucket, recorded late (LockedRecorder threads).
    rec.record_start([3], T0 - 1 * S)
    rec.record_start([3], T0 - 100 * S)
    # Slot 4: ten requests open 100 ms and one open 100 s: (10 x 0.1 + 2) / 2 = 1.5,
    # not min(10 x 0.1 + 100, 11 x 2) / 2 = 11.
    rec.record_start([4], T0 - 100 * S)
    rec.record_start([4] * 10, T0 - 100 * MS)
    loads = reader.read(T0, 5)
    assert loads.in_flight.tolist() == [0, 2, 2, 2, 11]
    assert np.allclose(loads.occupancy, [0, 1.5, 1.5, 1.5, 1.5])
    # Ending them finds each open entry where it is (a kept bucket or open_old).
    rec.record_end([1, 1], [T0 - 100 * S, T0 - 1 * S], [100 * S, S], T0)
    other.record_end([2], T0 - 100 * S, [100 * S], T0)
    rec.record_end([2, 3, 3], [T0 - S, T0 - S, T0 - 100 * S], [S, S, 100 * S], T0)
    rec.record_end([4] * 11, [T0 - 100 * S] + [T0 - 100 * MS] * 10, [100 * S] + [100 * MS] * 10, T0)
    after = reader.read(T0, 5)
    assert after.in_flight.tolist() == [0] * 5
    for r in (rec.row, other.row):
        for part in OPEN_PARTS:
            assert not block(store, r, part).any(), (r, part)
    # Now ended, each request's busy time inside the window counts: min(duration, 2 s).
    assert np.allclose(after.occupancy, [0, 1.5, 1.5, 1.5, 1.5])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_open_request_occupancy_is_off_by_at_most_a_bucket_per_straddling_request(namespace, seed):
    """Random open requests of ages up to 3 windows over several rows: the reader's
    busy time of open requests is exact except for requests that started in the bucket
    holding the window's start, each off by at most one bucket."""
    rng = np.random.default_rng(seed)
    st = CounterStore.create(namespace, rows=4, columns=8, window_ns=W, window_buckets=10)
    b = st.bucket_ns
    recs = [st.claim() for _ in range(4)]
    starts = {r.row: [] for r in recs}
    for t in sorted(rng.integers(T0 - 3 * W, T0, 60).tolist()):
        r = recs[int(rng.integers(0, 4))]
        r.record_start([5], t)
        starts[r.row].append(t)
    got = st.reader().read(T0, 8).occupancy[5] * W
    ages = [T0 - t for ts in starts.values() for t in ts]
    truth = sum(min(a, W) for a in ages)
    straddling = sum((T0 - W) // b == t // b for ts in starts.values() for t in ts)
    assert abs(got - truth) <= straddling * b + 1, (got, truth, straddling)
    st.close()


def test_handles_tell_when_the_owner_removed_the_counters(namespace):
    """recorders of removed counters cannot record anywhere a
    reader looks; replaced() says so, and a new attach sees the new counters."""
    owner = CounterStore.create(namespace, rows=2, columns=8, window_ns=W, window_buckets=10)
    worker = CounterStore.attach(namespace)
    rec = worker.claim()
    reader = CounterReader(namespace)
    assert not worker.replaced() and not reader.replaced() and not owner.replaced()
    owner.close()  # the owner unlinks
    assert worker.replaced() and reader.replaced()
    again = CounterStore.create(namespace, rows=2, columns=8, window_ns=W, window_buckets=10)
    assert worker.replaced() and reader.replaced()  # a new segment, not theirs
    rec.record_start([1], T0)  # lands in the removed matrix
    assert again.reader().read(T0, 8).in_flight[1] == 0
    fresh = CounterStore.attach(namespace)
    assert not fresh.replaced()
    fresh.claim().record_start([1], T0)
    assert again.reader().read(T0, 8).in_flight[1] == 1
    again.close()


def test_releasing_per_thread_rows_mid_request_leaves_no_negative_counts(store):
    """release() frees every thread's row while one thread is mid-request;
    that thread's record_end must fail, not land in a newly claimed row and drive it
    negative."""
    rec = ThreadRecorder(store)
    started, go = threading.Event(), threading.Event()
    outcome = {}

    def worker():
        rec.record_start([2, 3], T0)
        started.set()
        go.wait(10)
        try:
            rec.record_end([2, 3], T0, [MS, MS], T0 + MS)
            outcome["end"] = "recorded"
        except SlotOwnershipError as exc:
            outcome["end"] = str(exc)

    t = threading.Thread(target=worker)
    t.start()
    assert started.wait(10)
    rec.release()
    go.set()
    t.join(10)
    assert "was released" in outcome["end"]
    for r in range(store.rows):
        for part in OPEN_PARTS:
            assert (block(store, r, part) >= 0).all(), (r, part)
    assert store.reader().read(T0 + MS, 8).in_flight.sum() == 0
    assert not any(s.claimed for s in store.slots())
    with pytest.raises(SlotOwnershipError, match="was released"):
        rec.record_start([1], T0)  # nor does a thread that never recorded get a row


def test_host_loads_follow_lbcores_load_rules(store):
    """effective load uses lbcore's rule and its latency cap (a pod far
    slower than the rest is capped exactly as lbcore caps it)."""
    from lbcore.signals import load_for

    rec = store.claim()
    rec.record_start([0] * 9 + [1], T0)
    rec.record_end([0] * 9, T0, [10 * MS] * 9, T0 + 10 * MS)
    rec.record_start([1, 2, 2], T0 + 10 * MS)  # slot 1: one more open, one ends slowly
    rec.record_end([1], T0, [900 * MS], T0 + 900 * MS)
    loads = store.reader().read(T0 + 900 * MS, 4)
    ratio = loads.mean_latency_s[1] / loads.global_latency_s
    assert ratio > 5  # beyond lbcore's default cap
    for name in ("effective", "occupancy", "in-flight"):
        want = load_for(
            name, loads.in_flight, loads.occupancy, loads.mean_latency_s, loads.global_latency_s
        )
        assert np.array_equal(loads.signal(name), want), name
    assert np.array_equal(loads.effective(), loads.signal("effective"))


@pytest.mark.parametrize("kind", ["locked", "per-thread"])
def test_a_thread_recording_during_another_threads_rotation_loses_nothing(store, kind):
    """thread A's call moves the row to a new bucket and stops just as it
    starts recycling that bucket's column; thread B then records a call in the new
    bucket. Sharing a row, B must wait for A (LockedRecorder's lock): otherwise A goes
    on to zero the column B just recorded into, losing B's call and leaving its open
    entry negative. With a row per thread there is nothing to share."""
    rec = LockedRecorder(store.claim()) if kind == "locked" else ThreadRecorder(store)
    b = store.bucket_ns
    errors = []

    def a():
        try:
            rec.record_start([1], T0)
            rec.record_end([1], T0, [b], T0 + b)  # ends in the next bucket: rotates
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def b_call():
        try:
            rec.record_start([2], T0 + b + 10 * MS)
            rec.record_end([2], T0 + b + 10 * MS, [5 * MS], T0 + b + 15 * MS)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    b_waited = second_waits_for_first("counters.rotate", a, b_call)
    assert errors == []
    rows = [rec.recorder.row] if kind == "locked" else rec.rows
    for r in rows:
        for part in ("open_old", "open"):
            assert (block(store, r, part) >= 0).all(), (r, part)
    loads = store.reader().read(T0 + b + 20 * MS, 4)
    assert loads.completed.tolist() == [0, 1, 1, 0]
    assert loads.in_flight.tolist() == [0, 0, 0, 0]
    assert b_waited == (kind == "locked")
    rec.release()


def test_slots_newer_than_a_load_snapshot_count_as_idle(store):
    rec = store.claim()
    rec.record_start([1, 1], T0)
    loads = store.reader().read(T0 + 10 * MS, 4)  # a snapshot of slots 0..3
    per_endpoint = loads.take([1, 9])  # slot 9: an endpoint published after it
    assert per_endpoint.in_flight.tolist() == [2, 0]
    assert per_endpoint.occupancy[1] == 0 and per_endpoint.completed[1] == 0
    assert np.isnan(per_endpoint.mean_latency_s[1]) and np.isnan(per_endpoint.failure_rate[1])
    assert np.allclose(per_endpoint.signal("effective"), [2, 0])
    with pytest.raises(CounterInputError, match="must be >= 0"):
        loads.take([-1])


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
