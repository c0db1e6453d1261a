"""The zone record a table carries: the caller's zone and the zone controller's curve.

Discovery's zone controller (:mod:`discovery.zonecontrol`) moves the local share ``x``
of the caller's zone along a curve and publishes the curve, not its points: a worker
evaluates :meth:`ZoneCurve.share_at` at the instant it builds a plan, so a ramp needs
no publish per step. A publish happens only when the curve changes (a transition:
affinity switched on, a drop to the probe floor, a short zone, a recovery, a ramp that
reached its cap, a new cap).

The curve is linear and capped: ``x(t) = min(cap, x0 + rate × (t − start))`` for
``t ≥ start`` (``x0`` before), with ``rate`` in share per second and times on
CLOCK_MONOTONIC in nanoseconds. A constant state (the probe floor, a short zone, full
affinity) has ``rate = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shm.errors import TableInputError

__all__ = ["MAX_ZONE_BYTES", "ZONE_REASONS", "ZONE_STATES", "ZoneCurve"]

#: Controller states, in code order (the table stores the index).
#: ``off``: affinity off or the caller's zone unknown (x = 0); ``short``: fewer healthy
#: local pods than the minimum (x = 0); ``ramping``: x grows toward the cap; ``full``:
#: x is at the cap; ``floor``: suppressed to the probe floor until the signal recovers.
ZONE_STATES = ("off", "short", "ramping", "full", "floor")

#: Why the controller is in its state, in code order (the table stores the index).
ZONE_REASONS = (
    "none",
    "affinity_off",  # CSLB_ZONE_AFFINITY=off
    "no_zone",  # the caller's zone is not known (CSLB_ZONE unset, not discovered)
    "started",  # affinity on with a known zone: ramp from 0
    "short",  # fewer healthy local pods than CSLB_ZONE_MIN_PODS
    "latency",  # local latency above remote by more than the margin
    "unhealthy",  # too small a share of the local pods is healthy
    "recovered",  # the signal stayed good for the hold time: ramp again
    "ramp_done",  # the ramp reached the cap
    "cap_changed",  # the capacity cap moved (pods or callers per zone changed)
)

#: Longest zone name stored, in UTF-8 bytes (a Kubernetes topology label value fits).
MAX_ZONE_BYTES = 253


@dataclass(frozen=True, slots=True)
class ZoneCurve:
    """The caller's zone and the local share's curve, as one table publishes them.

    Parameters
    ----------
    zone
        The caller's zone (``""``: unknown; then x is 0).
    affinity
        Zone affinity on (``CSLB_ZONE_AFFINITY``).
    min_pods
        Healthy local pods a zone needs to keep keys local (``CSLB_ZONE_MIN_PODS``).
    state, reason
        The controller's state and why, names from :data:`ZONE_STATES` and
        :data:`ZONE_REASONS`.
    start_ns
        When the curve starts (CLOCK_MONOTONIC, ns).
    x0
        Local share at ``start_ns`` (0-1).
    rate
        Growth of the local share, in share per second (``>= 0``).
    cap
        Largest local share of the curve (0-1), the controller's cap: the zone's
        capacity cap, at most ``1 - probe floor`` (the controller keeps that share of
        keys global); ``0`` when ``short`` or ``off``.
    transitions
        Transitions of the controller so far in this namespace (a counter for metrics:
        a zone that flaps shows here even between two scrapes).
    """

    zone: str = ""
    affinity: bool = False
    min_pods: int = 3
    state: str = "off"
    reason: str = "affinity_off"
    start_ns: int = 0
    x0: float = 0.0
    rate: float = 0.0
    cap: float = 0.0
    transitions: int = 0

    def __post_init__(self) -> None:
        name = self.zone
        if not isinstance(name, str) or len(name.encode("utf-8", "replace")) > MAX_ZONE_BYTES:
            raise TableInputError(
                f"zone must be a string of at most {MAX_ZONE_BYTES} bytes: {self.zone!r:.80}"
            )
        if self.state not in ZONE_STATES:
            raise TableInputError(f"zone state {self.state!r}: expected one of {ZONE_STATES}")
        if self.reason not in ZONE_REASONS:
            raise TableInputError(f"zone reason {self.reason!r}: expected one of {ZONE_REASONS}")
        if not 0 <= int(self.min_pods) <= 1 << 20:
            raise TableInputError(f"zone min pods {self.min_pods} out of range 0..{1 << 20}")
        for name in ("x0", "cap"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise TableInputError(f"zone {name} must be a share in 0..1, got {v}")
        if not (math.isfinite(float(self.rate)) and 0.0 <= float(self.rate) <= 1e9):
            raise TableInputError(f"zone rate must be >= 0 share per second, got {self.rate}")
        if not 0 <= int(self.transitions) < 1 << 62:
            raise TableInputError(f"zone transitions must be >= 0, got {self.transitions}")
        if int(self.start_ns) < 0:
            raise TableInputError(f"zone start must be >= 0 ns, got {self.start_ns}")

    def share_at(self, now_ns: int) -> float:
        """The caller zone's local share ``x`` at ``now_ns`` (CLOCK_MONOTONIC ns), 0-1.

        0 without affinity or a known zone, else the capped linear curve.
        """
        if not (self.affinity and self.zone):
            return 0.0
        dt_s = max(int(now_ns) - int(self.start_ns), 0) / 1e9
        return min(self.cap, self.x0 + self.rate * dt_s)

    def reaches_cap_ns(self) -> int | None:
        """When a ramp reaches its cap (CLOCK_MONOTONIC ns); ``None``: not ramping."""
        if self.rate <= 0 or self.x0 >= self.cap:
            return None
        return int(self.start_ns) + math.ceil((self.cap - self.x0) / self.rate * 1e9)

    def state_code(self) -> int:
        """Index of :attr:`state` in :data:`ZONE_STATES`."""
        return ZONE_STATES.index(self.state)

    def reason_code(self) -> int:
        """Index of :attr:`reason` in :data:`ZONE_REASONS`."""
        return ZONE_REASONS.index(self.reason)
