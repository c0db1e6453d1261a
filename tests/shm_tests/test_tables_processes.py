"""Tables under real concurrency: reader processes route while writer processes publish,
and writers are SIGKILLed mid-publish."""

import os
import random
import signal
import threading
import time

import numpy as np
import pytest

import lbcore
from lbcore.route import route_ring_set
from shm import TableReader, TableUnavailableError, TableWriter, list_segments, segment_name
from shm.layout import TABLES_CONTROL, TABLES_DATA, word
from shm.seams import set_seam_hook
from shm.segment import Segment
from tests.shm_tests.helpers import VARIANTS, check, expected_routes, publish_generation, variant

RING_SETS = [variant(v) for v in range(VARIANTS)]


def reader_loop(ns, stop, conn, seed):
    """Route and verify continuously until ``stop``; report what was seen."""
    rng = random.Random(seed)
    routes = expected_routes()
    reader = TableReader(ns, timeout_s=10)
    stats = {"checked": 0, "overlapped": 0, "caught": 0, "distinct": 0, "backwards": 0}
    errors = []
    last = -1
    try:
        while not stop.is_set():
            t = reader.table()
            pause = rng.random()
            if pause < 0.3:  # linger on the table so the writer laps us now and then
                time.sleep(pause / 100)
            try:
                verdict = check(t, routes, RING_SETS)
            except Exception as exc:  # garbage from a rewritten buffer may raise
                verdict = f"gen {t.generation}: {exc!r}"
            if not t.valid():
                stats["overlapped"] += 1
                stats["caught"] += verdict is not None  # it was wrong, and we knew
                continue
            stats["checked"] += 1
            if verdict is not None and len(errors) < 10:
                errors.append(verdict)  # a torn read that looked valid: must never happen
            if t.generation < last:
                stats["backwards"] += 1
            if t.generation != last:
                stats["distinct"] += 1
            last = t.generation
    except TableUnavailableError as exc:
        errors.append(repr(exc))
    stats["last"] = last
    stats["errors"] = errors
    conn.send(stats)


def writer_run(ns, generations, conn):
    w = TableWriter(ns, min_capacity_bytes=4096)
    for _ in range(generations):
        publish_generation(w, RING_SETS)
        # A reader needs one buffer to stay put while it maps a new generation (up to
        # ~0.9 ms for these tables, most of it lbcore.Ring.from_arrays): a writer that
        # never pauses starves readers, which is not what this test is about (real
        # publishes are seconds apart). Readers linger on tables to get lapped instead.
        time.sleep(0.0007)
    conn.send(w.generation)
    w.close(unlink=False)


def start_readers(procs, ns, n):
    stop = procs.ctx.Event()
    pipes = []
    for i in range(n):
        a, b = procs.ctx.Pipe(duplex=False)
        procs.start(reader_loop, ns, stop, b, i)
        pipes.append(a)
    return stop, pipes


def collect(stop, pipes):
    stop.set()
    out = []
    for a in pipes:
        assert a.poll(30), "a reader did not report"
        out.append(a.recv())
    return out


def seed_namespace(ns):
    w = TableWriter(ns, min_capacity_bytes=4096)
    publish_generation(w, RING_SETS)
    w.close(unlink=False)


def test_readers_never_see_a_torn_table_while_thousands_of_generations_are_published(
    namespace, procs
):
    seed_namespace(namespace)
    stop, pipes = start_readers(procs, namespace, 2)
    time.sleep(0.2)
    a, b = procs.ctx.Pipe(duplex=False)
    writer = procs.start(writer_run, namespace, 2000, b)
    assert a.poll(120), "writer did not finish"
    final = a.recv()
    writer.join(10)
    time.sleep(0.1)
    stats = collect(stop, pipes)
    assert final == 2001
    for s in stats:
        assert s["errors"] == [], s
        assert s["backwards"] == 0, s
        assert s["last"] == final, s
        assert s["checked"] > 100 and s["distinct"] > 20, s
    # The readers really did overlap rewrites, and caught every one that mattered.
    assert sum(s["overlapped"] for s in stats) > 0, stats
    assert sum(s["caught"] for s in stats) > 0, stats


