import math
import os
import random
import re

import numpy as np
import pytest

import lbcore
from lbcore.ejection import Ejections
from lbcore.hashing import digest
from lbcore.route import route_ring_set
from shm import (
    Knobs,
    SegmentLayoutError,
    SegmentMagicError,
    SegmentMissingError,
    SegmentSizeError,
    SegmentVersionError,
    SlotOwnershipError,
    Table,
    TableChecksumError,
    TableInputError,
    TableReader,
    TableWriter,
    WriterBusyError,
    WriterUnusableError,
    list_segments,
    segment_name,
)
from shm.layout import BUFFER_HEADER_BYTES, LAYOUT_VERSION, TABLE_SECTIONS
from shm.names import SHM_DIR
from shm.segment import Segment
from tests.shm_tests.helpers import KEYS
from tests.shm_tests.seams import second_waits_for_first

EPS = [f"http://10.2.0.{i}:8080" for i in range(1, 21)]


def fading_set(t0=10**12):
    rs = lbcore.RingSet(EPS[:12])
    rs = rs.scale_up(EPS[12:16], now_ns=t0)
    return rs.scale_up(EPS[16:], now_ns=t0 + 5 * 10**9)


def data_words(namespace, table):
    """Writable access to the data segment holding ``table`` (to corrupt it on purpose)."""
    return Segment.attach(table.segment, writable=True)


def published(w: TableWriter, namespace: str, **reader_kw) -> tuple[TableReader, Table]:
    """Publish :func:`fading_set` with ``w``; a new reader and the table it maps."""
    w.publish(fading_set())
    reader = TableReader(namespace, **reader_kw)
    return reader, reader.table()


def test_nothing_published_yet_routes_to_fallback(namespace):
    with TableWriter(namespace):
        reader = TableReader(namespace)
        t = reader.table()
        assert t.generation == 0 and t.endpoints == ()
        assert (route_ring_set(t.ring_set, KEYS, 0) == lbcore.FALLBACK).all()
        assert t.valid()


def test_roundtrip_everything_a_worker_needs(namespace):
    rs = fading_set()
    n = len(rs.endpoints)
    zones = [f"eu-central-1{'abc'[i % 3]}" for i in range(n)]
    nodes = [f"node-ü{i}" for i in range(n)]
    ejected = np.zeros(n, bool)
    ejected[[3, 17]] = True
    knobs = Knobs(
        enabled=False,
        percentage=37.5,
        balance_factor=1.3,
        max_hops=4,
        load_signal="occupancy",
        fade_mode="skipper",
    )
    with TableWriter(namespace) as w:
        g = w.publish(
            rs,
            zones=zones,
            nodes=nodes,
            ejected=ejected,
            knobs=knobs,
            now_ns=123_456_789,
        )
        t = TableReader(namespace).table()
    assert g == 1 == t.generation
    assert t.endpoints == rs.endpoints and t.zones == tuple(zones) and t.nodes == tuple(nodes)
    assert np.array_equal(t.ejected, ejected) and not t.outlier_panic
    assert not t.ejections.reason.any() and t.ejections.counts.shape == (n, 3)
    assert t.knobs == knobs
    assert t.published_ns == 123_456_789 and t.publisher_pid == os.getpid()
    assert sorted(t.slots.tolist()) == list(range(n)) and t.n_slots == n
    assert t.ring_set.starts_ns == rs.starts_ns
    assert t.fade_duration_ns == rs.duration_ns and t.fade_exponent == rs.exponent
    assert np.array_equal(t.ring_set.tiers, rs.tiers)
    for name in lbcore.RingSet.__slots__:  # the reader built a complete RingSet
        mine, theirs = getattr(t.ring_set, name), getattr(rs, name)
        if isinstance(theirs, np.ndarray):
            assert np.array_equal(mine, theirs), name
    keys = [f"SKU-{i}" for i in range(3000)]
    for now in (10**12 - 1, 10**12 + 3 * 10**9, 10**12 + 9 * 10**9, 10**12 + 40 * 10**9):
        assert np.array_equal(route_ring_set(t.ring_set, keys, now), route_ring_set(rs, keys, now))
    loads = np.linspace(0, 3, n)
    got = route_ring_set(
        t.ring_set, keys, 10**12 + 9 * 10**9, loads=loads, balance_factor=1.25, max_hops=3
    )
    want = route_ring_set(
        rs, keys, 10**12 + 9 * 10**9, loads=loads, balance_factor=1.25, max_hops=3
    )
    assert np.array_equal(got, want)


