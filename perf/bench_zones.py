"""What zone affinity costs a worker's plans (``python -m perf --only zones``).

A worker builds its plans with :func:`workers.routing.snapshot.build_plan` on a table
mapped from shared memory: the first plan of each new generation, then a new one every
``CSLB_LOAD_REFRESH`` (:data:`REFRESH_NS`, its default) on a fresh load read, passing
the previous plan as ``reuse``. With zone affinity on, that plan also carries the zone's
views and B1's bars (each endpoint's expected share, averaged over the loads' window at
:data:`lbcore.zones.WINDOW_SAMPLES` instants); with the pods' load reports on, the
reports are folded onto those bar shares before the plan's loads are set.

For 100, 1,000 and 20,000 endpoints in 3 zones (the last 10 % fading in, half-way
through their fade; bounded load on the default factor and hop cap; another worker's
load history in the counters) two tables are published on real shared memory: one with
the caller's zone record ramping (local share 0.5 now, 0.2 at the start of the loads'
window), one with affinity off. Both are timed in the same run, interleaved, the
collector off and pinned to one core; each figure is the median over repetitions, and
each ratio is the zone table's time over the plain table's (reports: on over off):

* ``first``: the first plan of a freshly published generation (new table, new ring set
  objects: nothing memoized on them), on the routing thread, the table
  read as a busy worker's reader reads it: mapped by the batch up to
  :data:`~workers.routing.snapshot.INLINE_MAP_BYTES` of payload (unless its data segment
  is new to the reader), else by the map thread, which also prepares it
  (:func:`~workers.routing.snapshot.prepare_table`, timed apart: ``prepare_ms``; the
  first plan then reuses the plan prepared, as the worker's does);
* ``refresh``: a plan :data:`REFRESH_NS` after the previous one, ``reuse=`` the previous
  (occupancy, whose window the bars average over);
* ``refresh, no bar window``: the same with the in-flight signal (loads of the instant,
  bars at the instant's shares);
* ``refresh, reports``: ``refresh`` with every pod's load report past its blackout.

The targets are declared with the others' in :mod:`perf.targets`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import lbcore
import shm
from lbcore.report_settings import ReportSettings
from lbcore.reported import KIND_OCCUPANCY, ReportState, record_reports
from lbcore.zones import WINDOW_SAMPLES
from perf.bench_lbcore import pinned
from perf.common import S, endpoint_urls, no_gc, unique_namespace, unlink_namespace
from shm.tables import ZoneCurve
from workers.routing.reported import TableReports
from workers.routing.router import LOAD_REFRESH
from workers.routing.snapshot import INLINE_MAP_BYTES, build_plan, prepare_table, read_loads

__all__ = ["OPS", "SIZES", "run"]

SIZES = (100, 1_000, 20_000)
ZONES = ("z-a", "z-b", "z-c")
#: The operations timed, in the order of the page's table.
OPS = ("first", "refresh", "refresh, no bar window", "refresh, reports")
REFRESH_NS = round(LOAD_REFRESH.default * S)  # CSLB_LOAD_REFRESH's default
REPORTS_ON = ReportSettings(enabled=True, blackout_ns=10 * S, expiry_ns=30 * S, refresh_ns=5 * S)


class _Host:
    """One namespace: counters with another worker's load history and a table writer."""

    def __init__(self, tag: str, n: int, affinity: bool, now_ns: int) -> None:
        self.namespace = unique_namespace(tag)
        self.now_ns = now_ns
        self.store = shm.CounterStore.create(self.namespace, rows=4)
        self.writer = shm.TableWriter(self.namespace, counters=self.store)
        #: How long the map thread prepared each table it mapped (ms).
        self.prepared_ms: list[float] = []
        #: The map thread's last prepared table and plan (a worker's first plan reuses it).
        self.prepared: tuple[shm.Table, lbcore.Plan] | None = None
        self.reader: shm.TableReader | None = None
        self.counters = self.store.reader()
        eps = endpoint_urls(n)
        self.cut = n - max(n // 10, 1)
        self.endpoints = eps
        self.zones = [ZONES[i % 3] for i in range(n)]
        # Local share 0.2 ten seconds ago (the occupancy window's start), 0.5 now.
        self.curve = ZoneCurve(
            zone="z-a",
            affinity=affinity,
            state="ramping" if affinity else "off",
            reason="started" if affinity else "affinity_off",
            start_ns=now_ns - 10 * S,
            x0=0.2,
            rate=0.03,
            cap=0.9,
        )
        self.other: shm.Recorder | None = None

    def _prepare(self, table: shm.Table) -> None:
        t0 = time.perf_counter_ns()
        plan = prepare_table(table, self.now_ns)
        self.prepared_ms.append((time.perf_counter_ns() - t0) / 1e6)
        self.prepared = (table, plan)

    def first_reuse(self, table: shm.Table) -> lbcore.Plan | None:
        """What a worker's first plan of ``table`` reuses: the plan the map thread prepared."""
        ready = self.prepared
        return ready[1] if ready is not None and ready[0] is table else None

    def publish(self, load_signal: str) -> shm.Table:
        """A new generation of the same endpoints (new ring set objects), as a worker gets it.

        The reader is a worker's (:class:`workers.routing.snapshot.Follower`'s): large
        tables mapped and prepared by its map thread. Its first table is mapped by the
        caller, so the first call publishes twice.
        """
        rs = lbcore.RingSet(self.endpoints[: self.cut]).scale_up(
            self.endpoints[self.cut :], self.now_ns - 15 * S
        )
        knobs = shm.Knobs(load_signal=load_signal)
        gen = self.writer.publish(rs, zones=self.zones, zone=self.curve, knobs=knobs)
        if self.reader is None:
            # No idle look-ahead: a busy worker's batch maps the small tables itself
            # (an idle one's map thread may have mapped and prepared them first).
            self.reader = shm.TableReader(
                self.namespace,
                background=True,
                foreground_bytes=INLINE_MAP_BYTES,
                prefetch_s=3600.0,
                prepare=self._prepare,
            )
            self.reader.table()
            return self.publish(load_signal)
        deadline = time.monotonic() + 30.0
        table = self.reader.table()
        while table.generation != gen:  # the map thread still maps it
            if time.monotonic() > deadline:
                raise RuntimeError(f"generation {gen} not mapped after 30 s")
            time.sleep(0.001)
            table = self.reader.table()
        if self.other is None:
            self._load_history(table)
        return table

    def _load_history(self, table: shm.Table) -> None:
        slots = np.asarray(table.slots, dtype=np.intp)
        n = slots.size
        hot = np.random.default_rng(7).choice(n, max(n // 10, 2), replace=False)
        busy = np.repeat(slots[hot], 4)
        now = self.now_ns
        self.other = self.store.claim()
        self.other.record_start(busy, now - 3 * S)
        self.other.record_end(busy, now - 3 * S, np.full(busy.size, 2 * S), now)
        self.other.record_start(slots[hot], now)

    def close(self) -> None:
        for obj in (self.other, self.reader, self.writer, self.store):
            if obj is None:
                continue
            with contextlib.suppress(Exception):
                obj.release() if obj is self.other else obj.close()  # type: ignore[union-attr]
        unlink_namespace(self.namespace)


@contextlib.contextmanager
def _hosts(n: int, now_ns: int) -> Iterator[dict[str, _Host]]:
    made: dict[str, _Host] = {}
    try:
        made["zone"] = _Host("zz", n, True, now_ns)
        made["plain"] = _Host("zp", n, False, now_ns)
        yield made
    finally:
        for h in made.values():
            h.close()


def _reports(n: int, now_ns: int) -> TableReports:
    """Every pod's occupancy report, past its blackout at ``now_ns``."""
    state = ReportState.empty(n)
    values = np.random.default_rng(11).uniform(0.3, 0.7, n)
    at = now_ns - 20 * S
    for t in (at, at + 11 * S):
        state = record_reports(state, np.arange(n), values, KIND_OCCUPANCY, 7, t, 30 * S)
    return TableReports(state, np.full(n, np.nan), REPORTS_ON)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter_ns()
    got = fn()
    return (time.perf_counter_ns() - t0) / 1e6, got


def _reps(n: int, quick: bool) -> tuple[int, int]:
    """(first-plan repetitions, refresh repetitions) at ``n`` endpoints."""
    if n >= 10_000:
        return (2, 10) if quick else (7, 60)
    return (3, 30) if quick else (15, 300)


def _measure(n: int, quick: bool, log: Callable[[str], None]) -> list[dict[str, Any]]:
    now0 = time.monotonic_ns()
    first_reps, refresh_reps = _reps(n, quick)
    times: dict[tuple[str, str], list[float]] = {}
    zone_views = 0
    prepared: dict[str, float] = {}
    with _hosts(n, now0) as hosts:
        # First plans: a fresh generation each time, the zone and plain tables in turn.
        for _ in range(first_reps + 1):
            for kind, h in hosts.items():
                table = h.publish("occupancy")
                loads = read_loads(h.counters, table, now0)
                ready = h.first_reuse(table)
                ms, plan = _timed(
                    lambda t=table, lo=loads, r=ready: build_plan(t, lo, now0, reuse=r)
                )
                times.setdefault((kind, "first"), []).append(ms)
                zone_views = max(zone_views, plan.zone_views)
        for kind, h in hosts.items():
            # (nan: every table was mapped by the caller, nothing was prepared apart)
            prepared[kind] = statistics.median(h.prepared_ms) if h.prepared_ms else math.nan
            prepared[kind + " tables"] = len(h.prepared_ms)
        reports = _reports(n, now0)
        for signal, ops in (("occupancy", ("refresh", "refresh, reports")),
                            ("in-flight", ("refresh, no bar window",))):  # fmt: skip
            tables = {kind: h.publish(signal) for kind, h in hosts.items()}
            loads = {k: read_loads(hosts[k].counters, t, now0) for k, t in tables.items()}
            prev = {(k, op): build_plan(tables[k], loads[k], now0) for k in tables for op in ops}
            for i in range(1, refresh_reps + 2):
                now = now0 + i * REFRESH_NS
                for op in ops:
                    rep = reports if op == "refresh, reports" else None
                    for k, t in tables.items():
                        ms, plan = _timed(
                            lambda t=t, lo=loads[k], p=prev[(k, op)], r=rep, at=now: build_plan(
                                t, lo, at, reports=r, reuse=p
                            )
                        )
                        prev[(k, op)] = plan
                        times.setdefault((k, op), []).append(ms)
    rows = []
    for op in OPS:
        # The first repetition warms code paths (imports, caches of the interpreter).
        zone = statistics.median(times[("zone", op)][1:])
        plain = statistics.median(times[("plain", op)][1:])
        rows.append(
            {"endpoints": n, "op": op, "zone_ms": zone, "plain_ms": plain, "ratio": zone / plain}
        )
        if op == "first":
            rows[-1]["zone_prepare_ms"] = prepared["zone"]
            rows[-1]["plain_prepare_ms"] = prepared["plain"]
            # how many of the first plans' tables the map thread mapped and prepared
            rows[-1]["prepared_tables"] = prepared["zone tables"]
            rows[-1]["tables"] = first_reps + 1
        log(f"{n:>7,} {op:>24} {zone:>10.3f} {plain:>10.3f} {zone / plain:>7.2f}×")
        if op == "first" and not math.isnan(prepared["zone"]):
            log(f"{'':>7} {'(map thread: prepare)':>24} {prepared['zone']:>10.3f} "
                f"{prepared['plain']:>10.3f}   ({prepared['zone tables']} of "
                f"{first_reps + 1} zone tables)")  # fmt: skip
    if not zone_views:
        raise RuntimeError("the zone table's plans have no zone views: nothing measured")
    return rows


def measure_rows(
    quick: bool = False, cpu: int = 0, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """One row per size and operation: the zone table's ms, the plain table's, the ratio.

    Parameters
    ----------
    quick
        Fewer repetitions (a smoke test).
    cpu
        The core to pin to while measuring.
    log
        Where each row is printed as it is measured.
    """
    log("# plan builds (build_plan on a mapped table), median ms; ratio = zone / plain")
    log(f"{'endpoints':>7} {'op':>24} {'zone ms':>10} {'plain ms':>10} {'ratio':>8}")
    rows: list[dict[str, Any]] = []
    with no_gc(), pinned(cpu):
        for n in SIZES:
            rows += _measure(n, quick, log)
    by = {(r["endpoints"], r["op"]): r for r in rows}
    for n in SIZES:
        on, off = by[(n, "refresh, reports")], by[(n, "refresh")]
        for r in (on,):
            r["reports_ratio"] = on["zone_ms"] / off["zone_ms"]
            r["plain_reports_ratio"] = on["plain_ms"] / off["plain_ms"]
        log(f"{n:>7,} reports on / off in zone mode: {on['reports_ratio']:.2f}×")
    return rows


def run(quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``zones`` part of ``python -m perf``: zone plans next to plain ones."""
    return {
        "rows": measure_rows(quick, log=log),
        "notes": [
            "Both tables hold the same endpoints, ring set, knobs and load history; only "
            "the zone record differs (affinity on and ramping for `zone`, off for "
            "`plain`). The reports are a `TableReports` value built in the process "
            "(every pod reporting, past its blackout), handed to `build_plan` as the "
            "router hands it the reports it read from the counters.",
            "What a zone refresh still adds: B1's bar window (the fade weights at "
            f"{WINDOW_SAMPLES} instants and one mix of the views' arcs), the zone parts' "
            "counts, bars and "
            "under-the-bar masks, and a kernel object of twice the views. What the "
            "reports add is `effective_loads`' fold itself, as large on the no-zone "
            "table (`plain_reports_ratio` in RESULTS.json). A first plan's pass over the "
            "ring for the zone views' arcs is the map thread's `prepare_table` where "
            "the worker maps a table in the background, else the routing thread's.",
        ],
    }
