"""Benchmark lbcore's one-off routing calls against the pure-Python loop a user would write.

The ``lbcore`` part of ``python -m perf``. Measures ns per key for ``Ring.lookup``,
``Ring.lookup_bounded`` (10 % of endpoints over the bar) and N-ring fade-in routing
(``route_ring_set`` mid-fade), on rings of 100 and 1,000 endpoints × 100 virtual nodes,
with 13-character SKU strings (a Python list of ``str``, as decoded from JSON) and int64
IDs (a NumPy array), at batch sizes 1, 100, 10,000 and 1,000,000 — and in the same run
the baseline loop (``xxhash.xxh64_intdigest`` + ``bisect`` per key on a list ring), with
the ratio. Its targets are declared with the others' in :mod:`perf.results`.

Every repetition routes a fresh batch (the CPU learns a batch timed over and over), the
figure is the median over repetitions, and the process is pinned to one core while it
measures.

Usage::

    python perf/bench_lbcore.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import sys
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Run pinned to core ``cpu``; the affinity before is restored after (the suite goes on)."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def measure_rows(
    quick: bool = False, cpu: int = 0, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """One row per ring, key kind, batch size and operation, the loop's time beside it.

    Parameters
    ----------
    quick
        Fewer repetitions, and 100,000 keys instead of 1,000,000 for the largest batch.
    cpu
        The core to pin to while measuring.
    log
        Where each row is printed as it is measured.
    """
    rng = np.random.default_rng(20261129)
    sizes = [1, 100, 10_000] + ([100_000] if quick else [1_000_000])
    log(
        f"# lbcore routing benchmark — {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, NumPy {np.__version__}, xxhash {xxhash.VERSION}, "
        f"pinned to CPU {cpu}"
    )
    log("# ns per key, median over fresh batches; ratio = python loop / lbcore")
    log(f"{'ring':>7} {'keys':>4} {'batch':>9} {'op':>15} {'lbcore':>9} {'loop':>9} {'ratio':>7}")
    results: list[dict[str, Any]] = []
    gc.disable()
    try:
        with pinned(cpu):
            for n_eps in (100, 1000):
                results += _ring_rows(n_eps, sizes, quick, rng, log)
    finally:
        gc.enable()
    return results


def _ring_rows(
    n_eps: int, sizes: list[int], quick: bool, rng: np.random.Generator, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    eps = [f"http://10.{i // 250}.{i % 250}.1:8080" for i in range(n_eps)]
    ring = lbcore.Ring(eps)
    cold_ring = lbcore.Ring(eps)
    loop = PythonLoopRing(ring)
    loads = np.ones(n_eps)
    loads[rng.choice(n_eps, n_eps // 10, replace=False)] = 5.0  # 10 % over the bar
    t0 = 1_000 * S
    fading = lbcore.RingSet(eps[: n_eps - n_eps // 10]).scale_up(eps[n_eps - n_eps // 10 :], t0)
    now = t0 + 15 * S

    # A new load snapshot for every batch: in-flight counts that change with every
    # request, no snapshot is ever routed on twice (the redirect table never pays).
    ticks = iter(range(1 << 62))

    def cold(k: Any) -> Any:
        fresh = loads.copy()
        fresh[0] = 1.0 + (next(ticks) % 1000) * 1e-6
        return cold_ring.lookup_bounded(k, fresh, 1.25, max_hops=10)

    # A worker routes many batches on one load snapshot: route a ring's worth of
    # keys on it first, as the worker would have before this batch.
    ring.lookup_bounded(make_skus(rng, len(ring)), loads, 1.25, max_hops=10)
    ops: dict[str, Callable[[Any], Any]] = {
        "lookup": ring.lookup,
        "lookup_bounded": lambda k: ring.lookup_bounded(k, loads, 1.25, max_hops=10),
        "bounded_cold": cold,
        "fade_route": lambda k: route_ring_set(fading, k, now),
    }
    rows = []
    for kind, maker in (("sku", make_skus), ("int", make_ids)):
        for n in sizes:
            reps = reps_for(n, quick)
            base = measure(loop.lookup, [maker(rng, n) for _ in range(reps + 1)], n, as_python)
            for name, fn in ops.items():
                # Fresh batches for every op too: no op runs on data another warmed.
                ns = measure(fn, [maker(rng, n) for _ in range(reps + 1)], n)
                rows.append(
                    {
                        "endpoints": n_eps,
                        "keys": kind,
                        "batch": n,
                        "op": name,
                        "ns_per_key": ns,
                        "loop_ns_per_key": base,
                        "ratio": base / ns,
                    }
                )
                log(
                    f"{n_eps:>7} {kind:>4} {n:>9,} {name:>15} {ns:>9.1f} {base:>9.1f} "
                    f"{base / ns:>6.1f}×"
                )
    return rows


def run(quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``lbcore`` part of ``python -m perf``: lbcore's one-off calls next to the loop."""
    return {
        "rows": measure_rows(quick, log=log),
        "notes": [
            "`lookup_bounded` routes many batches on one load snapshot (as a worker does); "
            "`bounded_cold` gets a new snapshot every batch, so nothing it computed for one "
            "batch serves the next. `fade_route` is `lbcore.route_ring_set` mid-fade (one "
            "scale-up event half-way through its fade): it builds a whole `lbcore.Plan` per "
            "call, O(ring), so at batch 1 its time is the plan build's (a caller routing "
            "many batches on one snapshot builds the plan once, as a worker does).",
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns 1 if a target is missed."""
    from perf import results

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer repetitions; 100,000 instead of 1,000,000"
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--cpu", type=int, default=0, help="core to pin to (default 0)")
    args = ap.parse_args(argv)
    rows = measure_rows(args.quick, args.cpu, log=lambda s: print(s, flush=True))
    print("\n# targets")
    missed = 0
    for target, unit in results.targets({"lbcore": {"rows": rows}}):
        if target.part == "lbcore":
            missed += target.status != "met"
            print(f"{target.status.upper():>7}  {target.label}: {target.figures(unit)}")
    write_json(args.json, {"python": sys.version, "numpy": np.__version__, "results": rows})
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