def test_ejection_state_roundtrips_and_panic_lifts_the_routing_flags(namespace):
    rs = lbcore.RingSet(EPS[:5])
    state = Ejections.of(
        [0, 2, 0, 1, 0],
        [0, 7 * 10**12, 0, 8 * 10**12, 0],
        [0, 3, 1, 1, 0],
        [0, 0, 5 * 10**12, 0, 0],
        [[0, 0, 0], [1, 2, 0], [1, 0, 0], [1, 0, 0], [0, 0, 4]],
    )
    with TableWriter(namespace) as w:
        w.publish(rs, ejections=state)
        t = TableReader(namespace).table()
        assert t.ejected.tolist() == [False, True, False, True, False] and not t.outlier_panic
        assert t.ejections.equal(state)
        w.publish(rs, ejections=state, outlier_panic=True)
        t = TableReader(namespace).table()
        assert not t.ejected.any() and t.outlier_panic and t.ejections.equal(state)
        w.publish(rs, ejected=[True, False, False, False, False])  # flags alone: no state
        t = TableReader(namespace).table()
        assert t.ejected.tolist()[0] and not t.ejections.reason.any() and not t.outlier_panic


def test_rings_are_zero_copy_views_of_shared_memory(namespace):
    with TableWriter(namespace) as w:
        _reader, t = published(w, namespace)
        # Per-endpoint arrays (slots, ejections) are checked private copies: a process
        # writing the segment after the check must not reach what sizes arrays.
        private = [t.slots, t.ejected, t.ejections.until_ns, t.ejections.counts]
        for arr in private:
            assert not arr.flags.writeable
            assert arr.base is None or arr.base.flags.owndata
        arrays = []
        for ring in t.ring_set.rings:
            arrays += [ring.hashes, ring.owners, ring.buckets]
        for arr in arrays:
            assert not arr.flags.owndata and not arr.flags.writeable
        # Write through another mapping of the segment: every view sees it at once.
        seg = Segment.attach(t.segment, writable=True)
        mapped = t.payload()
        base = mapped.__array_interface__["data"][0]
        for arr in arrays:
            off = arr.__array_interface__["data"][0] - base
            assert 0 <= off < mapped.nbytes
            at = t.buffer_offset + BUFFER_HEADER_BYTES + off  # in the segment
            before = arr.copy()
            seg.buf[at] ^= 0x01
            assert not np.array_equal(arr, before)
            seg.buf[at] ^= 0x01
            assert np.array_equal(arr, before)


def test_empty_ring_set_is_publishable_and_routes_to_fallback(namespace):
    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS[:3]))
        w.publish(lbcore.RingSet(()))
        t = TableReader(namespace).table()
    assert t.generation == 2 and t.endpoints == ()
    assert (route_ring_set(t.ring_set, KEYS, 0) == -1).all()
    assert t.n_slots == 3 and t.slot_freed_ns.tolist() != [-1, -1, -1]


def test_generation_counts_publishes_exactly(namespace):
    with TableWriter(namespace, clock=lambda: 5) as w:
        reader = TableReader(namespace)
        rs = lbcore.RingSet(EPS[:4])
        for i in range(1, 6):
            assert w.publish(rs) == i
            assert reader.generation() == i == reader.table().generation
            w.heartbeat(now_ns=1000 + i)
            w.publish(rs, knobs=Knobs()) if i == 5 else None
        assert reader.generation() == 6
        w.heartbeat(now_ns=99_999)
        assert reader.generation() == 6 and reader.heartbeat_ns() == 99_999
        assert reader.writer_pid() == os.getpid() and reader.writer_alive()


