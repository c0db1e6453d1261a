"""The host's routing state read from shared memory: :class:`HostMonitor`.

One consistent snapshot of a namespace (:class:`HostSnapshot`): the current table, its
publisher's liveness, and per endpoint (:class:`EndpointState`) what the table says and
the load all the host's workers recorded. ``/metrics`` (:mod:`workers.surfaces.collector`),
``/healthz`` (:meth:`HostMonitor.health`) and ``/status`` (:mod:`workers.surfaces.status`)
show it; ``cslb inspect`` shows :func:`read_table`'s rows of the same table. Everything
here reads (maps segments read-only) and writes nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import lbcore
import shm
from lbcore import fadein_score
from lbcore.knobs import Knob, seconds_at_least
from lbcore.outlier import EJECT_REASONS
from lbcore.reported import KIND_NONE, SOURCES, effective_loads
from shm.tables.zone import ZoneCurve
from workers.routing.reported import TableReports, read_reports
from workers.routing.snapshot import bounded_bar, build_plan, compared_loads, zone_bars

__all__ = [
    "STALE_AFTER",
    "EndpointState",
    "FadingRing",
    "Health",
    "HostMonitor",
    "HostSnapshot",
    "TableRows",
    "read_table",
]


#: The counters' stats words of routing decisions (the others are the fan-out helper's).
_DECISION_STATS = ("decisions", "fallbacks", "moves")

#: ``CSLB_STALE_AFTER`` (``cslb inspect --stale-after``): when the publisher counts as dead.
STALE_AFTER = Knob(
    "stale_after_s",
    "CSLB_STALE_AFTER",
    "--stale-after",
    5.0,
    seconds_at_least(0.01),
    "A publisher heartbeat older than this many seconds means the publisher is not alive: "
    "/healthz answers 503, cslb_discovery_up is 0 and cslb inspect exits with status 3 "
    "(workers keep routing on the last table).",
    "SECONDS",
)


@dataclass(frozen=True, slots=True)
class EndpointState:
    """One endpoint of the current table with its host-wide load.

    Load fields are ``None`` when the host has no counters (nothing recorded yet).

    Attributes
    ----------
    address, zone, node : str
        As published (zone and node ``""`` when unknown).
    slot : int
        Counter slot (column of the counter matrix).
    tier : int
        Ring tier: 0 established, ``k`` joined with the ``k``-th fading ring.
    ejected : bool
        Routing skips it (ejected by outlier detection and not in outlier panic).
    eject_reason : str
        Why outlier detection ejected it (:data:`lbcore.outlier.EJECT_REASONS`; also in
        outlier panic, when routing ignores it), ``""`` when not ejected.
    ejected_for_s : float | None
        Seconds until the ejection ends (``None``: not ejected).
    ejections : tuple[int, ...]
        Ejections so far per reason, in :data:`lbcore.outlier.EJECT_REASONS` order.
    in_flight : int | None
        Open requests, all workers summed.
    occupancy : float | None
        Busy-seconds per second over the window.
    latency_s : float | None
        Mean latency over the window in seconds (``None``: nothing ended in it).
    requests_total, failures_total : int | None
        Lifetime totals of ended and failed requests.
    failures_by_kind : tuple[int, ...] | None
        ``failures_total`` by kind, in :data:`lbcore.outlier.FAILURE_KINDS` order.
    load : float | None
        The load bounded load compares: the table's ``load_signal`` (occupancy,
        in-flight or effective load) computed by the router's rule.
    eject_until_ns : int | None
        CLOCK_MONOTONIC time the ejection ends, in nanoseconds (``None``: not ejected).
    eject_multiplier : int
        The ejection time's multiplier (it grows with each ejection in a row).
    reported_utilization : float | None
        The pod's last valid ``application_utilization`` (``None``: no valid report, or
        load reports off).
    reported_age_s : float | None
        Seconds since the pod's last valid load report arrived (``None``: none).
    load_source : str
        What bounded load balances the pod on: ``"reported"`` (its own report) or
        ``"host"`` (this host's view), :data:`lbcore.reported.SOURCES`.
    """

    address: str
    zone: str
    node: str
    slot: int
    tier: int
    ejected: bool
    eject_reason: str = ""
    ejected_for_s: float | None = None
    ejections: tuple[int, ...] = (0,) * len(EJECT_REASONS)
    in_flight: int | None = None
    occupancy: float | None = None
    latency_s: float | None = None
    requests_total: int | None = None
    failures_total: int | None = None
    failures_by_kind: tuple[int, ...] | None = None
    load: float | None = None
    eject_until_ns: int | None = None
    eject_multiplier: int = 0
    reported_utilization: float | None = None
    reported_age_s: float | None = None
    load_source: str = "host"


@dataclass(frozen=True, slots=True)
class FadingRing:
    """One fading ring of the current table.

    Attributes
    ----------
    ring : int
        1 = the oldest fading ring (renumbered when an older one finishes).
    started_ns : int
        CLOCK_MONOTONIC time the ring's fade started, in nanoseconds: the same in every
        worker of the host and for the ring's whole fade (its stable name).
    added : tuple[str, ...]
        Endpoints that joined with it.
    age_s : float
        Seconds since its fade started.
    progress : float
        Elapsed share of the fade window, in ``[0, 1]``.
    share : float
        Share of keys it carries now under the table's fade mode (N-ring share; Skipper's
        fade-in score under ``fade_mode=skipper``; 1 under ``off``).
    n_ring_share : float
        Its N-ring share now, whatever the fade mode.
    """

    ring: int
    started_ns: int
    added: tuple[str, ...]
    age_s: float
    progress: float
    share: float
    n_ring_share: float


@dataclass(frozen=True, slots=True)
class Health:
    """Verdict for ``/healthz``.

    Attributes
    ----------
    ok : bool
        True while a table with endpoints is published and its publisher runs and
        heartbeats.
    reason : str
        Why not (or ``"ok"``).
    generation : int
        Latest published generation (0: none).
    heartbeat_age_s : float | None
        Seconds since the publisher's last heartbeat (``None``: no tables).
    writer_pid : int
        PID of the publisher (0: unknown).
    endpoints : int | None
        Endpoints of the current table (``None``: no table).
    problem : str
        What the publisher reports is wrong with its sources (``""``: nothing), e.g. an
        API request its service account is forbidden to make.
    """

    ok: bool
    reason: str
    generation: int = 0
    heartbeat_age_s: float | None = None
    writer_pid: int = 0
    endpoints: int | None = None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """The host's routing state at one instant (CLOCK_MONOTONIC ``now_ns``).

    Attributes
    ----------
    namespace : str
        Shared-memory namespace.
    now_ns : int
        When it was taken, in nanoseconds.
    health : Health
        Table published and publisher alive?
    tables_present : bool
        The namespace has a tables segment.
    generation : int
        Publish count of the current table (0: nothing published).
    table_age_s : float | None
        Seconds since that table was published.
    heartbeat_age_s : float | None
        Seconds since the publisher's last heartbeat or publish.
    writer_pid : int
        PID of the publisher (0: unknown).
    publisher_alive : bool
        Publisher process running and its heartbeat younger than ``stale_after_s``.
    stale_after_s : float
        The threshold used, in seconds.
    knobs : dict[str, Any]
        Routing knobs of the table (plus fade duration, exponent and vnodes).
    fading : tuple[FadingRing, ...]
        Fading rings, oldest first.
    endpoints : tuple[EndpointState, ...]
        Endpoints in table order.
    counters_present : bool
        The namespace has counters (per-endpoint loads and decision totals are known).
    decisions, fallbacks, moves : int | None
        Host lifetime totals of routed keys, fallback answers and bounded-load moves.
    window_s : float | None
        The occupancy window, in seconds.
    bar_increment : float | None
        What bounded load's bar counts for the call being routed, in the load signal's
        unit (:meth:`shm.HostLoads.bar_increment`, as the routers do): 1.0 for in-flight
        and effective load, the host's mean latency over the window for occupancy.
    bar : float | None
        Bounded load's bar on the newest ring in the load signal's unit, from the plan
        the routers build on this table and these loads
        (:func:`workers.routing.snapshot.build_plan`); ``None`` without bounded load or loads.
    bars : tuple[float, ...] | None
        With zone affinity in that plan, each endpoint's own bar (table order, the
        signal's unit): ``balance_factor × its bar share × (increment + Σ load)``, the
        bar shares being the expected shares averaged over the loads' window
        (:attr:`lbcore.Plan.bar_shares`), never below the average's bar; ``None`` when
        :attr:`bar` bounds every endpoint.
    outlier_panic : bool
        Too few endpoints are left un-ejected: routing ignores every ejection.
    fanout : dict[str, int]
        The fan-out's lifetime totals, host-wide (:data:`shm.layout.STATS_FIELDS` past
        the decisions: retries, bulkhead rejections, calls by locality, ...).
    zone : shm.tables.zone.ZoneCurve
        The table's zone record: the caller's zone, affinity, the zone controller's
        state, reason, cap and curve (:attr:`zone_share` is the curve now).
    """

    namespace: str
    now_ns: int
    health: Health
    tables_present: bool = False
    generation: int = 0
    table_age_s: float | None = None
    heartbeat_age_s: float | None = None
    writer_pid: int = 0
    publisher_alive: bool = False
    stale_after_s: float = STALE_AFTER.default
    knobs: dict[str, Any] = field(default_factory=dict)
    fading: tuple[FadingRing, ...] = ()
    endpoints: tuple[EndpointState, ...] = ()
    counters_present: bool = False
    decisions: int | None = None
    fallbacks: int | None = None
    moves: int | None = None
    window_s: float | None = None
    bar_increment: float | None = None
    bar: float | None = None
    bars: tuple[float, ...] | None = None
    outlier_panic: bool = False
    fanout: dict[str, int] = field(default_factory=dict)
    zone: ZoneCurve = field(default_factory=ZoneCurve)

    @property
    def zone_share(self) -> float:
        """The local share ``x`` of the caller's zone at :attr:`now_ns` (0-1)."""
        return self.zone.share_at(self.now_ns)

    @property
    def local_call_share(self) -> float | None:
        """Share of the fan-out's calls so far made in the caller's zone (``None``: none)."""
        local = self.fanout.get("calls_local", 0)
        calls = local + self.fanout.get("calls_remote", 0)
        return local / calls if calls else None


