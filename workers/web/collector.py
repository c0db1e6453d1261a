"""The host's routing state as Prometheus metrics, read from shared memory.

Any worker answers ``/metrics`` for the whole host: the collector reads the current
routing table (:class:`shm.TableReader`) and sums every worker's counter row
(:class:`shm.CounterReader`) at scrape time, the way prometheus_client's multiprocess
collector merges per-process files, but without files and without
``PROMETHEUS_MULTIPROC_DIR``. Per-decision counting stays in cslb's own shared counters
(one batched store per routed batch); nothing here runs on the routing path.

:class:`HostMonitor` takes one consistent snapshot of the host (:class:`HostSnapshot`);
the collector turns it into metric families, ``/healthz`` asks it for
:meth:`HostMonitor.health` and the status page renders it.

Metrics (labels ``endpoint``, ``zone`` per endpoint of the current table; ``started_ns``
per fading ring: the host's CLOCK_MONOTONIC time its fade started, in nanoseconds, a name
that stays the same in every worker and for the ring's whole fade, unlike its position):

========================================  =======  =================================================
name                                      type     meaning
========================================  =======  =================================================
``cslb_endpoint_occupancy``               gauge    busy-seconds per second over the window
``cslb_endpoint_in_flight``               gauge    open requests, all workers of the host
``cslb_endpoint_latency_seconds``         gauge    mean latency over the window (absent: none ended)
``cslb_endpoint_requests_total``          counter  requests ended, lifetime of the counters
``cslb_endpoint_failures_total``          counter  failed requests, lifetime of the counters
``cslb_endpoint_failures_by_kind_total``  counter  the same by ``kind`` (connect, timeout, ...)
``cslb_endpoint_ejected``                 gauge    1 while routing skips the endpoint (ejected)
``cslb_endpoint_ejections_total``         counter  outlier ejections so far, by ``reason``
``cslb_outlier_panic``                    gauge    1 while too few endpoints are left to eject
``cslb_decisions_total``                  counter  keys routed by the host's workers
``cslb_fallback_total``                   counter  keys answered with fallback (ingress)
``cslb_bounded_load_moves_total``         counter  keys bounded load moved off their ring owner
``cslb_table_generation``                 gauge    publish count of the current table (0: none)
``cslb_table_age_seconds``                gauge    time since that table was published
``cslb_discovery_heartbeat_age_seconds``  gauge    time since the publisher's last heartbeat
``cslb_fade_share``                       gauge    share of keys each fading ring carries now
``cslb_discovery_up``                     gauge    1 while the publisher runs and heartbeats
``cslb_build_info``                       gauge    1, labelled with what runs: version, kernel
``cslb_retries_total``                    counter  retries the fan-out helper sent
``cslb_retries_failed_total``             counter  of those, the ones that failed too
``cslb_retry_budget_exhausted_total``     counter  failed calls the retry budget kept from a retry
``cslb_bulkhead_rejections_total``        counter  calls kept from a pod at its cap or a full pool
========================================  =======  =================================================
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import lbcore
import shm
from lbcore.fade import fadein_score
from lbcore.knobs import Knob, parse_int_between, seconds_at_least
from lbcore.outlier import EJECT_REASONS, FAILURE_KINDS
from workers.routing.snapshot import bounded_bar, build_plan

__all__ = [
    "METRICS_MAX_ENDPOINTS",
    "STALE_AFTER",
    "CslbCollector",
    "EndpointState",
    "FadingRing",
    "Health",
    "HostMonitor",
    "HostSnapshot",
    "build_info",
]


#: ``CSLB_METRICS_MAX_ENDPOINTS``: above this many endpoints, per-endpoint series are
#: summed per zone so one scrape costs the same whatever the table's size.
METRICS_MAX_ENDPOINTS = Knob(
    "metrics_max_endpoints",
    "CSLB_METRICS_MAX_ENDPOINTS",
    "--metrics-max-endpoints",
    1000,
    parse_int_between(0, 1_000_000),
    "Most endpoints /metrics reports one series each for. A table with more reports its "
    "per-endpoint metrics summed per zone instead (label endpoint=\"*\"; no latency "
    "series), so a scrape stays a few samples per zone whatever the table's size. 0: "
    "always per zone.",
    "N",
)


#: ``CSLB_STALE_AFTER``: when the publisher counts as dead. The same setting and meaning
#: as ``cslb inspect --stale-after`` (declared again here: workers do not import discovery).
STALE_AFTER = Knob(
    "stale_after_s",
    "CSLB_STALE_AFTER",
    "--stale-after",
    5.0,
    seconds_at_least(0.01),
    "A publisher heartbeat older than this many seconds means the publisher is not alive: "
    "/healthz answers 503 and cslb_discovery_up is 0 (workers keep routing on the last table).",
    "SECONDS",
)


def build_info() -> dict[str, str]:
    """The labels of ``cslb_build_info`` (one sample, value 1): what this process runs.

    ``version`` is the installed cslb distribution's; ``kernel`` the routing kernel of
    this process (:func:`lbcore.kernel_name`: ``native`` or ``numpy``). A new label is
    one more entry here.
    """
    try:
        version = importlib.metadata.version("cslb")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"version": version, "kernel": lbcore.kernel_name()}


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
    """

    ring: int
    started_ns: int
    added: tuple[str, ...]
    age_s: float
    progress: float
    share: float


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
    outlier_panic : bool
        Too few endpoints are left un-ejected: routing ignores every ejection.
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
    outlier_panic: bool = False
    fanout: dict[str, int] = field(default_factory=dict)  # FANOUT_STATS totals, host-wide


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
            table, (generation, published_ns, knobs, fading, endpoints, n_slots, panic) = (
                reader.consistent(lambda t: (t, _read_table(t, now)))
            )
        except shm.ShmError as exc:
            return HostSnapshot(**base, health=Health(False, self._unavailable(exc)))
        base.update(
            tables_present=True,
            generation=generation,
            table_age_s=(now - published_ns) / 1e9 if generation else None,
            heartbeat_age_s=beat_age,
            writer_pid=pid,
            publisher_alive=dead is None,
            knobs=knobs,
            fading=fading,
            outlier_panic=panic,
            health=self._verdict(
                generation, pid, beat_age, dead, len(endpoints), self._problem(reader, now)
            ),
        )
        counters = self._counter_reader()
        if counters is None:
            return HostSnapshot(**base, endpoints=tuple(endpoints))
        try:
            stats = counters.stats()
            # (window failures per kind are not shown: skip their sums)
            loads = counters.read(now, n_slots, failure_kinds=False).take(
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
            bar=_bar(table, loads, now, increment),
            fanout={k: int(stats.get(k, 0)) for k in FANOUT_STATS},
        )

    def close(self) -> None:
        """Drop the mappings (the next call attaches again)."""
        with self._lock:
            if self._tables is not None:
                self._tables.close()
            if self._counters is not None:
                self._counters.close()
            self._tables = self._counters = None