def test_an_unchanged_table_is_not_a_new_generation(namespace):
    clock = [100]
    with TableWriter(namespace, clock=lambda: clock[0]) as w:
        reader = TableReader(namespace)
        rs = fading_set()
        assert w.publish(rs, knobs=Knobs(percentage=50), skip_unchanged=True) == 1
        clock[0] = 200
        same = fading_set()  # rebuilt, equal content
        assert w.publish(same, knobs=Knobs(percentage=50), skip_unchanged=True) == 1
        assert reader.table().generation == 1 and reader.heartbeat_ns() == 200
        assert w.publish(same, knobs=Knobs(percentage=60), skip_unchanged=True) == 2
        zones = ["z"] * len(same.endpoints)
        assert w.publish(same, knobs=Knobs(percentage=60), zones=zones, skip_unchanged=True) == 3
        assert w.publish(same, knobs=Knobs(percentage=60), zones=zones, skip_unchanged=True) == 3
        assert w.publish(same, knobs=Knobs(percentage=60), zones=zones) == 4  # forced
        assert reader.generation() == 4


def _bad_ejections():
    e = Ejections.none(4)
    return Ejections(e.reason, e.until_ns - 1, e.multiplier, e.decay_ns, e.counts)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"knobs": "fast"}, "knobs must be a shm.Knobs"),
        ({"zones": ["a"]}, "zones has 1 entries, expected 4"),
        ({"nodes": ["a", "b", "c", "d\0"]}, "NUL"),
        ({"ejections": "x"}, "ejections must be an lbcore.ejection.Ejections"),
        ({"ejections": Ejections.none(3)}, "ejections has 3 rows for 4 endpoints"),
        ({"ejections": _bad_ejections()}, "ejections: ejection times"),
        ({"ejections": Ejections.none(4), "ejected": [False] * 4}, "not both"),
        ({"ejected": [[True] * 4]}, "ejected has shape"),
        ({"zones": ["a", "b", "c", "\ud800"]}, "not valid Unicode"),
    ],
)
def test_bad_input_publishes_nothing(namespace, kwargs, match):
    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS[:4]))
        with pytest.raises(TableInputError, match=match):
            w.publish(lbcore.RingSet(EPS[:4]), **kwargs)
        assert w.generation == 1
        assert TableReader(namespace).table().generation == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"percentage": 101}, "CSLB_PERCENTAGE=101: expected a percentage from 0 to 100"),
        ({"percentage": math.nan}, "knob percentage is NaN"),
        ({"balance_factor": 0.9}, "CSLB_BALANCE_FACTOR=0.9: expected a number >= 1"),
        ({"max_hops": 0}, "CSLB_MAX_HOPS=0: expected a positive integer"),
        ({"max_hops": 2.5}, "CSLB_MAX_HOPS=2.5"),
        ({"load_signal": "cpu"}, "CSLB_LOAD_SIGNAL='cpu': expected one of"),
        ({"enabled": "maybe"}, "CSLB_ENABLED='maybe': expected true or false"),
        ({"fade_mode": "slow"}, "CSLB_FADE_MODE='slow'"),
    ],
)
def test_knob_validation(kwargs, match):
    with pytest.raises(TableInputError, match=re.escape(match)):
        Knobs(**kwargs)


def test_knob_defaults_are_lbcores():
    from lbcore import knobs

    d = knobs.defaults()
    assert Knobs() == Knobs(**{f: d[f] for f in Knobs.__slots__})
    assert Knobs(enabled="off", percentage="12.5%", max_hops="unlimited") == Knobs(
        enabled=False, percentage=12.5, max_hops=None
    )


