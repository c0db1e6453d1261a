"""Benchmark of the fan-out helper: ``python perf/bench_fanout.py`` (perf part ``fanout``).

Prints, per fanned-out key, the process CPU time (every thread) of:

* ``router.fanout(keys, send)`` on its pool of 8 threads, next to the loop a user
  writes by hand in the same run: ``route_table`` + ``endpoints_of`` + ``track`` around
  ``ThreadPoolExecutor(8).map`` (the ratio is the helper's overhead);
* ``await router.afanout(keys, asend)``, next to ``route_table`` + ``track`` around
  ``asyncio.gather``;

for 100 keys per fan-out on 10 endpoints, with a send that returns at once (the
machinery alone) and one that sleeps 1 ms (threads really wait). Then the recording
of one call alone: :class:`workers.ledger.CallLedger` ``begin`` + ``end`` with its
batched writes, next to one ``record_start`` + ``record_end`` per call through the
worker's :class:`shm.LockedRecorder` (what recording each call on its own would cost).
Medians over repetitions on fresh key batches; absolute numbers drift by up to 2x on
shared machines, ratios less. About 30 s (``--quick``: a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import lbcore
import shm
from workers.fanout_settings import FanoutSettings
from workers.ledger import CallLedger
from workers.router import Router

THREADS = 8
KEYS_PER_FANOUT = 100
EPS = [f"http://10.7.0.{i}:8080" for i in range(1, 11)]


def _batches(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10**9, (n, KEYS_PER_FANOUT))
    return [[f"AD{x:09d}-K11" for x in row] for row in ids]


def _cpu_per_key(run: Callable[[list[str]], Any], batches: list[list[str]], reps: int) -> float:
    """Median process CPU µs per key over ``reps`` runs of ``len(batches) // reps`` fan-outs."""
    per = len(batches) // reps
    out = []
    for r in range(reps):
        chunk = batches[r * per : (r + 1) * per]
        c0 = time.process_time()
        for keys in chunk:
            run(keys)
        out.append((time.process_time() - c0) / (len(chunk) * KEYS_PER_FANOUT) * 1e6)
    return statistics.median(out)


def _sends(sleep_s: float) -> tuple[Callable[..., Any], Callable[..., Any]]:
    def send(url: str, key: str, timeout: float | None = None) -> str:
        if sleep_s:
            time.sleep(sleep_s)
        return key

    async def asend(url: str, key: str, timeout: float | None = None) -> str:
        if sleep_s:
            await asyncio.sleep(sleep_s)
        return key

    return send, asend


def _hand_threads(router: Router, pool: ThreadPoolExecutor, send: Callable[..., Any]):
    def run(keys: list[str]) -> list[Any]:
        idx, table = router.route_table(keys)
        urls = router.endpoints_of(idx, table)
        with router.track(idx, table, keys=keys) as t:

            def call(i: int) -> Any:
                try:
                    return send(urls[i], keys[i], timeout=1.0)
                except Exception:
                    t.fail(i)
                    return None

            return list(pool.map(call, range(len(keys))))

    return run


def _hand_async(router: Router, asend: Callable[..., Any]):
    async def run(keys: list[str]) -> list[Any]:
        idx, table = router.route_table(keys)
        urls = router.endpoints_of(idx, table)
        with router.track(idx, table, keys=keys):
            return await asyncio.gather(
                *(asend(urls[i], keys[i], timeout=1.0) for i in range(len(keys))),
                return_exceptions=True,
            )

    return run


