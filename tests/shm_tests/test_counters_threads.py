"""Threads recording into one worker's counters (a locked row or one row per thread) lose no
update, also across a bucket rotation or a row released mid-request."""

import threading

import numpy as np
import pytest

from shm import LockedRecorder, SlotOwnershipError, ThreadRecorder
from tests.shm_tests.seams import second_waits_for_first
from tests.shm_tests.window import MS, OPEN_PARTS, T0, block


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