def test_publish_rejects_non_ring_sets(namespace):
    with TableWriter(namespace) as w, pytest.raises(TableInputError, match=r"lbcore\.RingSet"):
        w.publish(lbcore.Ring(EPS[:3]))


def test_slots_are_stable_and_reused_only_after_the_window(namespace):
    clock = [0]
    reuse = 12_000_000_000
    with TableWriter(namespace, slot_reuse_ns=reuse, clock=lambda: clock[0]) as w:
        reader = TableReader(namespace)

        def slots_now():
            t = reader.table()
            return dict(zip(t.endpoints, t.slots.tolist(), strict=True))

        w.publish(lbcore.RingSet(EPS[:5]))
        first = slots_now()
        assert sorted(first.values()) == [0, 1, 2, 3, 4]
        clock[0] = 1_000_000_000
        w.publish(lbcore.RingSet(EPS[1:5] + EPS[6:7]))  # EPS[0] leaves, EPS[6] arrives
        second = slots_now()
        assert all(second[ep] == first[ep] for ep in EPS[1:5])
        assert second[EPS[6]] == 5  # slot 0 is still warm: not reused
        clock[0] = 1_000_000_000 + reuse - 1
        w.publish(lbcore.RingSet(EPS[1:5] + EPS[6:8]))
        assert slots_now()[EPS[7]] == 6
        clock[0] = 1_000_000_000 + reuse
        w.publish(lbcore.RingSet(EPS[1:5] + EPS[6:9]))
        assert slots_now()[EPS[8]] == 0  # aged out: reused
        # A pod that leaves and comes back before its slot was reused gets it back.
        w.publish(lbcore.RingSet(EPS[2:5] + EPS[6:9]))
        clock[0] += 1
        w.publish(lbcore.RingSet(EPS[1:5] + EPS[6:9]))
        assert slots_now()[EPS[1]] == first[EPS[1]]
        assert w.n_slots == 7 == reader.table().n_slots


def test_a_second_writer_is_refused_and_a_new_one_continues(namespace):
    rs = lbcore.RingSet(EPS[:6])
    w = TableWriter(namespace)
    w.publish(rs)
    w.publish(lbcore.RingSet(EPS[:7]))
    with pytest.raises(WriterBusyError, match=f"process {os.getpid()} is the table writer"):
        TableWriter(namespace)
    w.close(unlink=False)
    w2 = TableWriter(namespace)
    try:
        assert w2.generation == 2 and w2.recovered is not None
        before = dict(zip(w2.recovered.endpoints, w2.recovered.slots.tolist(), strict=True))
        assert w2.publish(lbcore.RingSet(EPS[:8])) == 3
        t = TableReader(namespace).table()
        after = dict(zip(t.endpoints, t.slots.tolist(), strict=True))
        assert all(after[ep] == s for ep, s in before.items())  # slots survive the takeover
    finally:
        w2.close()


@pytest.mark.parametrize("damage", ["missing", "foreign"])
def test_a_new_writer_replaces_a_lost_or_damaged_data_segment(namespace, damage):
    w = TableWriter(namespace)
    w.publish(lbcore.RingSet(EPS[:5]))
    data = segment_name(namespace, "tables", 1)
    w.close(unlink=False)
    if damage == "missing":
        os.unlink(SHM_DIR + data)
    else:
        seg = Segment.attach(data, writable=True)
        seg.buf[:8] = b"NOTCSLB!"
    with pytest.raises((SegmentMissingError, SegmentMagicError)):
        TableReader(namespace).table()
    with TableWriter(namespace) as w2:
        assert w2.recovered is None and w2.generation == 1  # the count survives in control
        assert w2.publish(lbcore.RingSet(EPS[:6])) == 2
        t = TableReader(namespace).table()
        assert t.generation == 2 and t.segment == segment_name(namespace, "tables", 2)
        assert data not in list_segments(namespace)


