"""The counter matrix's lifecycle: created, taken over, grown, its rows claimed, released and
reused, refused to forked children, corrupt or removed segments named."""

import os

import pytest

from shm import (
    CounterInputError,
    CounterReader,
    CounterStore,
    NoFreeSlotError,
    SegmentLayoutError,
    SegmentMagicError,
    SegmentMissingError,
    SegmentSizeError,
    SlotOwnershipError,
    list_segments,
    segment_name,
)
from shm.names import SHM_DIR
from shm.segment import Segment
from tests.shm_tests.window import MS, T0, W


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
