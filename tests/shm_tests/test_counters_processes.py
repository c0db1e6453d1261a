"""Counters with real worker processes: occupancy accuracy, SIGKILLed workers, growth."""

import contextlib
import errno
import os
import resource
import signal
import time

import numpy as np
import pytest

from shm import (
    CounterStore,
    NoFreeSlotError,
    ProcessLivenessError,
    list_segments,
    segment_name,
)
from shm.owners import process_alive, process_start_ticks
from shm.seams import set_seam_hook
from tests.shm_damage import writable_counters

S = 1_000_000_000
MS = 1_000_000
W = 2 * S


def holder(ns, slots, hold_s, period_s, t_start, run_ns, conn):
    """A worker that keeps a request open to ``slots`` for ``hold_s`` of every ``period_s``."""
    rec = CounterStore.attach(ns).claim()
    intervals = []
    while time.monotonic_ns() < t_start + run_ns:
        t = time.monotonic_ns()
        rec.record_start(slots, t)
        time.sleep(hold_s)
        e = time.monotonic_ns()
        rec.record_end(slots, t, np.full(len(slots), e - t), e)
        intervals.append((t, e))
        time.sleep(max(0.0, period_s - (e - t) / S))
    conn.send(intervals)


def true_occupancy(intervals, now, window):
    lo = now - window
    busy = sum(max(0, min(e, now) - max(s, lo)) for s, e in intervals if s < now)
    return busy / window


def test_occupancy_is_within_5_percent_of_the_truth(namespace, procs):
    store = CounterStore.create(namespace, rows=8, columns=8, window_ns=W, window_buckets=10)
    t_start = time.monotonic_ns() + 100 * MS
    run = 3 * S
    shapes = [(0.012, 0.020), (0.006, 0.020), (0.009, 0.020)]  # 60 %, 30 %, 45 % busy
    pipes = []
    for i, (hold, period) in enumerate(shapes):
        a, b = procs.ctx.Pipe(duplex=False)
        # Each worker talks to the shared pod 0 and to a pod of its own (1, 2, 3).
        procs.start(holder, namespace, [0, i + 1], hold, period, t_start, run, b)
        pipes.append(a)
    reader = store.reader()
    time.sleep((t_start + 2500 * MS - time.monotonic_ns()) / S)
    during_at = time.monotonic_ns()
    during = reader.read(during_at, 4)  # workers busy, some requests open right now
    intervals = []
    for a in pipes:
        assert a.poll(30)
        intervals.append(a.recv())
    after_at = time.monotonic_ns()
    after = reader.read(after_at, 4)  # everything ended
    for loads, at in ((during, during_at), (after, after_at)):
        truth = [true_occupancy([iv for ivs in intervals for iv in ivs], at, W)]
        truth += [true_occupancy(ivs, at, W) for ivs in intervals]
        for slot, want in enumerate(truth):
            assert want > 0.25
            got = loads.occupancy[slot]
            assert abs(got - want) <= 0.05 * want, (slot, got, want)
    assert during.in_flight[0] <= 3 and after.in_flight.tolist() == [0, 0, 0, 0]
    store.close()


def stuck_worker(ns, conn):
    """Completes some requests, then starts a fan-out that never ends."""
    rec = CounterStore.attach(ns).claim()
    now = time.monotonic_ns()
    rec.record_start([0, 1, 2], now - 300 * MS)
    rec.record_end([0, 1, 2], now - 300 * MS, np.full(3, 200 * MS), now)
    rec.record_start([0, 0, 3, 5], now)
    conn.send(rec.row)
    time.sleep(600)


def test_in_flight_returns_to_exactly_zero_after_workers_are_sigkilled(namespace, procs):
    store = CounterStore.create(namespace, rows=6, columns=8, window_ns=W, window_buckets=10)
    reader = store.reader()
    workers, rows = [], []
    for _ in range(4):
        a, b = procs.ctx.Pipe(duplex=False)
        workers.append(procs.start(stuck_worker, namespace, b))
        assert a.poll(30)
        rows.append(a.recv())
    before = reader.read(time.monotonic_ns(), 8)
    assert before.in_flight.tolist() == [8, 0, 0, 4, 0, 4, 0, 0]
    for p in workers:
        os.kill(p.pid, signal.SIGKILL)
    workers[0].join(10)
    workers[1].join(10)  # the other two stay zombies: dead all the same
    time.sleep(0.05)
    assert reader.read(time.monotonic_ns(), 8).in_flight.sum() == 16  # not reaped yet
    assert sorted(store.reap()) == sorted(rows)
    after = reader.read(time.monotonic_ns(), 8)
    assert after.in_flight.tolist() == [0] * 8
    # Their busy history stays until it ages out: 4 workers x 200 ms on pods 0, 1, 2.
    assert np.allclose(after.occupancy[:3], 4 * 0.2 / 2, rtol=0.01)
    assert after.completed[:3].tolist() == [4, 4, 4]
    assert store.reap() == []
    assert all(not s.claimed for s in store.slots() if s.row in rows)
    store.close()


def test_claiming_reclaims_a_dead_owner_when_every_slot_is_taken(namespace, procs):
    store = CounterStore.create(namespace, rows=2, columns=8)
    workers = []
    for _ in range(2):
        a, b = procs.ctx.Pipe(duplex=False)
        workers.append(procs.start(stuck_worker, namespace, b))
        assert a.poll(30)
        a.recv()
    with pytest.raises(NoFreeSlotError):
        store.claim()
    os.kill(workers[1].pid, signal.SIGKILL)
    workers[1].join(10)
    rec = store.claim()  # no reap() needed
    assert rec.row == 1
    # Only the live worker's fan-out is still open.
    assert store.reader().read(time.monotonic_ns(), 8).in_flight.tolist() == [
        2,
        0,
        0,
        1,
        0,
        1,
        0,
        0,
    ]
    rec.release()
    store.close()


