"""Benchmark lbcore's batch routing against the pure-Python loop a user would write.

Prints ns per key for ``Ring.lookup``, ``Ring.lookup_bounded`` (10 % of endpoints over
the bar) and N-ring fade-in routing (``route_ring_set`` mid-fade), on rings of 100 and
1,000 endpoints × 100 virtual nodes, with 13-character SKU strings (a Python list of
``str``, as decoded from JSON) and int64 IDs (a NumPy array), at batch sizes 1, 100,
10,000 and 1,000,000 — and in the same run the baseline loop
(``xxhash.xxh64_intdigest`` + ``bisect`` per key on a list ring), with the ratio.

Every repetition routes a fresh batch (the CPU learns a batch timed over and over), the
figure is the median over repetitions, and the process is pinned to one core.

Usage::

    python perf/bench_lbcore.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

import lbcore
from lbcore.route import route_ring_set
from perf.common import PythonLoopRing, S, as_python, make_ids, make_skus, measure, write_json


def reps_for(n: int, quick: bool) -> int:
    if n <= 100:
        return 60 if quick else 300
    if n <= 10_000:
        return 8 if quick else 30
    return 2 if quick else 4


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns 1 if a target is missed."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer repetitions; 100,000 instead of 1,000,000"
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--cpu", type=int, default=0, help="core to pin to (default 0)")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    rng = np.random.default_rng(20261129)
    sizes = [1, 100, 10_000] + ([100_000] if args.quick else [1_000_000])
    print(
        f"# lbcore routing benchmark — {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, NumPy {np.__version__}, xxhash {xxhash.VERSION}, "
        f"pinned to CPU {args.cpu}"
    )
    print("# ns per key, median over fresh batches; ratio = python loop / lbcore")
    results: list[dict[str, Any]] = []
    header = (
        f"{'ring':>7} {'keys':>4} {'batch':>9} {'op':>15} {'lbcore':>9} {'loop':>9} {'ratio':>7}"
    )
    print(header)
    gc.disable()
    try:
        for n_eps in (100, 1000):
            eps = [f"http://10.{i // 250}.{i % 250}.1:8080" for i in range(n_eps)]
            ring = lbcore.Ring(eps)
            cold_ring = lbcore.Ring(eps)
            loop = PythonLoopRing(ring)
            loads = np.ones(n_eps)
            loads[rng.choice(n_eps, n_eps // 10, replace=False)] = 5.0  # 10 % over the bar
            t0 = 1_000 * S
            fading = lbcore.RingSet(eps[: n_eps - n_eps // 10]).scale_up(
                eps[n_eps - n_eps // 10 :], t0
            )
            now = t0 + 15 * S

            # A new load snapshot for every batch: in-flight counts that change with every
            # request, no snapshot is ever routed on twice (the redirect table never pays).
            ticks = iter(range(1 << 62))

            def cold(
                k: Any,
                ring: lbcore.Ring = cold_ring,
                loads: np.ndarray = loads,
                tick: Any = ticks,
            ) -> Any:
                fresh = loads.copy()
                fresh[0] = 1.0 + (next(tick) % 1000) * 1e-6
                return ring.lookup_bounded(k, fresh, 1.25, max_hops=10)

            # A worker routes many batches on one load snapshot: route a ring's worth of
            # keys on it first, as the worker would have before this batch.
            ring.lookup_bounded(make_skus(rng, len(ring)), loads, 1.25, max_hops=10)
            ops: dict[str, Callable[[Any], Any]] = {
                "lookup": ring.lookup,
                "lookup_bounded": lambda k, ring=ring, loads=loads: ring.lookup_bounded(
                    k, loads, 1.25, max_hops=10
                ),
                "bounded_cold": cold,
                "fade_route": lambda k, fading=fading, now=now: route_ring_set(fading, k, now),
            }
            for kind, maker in (("sku", make_skus), ("int", make_ids)):
                for n in sizes:
                    reps = reps_for(n, args.quick)
                    base = measure(
                        loop.lookup, [maker(rng, n) for _ in range(reps + 1)], n, as_python
                    )
                    for name, fn in ops.items():
                        # Fresh batches for every op too: no op runs on data another warmed.
                        ns = measure(fn, [maker(rng, n) for _ in range(reps + 1)], n)
                        row = {
                            "endpoints": n_eps,
                            "keys": kind,
                            "batch": n,
                            "op": name,
                            "ns_per_key": ns,
                            "loop_ns_per_key": base,
                            "ratio": base / ns,
                        }
                        results.append(row)
                        print(
                            f"{n_eps:>7} {kind:>4} {n:>9,} {name:>15} {ns:>9.1f} {base:>9.1f} "
                            f"{base / ns:>6.1f}×",
                            flush=True,
                        )
    finally:
        gc.enable()

    def find(eps: int, op: str, batch: int, kind: str) -> dict[str, Any]:
        return next(
            r
            for r in results
            if (r["endpoints"], r["op"], r["batch"], r["keys"]) == (eps, op, batch, kind)
        )

    big = max(sizes)
    checks = [
        (
            "batch 100, lookup_bounded (snapshot reused) ≥ 2× loop, 100 endpoints",
            [find(100, "lookup_bounded", 100, k) for k in ("sku", "int")],
            lambda r: r["ratio"] >= 2.0,
        ),
        (
            "batch 100, lookup_bounded (snapshot reused) ≥ 3.5× loop, 1,000 endpoints",
            [find(1000, "lookup_bounded", 100, k) for k in ("sku", "int")],
            lambda r: r["ratio"] >= 3.5,
        ),
        (
            f"batch {big:,}, lookup ≥ 10× loop",
            [find(e, "lookup", big, k) for e in (100, 1000) for k in ("sku", "int")],
            lambda r: r["ratio"] >= 10.0,
        ),
        (
            "batch 1 < 5 µs (lookup, lookup_bounded, fade_route)",
            [
                find(e, op, 1, k)
                for op in ("lookup", "lookup_bounded", "fade_route")
                for e in (100, 1000)
                for k in ("sku", "int")
            ],
            lambda r: r["ns_per_key"] < 5000,
        ),
    ]
    print("\n# targets")
    missed = 0
    for label, rows, ok in checks:
        good = all(ok(r) for r in rows)
        missed += not good
        figs = ", ".join(
            f"{r['endpoints']}/{r['keys']}: {r['ratio']:.1f}× ({r['ns_per_key']:.0f} ns)"
            for r in rows
        )
        print(f"{'PASS' if good else 'MISS'}  {label}: {figs}")
    cold = [find(e, "bounded_cold", 100, k) for e in (100, 1000) for k in ("sku", "int")]
    print(
        "info  batch 100, lookup_bounded with a new load snapshot every batch (no redirect "
        "table): " + ", ".join(f"{r['endpoints']}/{r['keys']}: {r['ratio']:.1f}×" for r in cold)
    )
    write_json(args.json, {"python": sys.version, "numpy": np.__version__, "results": results})
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
