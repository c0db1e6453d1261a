"""Benchmark of the shared-memory tables and counters (``python perf/bench_shm.py``).

Prints, each next to a baseline measured in the same run:

1. publish time for 100 / 1,000 / 5,000 endpoints (ring-set build + encode + publish),
   the time a worker needs to map a new generation, and the table size;
2. time from publish until a polling reader process routes on the new generation;
3. per-batch overhead of validating the snapshot when nothing changed;
4. cost of recording a 100-call fan-out (start + end), including the gthread choice
   (a row per thread vs one row per process behind a lock);
5. the memory (PSS and RSS) a worker adds by attaching, with several workers attached.

Times are medians (or minima, said so) of repeated runs; absolute numbers drift by up to
2x on shared machines, ratios less. Runs in about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import sys
import threading
import time
import timeit
import uuid

import numpy as np

import lbcore
from lbcore.hashing import digest
from lbcore.route import route_ring_set
from shm import CounterStore, LockedRecorder, TableReader, TableWriter, ThreadRecorder
from shm.names import list_segments, unlink_name


def _eps(n: int, salt: int = 0) -> list[str]:
    return [f"http://10.{salt}.{i // 250}.{i % 250 + 1}:8080" for i in range(n)]


def _keys(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"AD{x:09d}-K11" for x in rng.integers(0, 10**9, n)]


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _best(stmt, number: int, repeat: int = 7) -> float:
    """Best of ``repeat`` runs of ``number`` calls, seconds per call."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


# ------------------------------------------------------------------------------------
# 1. Publish and map.


