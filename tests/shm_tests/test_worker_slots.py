"""Slots a prefork master reserves for its workers, lifetime totals and decision counts.

Real processes (fork children, SIGKILLed) on real POSIX shared memory.
"""

import os
import signal
import time

import numpy as np
import pytest

from lbcore.knobs import KnobError
from shm import (
    SHM_NAMESPACE,
    CounterInputError,
    CounterStore,
    NoFreeSlotError,
    SlotOwnershipError,
    shm_namespace,
)
from shm.layout import STATS_FIELDS

S = 1_000_000_000
MS = 1_000_000

ZERO_STATS = dict.fromkeys(STATS_FIELDS, 0)


def _adopt_and_hold(ns, row, slots, conn):
    """A forked worker: adopt the reserved row, open a fan-out, report, then wait."""
    rec = CounterStore.attach(ns).claim(row=row)
    now = time.monotonic_ns()
    rec.record_start(slots, now)
    rec.count(len(slots) + 2, fallbacks=2, moves=1)
    conn.send((rec.row, os.getpid()))
    time.sleep(60)


def _try_adopt(ns, row, conn):
    try:
        rec = CounterStore.attach(ns).claim(row=row)
        conn.send(("adopted", rec.row))
    except SlotOwnershipError as exc:
        conn.send(("refused", str(exc)))


def _reserve_and_wait(ns, conn):
    conn.send(CounterStore.attach(ns).reserve())
    time.sleep(60)


def test_a_forked_worker_adopts_the_row_its_master_reserved(namespace, procs):
    store = CounterStore.create(namespace, rows=4, columns=8)
    store.claim()  # row 0 taken by someone else
    row = store.reserve()
    assert row == 1
    info = store.slots()[row]
    assert info.reserved and not info.claimed and info.pid == os.getpid()
    a, b = procs.ctx.Pipe(duplex=False)
    p = procs.start(_adopt_and_hold, namespace, row, [3, 3, 5], b)
    assert a.poll(10)
    got_row, pid = a.recv()
    assert (got_row, pid) == (row, p.pid)
    info = store.slots()[row]
    assert info.claimed and not info.reserved and info.pid == p.pid and info.alive
    reader = store.reader()
    loads = reader.read(time.monotonic_ns(), 8)
    assert loads.in_flight[3] == 2 and loads.in_flight[5] == 1
    assert reader.stats() == {**ZERO_STATS, "decisions": 5, "fallbacks": 2, "moves": 1}
    # SIGKILL the worker mid-request; the master's child_exit releases its row.
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert store.release(row, p.pid) is True
    info = store.slots()[row]
    assert not info.claimed and not info.reserved
    loads = reader.read(time.monotonic_ns(), 8)
    assert loads.in_flight.sum() == 0
    # Counted decisions survive the worker and its row's release.
    assert reader.stats() == {**ZERO_STATS, "decisions": 5, "fallbacks": 2, "moves": 1}
    # Releasing again, or a row held by another pid, frees nothing.
    assert store.release(row, p.pid) is False
    assert store.release(0, p.pid) is False and store.slots()[0].claimed


def test_only_the_reservers_child_may_adopt_the_row(namespace, procs):
    store = CounterStore.create(namespace, rows=4, columns=8)
    a, b = procs.ctx.Pipe(duplex=False)
    procs.start(_reserve_and_wait, namespace, b)  # another master reserves row 0
    assert a.poll(10)
    foreign = a.recv()
    with pytest.raises(SlotOwnershipError, match=f"row {foreign} .* not reserved for process"):
        store.claim(row=foreign)
    # A child of ours cannot adopt a row reserved by a sibling process either.
    c, d = procs.ctx.Pipe(duplex=False)
    procs.start(_try_adopt, namespace, foreign, d)
    assert c.poll(10)
    verdict, msg = c.recv()
    assert verdict == "refused" and "reserved by pid" in msg
    # Free, claimed and out-of-range rows are refused with what they are.
    free = next(s.row for s in store.slots() if not s.claimed and not s.reserved)
    with pytest.raises(SlotOwnershipError, match="it is free"):
        store.claim(row=free)
    with pytest.raises(SlotOwnershipError, match="out of range"):
        store.claim(row=9)
    with pytest.raises(SlotOwnershipError, match="must be an integer"):
        store.claim(row=True)
    assert not any(s.claimed for s in store.slots())  # nothing was claimed by the refusals