def _bench_fanout(router: Router, quick: bool, log: Callable[[str], None]) -> list[dict]:
    rows = []
    reps = 3 if quick else 7
    per = 3 if quick else 20
    pool = ThreadPoolExecutor(THREADS)
    loop = asyncio.new_event_loop()
    try:
        for sleep_s in (0.0, 0.001):
            send, asend = _sends(sleep_s)
            kind = "returns at once" if not sleep_s else "sleeps 1 ms"
            batches = _batches(reps * per * 4, seed=int(sleep_s * 1e4) + 1)
            parts = [batches[i::4] for i in range(4)]
            # Warm both paths (threads started, plans built) before measuring.
            router.fanout(batches[0], send)
            _hand_threads(router, pool, send)(batches[0])
            helper = _cpu_per_key(lambda k, s=send: router.fanout(k, s), parts[0], reps)
            hand = _cpu_per_key(_hand_threads(router, pool, send), parts[1], reps)
            hand_a = _hand_async(router, asend)
            ahelper = _cpu_per_key(
                lambda k, s=asend: loop.run_until_complete(router.afanout(k, s)), parts[2], reps
            )
            ahand = _cpu_per_key(lambda k, h=hand_a: loop.run_until_complete(h(k)), parts[3], reps)
            for form, a, b, base in (
                ("threads", helper, hand, "route + track + ThreadPoolExecutor(8).map"),
                ("asyncio", ahelper, ahand, "route + track + asyncio.gather"),
            ):
                row = {
                    "form": form,
                    "send": kind,
                    "helper_us_per_key": a,
                    "hand_us_per_key": b,
                    "ratio": a / b,
                    "baseline": base,
                }
                rows.append(row)
                log(
                    f"  {form:8s} send {kind:16s} helper {a:6.1f} µs/key   by hand {b:6.1f} "
                    f"µs/key   ratio {a / b:4.2f}  ({base})"
                )
    finally:
        pool.shutdown()
        loop.close()
    return rows


def _bench_recording(router: Router, quick: bool, log: Callable[[str], None]) -> list[dict]:
    ledger = CallLedger(router.recording)
    rec = router.recorder
    n = 20_000 if quick else 200_000
    slots = np.random.default_rng(3).integers(0, len(EPS), n).tolist()
    bound = int(router.table().n_slots)

    def batched() -> None:
        for s in slots:
            t = ledger.begin(s, 1 << 30)
            ledger.end(s, t)
        ledger.flush()

    one = [np.array([s], dtype=np.int64) for s in slots[: n // 10]]

    def unbatched() -> None:
        for s in one:
            t = time.monotonic_ns()
            rec.record_start(s, t, bound=bound)
            rec.record_end(s, t, 1000, time.monotonic_ns(), None, bound=bound)

    times_b, times_u = [], []
    for _ in range(3 if quick else 5):
        t0 = time.perf_counter_ns()
        batched()
        times_b.append((time.perf_counter_ns() - t0) / n)
        t0 = time.perf_counter_ns()
        unbatched()
        times_u.append((time.perf_counter_ns() - t0) / len(one))
    b, u = statistics.median(times_b), statistics.median(times_u)
    log(
        f"  recording one call: CallLedger begin + end (batched writes) {b:,.0f} ns/call; "
        f"record_start + record_end per call {u:,.0f} ns/call (ratio {b / u:.2f})"
    )
    return [{"op": "recording", "ledger_ns_per_call": b, "per_call_ns": u, "ratio": b / u}]


def run(quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``fanout`` part of ``python -m perf``: rows of figures and notes."""
    ns = f"perffo{uuid.uuid4().hex[:10]}"
    store = shm.CounterStore.create(ns, rows=8)
    writer = shm.TableWriter(ns, counters=store)
    router = None
    try:
        writer.publish(lbcore.RingSet(EPS), knobs=shm.Knobs())
        # Wide deadlines: a loaded machine must not turn the benchmark into timeouts.
        router = Router(
            ns,
            fanout_settings=FanoutSettings(threads=THREADS, timeout_s=5.0, endpoint_cap=THREADS),
        )
        log(f"fan-out of {KEYS_PER_FANOUT} keys over {len(EPS)} endpoints, {THREADS} threads")
        rows = _bench_fanout(router, quick, log)
        rows += _bench_recording(router, quick, log)
    finally:
        if router is not None:
            router.close()
        writer.close()
        store.close()
        for name in shm.list_segments(ns):
            shm.segment.unlink_name(name)
    notes = [
        "Process CPU time (all threads) per key; each pair measured in the same run, the "
        "ratio is the helper's cost over the hand-written loop (which records with one "
        "track() per fan-out, from its entry: queue time counted as busy time).",
    ]
    return {"rows": rows, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures (``--json FILE`` writes them too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args(argv)
    got = run(quick=args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
