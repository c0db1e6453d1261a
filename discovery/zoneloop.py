"""Zone affinity in the discovery loop: the controller fed from the sources and counters.

:class:`ZoneLoop` is the discovery loop's one handle on zones. It keeps what the
sources say about the callers (:class:`discovery.callers.CallerView` per source), the
last latency reading, and the :class:`discovery.zonecontrol.ZoneController`; the loop
asks it for the curve to publish with every table (:meth:`ZoneLoop.curve`) and, every
tick, after a latency reading (:meth:`ZoneLoop.read_latency`: per side, the mean of its
pods' mean latencies, :func:`discovery.zonecontrol.latency_reading`), whether the curve
changed, publishing only then.
Every transition is one ``zone_transition`` log line; the curve, state and reason travel
in the table (:class:`shm.tables.zone.ZoneCurve`), where the workers' metrics read them.

The caller's zone is ``CSLB_ZONE`` if set, else the one the caller's own Service's
slices give; callers per zone come from those slices, else from the endpoints file's
``callers``, else are assumed in proportion to the pods (:func:`lbcore.zones.zone_cap`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from discovery.callers import CallerView
from discovery.events import EventLog
from discovery.zonecontrol import ZoneController, ZoneSignals, affinity_cap, latency_reading
from lbcore.zone_settings import ZoneSettings
from lbcore.zones import zone_cap
from shm.tables.zone import ZoneCurve

__all__ = ["KUBERNETES_CALLERS", "LatencyReader", "ZoneLoop"]

#: Source name of the caller Service's slices (they win over the file's ``callers``).
KUBERNETES_CALLERS = "kubernetes-callers"

#: Latency per endpoint over the counters' window: completed calls and mean latency
#: (seconds), one entry per endpoint asked for; ``None`` when there are no counters.
LatencyReader = Callable[[tuple[str, ...]], "tuple[np.ndarray, np.ndarray] | None"]


class ZoneLoop:
    """The zone controller, its inputs and its log lines, for one discovery loop.

    Parameters
    ----------
    settings
        The zone settings (``CSLB_ZONE*``).
    log
        The discovery log.
    curve
        A recovered table's curve to continue from.
    """

    def __init__(
        self, settings: ZoneSettings, log: EventLog, curve: ZoneCurve | None = None
    ) -> None:
        self.settings = settings
        self.log = log
        self.controller = ZoneController(settings, curve)
        self.views: dict[str, CallerView] = {}
        self._latency: tuple[float, float, float, float] = (math.nan, math.nan, 0.0, 0.0)
        self._warned_not_found = False

    # -- inputs ---------------------------------------------------------------------------

    def set_view(self, source: str, view: CallerView, reason: str = "") -> bool:
        """What ``source`` now says about the callers; True if it changed anything."""
        if self.views.get(source) == view:
            return False
        self.views[source] = view
        self.log.info(
            "zone_callers",
            source=source,
            reason=reason,
            zone=self.zone(),
            callers=None if view.counts is None else dict(view.counts),
        )
        if source == KUBERNETES_CALLERS and not view.found and not self._warned_not_found:
            self._warned_not_found = True
            self.log.warning(
                "zone_caller_not_found",
                why="this pod's IP (CSLB_POD_IP) is not in the caller Service's "
                "EndpointSlices (CSLB_CALLER_SERVICE): its zone is unknown until it is",
            )
        return True

    def zone(self) -> str:
        """The caller's zone: ``CSLB_ZONE``, else the caller slices' (``""``: unknown)."""
        if self.settings.zone:
            return self.settings.zone
        v = self.views.get(KUBERNETES_CALLERS)
        return v.zone if v is not None else ""

    def callers(self) -> Mapping[str, int] | None:
        """Callers per zone: the caller slices', else the file's (``None``: unknown)."""
        for source in (KUBERNETES_CALLERS, "file"):
            v = self.views.get(source)
            if v is not None and v.counts is not None:
                return v.counts
        return None

    @property
    def latency(self) -> tuple[float, float, float, float]:
        """The last reading: local and remote latency (s, per pod; NaN: none), and their calls."""
        return self._latency

    def read_latency(
        self, endpoints: Sequence[str], zones: Sequence[str], read: LatencyReader
    ) -> None:
        """Take a latency reading of local and remote endpoints from ``read``.

        ``read(endpoints)`` gives completed calls and mean latency (seconds) per
        endpoint over the counters' window, or ``None`` (no counters: no reading).
        Local is the mean over the caller zone's endpoints of each one's mean latency,
        remote over the others' (:func:`discovery.zonecontrol.latency_reading`: each
        pod weighs once, however many calls its hot keys draw).
        """
        zone = self.zone()
        got = read(tuple(endpoints)) if endpoints and zone else None
        if got is None:
            self._latency = (math.nan, math.nan, 0.0, 0.0)
            return
        completed, mean_s = got
        local = np.array([z == zone for z in zones], dtype=np.bool_)
        self._latency = latency_reading(completed, mean_s, local)

    def tick(
        self,
        now_ns: int,
        endpoints: tuple[str, ...],
        zones: Sequence[str],
        skipped: np.ndarray | None,
        window: Callable[[tuple[str, ...], int], tuple[np.ndarray, np.ndarray] | None] | None,
        settings: ZoneSettings | None = None,
    ) -> ZoneCurve:
        """A latency reading from ``window`` (the publisher's), then :meth:`curve`.

        ``skipped``: per endpoint, routing skips it (ejected; ``None``: none is).
        """
        if settings is not None:
            self.settings = settings
        if not self.settings.affinity:
            window = None  # nothing to decide on latency: no counters read
        self.read_latency(endpoints, zones, lambda e: window(e, now_ns) if window else None)
        routable = np.ones(len(endpoints), np.bool_)
        if skipped is not None:
            routable &= ~np.asarray(skipped, dtype=np.bool_)
        return self.curve(now_ns, zones, routable, settings)

    # -- the curve ------------------------------------------------------------------------

    def curve(
        self,
        now_ns: int,
        zones: Sequence[str],
        routable: np.ndarray,
        settings: ZoneSettings | None = None,
    ) -> ZoneCurve:
        """The curve in force at ``now_ns`` for endpoints in ``zones`` (one per endpoint).

        ``routable`` marks the endpoints routing does not skip (not ejected). A new
        curve (a transition) is logged here.
        """
        if settings is not None:
            self.settings = settings
        zone = self.zone()
        pods: dict[str, int] = {}
        for z, ok in zip(zones, np.asarray(routable, dtype=np.bool_).tolist(), strict=True):
            if ok and z:
                pods[z] = pods.get(z, 0) + 1
        local_pods = sum(1 for z in zones if zone and z == zone)
        callers = self.callers()
        cap = zone_cap(pods, callers, zone) if zone else 0.0
        lo, re, lo_n, re_n = self._latency
        signals = ZoneSignals(zone, local_pods, pods.get(zone, 0), cap, lo, re, lo_n, re_n)
        before = self.controller.curve
        after = self.controller.step(now_ns, signals, self.settings)
        if after is not before:
            self.log.info(
                "zone_transition",
                zone=zone,
                state=after.state,
                reason=after.reason,
                previous_state=before.state,
                share=round(after.share_at(now_ns), 4),
                cap=round(affinity_cap(cap, self.settings.probe_floor), 4),
                capacity_cap=round(cap, 4),
                rate_per_s=round(after.rate, 6),
                local_pods=local_pods,
                healthy_local_pods=pods.get(zone, 0),
                callers=dict(callers) if callers is not None else "in proportion to pods",
                local_latency_ms=None if math.isnan(lo) else round(lo * 1e3, 3),
                remote_latency_ms=None if math.isnan(re) else round(re * 1e3, 3),
                local_calls=round(lo_n, 1),
                remote_calls=round(re_n, 1),
            )
        return after

    def due_ns(self) -> int | None:
        """When the curve next changes by itself (a ramp reaching its cap), if ever."""
        return self.controller.due_ns()