def bench_publish(ns: str) -> None:
    print("\n== 1. publish (build + encode + publish) and first map by a reader")
    print(
        f"{'endpoints':>9} {'table MiB':>9} {'build ms':>9} {'publish ms':>10} "
        f"{'copy+hash ms':>12} {'publish/copy':>12} {'map ms':>8} {'map/build':>10}"
    )
    with TableWriter(ns) as w:
        reader = TableReader(ns)
        for n in (100, 1000, 5000):
            builds, publishes, maps = [], [], []
            for rep in range(4):
                eps = _eps(n, salt=rep % 2)
                t0 = time.perf_counter()
                rs = lbcore.RingSet(eps[: n - n // 10]).scale_up(eps[n - n // 10 :], 10**12)
                t1 = time.perf_counter()
                w.publish(rs)
                t2 = time.perf_counter()
                t = reader.table()
                t3 = time.perf_counter()
                assert t.generation == w.generation
                if rep:  # the first publish of a size grows the segments: not steady state
                    builds.append(t1 - t0)
                    publishes.append(t2 - t1)
                    maps.append(t3 - t2)
            payload = w.capacity_bytes()
            nbytes = t.payload_bytes
            # Floor: copying the same number of bytes and checksumming them once.
            src = np.frombuffer(os.urandom(nbytes), np.uint8)
            dst = np.empty_like(src)

            def floor(src=src, dst=dst):
                np.copyto(dst, src)
                digest(memoryview(dst))

            copy = _best(floor, 1, 5)
            b, p, m = (statistics.median(x) * 1e3 for x in (builds, publishes, maps))
            print(
                f"{n:>9} {nbytes / 2**20:>9.2f} {b:>9.1f} {p:>10.2f} {copy * 1e3:>12.2f} "
                f"{p / (copy * 1e3):>12.1f} {m:>8.2f} {m / b:>10.2f}"
            )
            del payload
        reader.close()
    print(
        "  build: lbcore.RingSet with a 10 % fading ring (2 rings); publish: encode, write, "
        "checksum,\n  switch; copy+hash: memcpy + XXH3-64 of the same bytes (the floor); map: "
        "a reader's first\n  table() of a new generation (checksum, validation, Ring.from_arrays)"
    )


# ------------------------------------------------------------------------------------
# 2. Publish-to-reader latency.


def _poller(ns: str, final: int, conn) -> None:
    """Route on every new generation until ``final`` (or for 30 s).

    A loaded machine may make it miss some generations; they are left out.
    """
    reader = TableReader(ns)
    keys = _keys(100, 1)
    seen = []
    last = reader.table().generation
    idle_polls = 0
    idle_time = 0.0
    deadline = time.monotonic() + 30
    while last < final and time.monotonic() < deadline:
        t0 = time.perf_counter()
        t = reader.table()
        if t.generation != last:
            route_ring_set(t.ring_set, keys, 0)
            if t.valid():
                seen.append((t.generation, time.monotonic_ns()))
                last = t.generation
        else:
            idle_polls += 1
            idle_time += time.perf_counter() - t0
    conn.send((seen, idle_time / max(idle_polls, 1)))


def bench_latency(ns: str) -> None:
    print("\n== 2. publish -> a polling reader process routes 100 keys on the new generation")
    ctx = multiprocessing.get_context("fork")
    for n in (100, 1000):
        sets = [lbcore.RingSet(_eps(n, salt=s)) for s in range(2)]
        count = 30
        with TableWriter(ns) as w:
            first = w.publish(sets[1])
            a, b = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_poller, args=(ns, first + count, b), daemon=True)
            p.start()
            time.sleep(0.3)
            published = {}
            for i in range(count):
                t0 = time.monotonic_ns()
                g = w.publish(sets[i % 2])
                published[g] = (t0, time.monotonic_ns())
                time.sleep(0.02)
            assert a.poll(60), "the polling reader did not report"
            seen, idle = a.recv()
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join(10)
        after_return = [(ts - published[g][1]) / 1e3 for g, ts in seen]
        after_start = [(ts - published[g][0]) / 1e3 for g, ts in seen]
        missed = f"; {count - len(seen)} of {count} generations missed" if len(seen) < count else ""
        print(
            f"  {n:>5} endpoints: {statistics.median(after_return):8.1f} µs median after "
            f"publish() returned (p90 {np.percentile(after_return, 90):.1f}, max "
            f"{max(after_return):.1f}); {statistics.median(after_start):.1f} µs from its start"
            f"{missed}"
        )
        print(f"         baseline: one poll when nothing changed costs {idle * 1e6:.2f} µs")
    print("  (the reader maps the new generation once: checksum + validation + ring wrapping)")


# ------------------------------------------------------------------------------------
# 3. Validation overhead.


def bench_validation(ns: str) -> None:
    print("\n== 3. per-batch snapshot validation when nothing changed")
    with TableWriter(ns) as w:
        w.publish(lbcore.RingSet(_eps(100)))
        reader = TableReader(ns)
        t = reader.table()
        keys = _keys(100, 2)
        hashes = lbcore.hash_keys(keys)
        check = _best(lambda: reader.table().valid(), 20000)
        table_only = _best(reader.table, 20000)
        valid_only = _best(t.valid, 20000)
        route = _best(lambda: route_ring_set(t.ring_set, None, 0, hashes=hashes), 2000)
        full = _best(lambda: route_ring_set(t.ring_set, keys, 0), 2000)
        reader.close()
    print(f"  reader.table() + table.valid(): {check * 1e9:7.0f} ns per batch (best of 7)")
    print(f"    of which table() {table_only * 1e9:.0f} ns, valid() {valid_only * 1e9:.0f} ns")
    print(
        f"  baseline: routing 100 pre-hashed keys {route * 1e6:.1f} µs -> overhead "
        f"{check / route * 100:.2f} %; hashing + routing 100 keys {full * 1e6:.1f} µs -> "
        f"{check / full * 100:.2f} %"
    )


# ------------------------------------------------------------------------------------
# 4. Recording.


def bench_recording(ns: str) -> None:
    print("\n== 4. recording a 100-call fan-out (record_start + record_end)")
    store = CounterStore.create(ns, rows=16, columns=256)
    rng = np.random.default_rng(3)
    fan = 100
    slots = rng.integers(0, 40, fan)  # 100 calls over 40 pods: repeats, as in a real batch
    durations = rng.integers(1, 50, fan) * 1_000_000
    rec = store.claim()

    def batch():
        now = time.monotonic_ns()
        rec.record_start(slots, now)
        rec.record_end(slots, now, durations, now)

    m = store._ctl.current()
    opens, open_sum, busy, completed, latency = (
        m.block(rec.row, name)
        for name in ("open", "open_start_sum", "busy_ns", "completed", "latency_ns")
    )
    k = store.buckets

    def naive():
        # Baseline: the same counters updated one call at a time from Python.
        now = time.monotonic_ns()
        q = now // store.bucket_ns
        b = q % k
        since = now - q * store.bucket_ns
        for s in slots.tolist():
            opens[b, s] += 1
            open_sum[b, s] += since
        for s, d in zip(slots.tolist(), durations.tolist(), strict=True):
            opens[b, s] -= 1
            open_sum[b, s] -= since
            busy[b, s] += d
            completed[b, s] += 1
            latency[b, s] += d

    t_batch = _best(batch, 2000)
    t_naive = _best(naive, 100)
    print(
        f"  Recorder (one row):       {t_batch * 1e6:7.1f} µs per fan-out "
        f"({t_batch / fan * 1e9:.0f} ns per call)"
    )
    print(
        f"  baseline, a Python loop over the calls: {t_naive * 1e6:.1f} µs "
        f"-> batch is {t_naive / t_batch:.1f}x faster"
    )
    rec.release()

    # gthread: a row per thread vs one row behind a lock.
    locked = LockedRecorder(store.claim())
    per_thread = ThreadRecorder(store)

    def fanouts(r, n):
        for _ in range(n):
            now = time.monotonic_ns()
            r.record_start(slots, now)
            r.record_end(slots, now, durations, now)

    one = {}
    for name, r in (("per-thread rows", per_thread), ("one row + lock", locked)):
        fanouts(r, 10)
        one[name] = _best(lambda r=r: fanouts(r, 1), 2000)
    # Long-lived threads, as in a gthread worker's pool; rounds interleave the two
    # variants (the machine is shared). Round 0 warms up (claims the per-thread rows).
    many: dict[str, list[float]] = {}
    threads, each, rounds = 4, 300, 11
    variants = (("per-thread rows", per_thread), ("one row + lock", locked))
    barrier = threading.Barrier(threads + 1)

    def body() -> None:
        for _ in range(rounds):
            for _, r in variants:
                barrier.wait()
                fanouts(r, each)
                barrier.wait()

    pool = [threading.Thread(target=body) for _ in range(threads)]
    for t in pool:
        t.start()
    for i in range(rounds):
        for name, _ in variants:
            t0 = time.perf_counter()  # before: the workers cannot start until we arrive
            barrier.wait()
            barrier.wait()
            took = (time.perf_counter() - t0) / (threads * each)
            if i:
                many.setdefault(name, []).append(took)
    for t in pool:
        t.join()
    print("  gthread workers (threads of one process):")
    for name in one:
        runs = many[name]
        print(
            f"    {name:16s}: {one[name] * 1e6:6.1f} µs per fan-out from 1 thread (best of 7); "
            f"{threads} threads at once: {statistics.median(runs) * 1e6:6.1f} µs median, "
            f"{min(runs) * 1e6:.1f} best of {len(runs)} rounds"
        )
    locked.release()
    per_thread.release()

    # A ThreadRecorder claims a row on each thread's first call (flock + /proc read):
    # paid once per thread, on whatever request that thread serves first.
    fresh = ThreadRecorder(store)
    claims: list[float] = []

    def first_call() -> None:
        now = time.monotonic_ns()
        t0 = time.perf_counter()
        fresh.record_start(slots, now)
        claims.append(time.perf_counter() - t0)
        fresh.record_end(slots, now, durations, now)

    for _ in range(7):
        t = threading.Thread(target=first_call)
        t.start()
        t.join()
    fresh.release()
    print(
        f"    a new thread's first call (claims its row): {_median_us(claims):.0f} µs median, "
        f"then {one['per-thread rows'] * 1e6:.1f} µs per fan-out"
    )

    reader = store.reader()
    for _ in range(8):
        store.claim().record_start(slots, time.monotonic_ns())
    for cols in (100, 1000):
        store.ensure_columns(cols)
        t_read = _best(lambda c=cols: reader.read(time.monotonic_ns(), c), 200)
        print(
            f"  host-wide read of {cols} endpoint slots over 8 worker rows: {t_read * 1e6:.0f} µs"
        )
    store.close()


# ------------------------------------------------------------------------------------
# 5. Memory.


def _memory() -> dict[str, int]:
    """Rss, Pss and USS (private pages) of this process from smaps_rollup, in bytes."""
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    out["Uss"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def _shm_pss() -> int:
    """PSS of this process's mappings of /dev/shm/cslb.* segments, in bytes."""
    total = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                inside = "/dev/shm/cslb." in line
            elif inside and line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


def _worker_memory(ns: str, ready, go, conn) -> None:
    gc.collect()
    before = _memory()
    reader = TableReader(ns)
    t = reader.table()
    route_ring_set(t.ring_set, _keys(1000, 5), 0)
    rec = CounterStore.attach(ns).claim()
    rec.record_start(t.slots[:100], time.monotonic_ns())
    gc.collect()
    alone = _memory()
    shm_alone = _shm_pss()
    ready.set()
    go.wait(60)
    together = _memory()
    conn.send((before, alone, shm_alone, together, _shm_pss()))
    time.sleep(60)


def bench_memory(ns: str) -> None:
    print("\n== 5. memory a worker adds by attaching (1,000 endpoints, 2 rings)")
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: nothing shared by fork
    counters = CounterStore.create(ns, rows=16)
    eps = _eps(1000)
    rs = lbcore.RingSet(eps[:900]).scale_up(eps[900:], 10**12)
    with TableWriter(ns, counters=counters) as w:
        w.publish(rs)
        payload = TableReader(ns).table().payload_bytes
        workers = 4
        go = ctx.Event()
        procs, pipes = [], []
        for _ in range(workers):
            ready = ctx.Event()
            a, b = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_memory, args=(ns, ready, go, b), daemon=True)
            p.start()
            ready.wait(120)  # one at a time: the first "alone" reading sees only the writer
            procs.append(p)
            pipes.append(a)
        go.set()
        results = [a.recv() for a in pipes]
        for p in procs:
            p.kill()
            p.join(10)
    counters.close()
    mib = 2**20
    print(
        f"  table payload {payload / mib:.1f} MiB (in a buffer of {w.capacity_bytes() / mib:.1f} "
        f"MiB; the writer keeps two); counters {counters.memory_bytes() / mib:.1f} MiB"
    )

    def grew(after, before, key):
        return (after[key] - before[key]) / mib

    before, alone, shm_alone, _, _ = results[0]
    print(
        f"  first worker, only the writer also mapping: RSS +{grew(alone, before, 'Rss'):.1f} "
        f"MiB, PSS +{grew(alone, before, 'Pss'):.1f} MiB, private +"
        f"{grew(alone, before, 'Uss'):.1f} MiB, /dev/shm PSS {shm_alone / mib:.1f} MiB"
    )
    for i, (before, _, _, together, shm) in enumerate(results):
        print(
            f"  worker {i}, {workers} workers attached: RSS +{grew(together, before, 'Rss'):.1f}"
            f" MiB, PSS +{grew(together, before, 'Pss'):.1f} MiB, private +"
            f"{grew(together, before, 'Uss'):.1f} MiB, /dev/shm PSS {shm / mib:.1f} MiB"
        )
    print(
        f"  baseline: a private copy of the table would add {payload / mib:.1f} MiB of PSS to "
        "every worker;\n  shared, the /dev/shm part is divided among the mappers"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", choices=["publish", "latency", "validation", "recording", "memory"]
    )
    args = parser.parse_args(argv)
    version = sys.version.split()[0]
    print(f"shm benchmark: CPython {version}, NumPy {np.__version__}, {os.cpu_count()} CPUs")
    ns = f"bench{os.getpid()}{uuid.uuid4().hex[:4]}"
    steps = {
        "publish": bench_publish,
        "latency": bench_latency,
        "validation": bench_validation,
        "recording": bench_recording,
        "memory": bench_memory,
    }
    try:
        for name, step in steps.items():
            if args.only in (None, name):
                step(ns)
    finally:
        for seg in list_segments(ns):
            unlink_name(seg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
