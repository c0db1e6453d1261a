"""Benchmark of the worker's Router (``python perf/bench_router.py [--quick]``).

Prints, each next to a baseline measured in the same run:

1. per-batch cost of ``Router.route`` (100 keys, cached load snapshot) against the
   kernel alone (``Plan.route`` on the router's own plan), against a router that reads
   a fresh load snapshot and builds a new plan for every batch (``refresh_s=0``), with
   ejected endpoints too; and the share of the batch cost spent checking that the
   snapshot is current and counting the decisions;
1b. a worker routing at 100, 1,000 and 2,500 batches per second (a simulated clock,
   so the CPU never sleeps between batches) with the default refresh cadence, on a
   steady and on a busy host, against the same worker with a 60 s cadence: mean cost
   per batch with the refreshes (load reads and plan builds) included;
2. the cost of one snapshot refresh (summing the counter rows, the load signal, the
   plan build) and what that adds per batch at the default cadence;
3. staleness: while another worker's load changes every few milliseconds, the age of
   the snapshot each batch was routed on and the share of keys whose answer differs
   from the answer on a fresh snapshot at the same instant;
4. ``track()`` of a 100-call fan-out against the bare ``LockedRecorder`` calls.

Every repetition routes a fresh batch (a CPU that sees the same batch again learns it);
figures are medians. Absolute numbers drift by up to 2x on shared machines; the ratios
are what to read. About 40 s on 2 cores (``--quick``: about 15 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid

import numpy as np

import lbcore
from shm import CounterStore, Knobs, LockedRecorder, TableReader, TableWriter
from shm.names import SHM_DIR, unlink_name
from workers.routing.router import LOAD_REFRESH, Router
from workers.routing.snapshot import build_plan

BATCH = 100


def _eps(n: int, salt: int = 0) -> list[str]:
    return [f"http://10.{salt}.{i // 250}.{i % 250 + 1}:8080" for i in range(n)]


def _batches(count: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10**9, count * BATCH)
    return [[f"AD{x:09d}-K11" for x in ids[i * BATCH : (i + 1) * BATCH]] for i in range(count)]


def _per_batch_us(fn, batches: list[list[str]], repeat: int = 5) -> float:
    """Median over ``repeat`` passes of the mean µs per batch (fresh batches each call)."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for b in batches:
            fn(b)
        runs.append((time.perf_counter() - t0) / len(batches))
    return statistics.median(runs) * 1e6