def test_close_unlinks_everything_and_mapped_tables_keep_working(namespace):
    w = TableWriter(namespace)
    w.publish(lbcore.RingSet(EPS))
    reader = TableReader(namespace)
    t = reader.table()
    assert not reader.replaced()
    w.close()
    assert list_segments(namespace) == []
    assert reader.replaced()
    assert t.valid()
    assert np.array_equal(
        route_ring_set(t.ring_set, KEYS, 0), route_ring_set(lbcore.RingSet(EPS), KEYS, 0)
    )
    with pytest.raises(SegmentMissingError):
        TableReader(namespace)


def test_capacity_grows_to_new_segments_readers_follow(namespace):
    small = lbcore.RingSet([f"http://10.3.{i // 250}.{i % 250}:80" for i in range(200)])
    with TableWriter(namespace, min_capacity_bytes=4096) as w:
        w.publish(small)
        reader = TableReader(namespace)
        t1 = reader.table()
        seg1 = t1.segment
        cap1 = w.capacity_bytes()
        big_eps = [f"http://10.4.{i // 250}.{i % 250}:80" for i in range(5000)]
        big = lbcore.RingSet(big_eps)
        w.publish(big)
        assert w.capacity_bytes() > cap1
        # 25 % headroom over the payload, no more (no doubling on top).
        payload = reader.table().payload_bytes
        assert payload <= w.capacity_bytes() <= payload * 1.25 + 4096
        t2 = reader.table()
        assert t2.generation == 2 and t2.segment != seg1 and len(t2.endpoints) == 5000
        assert list_segments(namespace) == sorted([segment_name(namespace, "tables"), t2.segment])
        keys = [f"K{i}" for i in range(2000)]
        assert np.array_equal(route_ring_set(t2.ring_set, keys, 0), route_ring_set(big, keys, 0))
        # The old table lives on in its (now unlinked) segment, intact.
        assert t1.valid()
        assert np.array_equal(route_ring_set(t1.ring_set, keys, 0), route_ring_set(small, keys, 0))
        assert w.publish(small) == 3 and reader.table().segment == t2.segment


def test_a_buffer_reused_two_publishes_later_invalidates_tables_on_it(namespace):
    a, b = lbcore.RingSet(EPS[:10]), lbcore.RingSet(EPS[10:])  # same size: no growth
    with TableWriter(namespace) as w:
        reader = TableReader(namespace)
        w.publish(a)
        t = reader.table()
        before = t.ring_set.rings[0].hashes.copy()
        w.publish(b)
        assert t.valid()  # the other buffer was written
        w.publish(b)
        assert not t.valid()  # ours was rewritten
        # The views now show other bytes: routing on them would be wrong.
        assert not np.array_equal(t.ring_set.rings[0].hashes, before)


def test_consistent_retries_a_pass_that_overlapped_a_rewrite(namespace):
    a, b = lbcore.RingSet(EPS[:10]), lbcore.RingSet(EPS[10:])
    with TableWriter(namespace) as w:
        reader = TableReader(namespace)
        w.publish(a)
        calls = []

        def route(t):
            calls.append(t.generation)
            if len(calls) == 1:  # the writer laps us while we route
                w.publish(b)
                w.publish(b)
                return "torn"
            return route_ring_set(t.ring_set, KEYS, 0)

        out = reader.consistent(route)
        assert calls == [1, 3]
        assert np.array_equal(out, route_ring_set(b, KEYS, 0))

        def explode(t):
            if t.generation == 3:
                w.publish(a)
                w.publish(a)
                raise IndexError("garbage index from a rewritten buffer")
            return t.generation

        assert reader.consistent(explode) == 5

        def bug(t):
            raise KeyError("a real bug")

        with pytest.raises(KeyError, match="a real bug"):
            reader.consistent(bug)


def test_writer_in_a_forked_child_is_refused(namespace, procs):
    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS[:3]))
        r, wr = os.pipe()

        def child():
            try:
                w.publish(lbcore.RingSet(EPS[:4]))
                os.write(wr, b"published")
            except WriterUnusableError as exc:
                os.write(wr, str(exc).encode()[:200])

        p = procs.start(child)
        p.join(10)
        msg = os.read(r, 300).decode()
        assert "forked child must create its own writer" in msg
        assert w.generation == 1


