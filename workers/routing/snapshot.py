"""Following the host's tables and loads: the snapshot a worker's batches route on.

A :class:`Snapshot` is one table generation, one read of the host's loads and the
:class:`lbcore.Plan` built on both. :func:`build_plan` is the one place a table and
its knobs become a plan (the router, the status page and ``cslb route --live`` use it):
the
rollout gate, the fade mode, bounded load on the knobs' load signal with its bar
counting the routed call as what it adds to that signal
(:meth:`shm.HostLoads.bar_increment`), ejected endpoints, the counter slots, and the
table's sequence check as the plan's guard, so every batch reports whether the table
was still valid after it.

A :class:`Follower` keeps the current snapshot. Per batch that is one check: is the
snapshot's table still the one :meth:`shm.TableReader.table` returns, and is its
load read younger than the refresh cadence. Otherwise it reads the loads again (and
immediately when a new generation appears) and builds the next plan. New generations
are mapped by the reader, in its background thread for tables over a few MiB, so a
worker keeps routing on the previous generation while a large one is mapped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import lbcore
import shm
from lbcore.bounded import in_call_units, target_load
from lbcore.reported import effective_loads
from lbcore.zones import MAX_BAR_WINDOW_NS as MAX_WINDOW
from lbcore.zones import MAX_MIN_PODS, ZoneSplit, window_instants
from shm.segment import kernel_guarded
from workers.routing.reported import TableReports, read_reports

__all__ = [
    "Follower",
    "Snapshot",
    "bounded_bar",
    "build_plan",
    "compared_loads",
    "empty_table",
    "prepare_table",
    "read_loads",
    "read_reports",
    "reset_counter_warnings",
    "zone_bars",
    "zone_split",
]

log = logging.getLogger("cslb.router")

#: How long :meth:`Follower.current` retries on tables the writer keeps rewriting (s).
RETRY_S = 1.0
# How long TableReader.table() retries one read. A reader waits only while the writer
# switches buffers (microseconds); a buffer that never settles is damage, and a worker
# must not stall its request on it (shm remembers the verdict after the first wait).
_READ_TIMEOUT_S = 0.05
#: Tables up to this payload (bytes) are mapped by the batch that first sees them
#: (mapping costs well under a millisecond there); larger ones by the reader's
#: background thread, which also prepares them (:func:`prepare_table`).
INLINE_MAP_BYTES = 2 << 20
_CHECK_NS = 1_000_000_000  # pace of rechecking a generation that could not be read


def read_loads(counters: shm.CounterReader | None, table: shm.Table, now_ns: int) -> shm.HostLoads:
    """The host's loads per endpoint of ``table`` as a worker reads them (idle without counters).

    The table's slots are copied first: its arrays are views of shared memory the writer
    may reuse two publishes later (garbage read then raises, or is caught by the table's
    sequence check).
    """
    n = len(table.endpoints)
    if counters is None or n == 0:
        return shm.HostLoads.idle(n, now_ns)
    slots = np.array(table.slots, dtype=np.intp)
    try:
        loads = counters.read(now_ns, table.n_slots, failure_kinds=False).take(slots)
    except shm.ShmError as exc:
        # Counters shrunk, removed or damaged under the reader (the master repairs or
        # replaces them): route as on an idle host meanwhile, never fail the batch.
        _report_unreadable(counters, exc, now_ns)
        return shm.HostLoads.idle(n, now_ns)
    _report_ignored(counters, now_ns)
    return loads


# One warning a minute at most, per process, however many batches read damaged rows.
_IGNORED_LOG_NS = 60_000_000_000
_ignored_next_log = [0]


_unreadable_next_log = [0]


def reset_counter_warnings() -> None:
    """Forget when this process last warned about unreadable or ignored counter rows.

    Those warnings are logged at most once a minute per process, timed by the clock of
    the router that hit them; a caller with a clock of its own (a test) starts afresh.
    """
    _ignored_next_log[0] = 0
    _unreadable_next_log[0] = 0


def _report_unreadable(counters: shm.CounterReader, exc: Exception, now_ns: int) -> None:
    if now_ns < _unreadable_next_log[0]:
        return
    _unreadable_next_log[0] = now_ns + _IGNORED_LOG_NS
    log.warning(
        "counters of %s unreadable (%s): routing as on an idle host until they are "
        "repaired or replaced (logged at most once a minute)",
        counters.namespace,
        exc,
    )


def _report_ignored(counters: shm.CounterReader, now_ns: int) -> None:
    rows = counters.ignored_rows
    if not rows or now_ns < _ignored_next_log[0]:
        return
    _ignored_next_log[0] = now_ns + _IGNORED_LOG_NS
    log.warning(
        "counter rows %s of %s hold values no recorder writes (written by another "
        "process?): left out of loads and totals; %d row reads left out so far "
        "(logged at most once a minute)",
        list(rows[:10]),
        counters.namespace,
        counters.ignored_total,
    )


def build_plan(
    table: shm.Table,
    loads: shm.HostLoads | None,
    now_ns: int,
    *,
    balance_factor: Any = "knobs",
    ejected: bool = True,
    reports: TableReports | None = None,
    reuse: lbcore.Plan | None = None,
) -> lbcore.Plan:
    """The plan a worker routes ``table``'s batches on at ``now_ns``.

    Parameters
    ----------
    table
        A table generation (its views must stay valid while the plan is used: the
        plan's guard is the table's sequence check).
    loads
        Host-wide loads per endpoint of ``table`` (:func:`read_loads`); ``None``:
        nobody has called anyone yet (idle).
    now_ns
        The present on the fade clock (CLOCK_MONOTONIC), in nanoseconds.
    balance_factor
        ``"knobs"`` (a worker's): the table's; ``None``: no bounded load (the plain
        rings, for an explanation of a bounded-load move).
    ejected
        ``False``: as if no endpoint were ejected (for an explanation of a skip).
    reports
        The pods' load reports of ``table``'s endpoints (:func:`read_reports`;
        ``None``: reports off): bounded load compares the loads
        :func:`lbcore.reported.effective_loads` folds from them and the host's.
    reuse
        The previous plan (say the previous load snapshot's): a plan of the same table
        takes its zone split's local endpoints and its bars' base
        (:attr:`lbcore.Plan.view_arcs`) instead of computing them again.

    Raises
    ------
    lbcore.LBCoreError
        Arguments the plan rejects: on a table the writer rewrote meanwhile, garbage
        (check :meth:`shm.Table.valid`); on a valid one, damage.
    """
    k = table.knobs
    n = len(table.endpoints)
    bf = k.balance_factor if balance_factor == "knobs" else balance_factor
    if not n:
        bf = None  # (nothing to bound on an empty table)
    load, window_ns = None, 0
    ej = table.ejected
    kw: dict[str, Any] = {
        "ejected": ej if ejected and ej.size and ej.any() else None,
        "max_hops": k.max_hops,
        "gate": k.gate(),
        "fade_mode": k.fade_mode,
        "slots": table.slots,
        "n_slots": table.n_slots,
        "guard": table.guard,
    }
    if bf is not None:
        if loads is None or loads.in_flight.size != n:
            loads = shm.HostLoads.idle(n, now_ns)
        sig = k.load_signal
        # B1's bars expect the local share these loads saw: occupancy (and effective
        # load's occupancy part) is averaged over the counters' window, in-flight is now.
        window_ns = 0 if sig == "in-flight" else min(max(int(loads.window_ns), 0), MAX_WINDOW)
    zone = zone_split(table, now_ns, reuse, window_ns=window_ns)
    folded = None
    if bf is not None:
        assert loads is not None
        # In routed-call units: bounded load's 1.0 becomes what a call adds to the
        # signal (for occupancy its latency's share of the window, not one busy second
        # per second); in-flight and effective loads pass through unchanged.
        raw, inc = loads.signal(k.load_signal), loads.bar_increment(k.load_signal)
        if reports is None:
            load = in_call_units(raw, inc)
        else:
            state, settings = reports.state, reports.settings

            def folded(expected: np.ndarray | None) -> np.ndarray:
                # Reports go onto the shares the bars are drawn from (None: no zone
                # part is open, the plan's bars are Skipper's).
                got = effective_loads(raw, state, now_ns, settings, inc, expected=expected)
                return in_call_units(got.loads, inc)

    return lbcore.Plan(
        table.ring_set,
        now_ns,
        loads=load,
        loads_on_shares=folded,
        balance_factor=bf,
        zone=zone,
        reuse=reuse,
        **kw,
    )


def prepare_table(table: shm.Table, now_ns: int) -> lbcore.Plan:
    """Compute ahead what ``table``'s plans derive from it alone: its zone views' arcs.

    The one part of a zone plan that passes over the whole ring (the views are the
    table's, the same in every plan of it while the zone's share is above 0); kept
    with the ring (:func:`lbcore.zones.view_arcs`). Returns the plan they were computed
    on (without loads): as :func:`build_plan`'s ``reuse``, the table's first plan takes
    its zone split's local endpoints and its arcs as a refresh takes its predecessor's.
    A worker's tables reader calls it in its map thread. Nothing to compute for a table
    whose zone keeps no key local at ``now_ns``.

    Raises
    ------
    lbcore.LBCoreError
        As :func:`build_plan` (a table rewritten meanwhile, damage).
    """
    plan = build_plan(table, None, now_ns, balance_factor=None)
    if plan.zone_views:
        plan.view_arcs  # noqa: B018 (computed and kept with the ring)
    return plan


def zone_split(
    table: shm.Table, now_ns: int, reuse: lbcore.Plan | None = None, *, window_ns: int = 0
) -> ZoneSplit | None:
    """The zone part of ``table``'s plans at ``now_ns`` (``None``: no key is local then).

    The caller's zone and its local share ``x`` are the table's zone record
    (:meth:`shm.Table.zone_share`: the controller's curve at ``now_ns``), the zone's
    minimum size its ``min_pods``. ``reuse``: a plan of the same table, whose local
    endpoints are taken as they are (they are the table's, whatever the instant).
    ``window_ns``: how far back the loads the bars are compared with reach (ns): the
    bars take the curve at that window's :func:`lbcore.zones.window_instants`
    (``bar_shares``), 0: the instant's share only.
    """
    z = table.zone
    x = table.zone_share(now_ns)
    if x <= 0.0:
        return None
    # B1's bars expect what the loads saw: the curve over their window, not only now.
    bars = tuple(z.share_at(t) for t in window_instants(now_ns, window_ns)) if window_ns else None
    # The record's range is wider than the rule's: a value no writer publishes routes
    # as the nearest one the rule takes rather than failing every plan of the table.
    n = min(max(int(z.min_pods), 1), MAX_MIN_PODS)
    old = reuse.zone if reuse is not None and reuse.ring_set is table.ring_set else None
    if old is not None:
        return ZoneSplit(
            old.local, x, min_pods=n, bar_window_ns=window_ns, bar_shares=bars, name=old.name
        )
    return ZoneSplit.for_zone(
        table.zones, z.zone, x, min_pods=n, bar_window_ns=window_ns, bar_shares=bars
    )


def bounded_bar(plan: lbcore.Plan, view: int = -1) -> float | None:
    """Bounded load's bar in ``plan``'s ``view`` (default the newest ring), in its load units.

    lbcore's rule over the view's candidates (:func:`lbcore.bounded.target_load`);
    ``None`` without bounded load.
    """
    if plan.balance_factor is None or plan.loads is None or plan.newest is None:
        return None
    return target_load(plan.loads, plan.listed[view], plan.balance_factor)


def zone_bars(plan: lbcore.Plan) -> np.ndarray | None:
    """Each endpoint's own bar in a plan with an open zone part, in routed-call units.

    The bars the plan compared its loads with (:attr:`lbcore.Plan.bars`, read-only, in
    the units of the plan's loads, which :func:`build_plan` gives in routed-call units),
    table order; ``None`` without a zone part or bounded load.
    """
    return plan.bars


def compared_loads(plan: lbcore.Plan, increment: float) -> np.ndarray | None:
    """The loads ``plan``'s bounded load compares, in the load signal's unit.

    The plan holds them in routed-call units (:func:`lbcore.bounded.in_call_units`),
    with the pods' load reports folded in as :func:`build_plan` folds them (onto the
    bar shares under zone affinity); times ``increment``
    (:meth:`shm.HostLoads.bar_increment`) they are in the signal's unit again, as are
    :func:`bounded_bar` and :func:`zone_bars` times it. ``None`` without bounded load.
    """
    if plan.loads is None:
        return None
    return plan.loads * float(increment)


class Snapshot:
    """One table generation, one read of the host's loads, and the plan on both. Immutable.

    Attributes
    ----------
    table : shm.Table
        The generation.
    plan : lbcore.Plan
        What its batches route on (:func:`build_plan`).
    loads : shm.HostLoads
        The host's loads per endpoint of :attr:`table`, as read.
    read_ns : int
        When the loads were read (CLOCK_MONOTONIC ns).
    due_ns : int
        When they are to be read again.
    route : Callable
        :attr:`lbcore.Plan.route` of :attr:`plan`.
    route_counted : Callable
        :attr:`lbcore.Plan.route_counted` of :attr:`plan`.
    slot_view : memoryview
        :attr:`lbcore.Plan.slots` of :attr:`plan` (the kernel takes a memoryview's
        buffer for less than an array's: a fan-out's start and end pass it).
    guarded : bool
        The plan routes on the native kernel, whose reads of the table run under its
        SIGBUS guard (:func:`shm.segment.kernel_guarded`): the per-batch check probes
        no segment size.
    """

    __slots__ = (
        "due_ns",
        "guarded",
        "loads",
        "plan",
        "read_ns",
        "route",
        "route_counted",
        "slot_view",
        "table",
    )

    def __init__(
        self, table: shm.Table, plan: lbcore.Plan, loads: shm.HostLoads, read_ns: int, due_ns: int
    ) -> None:
        self.table = table
        self.plan = plan
        self.route = plan.route
        self.route_counted = plan.route_counted
        self.slot_view = memoryview(plan.slots)
        self.guarded = plan.kernel == "native" and kernel_guarded()
        self.loads = loads
        self.read_ns = read_ns
        self.due_ns = due_ns

    def __repr__(self) -> str:
        gen = self.table.generation
        return f"Snapshot(generation {gen}, loads read at {self.read_ns} ns, {self.plan})"


class Follower:
    """Keeps the snapshot a worker routes on: its tables reader, its load reads, its plans.

    Thread-safe: the fast path (nothing due) takes no lock; refreshes are serialized.

    Parameters
    ----------
    namespace
        Shared-memory namespace of the tables.
    refresh_ns
        Load snapshot cadence, in nanoseconds (0: every batch reads the loads).
    clock
        CLOCK_MONOTONIC nanoseconds.
    background
        How new generations are mapped: ``None`` in the reader's background thread
        above 2 MiB, ``True`` always there, ``False`` by the batch that sees them.
    warn_once
        ``warn_once(cause, msg, *args)``: a warning said once per cause.
    tick
        ``tick(now_ns)``, called on every refresh and at least once a second while
        batches come (the router's check for missing or replaced segments).

    Attributes
    ----------
    reader : shm.TableReader or None
        The tables reader (``None`` until the tables exist).
    counters : shm.CounterReader or None
        Where loads are read (``None``: no counters; loads read as idle).
    snapshot : Snapshot or None
        The current snapshot.
    """

    def __init__(
        self,
        namespace: str,
        refresh_ns: int,
        clock: Callable[[], int],
        background: bool | None,
        warn_once: Callable[..., None],
        tick: Callable[[int], None],
    ) -> None:
        self.namespace = namespace
        self.refresh_ns = refresh_ns
        self._clock = clock
        self._background = background
        self._warn_once = warn_once
        self._tick = tick
        self._lock = threading.Lock()
        self._until = 0  # the fast path's end: the snapshot's due time or the next tick
        self.reader: shm.TableReader | None = None
        self.counters: shm.CounterReader | None = None
        self.snapshot: Snapshot | None = None
        # (generation, recheck time, what is wrong with it) of a generation not routed on.
        self._bad: tuple[int, int, str] | None = None
        #: Why the current generation cannot be routed on (``None``: it can).
        self.problem: str | None = None
        # The map thread's last prepared table and its plan (prepare_table): the reuse
        # of that table's first plan. One attribute, replaced whole.
        self._prepared: tuple[shm.Table, lbcore.Plan] | None = None

    def connect(self) -> None:
        """Open the tables reader if there is none yet (missing tables: retried later)."""
        if self.reader is not None:
            return
        try:
            self.reader = shm.TableReader(
                self.namespace,
                timeout_s=_READ_TIMEOUT_S,
                background=self._background is not False,
                foreground_bytes=INLINE_MAP_BYTES if self._background is None else 0,
                prepare=self._prepare,
            )
        except shm.SegmentMissingError as exc:
            log.debug("tables of %s not readable yet: %s", self.namespace, exc)
        except shm.SegmentError as exc:  # foreign, another layout version, damaged
            self._warn_once(
                ("attach", "tables", str(exc)),
                "tables of %s cannot be used (retried every %g s; fallback meanwhile): %s",
                self.namespace,
                _CHECK_NS / 1e9,
                exc,
            )

    def _prepare(self, table: shm.Table) -> None:
        """In the reader's map thread: :func:`prepare_table` at this instant."""
        try:
            self._prepared = (table, prepare_table(table, self._clock()))
        except Exception as exc:  # (rewritten meanwhile, damage: the first plan says so)
            log.debug("preparing generation %d of %s: %s", table.generation, self.namespace, exc)

    def use_counters(self, counters: shm.CounterReader | None) -> None:
        """Read loads from ``counters`` from now on; the next batch reads them afresh."""
        self.counters = counters
        self.snapshot = None

    def current(self) -> Snapshot | None:
        """The snapshot to route on now, refreshed when due.

        ``None`` while there is no usable table (nothing published, segments missing or
        corrupt, or a writer rewriting faster than this worker can read for a second).
        """
        s = self.snapshot
        if (
            s is not None
            and self._clock() < self._until
            and self.reader.is_current(s.table, s.guarded)  # type: ignore[union-attr]
        ):
            return s
        return self._refresh()

    def of(self, table: shm.Table) -> Snapshot | None:
        """The current snapshot if it is of ``table`` (its plan knows the table's slots)."""
        s = self.snapshot
        return s if s is not None and s.table is table else None

    def _refresh(self) -> Snapshot | None:
        now = self._clock()
        self._tick(now)
        reader = self.reader
        if reader is None:
            return None
        bad = self._bad
        if bad is not None:
            # The current generation could not be read: not again until it changes or
            # the recheck interval passed (a corrupt table costs a checksum per read).
            if now < bad[1] and reader.generation() == bad[0]:
                s = self._last_good(now)
                if s is None:  # (its refresh may have found it damaged meanwhile)
                    self.problem = self._problem(bad, None)
                return s
            self._bad = None
        deadline = 0.0
        while True:
            try:
                t = reader.table()
            except shm.ShmError as exc:
                gen = reader.generation()
                self._bad = bad = (gen, now + _CHECK_NS, f"generation {gen} cannot be read ({exc})")
                s = self._last_good(now)
                self.problem = self._problem(bad, s)
                if s is not None:
                    self._warn_once(
                        ("table", type(exc), str(exc)),
                        "routing table of %s unusable, routing on generation %d meanwhile: %s",
                        self.namespace,
                        s.table.generation,
                        exc,
                    )
                else:
                    self._warn_once(
                        ("table", type(exc), str(exc)),
                        "no usable routing table in %s (fallback): %s",
                        self.namespace,
                        exc,
                    )
                return s
            try:
                s = self._take(t, now)
            except lbcore.TableDataError as exc:
                # Damaged after it was mapped and checked, found by its plan (a zone
                # plan reads the whole ring for its bars) rather than by a batch: the
                # same as when a batch finds it (Router.route_table), whose snapshot
                # would be of t by then. So every key falls back: the last snapshot (of
                # an earlier generation) is not routed on meanwhile, with zone
                # affinity (found here) as without (found by the batch).
                with self._lock:
                    self.snapshot = None
                self.damaged(t, exc)
                return None
            if s is not None:
                self.problem = None
                return s
            # The writer began rewriting t's buffer while we read it: the next table()
            # call maps the generation it published.
            if not deadline:
                deadline = time.monotonic() + RETRY_S
            elif time.monotonic() > deadline:
                log.warning("no stable table in %s for %g s", self.namespace, RETRY_S)
                return None
            now = self._clock()

    def damaged(self, table: shm.Table, exc: Exception) -> None:
        """``table`` failed a batch (or its plan) although valid: damaged after it was checked.

        Batches fall back until the recheck interval passed, then the generation is
        read and tried again; the cause is logged once and reported by
        :attr:`problem` (so ``/healthz`` says this worker cannot route).
        """
        now = self._clock()
        with self._lock:
            if self.snapshot is not None and self.snapshot.table is table:
                self.snapshot = None
        gen = table.generation
        self._bad = bad = (gen, now + _CHECK_NS, f"generation {gen} is damaged ({exc})")
        self.problem = self._problem(bad, None)
        self._warn_damaged(table, exc)

    @staticmethod
    def _problem(bad: tuple[int, int, str], s: Snapshot | None) -> str:
        """:attr:`problem` while generation ``bad`` is not routed on and ``s`` is instead."""
        return (
            f"{bad[2]}; "
            + (
                f"routing on generation {s.table.generation} meanwhile"
                if s is not None
                else "every key falls back"
            )
            + f", checked again every {_CHECK_NS / 1e9:g} s"
        )

    def _warn_damaged(self, table: shm.Table, exc: Exception) -> None:
        self._warn_once(
            ("damaged", table.generation, str(exc)),
            "routing table of %s damaged after it was mapped (fallback until it reads "
            "well again): %s",
            self.namespace,
            exc,
        )

    def _last_good(self, now: int) -> Snapshot | None:
        """The last snapshot, refreshed when due, while its table is still valid.

        ``None`` also when the refresh's plan finds that table damaged (a new plan when
        the views change, a new ejected set say, reads the ring's arcs): every key
        falls back then, as when a batch finds it; the caller says why in
        :attr:`problem` (the generation it cannot route on stays the one rechecked).
        """
        s = self.snapshot
        if s is None or not s.table.valid():
            return None
        if now < s.due_ns:
            return s
        try:
            return self._take(s.table, now) or s
        except lbcore.TableDataError as exc:
            with self._lock:
                if self.snapshot is s:
                    self.snapshot = None
            self._warn_damaged(s.table, exc)
            return None

    def _take(self, t: shm.Table, now: int) -> Snapshot | None:
        """The snapshot of ``t`` now: the current one while fresh, else a new one.

        ``None`` if ``t`` was rewritten while its loads were read or its plan built.
        """
        with self._lock:
            s = self.snapshot
            if s is not None and s.table is t and now < s.due_ns:
                # Fresh (another thread refreshed meanwhile, or only the tick was due).
                self._until = min(s.due_ns, now + _CHECK_NS)
                return s
            try:
                loads = read_loads(self.counters, t, now)
                reports = read_reports(self.counters, t, now)
                try:
                    # The previous plan: of the same table, its zone split's local
                    # endpoints and its bars' base carry over (lbcore.Plan's reuse).
                    prev = s.plan if s is not None else None
                    ready = self._prepared
                    if ready is not None and ready[0] is t:
                        # A new table the map thread prepared: its first plan reuses
                        # what was prepared, as a refresh reuses its predecessor.
                        self._prepared = None
                        if prev is None or prev.ring_set is not t.ring_set:
                            prev = ready[1]
                    plan = build_plan(t, loads, now, reports=reports, reuse=prev)
                except lbcore.LBCoreError as exc:
                    if not t.valid() or isinstance(exc, lbcore.TableDataError):
                        raise  # (the ring's damage: no loads route around it)
                    # Loads the plan refuses (damage no row check caught): route as on an
                    # idle host rather than refuse every batch.
                    self._warn_once(
                        ("loads", type(exc)),
                        "host loads of %s unusable (%s): routing as if idle",
                        self.namespace,
                        exc,
                    )
                    loads = shm.HostLoads.idle(len(t.endpoints), now)
                    plan = build_plan(t, loads, now)
                s = Snapshot(t, plan, loads, now, now + self.refresh_ns)
            except Exception:
                if t.valid():
                    raise
                return None
            if not t.valid():
                return None
            self._until = min(s.due_ns, now + _CHECK_NS)
            self.snapshot = s
            return s

    def drop(self) -> None:
        """Forget the current snapshot (the next batch takes a new one)."""
        self.snapshot = None

    def close(self) -> None:
        """Close the tables reader and drop the snapshot."""
        if self.reader is not None:
            self.reader.close()
        self.snapshot = None
        self._prepared = None


_EMPTY: list[shm.Table] = []


def empty_table() -> shm.Table:
    """A generation-0 table without endpoints (no tables published yet)."""
    if not _EMPTY:
        _EMPTY.append(shm.Table.empty())
    return _EMPTY[0]
