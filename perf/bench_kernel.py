"""Benchmark the kernels alone: one ``Plan.route`` call per batch, against the loop and the floor.

The plan is the worker's: a 100 × 100 or 1,000 × 100 ring set with a ring fading in
(mid-fade), bounded load (balance factor 1.25, hop cap 10) with 10 % of the endpoints
over the bar, the gate on (every key through it). Keys: 13-character SKU strings (a
list of ``str``) and int64 IDs (a NumPy array), at batch 1, 100 and 100,000, each timed
call on a fresh batch, one core pinned, medians. Then the time to build such a plan
(one per load snapshot on a worker) at 100, 1,000 and 20,000 endpoints, against the
50 ms a worker may stall. In the same run:

* **loop**: the ten-line ``xxhash.xxh64_intdigest`` + ``bisect`` loop a user writes;
* **floor**: C, XXH64 of each key's bytes plus one bucket-table load per key
  (``lbcore._kernel.floor``), no Python object touched;
* **numpy**: the same plan on the NumPy reference kernel.

Usage::

    python perf/bench_kernel.py [--quick] [--cpu N] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import lbcore
from lbcore import Gate, Plan, RingSet
from perf.common import (
    PythonLoopRing,
    as_python,
    endpoint_urls,
    make_ids,
    make_skus,
    measure,
    write_json,
)

BARS = {  # kernel time against the loop, per (ring, batch, keys)
    # Batch 1: the worker's whole path may take 3x the loop; the router and track()
    # need most of that, so the kernel must take at most half the loop's time.
    (100, 1, "sku"): 2.0,
    (100, 1, "int"): 2.0,
    (1000, 1, "sku"): 2.0,
    (1000, 1, "int"): 2.0,
    (100, 100, "sku"): 8.0,
    (100, 100, "int"): 8.0,
    (1000, 100, "sku"): 15.0,
    (1000, 100, "int"): 15.0,
    (100, 100_000, "sku"): 20.0,
    (1000, 100_000, "sku"): 20.0,
    (100, 100_000, "int"): 30.0,
    (1000, 100_000, "int"): 30.0,
}


STALL_MS = 50.0  # the longest a worker may stall (issue 12's "no regression" bar)


def ring_set_for(endpoints: int) -> tuple[RingSet, np.ndarray]:
    """The newest 10 % of ``endpoints`` fading in, and loads with 10 % over the bar."""
    eps = endpoint_urls(endpoints)
    cut = endpoints * 9 // 10
    rs = RingSet(eps[:cut]).scale_up(eps[cut:], 0)
    rng = np.random.default_rng(endpoints)
    loads = rng.uniform(0.5, 1.0, endpoints)
    loads[rng.choice(endpoints, endpoints // 10, replace=False)] = 3.0
    return rs, loads


def plan_for(endpoints: int, now_ns: int = 15_000_000_000) -> Plan:
    rs, loads = ring_set_for(endpoints)
    return Plan(rs, now_ns, loads=loads, balance_factor=1.25, max_hops=10, gate=Gate())


def build_times(reps: int) -> list[dict[str, Any]]:
    """Median ms to build the worker's plan (mid-fade, bounded load, the gate at 90 %)."""
    rows = []
    print(f"# plan build: ms per Plan(...) (median of {reps}), bar {STALL_MS:g} ms (worker stall)")
    for endpoints in (100, 1000, 20_000):
        rs, loads = ring_set_for(endpoints)
        ejected = np.zeros(endpoints, dtype=np.bool_)
        ejected[:: max(1, endpoints // 5)] = True
        row: dict[str, Any] = {"endpoints": endpoints, "ring_nodes": len(rs.newest)}
        for name in ("native", "numpy"):
            old = lbcore.use_kernel(name)
            times = []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                Plan(
                    rs,
                    15_000_000_000,
                    ejected=ejected,
                    loads=loads,
                    balance_factor=1.25,
                    max_hops=10,
                    gate=Gate(percentage=90.0),
                )
                times.append(time.perf_counter_ns() - t0)
            lbcore.use_kernel(old)
            row[f"{name}_ms"] = float(np.median(times)) / 1e6
        rows.append(row)
        ok = row["native_ms"] <= STALL_MS
        print(
            f"{endpoints:>7,} endpoints ({row['ring_nodes']:>9,} nodes): native "
            f"{row['native_ms']:7.2f} ms, numpy {row['numpy_ms']:7.2f} ms"
            f"{'' if ok else '  MISSED'}"
        )
    return rows


def floor_of(batch: Any, buckets: np.ndarray, shift: int) -> Any:
    """The C floor's input: the keys' bytes, fixed width."""
    texts = [k.encode() if isinstance(k, str) else str(k).encode() for k in as_python(batch)]
    width = max(len(t) for t in texts)
    buf = b"".join(t.ljust(width, b"0") for t in texts)
    native = lbcore.kernel.load_native()
    return lambda _: native.floor(buf, width, buckets, shift)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table; returns 1 if a bar is missed."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--cpu", type=int, default=1, help="core to pin to (default 1)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    if lbcore.kernel.load_native() is None:
        print("the native kernel is not built: nothing to compare", file=sys.stderr)
        return 1
    rng = np.random.default_rng(20261201)
    reps = {
        1: 300 if args.quick else 3000,
        100: 100 if args.quick else 600,
        100_000: 3 if args.quick else 9,
    }
    rows: list[dict[str, Any]] = []
    missed = 0
    print("# kernel-only routing: ns per key (median over fresh batches), one core")
    print(
        f"{'ring':>9} {'keys':>4} {'batch':>7} {'loop':>8} {'native':>8} {'x loop':>7} {'bar':>5} "
        f"{'floor':>7} {'x floor':>7} {'numpy':>8}"
    )
    for endpoints in (100, 1000):
        old = lbcore.use_kernel("native")
        native_plan = plan_for(endpoints)
        lbcore.use_kernel("numpy")
        numpy_plan = plan_for(endpoints)
        lbcore.use_kernel(old)
        newest = native_plan.newest
        loop = PythonLoopRing(newest)
        shift = 64 - newest.bucket_bits
        for keys in ("sku", "int"):
            make = make_skus if keys == "sku" else make_ids
            for n in (1, 100, 100_000):
                batches = [make(rng, n) for _ in range(reps[n] + 1)]
                py = [as_python(b) for b in batches]
                t_loop = measure(loop.lookup, py, n)
                t_native = measure(native_plan.route, batches, n)
                t_numpy = measure(numpy_plan.route, batches[: max(3, len(batches) // 10)], n)
                floors = [
                    floor_of(b, newest.buckets, shift)
                    for b in batches[: max(3, len(batches) // 10)]
                ]
                t0s = []
                for f in floors:
                    t0 = time.perf_counter_ns()
                    f(None)
                    t0s.append(time.perf_counter_ns() - t0)
                t_floor = float(np.median(t0s[1:])) / n
                ratio = t_loop / t_native
                bar = BARS.get((endpoints, n, keys))
                ok = bar is None or ratio >= bar
                missed += not ok
                rows.append(
                    {
                        "ring": f"{endpoints}x100",
                        "keys": keys,
                        "batch": n,
                        "loop_ns": t_loop,
                        "native_ns": t_native,
                        "ratio_loop": ratio,
                        "bar": bar,
                        "floor_ns": t_floor,
                        "ratio_floor": t_native / t_floor,
                        "numpy_ns": t_numpy,
                        "native_batch_ns": t_native * n,
                    }
                )
                bar_text = "" if bar is None else f"{bar:g}x"
                print(
                    f"{endpoints:>5}x100 {keys:>4} {n:>7,} {t_loop:8.1f} {t_native:8.1f} "
                    f"{ratio:6.1f}x {bar_text:>5} {t_floor:7.1f} {t_native / t_floor:6.1f}x "
                    f"{t_numpy:8.1f}{'' if ok else '  MISSED'}"
                )
    one = [r for r in rows if r["batch"] == 1]
    print(
        "# batch 1, whole kernel call: "
        + ", ".join(f"{r['ring']} {r['keys']} {r['native_batch_ns']:.0f} ns" for r in one)
    )
    builds = build_times(5 if args.quick else 21)
    missed += sum(b["native_ms"] > STALL_MS for b in builds)
    write_json(args.json, {"routing": rows, "plan_build": builds})
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