def _loaded_host(ns: str, n: int, *, ejected: int = 0, signal: str = "effective"):
    """Counters + a table of ``n`` endpoints (10 % fading in, half-way) + load history."""
    store = CounterStore.create(ns, rows=8)
    writer = TableWriter(ns, counters=store)
    now = time.monotonic_ns()
    eps = _eps(n)
    cut = n - n // 10
    rs = lbcore.RingSet(eps[:cut]).scale_up(eps[cut:], now - 15_000_000_000)
    ej = np.zeros(n, dtype=bool)
    ej[:ejected] = True
    writer.publish(rs, ejected=ej, knobs=Knobs(load_signal=signal))
    with TableReader(ns) as reader:
        table_slots = np.array(reader.table().slots, dtype=np.intp)
    # Another worker's history: hot endpoints busy for seconds, some calls still open.
    rec = store.claim()
    rng = np.random.default_rng(7)
    hot = rng.choice(n, max(n // 10, 2), replace=False)
    slots = np.repeat(table_slots[hot], 4)
    rec.record_start(slots, now - 3_000_000_000)
    rec.record_end(slots, now - 3_000_000_000, np.full(slots.size, 2_000_000_000), now)
    rec.record_start(table_slots[hot], now)
    return store, writer, rs, rec


# ------------------------------------------------------------------------------------
# 1. Per-batch cost.


def bench_route(ns: str, quick: bool) -> None:
    print(f"\n== 1. per-batch cost of route(), batch {BATCH}, median µs per batch")
    print(
        f"{'endpoints':>9} {'case':<34} {'router':>8} {'baseline':>9} {'router/base':>11}  baseline"
    )
    count = 300 if quick else 1000
    for n in (100, 1000):
        for ejected in (0, 3):
            sub = f"{ns}{n}e{ejected}"
            store, writer, _rs, rec = _loaded_host(sub, n, ejected=ejected)
            try:
                batches = _batches(count, seed=n + ejected)
                r = Router(sub, refresh_s=60.0)
                fresh = Router(sub, refresh_s=0.0)
                r.route(batches[0])
                plan = r.snapshot().plan
                base = _per_batch_us(plan.route, batches)
                mine = _per_batch_us(r.route, batches)
                label = f"cached snapshot{', 3 ejected' if ejected else ''}"
                print(
                    f"{n:>9} {label:<34} {mine:>8.1f} {base:>9.1f} {mine / base:>11.2f}"
                    "  the kernel alone (Plan.route)"
                )
                if ejected:
                    continue
                per_batch = _per_batch_us(fresh.route, batches[: count // 4], repeat=3)
                print(
                    f"{n:>9} {'fresh snapshot + plan every batch':<34} {per_batch:>8.1f} "
                    f"{mine:>9.1f} {per_batch / mine:>11.2f}  router, cached snapshot"
                )
                # Parts of the batch cost.
                check = _per_batch_us(lambda _b, snapshot=r.snapshot: snapshot(), batches)
                counted = _per_batch_us(lambda _b, rr=r.recording: rr.count(100, 0, 3), batches)
                print(
                    f"{n:>9} {'  of which: snapshot still current':<34} {check:>8.2f} "
                    f"{mine:>9.1f} {check / mine:>11.3f}  share of route()"
                )
                print(
                    f"{n:>9} {'  of which: counting (locked row)':<34} {counted:>8.2f} "
                    f"{mine:>9.1f} {counted / mine:>11.3f}  share of route()"
                )
                r.close()
                fresh.close()
            finally:
                rec.release()
                writer.close()
                store.close()


# ------------------------------------------------------------------------------------
# 1b. A worker at realistic rates with the default cadence.


class _SimClock:
    """CLOCK_MONOTONIC that a benchmark moves: one worker's time between its batches."""

    def __init__(self) -> None:
        self.now = time.monotonic_ns()

    def __call__(self) -> int:
        return self.now


def bench_rates(ns: str, quick: bool) -> None:
    default = float(LOAD_REFRESH.default)
    print(
        f"\n== 1b. a worker routing batches of {BATCH} at a given rate (simulated clock), "
        f"refresh {default:g} s (default)\n   vs 60 s, default knobs (effective load, "
        "bounded 1.25, 10 hops), 10 % fading in; another worker's load\n   changes every "
        "5 ms (busy) or not at all (idle). Mean µs per batch, refreshes (load\n   read and "
        "plan build) included."
    )
    print(
        f"{'endpoints':>9} {'load':<5} {'batch/s':>7} {'default µs':>10} {'60 s µs':>8} "
        f"{'default/60s':>11} {'refreshes':>9}"
    )
    for n in (100, 1000):
        for busy in (False, True):
            for rate in (100, 1000, 2500):
                row = [
                    _median_run(
                        f"{ns}rt{n}{int(busy)}{rate}r{int(r * 10)}", n, busy, rate, r, quick
                    )
                    for r in (default, 60.0)
                ]
                (d_us, d_ref), (c_us, _r) = row
                print(
                    f"{n:>9} {'busy' if busy else 'idle':<5} {rate:>7} {d_us:>10.1f} "
                    f"{c_us:>8.1f} {d_us / c_us:>11.2f} {d_ref:>9}"
                )


def _median_run(
    ns: str, n: int, busy: bool, rate: int, refresh: float, quick: bool
) -> tuple[float, int]:
    """:func:`_rate_run` repeated (3 times, once with ``--quick``): the median cost."""
    runs = [_rate_run(f"{ns}x{k}", n, busy, rate, refresh, quick) for k in range(1 if quick else 3)]
    return sorted(runs)[len(runs) // 2]


def _rate_run(
    ns: str, n: int, busy: bool, rate: int, refresh: float, quick: bool
) -> tuple[float, int]:
    store, writer, _rs, rec = _loaded_host(ns, n)
    other = store.claim()
    clock = _SimClock()
    try:
        r = Router(ns, refresh_s=refresh, clock=clock)
        slots = np.asarray(r.table().slots, dtype=np.intp)
        rng = np.random.default_rng(n + rate)
        step = 1_000_000_000 // rate
        count = max(int(rate * (0.6 if quick else 1.5)), 300)
        batches = _batches(count, seed=rate)
        for b in _batches(20, seed=rate + 1):  # first-call costs are not the steady state
            clock.now += step
            r.route(b)
        open_: list[tuple[np.ndarray, int]] = []
        next_churn = clock.now
        total = 0.0
        refreshes = 0
        last_snap = None
        for b in batches:
            clock.now += step
            if busy and clock.now >= next_churn:
                # Another worker: fan-outs of 20 calls open ~40 ms, one every 5 ms.
                next_churn = clock.now + 5_000_000
                e = slots[rng.integers(0, n, 20)]
                other.record_start(e, clock.now)
                open_.append((e, clock.now))
                while open_ and clock.now - open_[0][1] >= 40_000_000:
                    e0, t0 = open_.pop(0)
                    other.record_end(e0, t0, np.full(e0.size, clock.now - t0), clock.now)
            t0 = time.perf_counter()
            r.route(b)
            total += time.perf_counter() - t0
            s = r.snapshot()
            if s is not last_snap:
                refreshes += 1
                last_snap = s
        r.close()
        return total / count * 1e6, refreshes
    finally:
        other.release()
        rec.release()
        writer.close()
        store.close()


# ------------------------------------------------------------------------------------
# 2. Refresh cost.


def bench_refresh(ns: str) -> None:
    print("\n== 2. cost of one load-snapshot refresh (8 counter rows in use), median ms")
    print(
        f"{'endpoints':>9} {'read+signal':>11} {'plan build':>10} {'total':>7} "
        f"{'per batch @0.1s, 2,500 batch/s':>31} {'route() µs':>10}"
    )
    for n in (100, 1000):
        sub = f"{ns}rf{n}"
        store, writer, _rs, rec = _loaded_host(sub, n)
        extra = [store.claim() for _ in range(6)]  # 8 rows used in all
        try:
            r = Router(sub, refresh_s=60.0)
            batch = _batches(1, seed=3)[0]
            r.route(batch)
            t = r.table()
            counters = r.counters
            assert counters is not None
            slots = np.array(t.slots, dtype=np.intp)
            reads, builds = [], []
            for _ in range(15):
                now = time.monotonic_ns()
                t0 = time.perf_counter()
                loads = counters.read(now, t.n_slots, failure_kinds=False).take(slots)
                t1 = time.perf_counter()
                build_plan(t, loads, now)
                t2 = time.perf_counter()
                reads.append(t1 - t0)
                builds.append(t2 - t1)
            rd, bd = statistics.median(reads) * 1e3, statistics.median(builds) * 1e3
            route_us = _per_batch_us(r.route, _batches(200, seed=5))
            # A worker at 2,500 requests/s (PERF-NOTES: gunicorn's ceiling per core)
            # routes 250 batches per 0.1 s refresh.
            amort = (rd + bd) * 1e3 / 250
            print(
                f"{n:>9} {rd:>11.3f} {bd:>10.3f} {rd + bd:>7.3f} {amort:>28.2f} µs "
                f"{route_us:>10.1f}"
            )
            r.close()
        finally:
            for e in extra:
                e.release()
            rec.release()
            writer.close()
            store.close()


# ------------------------------------------------------------------------------------
# 3. Staleness.


def bench_staleness(ns: str, seconds: float) -> None:
    default = float(LOAD_REFRESH.default)
    print(
        f"\n== 3. staleness and steady-state cost per cadence (default {default:g} s), "
        "100 endpoints,\n   another worker's load changing every ~5 ms, ~300 batches/s"
    )
    print(
        f"{'signal':<10} {'refresh s':>9} {'age median':>10} {'p99':>6} {'max ms':>7} "
        f"{'keys differing':>14} {'route µs':>8} {'fresh µs':>8} {'fresh/cached':>12}"
    )
    n = 100
    cases = [("in-flight", 0.02), ("in-flight", default), ("in-flight", 0.5)]
    cases.append(("effective", default))
    for k, (signal, refresh) in enumerate(cases):
        sub = f"{ns}st{k}"
        store, writer, _rs, rec = _loaded_host(sub, n, signal=signal)
        stop = threading.Event()
        other = LockedRecorder(store.claim())
        th = threading.Thread(target=_churn, args=(other, n, stop, seconds + 5), daemon=True)
        th.start()
        try:
            r = Router(sub, refresh_s=refresh)
            fresh = Router(sub, refresh_s=0.0)
            batches = _batches(400, seed=9)
            ages: list[float] = []
            cached_t: list[float] = []
            fresh_t: list[float] = []
            diffs = keys_total = i = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                b = batches[i % len(batches)]
                i += 1
                t0 = time.perf_counter()
                idx = r.route(b)
                t1 = time.perf_counter()
                cached_t.append(t1 - t0)
                ages.append((time.monotonic_ns() - r.snapshot().read_ns) / 1e6)
                if i % 5 == 0:
                    t2 = time.perf_counter()
                    other_idx = fresh.route(b)
                    fresh_t.append(time.perf_counter() - t2)
                    diffs += int(np.count_nonzero(idx != other_idx))
                    keys_total += len(b)
                time.sleep(0.003)  # a worker also serves the request, not only routes
            ages.sort()
            mc = statistics.median(cached_t) * 1e6
            mf = statistics.median(fresh_t) * 1e6
            print(
                f"{signal:<10} {refresh:>9g} {statistics.median(ages):>10.1f} "
                f"{ages[int(len(ages) * 0.99)]:>6.1f} {ages[-1]:>7.1f} "
                f"{diffs / keys_total:>13.2%} {mc:>8.1f} {mf:>8.1f} "
                f"{mf / mc:>12.2f}"
            )
            r.close()
            fresh.close()
        finally:
            stop.set()
            th.join(10)
            other.release()
            rec.release()
            writer.close()
            store.close()
    print(
        "   keys differing: share of sampled keys whose answer on the cached snapshot differs\n"
        "   from the answer on a snapshot read at the same instant (refresh_s=0). The\n"
        "   times here are of a worker that sleeps between batches (cold caches), so\n"
        "   they are higher than in section 1; compare them with each other."
    )


def _churn(other: LockedRecorder, n: int, stop: threading.Event, limit_s: float) -> None:
    """Another worker: fan-outs of 20 calls, each open ~40 ms, one started every ~5 ms."""
    rng = np.random.default_rng(11)
    open_: list[tuple[np.ndarray, int]] = []
    deadline = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < deadline:
        now = time.monotonic_ns()
        s = rng.integers(0, n, 20)
        other.record_start(s, now)
        open_.append((s, now))
        if len(open_) > 8:
            s0, t0 = open_.pop(0)
            other.record_end(s0, t0, np.full(s0.size, now - t0), now)
        time.sleep(0.005)
    now = time.monotonic_ns()
    for s0, t0 in open_:
        other.record_end(s0, t0, np.full(s0.size, now - t0), now)


# ------------------------------------------------------------------------------------
# 4. track().


def bench_track(ns: str) -> None:
    print("\n== 4. recording a 100-call fan-out (enter + exit), median µs")
    store, writer, _rs, rec = _loaded_host(f"{ns}tr", 100)
    try:
        r = Router(f"{ns}tr")
        batches = _batches(300, seed=13)
        routed = [r.route_table(b) for b in batches]
        it = iter(routed * 5)

        def tracked(_b) -> None:
            idx, t = next(it)
            with r.track(idx, t):
                pass

        mine = _per_batch_us(tracked, batches)
        raw = r.recorder
        bound = int(r.table().n_slots)
        slots = [np.asarray(t.slots).take(idx).astype(np.int64) for idx, t in routed]
        it2 = iter(slots * 5)

        def bare(_b) -> None:
            s = next(it2)
            now = time.monotonic_ns()
            raw.record_start(s, now, bound=bound)
            raw.record_end(s, now, 1000, time.monotonic_ns(), bound=bound)

        base = _per_batch_us(bare, batches)
        print(
            f"track(): {mine:.1f} µs, bare LockedRecorder calls: {base:.1f} µs, "
            f"ratio {mine / base:.2f}"
        )
        r.close()
    finally:
        rec.release()
        writer.close()
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer batches, shorter staleness run")
    args = ap.parse_args(argv)
    ns = f"bench{os.getpid()}{uuid.uuid4().hex[:4]}"
    try:
        bench_route(ns, args.quick)
        bench_rates(ns, args.quick)
        bench_refresh(ns)
        bench_staleness(ns, 1.0 if args.quick else 2.5)
        bench_track(ns)
    finally:
        for entry in os.listdir(SHM_DIR):
            if entry.startswith(f"cslb.{ns}"):
                unlink_name("/" + entry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