class HostMonitor:
    """Read-only view of a namespace's tables and counters, attached lazily.

    Safe to create before anything exists (in a gunicorn master, or before discovery has
    started): each call attaches what is there now and reports the rest as absent. Thread
    safe. Maps segments read-only and writes nothing.

    Parameters
    ----------
    namespace
        Shared-memory namespace.
    stale_after_s
        Heartbeat age in seconds beyond which the publisher counts as dead.
    clock
        CLOCK_MONOTONIC nanoseconds (tests pass their own).
    """

    def __init__(
        self,
        namespace: str,
        *,
        stale_after_s: float = STALE_AFTER.default,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        shm.check_namespace(namespace)
        self.namespace = namespace
        self.stale_after_s = float(stale_after_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: shm.TableReader | None = None
        self._counters: shm.CounterReader | None = None
        #: The plan of the last snapshot with loads (the next one reuses its bars' base).
        self.last_plan: lbcore.Plan | None = None

    # -- attaching ---------------------------------------------------------------------

    def _table_reader(self) -> shm.TableReader:
        with self._lock:
            if self._tables is None:
                self._tables = shm.TableReader(self.namespace)
            return self._tables

    def _counter_reader(self) -> shm.CounterReader | None:
        with self._lock:
            c = self._counters
            if c is not None and c.replaced():
                c.close()  # the owner recreated the counters: read the new ones
                self._counters = c = None
            if c is None:
                try:
                    self._counters = c = shm.CounterReader(self.namespace)
                except shm.ShmError:
                    return None
            return c

    # -- reading -----------------------------------------------------------------------

    def _publisher(self, reader: shm.TableReader, now: int) -> tuple[int, float | None, str | None]:
        """Publisher PID, heartbeat age (s) and why it is not alive (``None``: alive).

        PID 0 and age ``None`` when the tables were removed (nothing known of a new one).

        Alive: the tables the reader maps are still the namespace's (a discovery that
        stops cleanly removes them), their writer process runs and its heartbeat is
        younger than ``stale_after_s``.
        """
        if reader.replaced():
            # Checked first: the mapped control segment is the removed one, so its PID and
            # heartbeat are the old publisher's, not those of a restarted one.
            return (
                0,
                None,
                (
                    f"the routing tables of namespace {self.namespace!r} were removed "
                    "(discovery stopped or is restarting); workers route on the last table"
                ),
            )
        beat_age = (now - reader.heartbeat_ns()) / 1e9
        pid = reader.writer_pid()
        if not reader.writer_alive():
            return pid, beat_age, f"publisher process {pid} is not running"
        if beat_age > self.stale_after_s:
            return (
                pid,
                beat_age,
                (
                    f"publisher heartbeat is {beat_age:.1f} s old (stale after "
                    f"{self.stale_after_s:g} s)"
                ),
            )
        return pid, beat_age, None

    def health(self) -> Health:
        """Table published, with endpoints, and publisher alive? Reads no counters.

        Maps the current table (once per generation) to count its endpoints.
        """
        now = self._clock()
        try:
            reader = self._table_reader()
            generation = reader.generation()
            pid, beat_age, dead = self._publisher(reader, now)
            endpoints = len(reader.table().endpoints) if generation else None
            problem = self._problem(reader, now)
        except shm.ShmError as exc:
            return Health(False, self._unavailable(exc))
        return self._verdict(generation, pid, beat_age, dead, endpoints, problem)

    @staticmethod
    def _problem(reader: shm.TableReader, now: int) -> str:
        """The publisher's report on its sources, with how long it has lasted."""
        status = reader.status()
        if status is None:
            return ""
        if not status.problem:
            return ""
        age = max(now - status.since_ns, 0) / 1e9 if status.since_ns else None
        return status.problem + ("" if age is None else f" (for {age:.0f} s)")

    def _unavailable(self, exc: shm.ShmError) -> str:
        if isinstance(exc, shm.SegmentMissingError):
            return (
                f"no routing tables in shared-memory namespace {self.namespace!r} "
                "(discovery has not started)"
            )
        return f"routing tables of namespace {self.namespace!r} unreadable: {exc}"

    @staticmethod
    def _verdict(
        generation: int,
        pid: int,
        beat_age: float | None,
        dead: str | None,
        endpoints: int | None,
        problem: str = "",
    ) -> Health:
        facts = {
            "generation": generation,
            "heartbeat_age_s": beat_age,
            "writer_pid": pid,
            "endpoints": endpoints,
            "problem": problem if dead is None else "",
        }
        if dead is not None:
            return Health(False, dead, **facts)
        if generation == 0:
            why = f": {problem}" if problem else ""
            return Health(False, f"discovery has not published a routing table yet{why}", **facts)
        if endpoints == 0:
            return Health(
                False,
                f"the routing table (generation {generation}) has no endpoints: discovery "
                "found no ready endpoint, so every key falls back to the ingress",
                **facts,
            )
        if problem:
            return Health(
                False,
                f"discovery cannot follow its sources: {problem}; workers route on the last "
                f"good table (generation {generation})",
                **facts,
            )
        return Health(True, "ok", **facts)

    def snapshot(self) -> HostSnapshot:
        """Everything ``/metrics`` and ``/status`` show, read at one instant.

        Never raises for missing or unreadable segments: they show as absent, with the
        reason in :attr:`HostSnapshot.health`.
        """
        now = self._clock()
        base: dict[str, Any] = {
            "namespace": self.namespace,
            "now_ns": now,
            "stale_after_s": self.stale_after_s,
        }
        try:
            reader = self._table_reader()
            pid, beat_age, dead = self._publisher(reader, now)
            table, rows = reader.consistent(lambda t: (t, read_table(t, now)))
        except shm.ShmError as exc:
            return HostSnapshot(**base, health=Health(False, self._unavailable(exc)))
        base.update(
            tables_present=True,
            generation=rows.generation,
            table_age_s=(now - rows.published_ns) / 1e9 if rows.generation else None,
            heartbeat_age_s=beat_age,
            writer_pid=pid,
            publisher_alive=dead is None,
            knobs=rows.shown_knobs(),
            fading=rows.fading,
            outlier_panic=rows.outlier_panic,
            zone=rows.zone,
            health=self._verdict(
                rows.generation,
                pid,
                beat_age,
                dead,
                len(rows.endpoints),
                self._problem(reader, now),
            ),
        )
        endpoints = rows.endpoints
        knobs = base["knobs"]
        counters = self._counter_reader()
        if counters is None:
            return HostSnapshot(**base, endpoints=tuple(endpoints))
        try:
            stats = counters.stats()
            # (window failures per kind are not shown: skip their sums)
            loads = counters.read(now, rows.n_slots, failure_kinds=False).take(
                [e.slot for e in endpoints]
            )
        except shm.ShmError:
            return HostSnapshot(**base, endpoints=tuple(endpoints))
        in_flight = loads.in_flight.tolist()
        occupancy = loads.occupancy.tolist()
        latency = loads.mean_latency_s.tolist()
        requests = loads.requests_total.tolist()
        failures = loads.failures_total.tolist()
        by_kind = loads.failures_total_by_kind.tolist()
        try:
            signal = loads.signal(knobs["load_signal"]).tolist()
            increment: float | None = loads.bar_increment(knobs["load_signal"])
        except (KeyError, shm.ShmError, ValueError):
            signal = [None] * len(endpoints)
            increment = None
        reports = read_reports(counters, table, now) if increment is not None else None
        util: list[Any] = [None] * len(endpoints)
        age: list[Any] = [None] * len(endpoints)
        source = ["host"] * len(endpoints)
        if reports is not None and len(reports.state.value) == len(endpoints):
            try:
                folded = effective_loads(
                    signal, reports.state, now, reports.settings, float(increment or 1.0)
                )
            except lbcore.LBCoreError:
                reports = None  # (garbage from a rewritten table: shown without reports)
            else:
                signal = folded.loads.tolist()
                source = [SOURCES[int(v)] for v in folded.source]
                valid = reports.state.kind != KIND_NONE
                ages = ((now - reports.state.at_ns) / 1e9).tolist()
                u = reports.utilization.tolist()
                for i in np.flatnonzero(valid).tolist():
                    age[i] = ages[i]
                    util[i] = None if math.isnan(u[i]) else u[i]
        bar, bars, self.last_plan = _bar(table, loads, now, increment, reports, self.last_plan)
        plan = self.last_plan
        if bars is not None and reports is not None and plan is not None:
            # with a zone, reports are folded onto the plan's shares: show what it compares
            compared = compared_loads(plan, float(increment or 1.0))
            signal = signal if compared is None else compared.tolist()
        # The constructor, not dataclasses.replace: a snapshot of a large table makes one
        # of these per endpoint, and replace costs several times more per call.
        loaded = tuple(
            EndpointState(
                e.address,
                e.zone,
                e.node,
                e.slot,
                e.tier,
                e.ejected,
                e.eject_reason,
                e.ejected_for_s,
                e.ejections,
                int(in_flight[i]),
                float(occupancy[i]),
                None if math.isnan(latency[i]) else float(latency[i]),
                int(requests[i]),
                int(failures[i]),
                tuple(by_kind[i]),
                None if signal[i] is None else float(signal[i]),
                e.eject_until_ns,
                e.eject_multiplier,
                util[i],
                age[i],
                source[i],
            )
            for i, e in enumerate(endpoints)
        )
        return HostSnapshot(
            **base,
            endpoints=loaded,
            counters_present=True,
            decisions=int(stats["decisions"]),
            fallbacks=int(stats["fallbacks"]),
            moves=int(stats["moves"]),
            window_s=loads.window_ns / 1e9,
            bar_increment=increment,
            bar=bar,
            bars=bars,
            fanout={k: int(v) for k, v in stats.items() if k not in _DECISION_STATS},
        )

    def close(self) -> None:
        """Drop the mappings (the next call attaches again)."""
        with self._lock:
            if self._tables is not None:
                self._tables.close()
            if self._counters is not None:
                self._counters.close()
            self._tables = self._counters = None


def _bar(
    table: shm.Table,
    loads: shm.HostLoads,
    now: int,
    increment: float | None,
    reports: TableReports | None = None,
    reuse: lbcore.Plan | None = None,
) -> tuple[float | None, tuple[float, ...] | None, lbcore.Plan | None]:
    """The routers' bounded-load bar on ``table`` with ``loads``, in the signal's unit.

    From the plan a router builds on them (its loads are in routed-call units: the
    bar times the increment is the bar in the signal's); ``None`` if ``table`` was
    rewritten meanwhile or has no bar. Second: with a zone part in the plan, each
    endpoint's own bar (table order; ``None`` otherwise), which is what bounds it then.
    Third: the plan, for the next snapshot's ``reuse`` (a zone plan's bars' base is a
    pass over the ring per view: once per table, not per scrape).
    """
    if increment is None:
        return None, None, None
    try:
        plan = build_plan(table, loads, now, reports=reports, reuse=reuse)
        bar, bars = bounded_bar(plan), zone_bars(plan)
    except lbcore.LBCoreError:
        return None, None, None  # garbage from a rewritten table (or damaged: health says so)
    if bar is None or not table.valid():
        return None, None, None
    shown = None if bars is None else tuple((bars * increment).tolist())
    return bar * increment, shown, plan


@dataclass(frozen=True, slots=True)
class TableRows:
    """One table copied out of shared memory, as ``/metrics``, ``/status`` and inspect show it.

    Built by :func:`read_table`, the one place that copies a table's rows out.

    Attributes
    ----------
    generation : int
        Publish count (0: nothing published).
    published_ns : int
        CLOCK_MONOTONIC time of the publish, in nanoseconds.
    publisher_pid : int
        PID of the process that published it.
    knobs : shm.Knobs
        The routing knobs published with it.
    fade_duration_s, fade_exponent : float
        The fade-in window (seconds) and curve exponent of its ring set.
    vnodes : int
        Virtual nodes per endpoint.
    fading : tuple[FadingRing, ...]
        Fading rings, oldest first.
    endpoints : tuple[EndpointState, ...]
        Endpoints in table order, without loads.
    n_slots : int
        Counter slots the table addresses.
    outlier_panic : bool
        Too few endpoints are left un-ejected: routing ignores every ejection.
    zone : shm.tables.zone.ZoneCurve
        Its zone record.
    """

    generation: int
    published_ns: int
    publisher_pid: int
    knobs: shm.Knobs
    fade_duration_s: float
    fade_exponent: float
    vnodes: int
    fading: tuple[FadingRing, ...]
    endpoints: tuple[EndpointState, ...]
    n_slots: int
    outlier_panic: bool
    zone: ZoneCurve = field(default_factory=ZoneCurve)

    def shown_knobs(self) -> dict[str, Any]:
        """The knobs the status page and ``/metrics`` show, with the fade's parameters."""
        k = self.knobs
        return {
            "enabled": bool(k.enabled),
            "percentage": k.percentage,
            "balance_factor": k.balance_factor,
            "max_hops": k.max_hops,
            "load_signal": k.load_signal,
            "fade_mode": k.fade_mode,
            "fade_duration_s": self.fade_duration_s,
            "fade_exponent": self.fade_exponent,
            "vnodes": self.vnodes,
        }


def read_table(t: shm.Table, now: int) -> TableRows:
    """Copy out of table ``t`` its rows at CLOCK_MONOTONIC ``now`` (ns).

    Run it under :meth:`shm.TableReader.consistent`: the copy is of one generation.
    """
    rs = t.ring_set
    k = t.knobs
    tiers = [int(x) for x in rs.tiers] if rs.endpoints else []
    fading = []
    if rs.endpoints:
        for ring, (start, n_ring_share) in enumerate(
            zip(rs.starts_ns, rs.share_list(now), strict=True), start=1
        ):
            age = now - start
            share = n_ring_share
            if k.fade_mode == "skipper":
                share = fadein_score(age, rs.duration_ns, rs.exponent)
            elif k.fade_mode == "off":
                share = 1.0
            progress = min(max(age / rs.duration_ns, 0.0), 1.0) if rs.duration_ns > 0 else 1.0
            added = tuple(ep for ep, tier in zip(rs.endpoints, tiers, strict=True) if tier == ring)
            fading.append(
                FadingRing(
                    ring,
                    int(start),
                    added,
                    age / 1e9,
                    progress,
                    float(share),
                    float(n_ring_share),
                )
            )
    ej = t.ejections
    endpoints = tuple(
        EndpointState(
            address,
            zone,
            node,
            slot,
            tier,
            ejected,
            EJECT_REASONS[reason - 1] if reason else "",
            max(until - now, 0) / 1e9 if reason else None,
            tuple(counts),
            eject_until_ns=int(until) if reason else None,
            eject_multiplier=int(multiplier),
        )
        for address, zone, node, slot, tier, ejected, reason, until, multiplier, counts in zip(
            t.endpoints,
            t.zones,
            t.nodes,
            t.slots.tolist(),
            tiers,
            t.ejected.tolist(),
            ej.reason.tolist(),
            ej.until_ns.tolist(),
            ej.multiplier.tolist(),
            ej.counts.tolist(),
            strict=True,
        )
    )
    return TableRows(
        generation=int(t.generation),
        published_ns=int(t.published_ns),
        publisher_pid=int(t.publisher_pid),
        knobs=k,
        fade_duration_s=rs.duration_ns / 1e9,
        fade_exponent=rs.exponent,
        vnodes=rs.vnodes,
        fading=tuple(fading),
        endpoints=endpoints,
        n_slots=int(t.n_slots),
        outlier_panic=bool(t.outlier_panic),
        zone=t.zone,
    )
