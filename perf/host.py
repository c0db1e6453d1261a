"""Host scaling: 1, 2, … worker processes routing and recording on the same shared tables.

Every process attaches its own :class:`workers.Router` to one namespace (one table, one
counter matrix, a counter row each) and routes fresh SKU batches through
``route_table`` + ``track`` as fast as it can for a fixed time, while a discovery-like
writer in the parent builds and publishes a new generation (a scale-up or scale-down by
10 %) every second, so every worker follows new generations while it routes. The figure
is the total decisions per second of the host; the scaling efficiency is the total of
N processes over N times the total of one.
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from typing import Any

import numpy as np

import lbcore
from perf.common import LoadedHost, PythonLoopRing, full_route, make_skus, unique_namespace
from perf.forked import Forked

PUBLISH_EVERY_S = 1.0
ROUTER = "cslb Router"
LOOP = "python loop"


def _worker(
    namespace: str,
    endpoints: list[str],
    op: str,
    batch: int,
    seconds: float,
    seed: int,
    go: Any,
    conn: Any,
) -> None:
    from workers.routing.router import Router

    router = Router(namespace) if op == ROUTER else None
    try:
        if router is not None:
            route = full_route(router)
        else:  # the machine's own scaling: pure Python, nothing shared between processes
            route = PythonLoopRing(lbcore.Ring(endpoints)).lookup
        rng = np.random.default_rng(seed)
        pool = [make_skus(rng, batch) for _ in range(max(100_000 // batch, 64))]
        for b in pool[:16]:
            route(b)
        conn.send("ready")
        if not go.wait(120):
            return
        first = router.table().generation if router is not None else 0
        i = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        size = len(pool)
        while True:
            route(pool[i % size])
            i += 1
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
        conn.send(
            {
                "batches": i,
                "decisions": i * batch,
                "seconds": elapsed,
                "generations": router.table().generation - first if router is not None else 0,
            }
        )
    finally:
        if router is not None:
            router.close()


def _publisher(host: LoadedHost, stop: threading.Event, published: list[float]) -> None:
    """Discovery's job, every second: build the next ring set (±10 % pods) and publish it."""
    rs = host.ring_set
    full = list(host.endpoints)
    small = full[: len(full) - max(len(full) // 10, 1)]
    k = 0
    while not stop.wait(PUBLISH_EVERY_S):
        k += 1
        t0 = time.perf_counter()
        rs = rs.with_endpoints(small if k % 2 else full, time.monotonic_ns())
        host.publish(rs)
        published.append(time.perf_counter() - t0)


def run_once(
    host: LoadedHost, op: str, procs: int, batch: int, seconds: float, seed: int = 0
) -> dict[str, Any]:
    """``procs`` routing processes for ``seconds``; returns the host's totals."""
    forked = Forked()  # forks while no thread runs in this process yet
    go = forked.ctx.Event()
    stop = threading.Event()
    published: list[float] = []
    pub = None
    try:
        for k in range(procs):
            forked.start(
                _worker,
                lambda send, k=k: (
                    host.namespace, host.endpoints, op, batch, seconds, seed * 100 + k, go, send
                ),
            )
        forked.expect("ready", 120, "get ready")
        pub = threading.Thread(target=_publisher, args=(host, stop, published), daemon=True)
        pub.start()
        go.set()
        results = forked.receive(seconds + 120, "report")
    finally:
        stop.set()
        if pub is not None:
            pub.join(30)
        forked.close()
    total = sum(r["decisions"] / r["seconds"] for r in results)
    return {
        "processes": procs,
        "batch": batch,
        "decisions_per_s": total,
        "per_process": [r["decisions"] / r["seconds"] for r in results],
        "generations_followed": min(r["generations"] for r in results),
        "publishes": len(published),
    }


def run(quick: bool = False, log: Any = print) -> dict[str, Any]:
    """Run the host benchmark; returns ``{"rows": [...], "notes": [...]}``.

    Each row: ``processes``, ``batch``, ``decisions_per_s``, ``efficiency`` (total over
    processes × the one-process total), ``generations_followed`` (fewest new
    generations any process routed on), ``publishes``.
    """
    cores = max(multiprocessing.cpu_count(), 1)
    counts = list(range(1, cores + 1))
    seconds = 1.0 if quick else 4.0
    rounds = 1 if quick else 3
    cases = [(ROUTER, 100), (LOOP, 100)] + ([] if quick else [(ROUTER, 1_000)])
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    with LoadedHost(unique_namespace("host"), 100, rows=cores + 4) as host:
        # Rounds interleave cases and process counts: a neighbour's load hits them alike.
        for k in range(rounds):
            for op, batch in cases:
                for procs in counts:
                    r = run_once(host, op, procs, batch, seconds, seed=k * 10 + procs)
                    runs.setdefault((op, batch, procs), []).append(r)
    rows: list[dict[str, Any]] = []
    for op, batch in cases:
        one = statistics.median(r["decisions_per_s"] for r in runs[op, batch, 1])
        for procs in counts:
            rs = runs[op, batch, procs]
            total = statistics.median(r["decisions_per_s"] for r in rs)
            row = {
                "op": op,
                "processes": procs,
                "batch": batch,
                "decisions_per_s": total,
                "efficiency": total / (procs * one),
                "generations_followed": min(r["generations_followed"] for r in rs),
                "publishes": sum(r["publishes"] for r in rs),
                "rounds": len(rs),
            }
            rows.append(row)
            log(
                f"  host {op:<11} batch {batch:>5} × {procs} processes: "
                f"{total / 1e6:.2f} M keys/s, efficiency {row['efficiency']:.2f}"
                + (
                    f", each run followed ≥ {row['generations_followed']} new generations"
                    if op == ROUTER
                    else ""
                )
            )
    notes = [
        f"Median of {rounds} runs of {seconds:g} s each, 100 endpoints (10 % fading in), "
        "fresh SKU batches through "
        f"route_table + track; a new generation published every {PUBLISH_EVERY_S:g} s "
        "by a writer thread in the parent process (ring-set build + publish, ±10 % pods). "
        "The python loop rows (the pure-Python xxhash + bisect loop, nothing shared) show "
        "how far this machine itself scales at the time: the control for the Router's "
        "scaling.",
    ]
    return {"rows": rows, "notes": notes}