def _bar(table: shm.Table, loads: shm.HostLoads, now: int, increment: float | None) -> float | None:
    """The routers' bounded-load bar on ``table`` with ``loads``, in the signal's unit.

    From the plan a router builds on them (its loads are in routed-call units: the
    bar times the increment is the bar in the signal's); ``None`` if ``table`` was
    rewritten meanwhile or has no bar.
    """
    if increment is None:
        return None
    try:
        bar = bounded_bar(build_plan(table, loads, now))
    except lbcore.LBCoreError:
        return None  # garbage from a rewritten table (or a damaged one: health says so)
    return None if bar is None or not table.valid() else bar * increment


def _read_table(
    t: shm.Table, now: int
) -> tuple[int, int, dict[str, Any], tuple[FadingRing, ...], list[EndpointState], int, bool]:
    """Copy out of a table everything a snapshot needs (run under ``consistent``)."""
    rs = t.ring_set
    k = t.knobs
    knobs: dict[str, Any] = {
        "enabled": bool(k.enabled),
        "percentage": k.percentage,
        "balance_factor": k.balance_factor,
        "max_hops": k.max_hops,
        "load_signal": k.load_signal,
        "fade_mode": k.fade_mode,
        "fade_duration_s": rs.duration_ns / 1e9,
        "fade_exponent": rs.exponent,
        "vnodes": rs.vnodes,
    }
    tiers = [int(x) for x in rs.tiers] if rs.endpoints else []
    fading = []
    if rs.endpoints:
        for ring, (start, share) in enumerate(
            zip(rs.starts_ns, rs.share_list(now), strict=True), start=1
        ):
            age = now - start
            if k.fade_mode == "skipper":
                share = fadein_score(age, rs.duration_ns, rs.exponent)
            elif k.fade_mode == "off":
                share = 1.0
            progress = min(max(age / rs.duration_ns, 0.0), 1.0) if rs.duration_ns > 0 else 1.0
            added = tuple(ep for ep, tier in zip(rs.endpoints, tiers, strict=True) if tier == ring)
            fading.append(FadingRing(ring, int(start), added, age / 1e9, progress, float(share)))
    ej = t.ejections
    endpoints = [
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
        )
        for address, zone, node, slot, tier, ejected, reason, until, counts in zip(
            t.endpoints,
            t.zones,
            t.nodes,
            t.slots.tolist(),
            tiers,
            t.ejected.tolist(),
            ej.reason.tolist(),
            ej.until_ns.tolist(),
            ej.counts.tolist(),
            strict=True,
        )
    ]
    return (
        int(t.generation),
        int(t.published_ns),
        knobs,
        tuple(fading),
        endpoints,
        int(t.n_slots),
        bool(t.outlier_panic),
    )