def killable_writer(ns, conn, inside=None, skip=0):
    """Publishes until SIGKILLed. With ``inside`` (an event), the ``skip``-th publish
    after the first stops where its payload is written and its seq still odd (seam
    ``tables.publish.writing``), sets ``inside`` and waits there for the SIGKILL."""
    w = TableWriter(ns)
    conn.send(w.generation)
    conn.send(publish_generation(w, RING_SETS))
    if inside is not None:
        left = [skip]

        def hook(point):
            if point == "tables.publish.writing":
                if left[0] == 0:
                    inside.set()
                    threading.Event().wait(60)  # (the test kills this process meanwhile)
                left[0] -= 1

        set_seam_hook(hook)
    while True:
        publish_generation(w, RING_SETS)


def idle_buffer_seq(ns):
    """``seq`` of the buffer the writer writes next (odd: a publish is under way)."""
    ctl = Segment.attach(segment_name(ns, "tables"))
    cur = ctl.words[word(TABLES_CONTROL, "current")]
    data = Segment.attach(f"{ctl.name}.{cur >> 1}")
    idle = 1 - (cur & 1)
    off = data.words[word(TABLES_DATA, f"buffer_offset{idle}")]
    return data.words[off // 8]


def test_sigkilled_writers_leave_the_last_complete_generation(namespace, procs):
    rng = random.Random(42)
    seed_namespace(namespace)
    stop, pipes = start_readers(procs, namespace, 2)
    routes = expected_routes()
    reader = TableReader(namespace)
    last = 1
    mid_publish = 0
    for i in range(100):
        a, b = procs.ctx.Pipe(duplex=False)
        # Half the writers are killed at a random moment, half inside a publish (held at
        # its seam, so the kill lands there however loaded the machine is).
        inside = procs.ctx.Event() if i % 2 else None
        p = procs.start(killable_writer, namespace, b, inside, rng.randrange(3))
        assert a.poll(30), "writer did not start"
        assert a.recv() == last  # the new writer continues the count exactly
        assert a.poll(30)
        assert a.recv() == last + 1
        if inside is not None:
            assert inside.wait(30), "the writer never got inside a publish"
        else:
            time.sleep(rng.uniform(0, 0.004))  # (a random moment, not a wait for anything)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        t = reader.table()
        assert t.valid() and check(t, routes, RING_SETS) is None
        assert t.generation == reader.generation() > last
        assert not reader.writer_alive()
        odd = idle_buffer_seq(namespace) & 1
        assert odd or inside is None, "a kill inside a publish left an even seq"
        mid_publish += odd
        last = t.generation
    stats = collect(stop, pipes)
    for s in stats:
        assert s["errors"] == [] and s["backwards"] == 0, s
        assert s["checked"] > 0, s
    assert mid_publish >= 50, mid_publish  # every held writer's, any random one's
    with TableWriter(namespace) as w:
        assert w.generation == last
        assert publish_generation(w, RING_SETS) == last + 1
        assert check(reader.table(), routes, RING_SETS) is None


def test_writer_killed_while_growing_leaves_an_orphan_the_next_one_replaces(namespace):
    small = lbcore.RingSet([f"http://10.9.0.{i}:80" for i in range(1, 4)], vnodes=5)
    big = lbcore.RingSet([f"http://10.9.1.{i}:80" for i in range(1, 200)])
    with TableWriter(namespace, min_capacity_bytes=4096) as w:
        w.publish(small)
        # What a writer killed between creating the larger segment and switching to it
        # leaves behind: a segment nobody names.
        orphan = Segment.create(segment_name(namespace, "tables", 2), 4096)
        orphan.buf[:8] = b"garbage!"
        reader = TableReader(namespace)
        assert reader.table().generation == 1
        w.publish(big)
        t = reader.table()
        assert t.generation == 2 and t.segment == segment_name(namespace, "tables", 2)
        assert np.array_equal(
            route_ring_set(t.ring_set, ["a", "b"], 0), route_ring_set(big, ["a", "b"], 0)
        )


def test_killed_readers_do_not_disturb_the_writer(namespace, procs):
    seed_namespace(namespace)

    def spin(ns):
        r = TableReader(ns)
        while True:
            route_ring_set(r.table().ring_set, ["x"], 0)

    for _ in range(5):
        p = procs.start(spin, namespace)
        time.sleep(0.02)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    with TableWriter(namespace) as w:
        assert publish_generation(w, RING_SETS) == 2


# ---------------------------------------------------------------------------------------
# Forced interleavings: child processes pause at the protocol's seams (shm.seams.seam).


def _eps_n(n, salt=7):
    return [f"http://10.{salt}.0.{i}:80" for i in range(1, n + 1)]


def seam_reader(ns, paused, go, conn):
    """Answers each "read" with (generation, endpoints); the first read pauses between
    loading ``current`` and loading the buffer's ``seq`` until ``go``."""
    armed = [True]

    def hook(point):
        if point == "tables.read.mapped" and armed[0]:
            armed[0] = False
            paused.set()
            go.wait(30)

    set_seam_hook(hook)
    reader = TableReader(ns)
    while (cmd := conn.recv()) != "stop":
        assert cmd == "read"
        t = reader.table()
        conn.send((t.generation, len(t.endpoints)))


def seam_writer(ns, conn, resume, at="tables.publish.switch", min_capacity=1 << 20):
    """Publishes ("publish", n, pause) commands; with ``pause`` it stops at seam ``at``
    (default: the new buffer is complete, ``current`` does not name it yet) until
    ``resume`` (or SIGKILL)."""
    armed = [False]

    def hook(point):
        if point == at and armed[0]:
            conn.send("paused")
            resume.wait(30)

    set_seam_hook(hook)
    w = TableWriter(ns, min_capacity_bytes=min_capacity)
    while True:
        _, n, pause = conn.recv()
        armed[0] = pause
        conn.send(w.publish(lbcore.RingSet(_eps_n(n), vnodes=5)))


@pytest.mark.parametrize("writer_fate", ["resumed", "killed"])
def test_a_stalled_reader_never_routes_ahead_of_current(namespace, procs, writer_fate):
    """Regression: a reader stalls after loading ``current`` (naming buffer
    X at generation 2) while the writer publishes 3 into Y and completes 4 in X but has
    not yet switched ``current``. The reader must not take generation 4 from X: it is
    not current yet, the next call would go back to 3, and if the writer dies there a
    new writer publishes a different generation 4."""
    ctx = procs.ctx
    resume = ctx.Event()
    wconn, wchild = ctx.Pipe()
    writer = procs.start(seam_writer, namespace, wchild, resume)  # 1 MiB: no growth

    def publish(n, pause=False):
        wconn.send(("publish", n, pause))
        assert wconn.poll(30)
        return wconn.recv()

    assert publish(4) == 1 and publish(5) == 2  # current: buffer 1, generation 2
    paused, go = ctx.Event(), ctx.Event()
    rconn, rchild = ctx.Pipe()
    procs.start(seam_reader, namespace, paused, go, rchild)
    rconn.send("read")
    assert paused.wait(30), "the reader did not reach the seam"
    assert publish(6) == 3  # into buffer 0; current names it
    wconn.send(("publish", 7, True))  # generation 4 into buffer 1, not yet current
    assert wconn.poll(30) and wconn.recv() == "paused"
    go.set()
    seen = []
    assert rconn.poll(30)
    seen.append(rconn.recv())
    rconn.send("read")
    assert rconn.poll(30)
    seen.append(rconn.recv())
    if writer_fate == "killed":
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(10)
        with TableWriter(namespace) as w2:
            assert w2.generation == 3
            assert w2.publish(lbcore.RingSet(_eps_n(8), vnodes=5)) == 4
            rconn.send("read")
            assert rconn.poll(30)
            seen.append(rconn.recv())
            w2.close(unlink=False)
        want_last = (4, 8)
    else:
        resume.set()
        assert wconn.poll(30) and wconn.recv() == 4
        rconn.send("read")
        assert rconn.poll(30)
        seen.append(rconn.recv())
        want_last = (4, 7)
    rconn.send("stop")
    gens = [g for g, _ in seen]
    assert gens == sorted(gens), f"generations went backwards: {seen}"
    assert len({g: n for g, n in seen}) == len(set(seen)), f"a generation named two tables: {seen}"
    assert seen == [(3, 6), (3, 6), want_last]


def ask(conn, msg):
    conn.send(msg)
    assert conn.poll(30), f"no answer to {msg!r}"
    return conn.recv()


def test_a_writer_killed_between_current_and_the_generation_word(namespace, procs):
    """``current`` names the new table, the generation word still says the one before:
    the table is published, readers say its generation, and the next writer counts on
    from it (never a second, different table under the same generation)."""
    resume = procs.ctx.Event()
    wconn, wchild = procs.ctx.Pipe()
    writer = procs.start(seam_writer, namespace, wchild, resume, "tables.publish.current")
    assert ask(wconn, ("publish", 3, False)) == 1
    assert ask(wconn, ("publish", 4, True)) == "paused"
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(10)
    reader = TableReader(namespace)
    try:
        t = reader.table()
        assert (t.generation, len(t.endpoints)) == (2, 4)
        assert reader.generation() == 2
        with TableWriter(namespace) as w2:
            assert w2.generation == 2
            assert TableReader(namespace).generation() == 2  # the word is repaired
            assert w2.publish(lbcore.RingSet(_eps_n(5), vnodes=5)) == 3
            t = reader.table()
            assert (t.generation, len(t.endpoints)) == (3, 5)
            w2.close(unlink=False)
    finally:
        reader.close()


@pytest.mark.parametrize("at", ["tables.publish.switch", "tables.publish.switched"])
def test_a_writer_killed_while_growing_leaves_nothing_behind_its_successor(namespace, procs, at):
    """killed between creating the larger segment and switching to it, a
    writer leaves the new segment; killed after the switch, the old one. The next
    writer removes whichever the control segment does not name."""
    resume = procs.ctx.Event()
    wconn, wchild = procs.ctx.Pipe()
    writer = procs.start(seam_writer, namespace, wchild, resume, at, 4096)
    assert ask(wconn, ("publish", 3, False)) == 1
    ctl, one, two = (segment_name(namespace, "tables", e) for e in (None, 1, 2))
    assert ask(wconn, ("publish", 300, True)) == "paused"  # growing into epoch 2
    assert list_segments(namespace) == [ctl, one, two]
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(10)
    reader = TableReader(namespace)
    survivor, stale = (one, two) if at == "tables.publish.switch" else (two, one)
    assert reader.table().segment == survivor
    assert reader.table().generation == (1 if survivor == one else 2)
    with TableWriter(namespace) as w:
        assert w.removed_stale == [stale]
        assert list_segments(namespace) == [ctl, survivor]
        big = lbcore.RingSet(_eps_n(300), vnodes=5)
        g = w.publish(big)
        t = reader.table()
        assert t.generation == g and np.array_equal(
            route_ring_set(t.ring_set, ["k"], 0), route_ring_set(big, ["k"], 0)
        )
        assert list_segments(namespace) == [ctl, t.segment]


def stoppable_writer(ns, n, conn):
    """Creates the writer, then publishes ``n`` endpoints on "publish", closes cleanly
    (removing the segments) on "close"."""
    w = TableWriter(ns)
    conn.send("created")
    while (cmd := conn.recv()) != "close":
        assert cmd == "publish"
        conn.send(w.publish(lbcore.RingSet(_eps_n(n, salt=n), vnodes=5)))
    w.close()
    conn.send("closed")


def test_readers_follow_a_writer_that_was_stopped_and_started_again(namespace, procs):
    """a writer that stops cleanly removes its segments; the next one creates
    new ones under the same names, its first generation in the same buffer with the
    same seq. A reader keeps its last table meanwhile and then follows the new writer
    by itself (it must not mistake the new buffer for the one it cached)."""
    a, child = procs.ctx.Pipe()
    first = procs.start(stoppable_writer, namespace, 4, child)
    assert a.poll(30) and a.recv() == "created"
    assert ask(a, "publish") == 1
    reader = TableReader(namespace, recheck_s=0.02)
    old = reader.table()
    assert old.generation == 1 and len(old.endpoints) == 4
    assert ask(a, "close") == "closed"
    first.join(10)
    assert list_segments(namespace) == [] and reader.replaced()
    time.sleep(0.05)
    assert reader.table() is old and old.valid()  # nothing to follow: keep routing
    b, child = procs.ctx.Pipe()
    procs.start(stoppable_writer, namespace, 6, child)
    assert b.poll(30) and b.recv() == "created"
    time.sleep(0.05)
    assert reader.table() is old  # the new writer has published nothing yet
    assert reader.reattached == 0
    assert ask(b, "publish") == 1
    deadline = time.monotonic() + 10
    while reader.table() is old and time.monotonic() < deadline:
        time.sleep(0.005)
    t = reader.table()
    assert (t.generation, len(t.endpoints)) == (1, 6)
    want = route_ring_set(lbcore.RingSet(_eps_n(6, salt=6), vnodes=5), ["a", "b", "c"], 0)
    assert np.array_equal(route_ring_set(t.ring_set, ["a", "b", "c"], 0), want)
    assert reader.reattached == 1 and not reader.replaced()
    assert reader.writer_alive() and reader.generation() == 1
    assert old.valid() and len(old.endpoints) == 4  # the old table is still intact
    ask(b, "close")


def creator_stopped_at(ns, at, kind, conn):
    """Creates the tables (or counters) of ``ns`` and stops at seam ``at`` until killed."""
    from shm import CounterStore

    def hook(point):
        if point == at:
            conn.send("paused")
            time.sleep(600)

    set_seam_hook(hook)
    if kind == "tables":
        TableWriter(ns)
    else:
        CounterStore.create(ns, rows=2, columns=8)


@pytest.mark.parametrize(
    "kind, at",
    [
        ("tables", "segment.created"),
        ("tables", "tables.control.init"),
        ("counters", "segment.created"),
        ("counters", "counters.control.init"),
    ],
)
def test_a_creator_killed_mid_creation_does_not_block_the_next(namespace, procs, kind, at):
    """killed after creating the control segment but before sizing it, or
    before writing its magic (written last), a creator leaves an unfinished segment; the
    next one, holding the lock, finishes the job instead of calling it foreign."""
    from shm import CounterStore

    a, b = procs.ctx.Pipe(duplex=False)
    creator = procs.start(creator_stopped_at, namespace, at, kind, b)
    assert a.poll(30) and a.recv() == "paused"
    os.kill(creator.pid, signal.SIGKILL)
    creator.join(10)
    name = segment_name(namespace, kind)
    assert name in list_segments(namespace)  # unfinished: 0 bytes, or magic 0
    if kind == "tables":
        with TableWriter(namespace) as w:
            assert w.publish(lbcore.RingSet(_eps_n(3), vnodes=5)) == 1
            assert TableReader(namespace).table().generation == 1
    else:
        store = CounterStore.create(namespace, rows=2, columns=8)
        store.claim().record_start([3], 0)
        assert CounterStore.attach(namespace).reader().read(0, 8).in_flight[3] == 1
        store.close()
