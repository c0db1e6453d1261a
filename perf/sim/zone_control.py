"""Discovery's zone controller against caches: does a recovery's ramp flap it back down.

:class:`discovery.zonecontrol.ZoneController` decides each caller zone's local share
``x`` from local and remote call latency. Here it runs inside the zones simulation
(:func:`perf.sim.zones.run`) at the default settings (:mod:`lbcore.zone_settings`,
affinity on): one controller per caller zone, as each host's discovery runs its own,
stepped every ``step_s`` with its zone's calls and their mean latency per pod over the
counters' window (``window_s``), turned into a reading by discovery's own rule
(:func:`discovery.zonecontrol.latency_reading`, as
:meth:`discovery.zoneloop.ZoneLoop.read_latency` does: each side the mean of its pods'
means). Every tick each zone
routes with cslb's key split at the share its controller's curve gives for that
instant, as a worker's plan does.

The cache effect is what a unit test of the controller cannot show: every key that
turns local meets a local cache that does not hold it, so while ``x`` rises the local
calls miss more often and run slower than the remote ones, which hit warm caches.
If that excess passed the latency margin the ramp would drop the zone back to the
probe floor, and after the hold time ramp again: a flap. The study starts affinity
after the warm-up, slows one zone's pods (``slow``: a latency fault) long enough to
send it to the floor, and follows the recovery's ramp.

A second fault starts at full affinity: the controller holds each cap at
``1 - probe floor`` (:func:`discovery.zonecontrol.affinity_cap`), so even a zone whose
capacity cap is 1 keeps a trickle of remote calls for the latency reading's remote side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from discovery.zonecontrol import ZoneController, ZoneSignals, latency_reading
from lbcore.zone_settings import ZoneSettings
from perf.sim.zone_routing import KeySplit, Layout, Strategy, zone_shares
from perf.sim.zones import ZonesConfig, run

__all__ = ["CASES", "ControllerDriver", "Transition", "controller_study"]

#: The cases ``cslb simulate --scenario zone-controller`` runs: (name, the fault as
#: :attr:`perf.sim.zones.ZonesConfig.slow`). The fault triples zone z-a's service
#: times: first while the start's ramp has x below its cap, then at full.
CASES: tuple[tuple[str, tuple[int, float, float, float]], ...] = (
    ("fault while ramping", (0, 3.0, 10.0, 40.0)),
    ("fault at full", (0, 3.0, 60.0, 90.0)),
)

#: Added to the simulation's clock (seconds after warm-up) to make CLOCK_MONOTONIC-like
#: nanoseconds that stay positive through the warm-up.
_EPOCH_NS = 10**12


@dataclass(frozen=True, slots=True)
class Transition:
    """One new curve of one zone's controller.

    Attributes
    ----------
    t_s
        Seconds after warm-up.
    zone, state, reason
        The caller zone and the controller's new state and why.
    x
        The share at that instant.
    local_ms, remote_ms
        The latency reading it decided on (mean of the pods' means, ms; NaN: none).
    local_calls, remote_calls
        Calls behind the reading (in the window).
    """

    t_s: float
    zone: str
    state: str
    reason: str
    x: float
    local_ms: float
    remote_ms: float
    local_calls: float
    remote_calls: float


@dataclass
class ControllerDriver:
    """Feeds each caller zone's controller and sets its share (:class:`perf.sim.zones.TickDriver`).

    Parameters
    ----------
    layout
        Pods and callers per zone.
    settings
        The controllers' settings (the zone name is filled in per zone).
    window_s
        The counters' window a latency reading covers, in seconds.
    step_s
        How often a controller steps, in seconds (the discovery loop's tick).
    tick_s
        The simulation's tick, in seconds.
    """

    layout: Layout
    settings: ZoneSettings
    window_s: float
    step_s: float
    tick_s: float
    transitions: list[Transition] = field(default_factory=list)
    #: Per second after warm-up: ``t`` and, per zone, ``x`` and the latency excess.
    series: dict[str, list[Any]] = field(default_factory=dict)
    #: Per zone, the highest latency excess read while ramping after a recovery (NaN: none).
    recovery_excess: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        zones = self.layout.zones
        w = max(1, round(self.window_s / self.tick_s))
        n = self.layout.zone_of.size
        # per tick of the window, per caller zone and pod: calls, and their latency summed
        self._calls = np.zeros((w, zones, n))
        self._lat = np.zeros((w, zones, n))
        self._k = 0
        self._next_step_s = 0.0
        # capacity caps; each controller holds its own below 1 - probe floor
        self._caps = zone_shares(self.layout, 1.0)
        self.controllers = [
            ZoneController(replace(self.settings, zone=name)) for name in self.layout.names
        ]
        self.series = {"t": [], "x": [], "excess": []}
        self.recovery_excess = [math.nan] * zones

    def tick(
        self,
        strategy: Strategy,
        t_s: float,
        caller: np.ndarray,
        pods: np.ndarray,
        latency: np.ndarray,
    ) -> None:
        """Count the tick's calls; at each step, step the controllers; set every share."""
        assert isinstance(strategy, KeySplit)
        zones, n = self.layout.zones, self.layout.zone_of.size
        slot = self._k % self._calls.shape[0]
        self._k += 1
        cell = caller * n + pods
        self._calls[slot] = np.bincount(cell, minlength=zones * n).reshape(zones, n)
        self._lat[slot] = np.bincount(cell, weights=latency, minlength=zones * n).reshape(zones, n)
        if t_s < 0:
            return  # warm-up: global, the controllers not started yet
        now_ns = _EPOCH_NS + round(t_s * 1e9)
        if t_s + 1e-9 >= self._next_step_s:
            self._next_step_s += self.step_s
            self._step(now_ns, t_s)
        for z, c in enumerate(self.controllers):
            strategy.set_zone_share(z, float(c.share_at(now_ns)))

    def _step(self, now_ns: int, t_s: float) -> None:
        calls, lat = self._calls.sum(axis=0), self._lat.sum(axis=0)
        mean_s = np.divide(lat, calls, out=np.full_like(lat, math.nan), where=calls > 0)
        xs, excess = [], []
        for z, c in enumerate(self.controllers):
            # discovery's own reading, from each pod's calls and mean latency
            lo, re, lo_n, re_n = latency_reading(calls[z], mean_s[z], self.layout.zone_of == z)
            s = ZoneSignals(
                zone=self.layout.names[z],
                local_pods=self.layout.pods[z],
                healthy_local_pods=self.layout.pods[z],
                cap=float(self._caps[z]),
                local_latency_s=lo,
                remote_latency_s=re,
                local_calls=lo_n,
                remote_calls=re_n,
            )
            before = c.curve
            after = c.step(now_ns, s)
            if after is not before:
                self.transitions.append(
                    Transition(
                        t_s=round(t_s, 3),
                        zone=s.zone,
                        state=after.state,
                        reason=after.reason,
                        x=float(after.share_at(now_ns)),
                        local_ms=s.local_latency_s * 1e3,
                        remote_ms=s.remote_latency_s * 1e3,
                        local_calls=s.local_calls,
                        remote_calls=s.remote_calls,
                    )
                )
            e = s.latency_excess()
            if before.state == "ramping" and before.reason == "recovered" and math.isfinite(e):
                self.recovery_excess[z] = float(max(e, self.recovery_excess[z], key=_finite))
            xs.append(float(c.share_at(now_ns)))
            excess.append(e)
        self.series["t"].append(t_s)
        self.series["x"].append(xs)
        self.series["excess"].append(excess)


def controller_study(
    base: ZonesConfig,
    *,
    settings: ZoneSettings | None = None,
    slow: tuple[int, float, float, float] | None = (0, 3.0, 60.0, 90.0),
    step_s: float = 1.0,
) -> dict[str, Any]:
    """Run cslb's key split under one controller per zone, with a latency fault.

    Parameters
    ----------
    base
        The run (fleet, traffic, caches; ``seconds`` long enough for the fault, the hold
        and the recovery's ramp).
    settings
        The controllers' settings; default: the defaults with affinity on.
    slow
        The fault, as :attr:`perf.sim.zones.ZonesConfig.slow`; ``None``: none.
    step_s
        Seconds between controller steps.

    Returns
    -------
    dict
        ``transitions`` (every zone's new curves, in order, as dicts of
        :class:`Transition`), ``floors`` (per zone, how many times it went to the
        floor), ``recovery_excess`` (per zone, the highest latency excess read while
        ramping after a recovery; NaN: no recovery), ``series`` (per step: ``t``, ``x``
        and ``excess`` per zone), ``run`` (the zones run's figures), ``settings`` and
        ``slow``.
    """
    out: dict[str, Any] = {"transitions": [], "floors": {}}
    settings = replace(settings or ZoneSettings(), affinity=True)
    cfg = replace(base, strategy="cslb", share=0.0, ramp=None, slow=slow).validate()
    driver = ControllerDriver(
        Layout(cfg.pods, cfg.callers), settings, cfg.window_s, step_s, cfg.tick_s
    )
    res = run(cfg, driver)
    trans = [{k: getattr(t, k) for k in Transition.__slots__} for t in driver.transitions]
    out.update(
        transitions=trans,
        floors={
            name: sum(1 for t in trans if t["zone"] == name and t["state"] == "floor")
            for name in driver.layout.names
        },
        recovery_excess=dict(zip(driver.layout.names, driver.recovery_excess, strict=True)),
        series={k: np.asarray(v, dtype=np.float64) for k, v in driver.series.items()},
        run=res,
        settings=settings,
        slow=slow,
    )
    return out


def _finite(v: float) -> float:
    """Order NaN below every number."""
    return v if math.isfinite(v) else -math.inf
