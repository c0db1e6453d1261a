"""The host's routing state as Prometheus metrics, read from shared memory.

Any worker answers ``/metrics`` for the whole host: the collector reads the current
routing table (:class:`shm.TableReader`) and sums every worker's counter row
(:class:`shm.CounterReader`) at scrape time, the way prometheus_client's multiprocess
collector merges per-process files, but without files and without
``PROMETHEUS_MULTIPROC_DIR``. Per-decision counting stays in cslb's own shared counters
(one batched store per routed batch); nothing here runs on the routing path.

:class:`~workers.surfaces.hosts.HostMonitor` takes one consistent snapshot of the host
(:mod:`workers.surfaces.hosts`); the collector turns it into metric families.

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
``cslb_endpoint_reported_utilization``    gauge    the pod's last valid reported utilization
``cslb_endpoint_reported_age_seconds``    gauge    time since the pod's last valid load report
``cslb_endpoint_load_source``             gauge    1 for the ``source`` bounded load uses
``cslb_load_reports_malformed_total``     counter  answers whose load report was malformed
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
``cslb_calls_total``                      counter  fan-out calls to pods by ``locality`` (local,
                                                   remote: in the caller's zone or not)
``cslb_zone_local_share``                 gauge    share of keys local to the caller's ``zone`` now
``cslb_zone_local_share_cap``             gauge    the zone controller's cap on that share
``cslb_zone_affinity_state``              gauge    1 for the zone controller's ``state``, else 0
``cslb_zone_affinity_reason``             gauge    1 for the ``reason`` of that state, else 0
``cslb_zone_transitions_total``           counter  the zone controller's transitions so far
========================================  =======  =================================================
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

import lbcore
from lbcore.knobs import Knob, parse_int_between
from lbcore.outlier import EJECT_REASONS, FAILURE_KINDS
from lbcore.reported import SOURCES
from shm.tables.zone import ZONE_REASONS, ZONE_STATES
from workers.surfaces.hosts import STALE_AFTER, EndpointState, HostMonitor, HostSnapshot

__all__ = [
    "FANOUT_STATS",
    "LOCALITIES",
    "METRICS_MAX_ENDPOINTS",
    "CslbCollector",
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

    Every scrape reads the shared memory afresh. With no tables or counters yet it still
    answers, with ``cslb_discovery_up 0`` and ``cslb_table_generation 0``.

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
        reported = _gauge(
            "cslb_endpoint_reported_utilization",
            "The pod's last valid application_utilization from its endpoint-load-metrics "
            "header (no sample without one, or with CSLB_LOAD_REPORTS off).",
            ep,
        )
        reported_age = _gauge(
            "cslb_endpoint_reported_age_seconds",
            "Time since the pod's last valid load report arrived (no sample without one).",
            ep,
        )
        load_source = _gauge(
            "cslb_endpoint_load_source",
            "1 for the signal bounded load balances the endpoint on: source=reported (the "
            "pod's own load report) or source=host (this host's own view), else 0.",
            [*ep, "source"],
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
            reported,
            reported_age,
            load_source,
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
        families += _zone_families(s)
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
            if e.reported_utilization is not None:
                reported.add_metric(labels, e.reported_utilization)
            if e.reported_age_s is not None:
                reported_age.add_metric(labels, e.reported_age_s)
            for src in SOURCES:
                load_source.add_metric([*labels, src], float(e.load_source == src))
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
    how many are ejected; the load source is ``reported`` when every endpoint's is (no
    reported utilization or age: they do not add up). Loads are absent when no endpoint
    has counters.
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
                reported_utilization=None,
                reported_age_s=None,
                load_source=(
                    "reported" if all(e.load_source == "reported" for e in group) else "host"
                ),
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
    "reports_malformed": (
        "cslb_load_reports_malformed",
        "Answers whose endpoint-load-metrics or Server-Timing header was malformed "
        "(ignored; each pod logged at most once a minute), with CSLB_LOAD_REPORTS on.",
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


# --------------------------------------------------------------------------------------
# Zone affinity: the calls by locality and the zone controller's state.

#: The calls counter's ``locality`` label and the stats field each value reads.
LOCALITIES = {"local": "calls_local", "remote": "calls_remote"}


def _zone_families(s: HostSnapshot | None) -> list[Metric]:
    """Calls by locality and the table's zone record (``None``: the families only).

    The calls are lifetime totals of the counter rows (they survive table changes);
    the zone record's series appear once a table is published, the local share for
    the caller's zone (``zone=""`` when it is unknown: the share is then 0).
    """
    calls = _counter(
        "cslb_calls",
        "Calls the fan-out helper made to pods, retries included, fallbacks to the ingress "
        "not, by locality: local (the pod is in the caller's zone) or remote.",
        ["locality"],
    )
    share = _gauge(
        "cslb_zone_local_share",
        "Share of keys routed on the caller's zone's ring now (x of zone affinity: the zone "
        "controller's curve at this instant); 0 with affinity off.",
        ["zone"],
    )
    cap = _gauge(
        "cslb_zone_local_share_cap",
        "The zone controller's cap on that share: the zone's capacity cap, min(1, pod "
        "share of the zone / caller share), at most 1 - probe floor; 0 when short or off.",
        ["zone"],
    )
    state = _gauge(
        "cslb_zone_affinity_state",
        "1 for the zone controller's state (off, short, ramping, full, floor), else 0.",
        ["state"],
    )
    reason = _gauge(
        "cslb_zone_affinity_reason",
        "1 for why the zone controller is in its state (affinity_off, no_zone, started, "
        "short, latency, unhealthy, recovered, ramp_done, cap_changed), else 0.",
        ["reason"],
    )
    transitions = _counter(
        "cslb_zone_transitions",
        "Transitions of the zone controller so far (each is also a log line).",
    )
    out: list[Metric] = [calls, share, cap, state, reason, transitions]
    if s is None:
        return out
    if s.counters_present:
        for label, key in LOCALITIES.items():
            calls.add_metric([label], float(s.fanout.get(key, 0)))
    if not s.tables_present:
        return out
    z = s.zone
    share.add_metric([z.zone], s.zone_share)
    cap.add_metric([z.zone], z.cap)
    for name in ZONE_STATES:
        state.add_metric([name], float(name == z.state))
    for name in ZONE_REASONS[1:]:  # ("none" is no reason)
        reason.add_metric([name], float(name == z.reason))
    transitions.add_metric([], float(z.transitions))
    return out