# --------------------------------------------------------------------------------------
# The collector.


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    # A base unit in the name is declared too (OpenMetrics writes it as a # UNIT line).
    unit = "seconds" if name.endswith("_seconds") else ""
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    # prometheus_client names the family without "_total" and appends it to the sample.
    return CounterMetricFamily(name, doc, labels=labels)


class CslbCollector:
    """Prometheus collector of a namespace's routing state, host-wide.

    Register it in its own registry and serve ``generate_latest(registry)``::

        registry = CollectorRegistry()
        registry.register(CslbCollector("prapi"))

    Every scrape reads the shared memory afresh (about 0.5 ms for a hundred endpoints
    and 8 worker rows; the app's ``/metrics``, written by prometheus_client, takes
    4-7 ms). With no tables or counters yet it still answers, with
    ``cslb_discovery_up 0`` and ``cslb_table_generation 0``.

    Parameters
    ----------
    namespace
        Shared-memory namespace.
    stale_after_s
        Heartbeat age in seconds beyond which ``cslb_discovery_up`` is 0.
    monitor
        A :class:`HostMonitor` to share (``/healthz`` and ``/status`` use the same one);
        by default the collector makes its own.
    """

    def __init__(
        self,
        namespace: str,
        *,
        stale_after_s: float = STALE_AFTER.default,
        monitor: HostMonitor | None = None,
        max_endpoints: int = METRICS_MAX_ENDPOINTS.default,
    ) -> None:
        self.monitor = monitor or HostMonitor(namespace, stale_after_s=stale_after_s)
        self.max_endpoints = int(max_endpoints)

    def describe(self) -> Iterator[Metric]:
        """The families this collector yields (without samples), for the registry."""
        return iter(self._families(None))

    def collect(self) -> Iterator[Metric]:
        """The metric families of one snapshot of the host."""
        return iter(self._families(self.monitor.snapshot()))

    def _families(self, s: HostSnapshot | None) -> list[Metric]:
        ep = ["endpoint", "zone"]
        occupancy = _gauge(
            "cslb_endpoint_occupancy",
            "Busy-seconds per second the host's workers spent waiting on the endpoint, "
            "over the occupancy window (1 = one request open all the time).",
            ep,
        )
        in_flight = _gauge(
            "cslb_endpoint_in_flight", "Requests to the endpoint open now, all workers.", ep
        )
        latency = _gauge(
            "cslb_endpoint_latency_seconds",
            "Mean latency of requests to the endpoint that ended within the occupancy "
            "window (no sample when none ended).",
            ep,
        )
        requests = _counter(
            "cslb_endpoint_requests", "Requests to the endpoint that ended (all workers).", ep
        )
        failures = _counter(
            "cslb_endpoint_failures", "Requests to the endpoint that failed (all workers).", ep
        )
        by_kind = _counter(
            "cslb_endpoint_failures_by_kind",
            "Requests to the endpoint that failed, by how: connect (refused, reset, DNS), "
            "timeout, status (5xx or another failure status), other (all workers).",
            [*ep, "kind"],
        )
        ejected = _gauge(
            "cslb_endpoint_ejected",
            "1 while routing skips the endpoint because outlier detection ejected it, else 0 "
            "(0 for every endpoint in outlier panic).",
            ep,
        )
        ejections = _counter(
            "cslb_endpoint_ejections",
            "Outlier ejections of the endpoint so far, by reason (consecutive_failures, "
            "failure_percentage, success_rate), as the discovery process publishes them.",
            [*ep, "reason"],
        )
        panic = _gauge(
            "cslb_outlier_panic",
            "1 while too few endpoints are left un-ejected (below the panic threshold): "
            "routing ignores every ejection.",
        )
        decisions = _counter("cslb_decisions", "Keys routed by the host's workers.")
        fallback = _counter(
            "cslb_fallback",
            "Keys answered with fallback (the caller uses the ingress): gate, kill switch, "
            "empty or all-ejected table.",
        )
        moves = _counter(
            "cslb_bounded_load_moves",
            "Keys bounded load routed away from their ring owner because it was over the bar.",
        )
        generation = _gauge(
            "cslb_table_generation", "Publish count of the routing table in use (0: none)."
        )
        table_age = _gauge(
            "cslb_table_age_seconds",
            "Time since the routing table in use was published (no sample before the first).",
        )
        beat_age = _gauge(
            "cslb_discovery_heartbeat_age_seconds",
            "Time since the discovery process last wrote a heartbeat or published.",
        )
        fade = _gauge(
            "cslb_fade_share",
            "Share of keys a fading ring carries now (under fade_mode=skipper Skipper's "
            "fade-in score of the ring's pods); label started_ns: the host's CLOCK_MONOTONIC "
            "time its fade started, in nanoseconds, the same in every worker.",
            ["started_ns"],
        )
        up = _gauge(
            "cslb_discovery_up",
            "1 while the discovery process runs and its heartbeat is fresh, else 0.",
        )
        info = build_info()
        build = _gauge(
            "cslb_build_info",
            "Always 1; the labels say what runs (version: the cslb release).",
            list(info),
        )
        families: list[Metric] = [
            build,
            occupancy,
            in_flight,
            latency,
            requests,
            failures,
            by_kind,
            ejected,
            ejections,
            panic,
            decisions,
            fallback,
            moves,
            generation,
            table_age,
            beat_age,
            fade,
            up,
        ]
        families += _fanout_families(s)
        if s is None:
            return families
        build.add_metric(list(info.values()), 1.0)
        up.add_metric([], 1.0 if s.publisher_alive else 0.0)
        if s.tables_present:
            panic.add_metric([], 1.0 if s.outlier_panic else 0.0)
        generation.add_metric([], float(s.generation))
        if s.table_age_s is not None:
            table_age.add_metric([], s.table_age_s)
        if s.heartbeat_age_s is not None:
            beat_age.add_metric([], s.heartbeat_age_s)
        for r in s.fading:
            fade.add_metric([str(r.started_ns)], r.share)
        endpoints: Any = s.endpoints
        if len(endpoints) > self.max_endpoints:
            endpoints = _per_zone(endpoints)
        for e in endpoints:
            labels = [e.address, e.zone]
            ejected.add_metric(labels, float(e.ejected))
            for reason, n in zip(EJECT_REASONS, e.ejections, strict=True):
                ejections.add_metric([*labels, reason], float(n))
            if e.occupancy is None:
                continue
            occupancy.add_metric(labels, e.occupancy)
            in_flight.add_metric(labels, float(e.in_flight or 0))
            if e.latency_s is not None:
                latency.add_metric(labels, e.latency_s)
            requests.add_metric(labels, float(e.requests_total or 0))
            failures.add_metric(labels, float(e.failures_total or 0))
            for kind, n in zip(FAILURE_KINDS, e.failures_by_kind or (0,) * 4, strict=True):
                by_kind.add_metric([*labels, kind], float(n))
        if s.counters_present:
            decisions.add_metric([], float(s.decisions or 0))
            fallback.add_metric([], float(s.fallbacks or 0))
            moves.add_metric([], float(s.moves or 0))
        return families


