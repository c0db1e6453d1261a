"""TableReader(background=True): a new generation is mapped in a thread while table()
keeps returning the previous one, never a table whose buffer is being rewritten."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import lbcore
from lbcore.route import route_ring_set
from shm import SegmentMissingError, TableChecksumError, TableReader, TableWriter
from shm.layout import BUFFER_HEADER_BYTES, TABLES_DATA
from shm.seams import set_seam_hook
from shm.segment import Segment
from tests.background_harness import fork_while_locked, held_background_map

EPS = [f"http://10.7.0.{i}:8080" for i in range(1, 41)]
KEYS = [f"sku-{i}" for i in range(500)]


def _sets() -> list[lbcore.RingSet]:
    rs1 = lbcore.RingSet(EPS[:30])
    rs2 = rs1.scale_up(EPS[30:35], 10**12)
    rs3 = rs2.with_endpoints([*EPS[1:35], *EPS[35:]], 10**12 + 10**9)
    return [rs1, rs2, rs3]


def _writer(namespace: str) -> TableWriter:
    # Room for every generation in one data segment: buffers are reused, never grown.
    return TableWriter(namespace, min_capacity_bytes=8 << 20)


@pytest.fixture
def held():
    """An event the background mapping thread waits for at its first seam."""
    with held_background_map() as gate:
        yield gate


def _until(reader: TableReader, generation: int, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        t = reader.table()
        assert t.valid()
        if t.generation == generation:
            return t
        assert time.monotonic() < deadline, f"still on generation {t.generation}"
        time.sleep(0.002)


def first_while_second_maps(w: TableWriter, r: TableReader, rs1, rs2, checks: int = 1):
    """Publish ``rs1`` (mapped at once: nothing to fall back on), then ``rs2``; the reader
    answers the first ``checks`` times while the held thread has the second to map.
    Returns the first."""
    w.publish(rs1)
    t1 = r.table()
    w.publish(rs2)
    for _ in range(checks):
        assert r.table() is t1 and t1.valid()
    return t1


def test_previous_table_serves_while_the_new_one_is_mapped(namespace, held):
    rs1, rs2, _ = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True) as r:
        t1 = first_while_second_maps(w, r, rs1, rs2, checks=5)
        assert t1.generation == 1 and r.mapped_in_background == 0
        held.set()
        t2 = _until(r, 2)
        assert r.mapped_in_background == 1
        assert t2.endpoints == rs2.endpoints
        np.testing.assert_array_equal(
            route_ring_set(t2.ring_set, KEYS, 10**12), route_ring_set(rs2, KEYS, 10**12)
        )
        assert r.table() is t2  # cached from now on


def test_a_rewritten_previous_buffer_waits_for_the_new_generation(namespace, held):
    rs1, rs2, rs3 = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True) as r:
        t1 = first_while_second_maps(w, r, rs1, rs2)  # mapping generation 2 in the background
        w.publish(rs3)  # rewrites t1's buffer
        assert not t1.valid()
        threading.Timer(0.2, held.set).start()
        t0 = time.monotonic()
        t = r.table()  # must not return t1: waits for the background map
        assert time.monotonic() - t0 >= 0.1
        assert t.valid() and t.generation == 3
        assert t.endpoints == rs3.endpoints


def test_a_corrupt_new_generation_is_reported_and_the_old_one_stays_usable(namespace, held):
    rs1, rs2, _ = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True) as r:
        t1 = first_while_second_maps(w, r, rs1, rs2)
        # Damage generation 2 while the thread is held before reading it.
        seg = Segment.attach(t1.segment, writable=True)
        try:
            other = int(seg.header(TABLES_DATA)[f"buffer_offset{1 - t1.buffer}"][0])
            off = other + BUFFER_HEADER_BYTES + 1000
            seg.buf[off] ^= 0x40
        finally:
            seg.close()
        held.set()
        deadline = time.monotonic() + 10
        with pytest.raises(TableChecksumError, match="generation 2: payload checksum"):
            while time.monotonic() < deadline:
                assert r.table() is t1
                time.sleep(0.002)
        assert t1.valid()
        np.testing.assert_array_equal(
            route_ring_set(t1.ring_set, KEYS, 0), route_ring_set(rs1, KEYS, 0)
        )


def test_threads_share_one_background_reader_while_the_writer_publishes(namespace):
    sets = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True) as r:
        w.publish(sets[0])
        r.table()
        stop = threading.Event()
        errors: list[BaseException] = []
        seen: list[list[int]] = [[] for _ in range(4)]

        def reader(out: list[int]) -> None:
            try:
                while not stop.is_set():
                    t = r.table()
                    # A result counts only if the table is still valid afterwards (a
                    # buffer rewritten under the route may even make it raise).
                    try:
                        idx = route_ring_set(t.ring_set, KEYS[:50], 10**12)
                    except Exception:
                        if t.valid():
                            raise
                        continue
                    if t.valid():
                        assert idx.min() >= 0 and idx.max() < len(t.endpoints)
                    out.append(t.generation)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(seen[i],)) for i in range(4)]
        for th in threads:
            th.start()
        try:
            for i in range(1, 40):
                w.publish(sets[i % 3])
                time.sleep(0.003)
        finally:
            final = w.generation
            deadline = time.monotonic() + 10
            while r.table().generation != final and time.monotonic() < deadline:
                time.sleep(0.002)
            stop.set()
            for th in threads:
                th.join(10)
        assert not errors, errors
        for gens in seen:
            assert gens == sorted(gens)  # never back to an older generation
        assert r.table().generation == final
        assert r.mapped_in_background >= 1


def test_generations_up_to_foreground_bytes_are_mapped_at_once(namespace, held):
    rs1, rs2, rs3 = _sets()
    with _writer(namespace) as w:
        w.publish(rs1)
        w.publish(rs2)
        size = w.capacity_bytes()  # every payload here is smaller than the buffers
        with TableReader(namespace, background=True, foreground_bytes=size) as r:
            assert r.table().generation == 2
            w.publish(rs3)
            t3 = r.table()  # at most `size` bytes: mapped by this call, held thread or not
            assert t3.generation == 3 and r.mapped_in_background == 0
            assert t3.endpoints == rs3.endpoints
        with TableReader(namespace, background=True, foreground_bytes=1000) as r:
            t3 = r.table()
            w.publish(rs1)
            assert r.table() is t3  # larger: mapped in the (held) background thread
            held.set()
            assert _until(r, 4).endpoints == rs1.endpoints
            assert r.mapped_in_background == 1


def test_a_due_segment_recheck_does_not_pull_the_map_into_the_foreground(namespace, held):
    rs1, rs2, _ = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True, recheck_s=0.0) as r:
        # The recheck is due on every call: a stat, then the thread.
        first_while_second_maps(w, r, rs1, rs2, checks=5)
        held.set()
        assert _until(r, 2).endpoints == rs2.endpoints
        assert r.mapped_in_background == 1


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)]
)
def test_foreground_bytes_must_be_a_byte_count(namespace, value, error):
    with _writer(namespace) as w:
        w.publish(_sets()[0])
        with pytest.raises(error, match="foreground_bytes must be an int >= 0"):
            TableReader(namespace, background=True, foreground_bytes=value)


def test_a_reader_that_cannot_attach_starts_no_thread(namespace):
    before = threading.active_count()
    for _ in range(5):  # what a worker does every second while discovery is not up yet
        with pytest.raises(SegmentMissingError):
            TableReader(namespace, background=True)
    assert threading.active_count() == before


@pytest.fixture
def reads():
    """Names of the threads that read a table buffer (at the read's first seam)."""
    names: list[str] = []

    def hook(point: str) -> None:
        if point == "tables.read.mapped":
            names.append(threading.current_thread().name)

    set_seam_hook(hook)
    try:
        yield names
    finally:
        set_seam_hook(None)


def test_an_idle_reader_maps_new_generations_ahead_of_its_next_call(namespace, reads):
    rs1, rs2, rs3 = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True, prefetch_s=0.005) as r:
        w.publish(rs1)
        assert r.table().generation == 1
        assert reads == ["MainThread"]  # the first table: mapped by the call
        w.publish(rs2)
        w.publish(rs3)  # the writer reuses generation 1's buffer: the old table is gone
        deadline = time.monotonic() + 10
        while r.mapped_ahead() != 3:
            assert time.monotonic() < deadline, "generation 3 not mapped ahead"
            time.sleep(0.002)
        t = r.table()  # no map, no wait: taken from the background thread
        assert t.generation == 3 and t.endpoints == rs3.endpoints and t.valid()
        assert reads[0] == "MainThread" and set(reads[1:]) == {"cslb-table-map"}
        assert r.table() is t
        n = len(reads)
        time.sleep(0.05)  # idle, nothing new: the thread maps nothing more
        assert len(reads) == n


def test_a_reader_never_called_maps_nothing_ahead(namespace, reads):
    rs1, _, _ = _sets()
    with _writer(namespace) as w, TableReader(namespace, background=True, prefetch_s=0.005):
        w.publish(rs1)
        time.sleep(0.05)
        assert reads == []  # the first table is the caller's (it may never route)


def test_a_child_forked_while_the_map_thread_holds_the_reader_lock_can_read(namespace):
    """The look-ahead thread takes the reader's lock every ``prefetch_s``; a fork at that
    moment must not leave the child a lock nobody releases."""
    with _writer(namespace) as w, TableReader(namespace, background=True) as r:
        w.publish(_sets()[0])
        assert r.table().generation == 1
        assert fork_while_locked(r, lambda r: r.table().generation == 1)
