"""The zone controller: how much of the caller zone's keys stay local, over time.

Discovery is the host's one table writer, so the local share ``x`` of the caller's zone
is decided here, once per host, and published as a curve
(:class:`shm.tables.zone.ZoneCurve`) that every worker evaluates at its own instant. Pure:
time and measurements come in as arguments (:class:`ZoneSignals`); the discovery loop
feeds it (:mod:`discovery.zoneloop`) and publishes whenever :meth:`ZoneController.step`
returns a new curve.

States (:data:`shm.tables.zone.ZONE_STATES`):

* ``off`` (x = 0): affinity off, or the caller's zone unknown.
* ``short`` (x = 0): fewer healthy local pods than the minimum; the zone routes
  globally (not the probe floor: a short zone cannot carry even that share safely).
* ``ramping``: x grows linearly from where it stands to the cap at ``cap / ramp``
  per second (``CSLB_ZONE_RAMP``; 0 jumps), so a zone's caches warm before it takes
  its whole share; each key moves once (the local set only grows).
* ``full``: x at the cap. A cap that shrinks below x takes x down with it at once (the
  cap is a capacity bound); a cap that grows starts a ramp from x.
* ``floor`` (x = the probe floor): local latency exceeded remote latency by more than
  the margin, or too small a share of the local pods is healthy. The floor keeps a
  trickle of local calls so the signal stays measured.

The cap is the zone's capacity cap (``lbcore.zones.zone_cap``) but never above
``1 - probe floor`` (:func:`affinity_cap`): the probe floor's share of keys stays
global even at full affinity (``off`` and ``short`` publish a cap of 0). Without that
trickle of remote calls a zone whose capacity cap is 1 (an even fleet) would call
remote pods only when bounded load spills, too rarely for a latency reading, and a
local fault would go unseen; it is the mirror of the floor's trickle of local calls.

Hysteresis: leaving ``floor`` or ``short`` needs the signal below a *lower* threshold
(half the latency margin; three quarters of the local pods healthy; the minimum of
healthy pods) without a break for the hold time, and then x ramps from where it stands
rather than jumping. A signal that oscillates around the margin therefore drops x once
and keeps it at the floor; it cannot flap. A latency reading needs enough calls on both
sides (:data:`MIN_CALLS`); without one the latency neither drops x nor counts toward a
recovery, and a recovery run in progress is neither broken nor advanced by it.

The latency signal (:func:`latency_reading`) weighs each pod once: a side's latency is
the mean over its pods of each pod's mean call latency, not the mean over its calls. The
two sides carry different keys, and a few hot keys, cache hits at their one owner, can be
most of the small side's calls (the remote side at a ramp's end, when the zone's draw
leaves some of them global): by call that side looks fast with nothing wrong and the zone
drops. A fault in the zone slows every local pod, which the mean over pods still shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from lbcore.zone_settings import ZoneSettings
from shm.tables.zone import ZoneCurve

__all__ = [
    "HEALTHY_DROP",
    "HEALTHY_RECOVER",
    "MIN_CALLS",
    "RECOVER_MARGIN_SHARE",
    "ZoneController",
    "ZoneSignals",
    "affinity_cap",
    "latency_reading",
]

#: Below this share of healthy (not ejected) local pods, x drops to the probe floor.
HEALTHY_DROP = 0.5
#: A floor caused by unhealthy pods recovers only at or above this healthy share.
HEALTHY_RECOVER = 0.75
#: The latency recovery threshold, as a share of the margin (0.35 → 0.175).
RECOVER_MARGIN_SHARE = 0.5
#: Completed calls (in the counters' window) each side needs for a latency reading.
MIN_CALLS = 20.0


def latency_reading(
    completed: np.ndarray, mean_s: np.ndarray, local: np.ndarray
) -> tuple[float, float, float, float]:
    """Local and remote latency from per-pod counters, weighting each pod once.

    A side's latency is the mean over its pods with a completed call of each pod's
    mean latency, not the mean over calls: a few hot keys, always cache hits at their
    one owner, can be most of a small side's calls (the remote side at full affinity,
    or at a ramp's end) and would make that side look fast with nothing wrong. Weighted
    by pod, that owner counts once. A fault in the caller's zone slows every local pod,
    so it still shows.

    Parameters
    ----------
    completed
        Calls completed per pod in the counters' window.
    mean_s
        Mean call latency per pod over that window, in seconds (read only where
        ``completed`` > 0).
    local
        Per pod, whether it is in the caller's zone.

    Returns
    -------
    tuple of float
        Local and remote latency in seconds (NaN: no pod with a call on that side),
        and the calls behind each (for :data:`MIN_CALLS`).
    """
    n = np.asarray(completed, dtype=np.float64)
    m = np.asarray(mean_s, dtype=np.float64)
    is_local = np.asarray(local, dtype=np.bool_)
    # a NaN or negative count or mean is a broken counter, not a pod with calls
    seen = np.isfinite(n) & (n > 0) & np.isfinite(m) & (m >= 0)
    out: list[float] = []
    for side in (is_local, ~is_local):
        pods = side & seen
        out.append(float(m[pods].mean()) if pods.any() else math.nan)
    out += [float(n[is_local & seen].sum()), float(n[~is_local & seen].sum())]
    return out[0], out[1], out[2], out[3]


def affinity_cap(capacity_cap: float, probe_floor: float) -> float:
    """The highest local share the controller gives a zone.

    Parameters
    ----------
    capacity_cap
        The zone's capacity cap (``lbcore.zones.zone_cap``), 0-1.
    probe_floor
        ``CSLB_ZONE_PROBE_FLOOR``, 0-0.5: this share of the keys stays global.

    Returns
    -------
    float
        ``min(capacity_cap, 1 - probe_floor)``, clipped to 0-1.
    """
    return min(max(float(capacity_cap), 0.0), 1.0 - max(float(probe_floor), 0.0), 1.0)


@dataclass(frozen=True, slots=True)
class ZoneSignals:
    """What the controller is told at one instant.

    Parameters
    ----------
    zone
        The caller's zone (``""``: unknown).
    local_pods
        Published pods in the caller's zone.
    healthy_local_pods
        Those of them routing does not skip (not ejected).
    cap
        The zone's capacity cap (``lbcore.zones.zone_cap``), 0-1.
    local_latency_s, remote_latency_s
        Local and remote latency in seconds over the counters' window: the mean over
        each side's pods of their mean call latency (:func:`latency_reading`; NaN:
        unknown).
    local_calls, remote_calls
        Calls completed in that window to local and to remote pods.
    """

    zone: str
    local_pods: int
    healthy_local_pods: int
    cap: float
    local_latency_s: float = math.nan
    remote_latency_s: float = math.nan
    local_calls: float = 0.0
    remote_calls: float = 0.0

    def latency_excess(self) -> float:
        """How far local latency is above remote, as a share of remote (NaN: unknown)."""
        if min(self.local_calls, self.remote_calls) < MIN_CALLS:
            return math.nan
        lo, re = self.local_latency_s, self.remote_latency_s
        if not (math.isfinite(lo) and math.isfinite(re)) or re <= 0:
            return math.nan
        return lo / re - 1.0

    def healthy_share(self) -> float:
        """Healthy share of the local pods (1 when there are none: nothing to judge)."""
        return self.healthy_local_pods / self.local_pods if self.local_pods else 1.0


class ZoneController:
    """The state machine of the caller zone's local share.

    Parameters
    ----------
    params
        Its settings (``CSLB_ZONE_*``; the zone itself comes with the signals).
    curve
        A curve to continue from (a restarted publisher's, from the tables).
    """

    def __init__(self, params: ZoneSettings, curve: ZoneCurve | None = None) -> None:
        self.params = params
        self.curve = curve if curve is not None else ZoneCurve(min_pods=params.min_pods)
        # Since when the signal has been good without a break (CLOCK_MONOTONIC ns).
        self.good_since: int | None = None

    def share_at(self, now_ns: int) -> float:
        """The local share at ``now_ns`` (CLOCK_MONOTONIC ns)."""
        return self.curve.share_at(now_ns)

    def due_ns(self) -> int | None:
        """When the curve next changes by itself (a ramp reaching its cap), if ever."""
        return self.curve.reaches_cap_ns()

    def step(self, now_ns: int, s: ZoneSignals, params: ZoneSettings | None = None) -> ZoneCurve:
        """Move to the state the signals call for at ``now_ns``; returns the curve in force.

        The returned curve is the same object as before when nothing changed, so the
        caller publishes only when ``step(...) is not`` the previous curve.
        """
        if params is not None and params != self.params:
            self.params = params
            self.curve = replace(self.curve, min_pods=params.min_pods)
        p = self.params
        c = self.curve
        if not p.affinity:
            return self._go(now_ns, "off", "affinity_off", 0.0, s)
        if not s.zone:
            return self._go(now_ns, "off", "no_zone", 0.0, s)
        if s.zone != c.zone and c.zone:
            # Another zone: its caches are cold; start over.
            self.curve = c = replace(c, state="off", reason="no_zone")
        cap = affinity_cap(s.cap, p.probe_floor)
        if s.healthy_local_pods < p.min_pods:
            if c.state != "short":
                return self._go(now_ns, "short", "short", 0.0, s)
            self.good_since = None
            return c
        excess = s.latency_excess()
        bad_latency = excess > p.latency_margin  # NaN: False
        bad_health = s.healthy_share() < HEALTHY_DROP
        if c.state == "off":
            return self._ramp(now_ns, 0.0, cap, "started", s)
        if c.state in ("short", "floor"):
            if c.state == "floor" and (bad_latency or bad_health):
                self.good_since = None
                return c
            good = (
                s.healthy_local_pods >= p.min_pods
                and s.healthy_share() >= HEALTHY_RECOVER
                and not excess >= p.latency_margin * RECOVER_MARGIN_SHARE  # NaN: not known bad
            )
            if c.state == "floor" and c.reason == "latency" and not math.isfinite(excess):
                good = good and self.good_since is not None  # a run only a reading can start
            if not good:
                self.good_since = None
                return c
            if self.good_since is None:
                self.good_since = now_ns
            if now_ns - self.good_since < p.hold_ns:
                return c
            return self._ramp(now_ns, c.share_at(now_ns), cap, "recovered", s)
        # ramping or full
        if bad_latency or bad_health:
            floor = min(p.probe_floor, cap)
            why = "latency" if bad_latency else "unhealthy"
            return self._go(now_ns, "floor", why, floor, s, cap)
        x = c.share_at(now_ns)
        if abs(cap - c.cap) > 1e-9:
            if x >= cap:
                return self._go(now_ns, "full", "cap_changed", cap, s, cap)
            return self._ramp(now_ns, x, cap, "cap_changed", s)
        if c.state == "ramping" and x >= cap:
            return self._go(now_ns, "full", "ramp_done", cap, s, cap)
        return c

    # -- transitions ----------------------------------------------------------------------

    def _go(
        self,
        now_ns: int,
        state: str,
        reason: str,
        x: float,
        s: ZoneSignals,
        cap: float | None = None,
    ) -> ZoneCurve:
        c = self.curve
        new = ZoneCurve(
            zone=s.zone,
            affinity=self.params.affinity,
            min_pods=self.params.min_pods,
            state=state,
            reason=reason,
            start_ns=int(now_ns),
            x0=float(x),
            rate=0.0,
            cap=float(x if cap is None else cap),
            transitions=c.transitions + 1,
        )
        if _same(c, new):
            return c
        self.good_since = None
        self.curve = new
        return new

    def _ramp(self, now_ns: int, x: float, cap: float, reason: str, s: ZoneSignals) -> ZoneCurve:
        if x >= cap or self.params.ramp_ns <= 0:  # a ramp of 0 s jumps
            return self._go(now_ns, "full", reason, cap, s, cap)
        self.good_since = None
        self.curve = ZoneCurve(
            zone=s.zone,
            affinity=True,
            min_pods=self.params.min_pods,
            state="ramping",
            reason=reason,
            start_ns=int(now_ns),
            x0=float(x),
            rate=cap / (self.params.ramp_ns / 1e9),
            cap=float(cap),
            transitions=self.curve.transitions + 1,
        )
        return self.curve


def _same(a: ZoneCurve, b: ZoneCurve) -> bool:
    """The same constant curve (state, reason and values), whatever its start time."""
    return (a.zone, a.affinity, a.min_pods, a.state, a.reason, a.x0, a.rate, a.cap) == (
        b.zone,
        b.affinity,
        b.min_pods,
        b.state,
        b.reason,
        b.x0,
        b.rate,
        b.cap,
    )
