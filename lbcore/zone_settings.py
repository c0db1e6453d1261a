"""Settings of zone affinity, declared once each (:mod:`lbcore.zones` holds the rules).

* ``CSLB_ZONE``: the caller's zone (empty: unknown; no endpoint is local then).
* ``CSLB_ZONE_AFFINITY`` (default ``off``): whether keys are split by zone at all. Off
  routes exactly as before, Skipper parity included.
* ``CSLB_ZONE_RAMP``: seconds for the local share to go from 0 to its cap once affinity
  is on (and again after a suppression). The default is the N-ring fade's window (30 s):
  raising the share moves keys onto local pods whose caches do not hold them yet, the
  same cold-cache cost per moved key as a scale-up, so the same rate is a safe start; the
  simulator (``cslb simulate --scenario zones``) is where it is tuned.
* ``CSLB_ZONE_PROBE_FLOOR`` (1 %): the share kept while affinity is suppressed, so the
  local latency keeps being measured; and the share of keys kept global at full
  affinity (the cap is at most ``1 -`` it), so the remote latency does too.
* ``CSLB_ZONE_MIN_PODS`` (3, Skipper's rule for its zone filter): a zone with fewer
  non-ejected local pods is global (share 0, not the floor).
* ``CSLB_ZONE_LATENCY_MARGIN`` (35 %): affinity drops to the floor when local latency
  exceeds remote latency by more than this fraction.
* ``CSLB_ZONE_HOLD`` (30 s): how long the latency signal must stay below the recovery
  threshold before the share ramps up again. Latency is measured over the occupancy
  window (10 s by default); three windows mean the recovery is seen in measurements
  that share no call with the window that tripped the suppression, which is what keeps
  a fault that comes and goes every window or two from flapping the zone.

Pure: values come in as mappings; :class:`ZoneSettings` holds the intervals as
nanoseconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lbcore.knobs import (
    Knob,
    defaults,
    from_mapping,
    parse_choice,
    parse_int_between,
    parse_number_between,
    seconds_at_least,
)
from lbcore.zones import MAX_MIN_PODS

__all__ = [
    "ZONE",
    "ZONE_AFFINITY",
    "ZONE_HOLD",
    "ZONE_KNOBS",
    "ZONE_LATENCY_MARGIN",
    "ZONE_MIN_PODS",
    "ZONE_PROBE_FLOOR",
    "ZONE_RAMP",
    "ZoneSettings",
    "parse_zone",
]

#: Longest ramp or hold accepted, in seconds (one day).
MAX_ZONE_SECONDS = 86_400.0

#: Largest probe floor accepted, a share of keys (above it affinity is not suppressed).
MAX_PROBE_FLOOR = 0.5

#: Largest latency margin accepted, a fraction (10: local latency 11 times remote).
MAX_LATENCY_MARGIN = 10.0

# A Kubernetes label value (topology.kubernetes.io/zone): at most 63 characters,
# alphanumerics with '-', '_' or '.' inside.
_ZONE_NAME = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")


def parse_zone(text: str) -> str:
    """A zone name as Kubernetes labels carry it, or ``""`` (unknown)."""
    t = text.strip()
    if not _ZONE_NAME.fullmatch(t):
        raise ValueError(
            "expected a zone name (a Kubernetes label value: up to 63 letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit) or nothing"
        )
    return t


ZONE = Knob(
    "zone",
    "CSLB_ZONE",
    "--zone",
    "",
    parse_zone,
    "This caller's zone (as its endpoints' EndpointSlice 'zone'). Empty: unknown, so "
    "no endpoint is local and routing is global. A Kubernetes label value: up to 63 "
    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit.",
    "ZONE",
)
ZONE_AFFINITY = Knob(
    "zone_affinity",
    "CSLB_ZONE_AFFINITY",
    "--zone-affinity",
    "off",
    parse_choice(("off", "on")),
    "'on': a share of the keys, chosen by key, is routed on the zone's ring (the global "
    "ring restricted to local pods) so their calls stay in the zone. 'off' routes "
    "exactly as before. One of: off, on.",
    "off|on",
)
ZONE_RAMP = Knob(
    "zone_ramp_s",
    "CSLB_ZONE_RAMP",
    "--zone-ramp",
    30.0,
    seconds_at_least(0.0, MAX_ZONE_SECONDS),
    "Seconds for the local share to rise from 0 to its cap (once affinity is on, and "
    f"again after a suppression); 0 jumps at once. Range: 0 to {MAX_ZONE_SECONDS:,.0f} s.",
    "SECONDS",
)
ZONE_PROBE_FLOOR = Knob(
    "zone_probe_floor",
    "CSLB_ZONE_PROBE_FLOOR",
    "--zone-probe-floor",
    0.01,
    parse_number_between(0.0, MAX_PROBE_FLOOR, what="a share"),
    "Local share kept while affinity is suppressed (local latency too high), so local "
    "latency keeps being measured; also the share of keys kept global at full affinity "
    "(the local share's cap is at most 1 minus it), so remote latency does too. "
    f"Range: 0 to {MAX_PROBE_FLOOR:g}.",
    "SHARE",
)
ZONE_MIN_PODS = Knob(
    "zone_min_pods",
    "CSLB_ZONE_MIN_PODS",
    "--zone-min-pods",
    3,
    parse_int_between(1, MAX_MIN_PODS),
    "A zone with fewer non-ejected local pods routes every key globally (share 0). "
    f"Range: 1 to {MAX_MIN_PODS:,}.",
    "N",
)
ZONE_LATENCY_MARGIN = Knob(
    "zone_latency_margin",
    "CSLB_ZONE_LATENCY_MARGIN",
    "--zone-latency-margin",
    0.35,
    parse_number_between(0.0, MAX_LATENCY_MARGIN, above=True, what="a fraction"),
    "Affinity drops to the probe floor when local latency exceeds remote latency by more "
    f"than this fraction (0.35: 35 %). Range: above 0, at most {MAX_LATENCY_MARGIN:g}.",
    "FRACTION",
)
ZONE_HOLD = Knob(
    "zone_hold_s",
    "CSLB_ZONE_HOLD",
    "--zone-hold",
    30.0,
    seconds_at_least(1.0, MAX_ZONE_SECONDS),
    "Seconds the latency signal must stay below the recovery threshold before a "
    "suppressed zone ramps up again (three occupancy windows by default: no flapping). "
    f"Range: 1 to {MAX_ZONE_SECONDS:,.0f} s.",
    "SECONDS",
)

#: The seven settings, in documentation order.
ZONE_KNOBS: tuple[Knob, ...] = (
    ZONE,
    ZONE_AFFINITY,
    ZONE_RAMP,
    ZONE_PROBE_FLOOR,
    ZONE_MIN_PODS,
    ZONE_LATENCY_MARGIN,
    ZONE_HOLD,
)


@dataclass(frozen=True, slots=True)
class ZoneSettings:
    """The zone settings in the units the controller uses.

    Attributes
    ----------
    zone : str
        ``CSLB_ZONE`` (``""``: unknown).
    affinity : bool
        ``CSLB_ZONE_AFFINITY`` is ``on``.
    ramp_ns, hold_ns : int
        ``CSLB_ZONE_RAMP`` and ``CSLB_ZONE_HOLD``, in nanoseconds.
    probe_floor : float
        Local share while suppressed, in ``[0, 0.5]``.
    min_pods : int
        ``CSLB_ZONE_MIN_PODS``.
    latency_margin : float
        ``CSLB_ZONE_LATENCY_MARGIN``, a fraction (0.35: local latency 35 % above remote).
    """

    zone: str = ZONE.default
    affinity: bool = ZONE_AFFINITY.default == "on"
    ramp_ns: int = round(ZONE_RAMP.default * 1e9)
    probe_floor: float = ZONE_PROBE_FLOOR.default
    min_pods: int = ZONE_MIN_PODS.default
    latency_margin: float = ZONE_LATENCY_MARGIN.default
    hold_ns: int = round(ZONE_HOLD.default * 1e9)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ZoneSettings:
        """From knob values by name (:func:`lbcore.knobs.from_args` or ``from_mapping``).

        Names missing from ``values`` take their defaults.
        """
        v = {**defaults(ZONE_KNOBS), **values}
        return cls(
            zone=str(v["zone"]),
            affinity=v["zone_affinity"] == "on",
            ramp_ns=round(float(v["zone_ramp_s"]) * 1e9),
            probe_floor=float(v["zone_probe_floor"]),
            min_pods=int(v["zone_min_pods"]),
            latency_margin=float(v["zone_latency_margin"]),
            hold_ns=round(float(v["zone_hold_s"]) * 1e9),
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "environment") -> ZoneSettings:
        """From an environment or ConfigMap mapping (``CSLB_*`` keys or knob names)."""
        return cls.from_values(from_mapping(data, ZONE_KNOBS, source=source))