def _per_zone(endpoints: tuple[EndpointState, ...]) -> list[EndpointState]:
    """One row per zone summing its endpoints' series (``endpoint="*"``, no latency).

    Occupancy, in-flight calls and the totals add up across endpoints; ``ejected`` is
    how many are ejected. Loads are absent when no endpoint has counters.
    """
    zones: dict[str, list[EndpointState]] = {}
    for e in endpoints:
        zones.setdefault(e.zone, []).append(e)
    out = []
    for _, group in sorted(zones.items()):
        loaded = [e for e in group if e.occupancy is not None]
        kinds = [
            sum(k) for k in zip(*(e.failures_by_kind or (0,) * 4 for e in loaded), strict=True)
        ]
        out.append(
            dataclasses.replace(
                group[0],
                address="*",
                ejected=sum(1 for e in group if e.ejected),
                ejections=tuple(sum(n) for n in zip(*(e.ejections for e in group), strict=True)),
                occupancy=sum(e.occupancy or 0.0 for e in loaded) if loaded else None,
                in_flight=sum(e.in_flight or 0 for e in loaded),
                latency_s=None,
                requests_total=sum(e.requests_total or 0 for e in loaded),
                failures_total=sum(e.failures_total or 0 for e in loaded),
                failures_by_kind=tuple(kinds) if kinds else None,
            )
        )
    return out


