"""Settings of pod-reported load, declared once each (:mod:`lbcore.reported` applies them).

* ``CSLB_LOAD_REPORTS`` (default ``off``): whether bounded load uses the pods' own
  reports at all. Off keeps today's routing exactly, Skipper parity included. It is
  opt-in because a report is an input written by the pods (another team's code, a new
  trust boundary) and is worth trusting only once ``cslb_endpoint_reported_utilization``
  has been seen to make sense for a service; with it on, pods that report nothing are
  balanced exactly as before, so turning it on is safe for a fleet that does not report.
* ``CSLB_LOAD_REPORT_BLACKOUT`` (10 s, gRPC A58's): how long a pod's first reports are
  used only to raise its load, never to lower it below the host's view.
* ``CSLB_LOAD_REPORT_EXPIRY``: a report older than this is not used. It must stay well
  above the refresh interval (a pod whose keys all moved away is reported on only by
  refreshes; a report expiring between two of them hands it its keys back at once).
* ``CSLB_LOAD_REPORT_REFRESH``: the discovery process asks a pod's load-only path for
  a new report when its latest one is older than this.

The defaults were chosen with the simulator (``cslb simulate --scenario reports``: several
client hosts, one pod made hot by other callers; its sweep varies each setting):

* the refresh interval bounds how long a pod that cooled down waits for its keys (about
  one refresh plus the pod's own measuring window); a shorter one costs a load-only
  request per idle pod per host that often, a longer one leaves a cooled pod idle;
* without refreshes a cooled pod gets its keys back only at expiry, so the expiry is the
  fallback for a pod whose load-only path fails. A58's 3 min suits a balancer whose only
  signal is the report; here the host's own view is a sound fallback, so a shorter one
  is better. It is fixed rather than a multiple of the observed report interval: a
  host's interval to a pod is its call rate to it, which bounded load itself drives to
  zero for a hot pod, so such an expiry would lapse exactly when the report matters and
  hand the pod its keys back at each lapse;
* since a high report counts at once, the blackout does not delay shedding a hot pod; it
  only holds back the low reports of a pod that just started, so A58's 10 s is kept.

Pure: values come in as mappings; :class:`ReportSettings` holds them as nanoseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lbcore.knobs import (
    Knob,
    KnobError,
    defaults,
    from_mapping,
    parse_bool,
    seconds_at_least,
)

__all__ = [
    "LOAD_REPORTS",
    "LOAD_REPORT_BLACKOUT",
    "LOAD_REPORT_EXPIRY",
    "LOAD_REPORT_REFRESH",
    "REPORT_KNOBS",
    "ReportSettings",
]

#: Longest blackout, expiry or refresh interval accepted, in seconds (one hour): past
#: it a report says nothing about the pod's present load.
MAX_REPORT_SECONDS = 3600.0


LOAD_REPORTS = Knob(
    "load_reports",
    "CSLB_LOAD_REPORTS",
    "--load-reports",
    False,
    parse_bool,
    "Bounded load uses the pods' own load reports (the endpoint-load-metrics header): a "
    "pod with a fresh report is compared by its reported occupancy against the other "
    "reporting pods, the others by this host's own view. 'off' routes exactly as before.",
    "BOOL",
)
LOAD_REPORT_BLACKOUT = Knob(
    "load_report_blackout_s",
    "CSLB_LOAD_REPORT_BLACKOUT",
    "--load-report-blackout",
    10.0,
    seconds_at_least(0.0, MAX_REPORT_SECONDS),
    "Seconds after a pod's first report (and after its slot's address changes, or its "
    "reports lapsed) during which a report may only raise the pod's load above this "
    "host's view, never lower it: a pod that just started reports idle before it is warm.",
    "SECONDS",
)
LOAD_REPORT_EXPIRY = Knob(
    "load_report_expiry_s",
    "CSLB_LOAD_REPORT_EXPIRY",
    "--load-report-expiry",
    30.0,
    seconds_at_least(1.0, MAX_REPORT_SECONDS),
    "Seconds after which a pod's latest report is no longer used (the pod is balanced on "
    "this host's view until it reports again, after a new blackout). Must exceed twice "
    "the refresh interval.",
    "SECONDS",
)
LOAD_REPORT_REFRESH = Knob(
    "load_report_refresh_s",
    "CSLB_LOAD_REPORT_REFRESH",
    "--load-report-refresh",
    5.0,
    seconds_at_least(0.5, MAX_REPORT_SECONDS),
    "Seconds after which the discovery process asks a pod's load-only path for a new "
    "report (a pod whose keys all moved away gets no calls, so no reports: this is how "
    "it gets its keys back when it cools down).",
    "SECONDS",
)

#: The four settings, in documentation order.
REPORT_KNOBS: tuple[Knob, ...] = (
    LOAD_REPORTS,
    LOAD_REPORT_BLACKOUT,
    LOAD_REPORT_EXPIRY,
    LOAD_REPORT_REFRESH,
)


@dataclass(frozen=True, slots=True)
class ReportSettings:
    """The report settings in the units the folding rules use.

    Attributes
    ----------
    enabled : bool
        ``CSLB_LOAD_REPORTS``.
    blackout_ns, expiry_ns, refresh_ns : int
        The three intervals, in nanoseconds.
    """

    enabled: bool = LOAD_REPORTS.default
    blackout_ns: int = round(LOAD_REPORT_BLACKOUT.default * 1e9)
    expiry_ns: int = round(LOAD_REPORT_EXPIRY.default * 1e9)
    refresh_ns: int = round(LOAD_REPORT_REFRESH.default * 1e9)

    def __post_init__(self) -> None:
        if self.expiry_ns < 2 * self.refresh_ns:
            raise KnobError(
                f"{LOAD_REPORT_EXPIRY.env}={self.expiry_ns / 1e9:g} must be at least twice "
                f"{LOAD_REPORT_REFRESH.env}={self.refresh_ns / 1e9:g}: a pod reported on "
                "only by refreshes would otherwise lose its report between two of them"
            )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ReportSettings:
        """From knob values by name (:func:`lbcore.knobs.from_args` or ``from_mapping``).

        Names missing from ``values`` take their defaults.
        """
        v = {**defaults(REPORT_KNOBS), **values}
        return cls(
            enabled=bool(v["load_reports"]),
            blackout_ns=round(float(v["load_report_blackout_s"]) * 1e9),
            expiry_ns=round(float(v["load_report_expiry_s"]) * 1e9),
            refresh_ns=round(float(v["load_report_refresh_s"]) * 1e9),
        )

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, source: str = "environment"
    ) -> ReportSettings:
        """From an environment or ConfigMap mapping (``CSLB_*`` keys or knob names)."""
        return cls.from_values(from_mapping(data, REPORT_KNOBS, source=source))