# ---------------------------------------------------------------------------------------
# Corrupted and mismatched segments.


def test_flipped_payload_byte_is_a_checksum_error(namespace):
    with TableWriter(namespace) as w:
        _reader, t = published(w, namespace)
        seg = data_words(namespace, t)
        off = t.buffer_offset + BUFFER_HEADER_BYTES + 1000
        seg.buf[off] ^= 0x40
        fresh = TableReader(namespace)
        with pytest.raises(
            TableChecksumError, match=rf"{t.segment}.*generation 1: payload checksum"
        ):
            fresh.table()
        assert t.valid()  # the table already mapped is untouched in its seq, still usable
        w.publish(fading_set())  # the next generation goes to the other buffer and heals it
        assert fresh.table().generation == 2


def test_foreign_control_segment(namespace):
    name = segment_name(namespace, "tables")
    seg = Segment.create(name, 4096)
    seg.array(np.uint8, 0, 4096)[:] = np.frombuffer(os.urandom(4096), np.uint8) | 1
    with pytest.raises(SegmentMagicError, match=f"{name}: does not start with a cslb magic"):
        TableReader(namespace)
    with pytest.raises(SegmentMagicError):
        TableWriter(namespace)
    with TableWriter(namespace, replace_invalid=True) as w:
        assert w.publish(lbcore.RingSet(EPS[:3])) == 1
        assert TableReader(namespace).table().generation == 1


def test_other_layout_version(namespace):
    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS[:3]))
        ctl = Segment.attach(segment_name(namespace, "tables"), writable=True)
        other = LAYOUT_VERSION + 1
        ctl.words[1] = other
        with pytest.raises(
            SegmentVersionError,
            match=f"is layout version {other}, this build reads version {LAYOUT_VERSION}",
        ):
            TableReader(namespace)


def test_truncated_data_segment(namespace):
    with TableWriter(namespace) as w:
        w.publish(lbcore.RingSet(EPS[:3]))
        t = TableReader(namespace).table()
        os.truncate(SHM_DIR + t.segment, 8192)
        with pytest.raises(SegmentSizeError, match=f"{t.segment}: header says"):
            TableReader(namespace).table()