def test_a_reused_pid_is_not_mistaken_for_the_owner(namespace):
    store = CounterStore.create(namespace, rows=1, columns=8)
    rec = store.claim()
    rec.record_start([2, 2], time.monotonic_ns())
    # Pretend the owner died and the kernel gave its PID to this (live) process: same
    # PID, different start time.
    writable_counters(namespace).slots["start_ticks"][0] += 1
    assert store.reap() == [0]
    assert store.reader().read(time.monotonic_ns(), 8).in_flight.sum() == 0
    store.close()


def grower_victim(ns, go, conn):
    rec = CounterStore.attach(ns).claim()
    t = time.monotonic_ns()
    rec.record_start([3, 3], t)
    conn.send("started")
    go.wait(30)
    rec.record_end([3], t, [MS], time.monotonic_ns())  # follows the grown matrix
    rec.record_start([900], time.monotonic_ns())
    conn.send("done")
    time.sleep(600)


def test_a_worker_follows_growth_and_keeps_its_counts(namespace, procs):
    store = CounterStore.create(namespace, rows=2, columns=8)
    go = procs.ctx.Event()
    a, b = procs.ctx.Pipe(duplex=False)
    procs.start(grower_victim, namespace, go, b)
    assert a.poll(30) and a.recv() == "started"
    assert store.ensure_columns(901) >= 901
    go.set()
    assert a.poll(30) and a.recv() == "done"
    loads = store.reader().read(time.monotonic_ns())
    assert loads.in_flight[[3, 900]].tolist() == [1, 1]
    assert loads.completed[3] == 1
    store.close()


def seam_grower(ns, at, conn):
    """Grows the counters and stops at seam ``at`` until SIGKILLed."""

    def hook(point):
        if point == at:
            conn.send("paused")
            time.sleep(600)

    set_seam_hook(hook)
    CounterStore.attach(ns).ensure_columns(500)


@pytest.mark.parametrize("cleaner", ["create", "grow"])
@pytest.mark.parametrize("at", ["counters.grow.switch", "counters.grow.switched"])
def test_a_grower_killed_mid_growth_leaves_nothing_behind(namespace, procs, at, cleaner):
    """a process killed while growing the matrix leaves the new data segment
    (before the switch) or the old one (after it); the next owner taking over, or the
    next grower, removes it. Recorded counts survive either way."""
    store = CounterStore.create(namespace, rows=2, columns=8, window_ns=W, window_buckets=10)
    rec = store.claim()
    rec.record_start([3], time.monotonic_ns())
    a, b = procs.ctx.Pipe(duplex=False)
    grower = procs.start(seam_grower, namespace, at, b)
    assert a.poll(30) and a.recv() == "paused"
    ctl, one, two = (segment_name(namespace, "counters", e) for e in (None, 1, 2))
    assert list_segments(namespace) == [ctl, one, two]
    os.kill(grower.pid, signal.SIGKILL)
    grower.join(10)
    if cleaner == "create":  # an owner restarted with the same geometry takes over
        other = CounterStore.create(namespace, rows=2, columns=8, window_ns=W, window_buckets=10)
    else:  # a process that grows the matrix again
        other = CounterStore.attach(namespace)
        other.ensure_columns(1000)
    current = other.matrix_view().segment
    assert list_segments(namespace) == [ctl, current]
    assert other.reader().read(time.monotonic_ns(), 8).in_flight[3] == 1
    store.close()


@contextlib.contextmanager
def only_free_fds(k):
    """Run the body with exactly ``k`` free file descriptors in this process."""
    used = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 64, hard))
    filler = []
    try:
        while True:
            try:
                filler.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        for _ in range(k):
            os.close(filler.pop())
        yield
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_reaper_that_cannot_read_proc_leaves_live_owners_alone(namespace, procs):
    """with /proc unreadable (here: out of file descriptors), a live worker's
    row must be neither reaped (its in-flight dropped) nor handed to a new claimant."""
    store = CounterStore.create(namespace, rows=1, columns=8, window_ns=W, window_buckets=10)
    a, b = procs.ctx.Pipe(duplex=False)
    worker = procs.start(stuck_worker, namespace, b)
    assert a.poll(30)
    row = a.recv()
    ticks = process_start_ticks(worker.pid)
    before = store.reader().read(time.monotonic_ns(), 8)  # (maps the matrix: one fd fewer)
    with only_free_fds(0):
        try:
            process_start_ticks(worker.pid)
        except ProcessLivenessError as exc:
            unknown = exc
        alive = process_alive(worker.pid, ticks)
        try:
            store.claim()  # cannot even read its own identity: must not claim anything
        except ProcessLivenessError as exc:
            own = exc
    with only_free_fds(1):  # the lock takes the one left; /proc/<pid>/stat cannot open
        reaped = store.reap()
        try:
            store.claim()
            claimed = "claimed a live worker's row"
        except NoFreeSlotError:
            claimed = "refused"
    assert unknown.errno == errno.EMFILE and f"/proc/{worker.pid}/stat" in str(unknown)
    assert alive
    assert own.errno == errno.EMFILE and "/proc/" in str(own)
    assert reaped == [] and claimed == "refused"
    loads = store.reader().read(time.monotonic_ns(), 8)
    assert loads.in_flight.tolist() == before.in_flight.tolist() == [2, 0, 0, 1, 0, 1, 0, 0]
    assert store.slots()[row].claimed and store.slots()[row].pid == worker.pid
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    assert store.reap() == [row]  # once /proc answers, the dead owner is reaped
    store.close()