def test_a_child_that_dies_before_adopting_frees_its_reserved_row(namespace, procs):
    store = CounterStore.create(namespace, rows=2, columns=8)
    r0, r1 = store.reserve(), store.reserve()
    assert {r0, r1} == {0, 1}
    with pytest.raises(NoFreeSlotError):
        store.reserve()  # both rows held by this (live) process
    p = procs.start(time.sleep, 60)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert store.release(r1, p.pid) is True  # still reserved by us: freed
    assert store.reserve() == r1


def test_reap_frees_rows_whose_reserver_died(namespace, procs):
    store = CounterStore.create(namespace, rows=2, columns=8)
    a, b = procs.ctx.Pipe(duplex=False)
    p = procs.start(_reserve_and_wait, namespace, b)
    assert a.poll(10)
    row = a.recv()
    assert store.reap() == []  # reserver alive: kept
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert store.reap() == [row]
    assert not store.slots()[row].reserved


def test_request_totals_outlive_the_window_and_survive_growth(namespace):
    store = CounterStore.create(namespace, rows=2, columns=8, window_ns=2 * S, window_buckets=2)
    rec = store.claim()
    t = 10 * S
    rec.record_start([1, 1, 2], t)
    rec.record_end([1, 1, 2], t, [MS, MS, MS], t + MS, failed=[True, False, True])
    # A call spanning buckets takes the general path; it counts too.
    rec.record_start([2], t + MS)
    rec.record_end([2], t + MS, [3 * S], t + 3 * S + MS)
    reader = store.reader()
    later = reader.read(t + 60 * S, 8)  # long after the window
    assert later.completed.sum() == 0
    assert later.requests_total.tolist()[:3] == [0, 2, 2]
    assert later.failures_total.tolist()[:3] == [0, 1, 1]
    taken = later.take(np.array([2, 1, 40]))  # slot 40: beyond this snapshot, idle
    assert taken.requests_total.tolist() == [2, 2, 0]
    assert taken.failures_total.tolist() == [1, 1, 0]
    store.ensure_columns(100)
    rec.record_start([90], t + 61 * S)
    rec.record_end([90], t + 61 * S, [MS], t + 61 * S + MS)
    grown = reader.read(t + 62 * S)
    assert grown.requests_total[[1, 2, 90]].tolist() == [2, 2, 1]
    assert grown.failures_total[[1, 2, 90]].tolist() == [1, 1, 0]


def test_decision_counts_add_up_over_rows_and_reuse(namespace, procs):
    store = CounterStore.create(namespace, rows=2, columns=8)
    reader = store.reader()
    assert reader.stats() == ZERO_STATS
    rec = store.claim()
    rec.count(100, 3, 7)
    rec.count(np.int64(10))
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(CounterInputError, match="integers >= 0"):
            rec.count(bad)
    assert reader.stats() == {**ZERO_STATS, "decisions": 110, "fallbacks": 3, "moves": 7}
    rec.tally("retries", 4)
    rec.tally("bulkhead_rejections", np.int64(2))
    for field, bad in (("retries", -1), ("retries", 1.5), ("retries", True), ("nope", 1)):
        with pytest.raises(CounterInputError, match=r"integers >= 0|unknown stats field"):
            rec.tally(field, bad)
    want = {**ZERO_STATS, "decisions": 110, "fallbacks": 3, "moves": 7}
    assert reader.stats() == {**want, "retries": 4, "bulkhead_rejections": 2}
    rec.release()
    again = store.claim()  # same row reused: the totals carry on, never reset
    assert again.row == rec.row
    again.count(1, 1, 0)
    store.ensure_columns(64)  # growth copies the row's totals
    assert reader.stats() == {
        **want,
        "decisions": 111,
        "fallbacks": 4,
        "retries": 4,
        "bulkhead_rejections": 2,
    }

    def child():
        again.count(5)  # a forked child must not write its parent's row

    p = procs.start(child)
    p.join(10)
    assert p.exitcode != 0
    assert reader.stats()["decisions"] == 111


def test_the_namespace_setting_is_declared_once_and_validated():
    assert SHM_NAMESPACE.env == "CSLB_SHM_NAMESPACE" and SHM_NAMESPACE.default == "default"
    assert shm_namespace({}) == "default"
    assert shm_namespace({"CSLB_SHM_NAMESPACE": " blue-1 "}) == "blue-1"
    with pytest.raises(KnobError, match="CSLB_SHM_NAMESPACE"):
        shm_namespace({"CSLB_SHM_NAMESPACE": "a/b"})
    from discovery import settings

    assert settings.SHM_NAMESPACE is SHM_NAMESPACE