# --------------------------------------------------------------------------------------
# The fan-out helper's counters (workers.fanout.threads): retries and the retry budget.

#: Host-wide lifetime totals of the fan-out helper, from the counters' stats words, and
#: the metric each one is exposed as (a counter: ``<name>_total``).
FANOUT_STATS = {
    "retries": (
        "cslb_retries",
        "Retries the fan-out helper sent (one per failed call at most), all workers.",
    ),
    "retries_failed": (
        "cslb_retries_failed",
        "Retries that failed too (their error went back to the caller).",
    ),
    "retries_refused": (
        "cslb_retry_budget_exhausted",
        "Failed calls not retried because the worker's retry budget was used up.",
    ),
    "bulkhead_rejections": (
        "cslb_bulkhead_rejections",
        "Calls the bulkhead kept from a pod with its cap of calls in flight (sent to the "
        "retry pod instead, or failed) or from a full fan-out pool; never a pod's failure.",
    ),
}


def _fanout_families(s: HostSnapshot | None) -> list[Metric]:
    """The fan-out helper's counters of snapshot ``s`` (``None``: the families only)."""
    out: list[Metric] = []
    for key, (name, doc) in FANOUT_STATS.items():
        c = _counter(name, doc)
        if s is not None and s.counters_present:
            c.add_metric([], float(s.fanout.get(key, 0)))
        out.append(c)
    return out