def _rewrite_checksum(reader, t, seg):
    off = t.buffer_offset
    words = seg.words
    n = words[off // 8 + 2]
    start = off + BUFFER_HEADER_BYTES
    words[off // 8 + 3] = digest(seg.buf[start : start + n])


def test_bad_layout_with_a_valid_checksum_is_caught_before_use(namespace):
    with TableWriter(namespace) as w:
        reader, t = published(w, namespace)
        seg = data_words(namespace, t)
        # Make an owner point past the endpoint list, and re-sign the payload as a
        # buggy writer would: the reader must refuse it, not index out of bounds.
        owners = t.ring_set.rings[0].owners
        addr = owners.__array_interface__["data"][0]
        payload_at = t.payload().__array_interface__["data"][0]
        base = payload_at - t.buffer_offset - BUFFER_HEADER_BYTES  # the segment's start
        w32 = seg.array(np.int32, addr - base, 1)
        w32[0] = 999
        _rewrite_checksum(reader, t, seg)
        with pytest.raises(SegmentLayoutError, match="ring 0 owners must be endpoint indices"):
            TableReader(namespace).table()


def test_random_corruption_never_crashes_or_reads_out_of_bounds(namespace):
    """Flip random payload bytes (re-signed so the checks behind the checksum run):
    every read either yields a table that routes, or a SegmentCorruptError."""
    from shm import SegmentCorruptError

    rng = random.Random(1234)
    with TableWriter(namespace) as w:
        w.publish(fading_set(), zones=["z"] * 20)
        reader = TableReader(namespace)
        t = reader.table()
        seg = data_words(namespace, t)
        off = t.buffer_offset + BUFFER_HEADER_BYTES
        n = seg.words[t.buffer_offset // 8 + 2]
        pristine = bytes(seg.buf[off : off + n])
        hot = list(range(0, 1024)) + [rng.randrange(n) for _ in range(200)]
        outcomes = {"ok": 0, "refused": 0}
        for i in range(400):
            seg.buf[off : off + n] = pristine
            for _ in range(rng.choice((1, 1, 2, 8))):
                pos = rng.choice(hot)
                seg.buf[off + pos] = rng.randrange(256)
            _rewrite_checksum(reader, t, seg)
            fresh = TableReader(namespace)
            try:
                table = fresh.table()
                route_ring_set(table.ring_set, KEYS, 10**12 + i * 10**8)
                outcomes["ok"] += 1
            except SegmentCorruptError:
                outcomes["refused"] += 1
            fresh.close()
        assert outcomes["refused"] > 100


def test_threads_share_one_reader_while_the_tables_grow(namespace):
    """a gthread worker's threads share one TableReader. Thread A stops inside
    a remap (current loaded, data segment mapped); the writer grows the tables to a new
    segment; thread B then needs a remap too. B must wait for A (one remap at a time),
    not switch the reader's mappings under A's feet; both end on the new table."""
    small = lbcore.RingSet(EPS[:3], vnodes=5)
    big = lbcore.RingSet([f"http://10.8.{i // 200}.{i % 200}:80" for i in range(400)])
    with TableWriter(namespace, min_capacity_bytes=4096) as w:
        w.publish(small)
        reader = TableReader(namespace)
        results, errors = {}, []

        def run(name):
            try:
                t = reader.table()
                results[name] = (t.generation, len(t.endpoints), t.valid())
            except Exception as exc:
                errors.append((name, exc))

        b_waited = second_waits_for_first(
            "tables.read.mapped",
            lambda: run("a"),
            lambda: run("b"),
            # grows: a new data segment, the old one unlinked
            while_held=lambda: w.publish(big),
        )
        assert errors == []
        assert b_waited, "thread B remapped while thread A was inside a remap"
        assert results == {"a": (2, 400, True), "b": (2, 400, True)}
        keys = [f"K{i}" for i in range(100)]
        assert np.array_equal(
            route_ring_set(reader.table().ring_set, keys, 0), route_ring_set(big, keys, 0)
        )


def test_growth_adds_a_quarter_of_headroom_not_double_the_buffers(namespace):
    """a table that just outgrows its buffers gets new ones 1.25x its size,
    not twice the old ones (both segments exist until the switch: /dev/shm is small)."""
    rs = lbcore.RingSet(EPS[:20], vnodes=50)
    with TableWriter(namespace, min_capacity_bytes=4096) as w:
        w.publish(rs)
        cap = w.capacity_bytes()
        payload = TableReader(namespace).table().payload_bytes
        # Long node names make the next payload ~1.3x the last: just over the capacity.
        pad = "n" * (int(0.3 * payload) // 20)
        w.publish(rs, nodes=[pad] * 20)
        grown = TableReader(namespace).table().payload_bytes
        assert cap < grown < 1.5 * cap  # it did have to grow, a little
        assert grown <= w.capacity_bytes() <= grown * 1.25 + 4096
        assert TableReader(namespace).table().nodes == (pad,) * 20


def test_a_closed_writer_says_so(namespace):
    """a closed writer raises WriterUnusableError (not a recorder's error),
    which old callers catching SlotOwnershipError still catch."""
    w = TableWriter(namespace)
    w.publish(lbcore.RingSet(EPS[:3]))
    w.close()
    with pytest.raises(WriterUnusableError, match=r"table writer of .* is closed") as info:
        w.publish(lbcore.RingSet(EPS[:3]))
    assert isinstance(info.value, SlotOwnershipError)
    with pytest.raises(WriterUnusableError):
        w.heartbeat()


@pytest.mark.parametrize("damage", ["payload", "seq"])
def test_a_corrupt_current_generation_is_judged_once(namespace, monkeypatch, damage):
    """while the current generation stays corrupt, every table() call must
    not check the whole table again (a checksum over megabytes) or wait out the
    timeout: the verdict is kept until the buffer or current changes."""
    from shm import TableUnavailableError
    from shm.seams import set_seam_hook
    from shm.tables import protocol

    checksums = []
    real = protocol.payload_checksum
    monkeypatch.setattr(protocol, "payload_checksum", lambda b: checksums.append(1) or real(b))
    passes = []
    set_seam_hook(lambda point: passes.append(point) if point == "tables.read.mapped" else None)
    try:
        with TableWriter(namespace) as w:
            _reader, t = published(w, namespace, timeout_s=0.2)
            seg = data_words(namespace, t)
            off = t.buffer_offset
            if damage == "payload":
                seg.buf[off + BUFFER_HEADER_BYTES + 1000] ^= 0x40
                error = TableChecksumError
            else:
                seg.words[off // 8] += 1  # an odd seq in the current buffer
                error = TableUnavailableError
            fresh = TableReader(namespace, timeout_s=0.2)
            checksums.clear()
            with pytest.raises(error):
                fresh.table()
            first_checks, first_passes = len(checksums), len(passes)
            for _ in range(5):
                passes.clear()
                with pytest.raises(error):
                    fresh.table()
                assert passes == ["tables.read.mapped"]  # one look, no retries
            assert len(checksums) == first_checks  # no table checked again
            assert first_passes >= 3
            w.publish(fading_set())  # a new generation in the other buffer
            assert fresh.table().generation == 2
    finally:
        set_seam_hook(None)


@pytest.mark.parametrize("fading", [False, True])
def test_every_ring_is_stored_with_its_own_owners_and_no_routing_maps(namespace, fading):
    rs = fading_set() if fading else lbcore.RingSet(EPS)
    with TableWriter(namespace) as w:
        w.publish(rs)
        reader = TableReader(namespace)
        got = reader.table().ring_set
        for a, b in zip(got.rings, rs.rings, strict=True):
            np.testing.assert_array_equal(a.hashes, b.hashes)
            np.testing.assert_array_equal(a.owners, b.owners)
            np.testing.assert_array_equal(a.buckets, b.buckets)
        np.testing.assert_array_equal(
            route_ring_set(got, KEYS, 10**13), route_ring_set(rs, KEYS, 10**13)
        )
        assert not {"ring_pos", "owner_table"} & {name for name, _ in TABLE_SECTIONS}
        reader.close()


@pytest.mark.parametrize("which", ["control", "data"])
def test_a_segment_of_the_layout_before_routing_maps_were_dropped_is_refused(namespace, which):
    """Version 5 tables carried ``ring_pos`` and ``owner_table``; this build reads none."""
    with TableWriter(namespace) as w:
        t = w.publish(lbcore.RingSet(EPS[:3])) and TableReader(namespace).table()
        name = segment_name(namespace, "tables") if which == "control" else t.segment
        seg = Segment.attach(name, writable=True)
        seg.words[1] = 5  # the version word, as a version 5 writer left it
        seg.close()
        with pytest.raises(
            SegmentVersionError,
            match=f"{name}: is layout version 5, this build reads version {LAYOUT_VERSION}",
        ):
            TableReader(namespace).table()


def test_the_checksum_is_xxh3_of_the_payload(namespace):
    with TableWriter(namespace) as w:
        reader, t = published(w, namespace)
        seg = Segment.attach(t.segment)
        off = t.buffer_offset
        n = int(seg.words[off // 8 + 2])
        start = off + BUFFER_HEADER_BYTES
        assert int(seg.words[off // 8 + 3]) == digest(seg.buf[start : start + n])
        assert n == t.payload_bytes
        seg.close()
        reader.close()