def _claim_and_hold(ns, slots, conn):
    rec = CounterStore.attach(ns).claim()
    if slots:
        rec.record_start(slots, time.monotonic_ns())
    conn.send(rec.row)
    time.sleep(60)


def test_reserving_a_dead_owners_row_releases_its_in_flight(namespace, procs):
    store = CounterStore.create(namespace, rows=1, columns=8)
    a, b = procs.ctx.Pipe(duplex=False)
    p = procs.start(_claim_and_hold, namespace, [2, 2, 5], b)
    assert a.poll(10) and a.recv() == 0
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)  # waited for: an ordinary dead owner
    assert store.reader().read(time.monotonic_ns()).in_flight.sum() == 3
    assert store.reserve() == 0
    assert store.reader().read(time.monotonic_ns()).in_flight.sum() == 0


def test_a_late_child_exit_cannot_free_the_row_reserved_for_the_next_child(namespace):
    """gunicorn: worker A dies; if the master forks B (pre_fork -> reserve) before it has
    waited for A, A's row is not handed to B: A's child_exit would free it under B."""
    store = CounterStore.create(namespace, rows=2, columns=8)
    store.claim()  # row 0 held by a live process (us)
    pid = os.fork()
    if pid == 0:  # worker A: claim, then die at once
        try:
            CounterStore.attach(namespace).claim()
        finally:
            os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # A exited but is not waited for: a zombie child
        if not store.slots()[1].alive and store.slots()[1].pid == pid:
            break
        time.sleep(0.01)
    try:
        with pytest.raises(NoFreeSlotError):
            store.reserve()  # A's row is not handed on while its exit is pending
    finally:
        os.waitpid(pid, 0)
    assert store.release(1, pid) is True  # child_exit(A), right after gunicorn's wait
    assert store.reserve() == 1  # now B may have it


def test_a_slot_handed_to_a_new_endpoint_starts_its_totals_at_zero(namespace):
    import lbcore
    from shm import TableReader, TableWriter

    store = CounterStore.create(namespace, rows=2, columns=8, window_ns=2 * S, window_buckets=2)
    writer = TableWriter(namespace, counters=store, slot_reuse_ns=4 * S)
    try:
        a, b, c = "http://10.0.0.1:80", "http://10.0.0.2:80", "http://10.0.0.3:80"
        t = 100 * S
        writer.publish(lbcore.RingSet((a, b)), now_ns=t)
        rec = store.claim()
        rec.record_start([0, 0, 1], t)
        rec.record_end([0, 0, 1], t, [MS] * 3, t + MS, failed=[True, False, False])
        writer.publish(lbcore.RingSet((b,)), now_ns=t + S)  # a leaves: slot 0 freed
        writer.publish(lbcore.RingSet((b, a)), now_ns=t + 2 * S)  # a is back: keeps slot 0
        reader = store.reader()
        assert reader.read(t + 3 * S).requests_total[:2].tolist() == [2, 1]
        writer.publish(lbcore.RingSet((b,)), now_ns=t + 3 * S)  # a leaves again
        writer.publish(lbcore.RingSet((b, c)), now_ns=t + 10 * S)  # c takes slot 0
        with TableReader(namespace) as tables:
            table = tables.table()
            assert int(table.slots[table.endpoints.index(c)]) == 0  # a's old slot
        got = reader.read(t + 10 * S)
        assert got.requests_total[:2].tolist() == [0, 1]
        assert got.failures_total[:2].tolist() == [0, 0]
    finally:
        writer.close()
        store.close()


def test_a_writer_follows_counters_recreated_under_it(namespace):
    import lbcore
    from shm import TableWriter

    first = CounterStore.create(namespace, rows=2, columns=8)
    writer = TableWriter(namespace, counters=first)
    try:
        eps = [f"http://10.0.1.{i}:80" for i in range(4)]
        writer.publish(lbcore.RingSet(eps))
        first.close()  # the owner (a gunicorn master) goes away and removes them
        second = CounterStore.create(namespace, rows=2, columns=8)  # the next one
        many = [f"http://10.0.2.{i}:80" for i in range(40)]
        writer.publish(lbcore.RingSet(eps + many))  # needs 44 slots
        assert second.columns >= 44  # grown: the writer grew the live counters
        second.close()
        writer.publish(lbcore.RingSet(eps))  # no counters at all now: still publishes
        assert writer.generation == 3
    finally:
        writer.close()
