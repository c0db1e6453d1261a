"""The simulator's settings and results.

Events, :class:`SimConfig` (checked when built) and :class:`SimResult`;
:mod:`perf.sim.model` runs them and re-exports these names.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import lbcore
from lbcore import knobs, signals
from perf.sim.routing import FADE_MODES

__all__ = [
    "BACKLOG_WARN_S",
    "BAR_INCREMENTS",
    "HORIZON_S",
    "MEMORY_LIMIT_BYTES",
    "PREFILL_COHORTS",
    "SIGNALS",
    "ScaleDown",
    "ScaleUp",
    "SimConfig",
    "SimConfigError",
    "SimResult",
    "SlowPod",
    "to_jsonable",
]

#: Load signals bounded load can use (lbcore.signals.LOAD_SIGNALS).
SIGNALS = tuple(signals.LOAD_SIGNALS)
#: What the bounded-load bar adds for the call being routed: ``routed-call`` (the
#: default, what cslb's worker router does), what the call adds to the signal
#: (:func:`lbcore.bounded.routed_call_load`: 1.0 for counts, its mean latency's share
#: of the window for occupancy); ``skipper``, 1.0 whatever the signal (Skipper's
#: formula, what cslb did for occupancy before; kept for comparison).
BAR_INCREMENTS = ("skipper", "routed-call")

#: Production defaults of the routing knobs (lbcore.knobs), the simulator's defaults too.
_KNOB = knobs.defaults()

PREFILL_COHORTS = 100  # stamps used to order the warm-start cache contents by popularity
#: Completions further ahead than this are booked at it (the ring of future ticks).
HORIZON_S = 60.0
#: Largest run the simulator sets out on: its arrays' estimated size, in bytes.
MEMORY_LIMIT_BYTES = 6 << 30
#: A pod whose queue still holds this much work at the end of a run is reported
#: overloaded, in seconds (a pod at its limit for a moment queues for milliseconds).
BACKLOG_WARN_S = 1.0


class SimConfigError(ValueError):
    """A simulation setting is out of range; the message names the field."""


@dataclass(frozen=True)
class ScaleUp:
    """``count`` new pods become ready at ``at_s`` (spread evenly over ``ready_spread_s``)."""

    at_s: float
    count: int
    ready_spread_s: float = 0.0


@dataclass(frozen=True)
class ScaleDown:
    """The ``count`` most recently added pods are deleted at ``at_s`` (at least one stays)."""

    at_s: float
    count: int


@dataclass(frozen=True)
class SlowPod:
    """Pod ``pod``'s service times are multiplied by ``factor`` from ``at_s`` to ``until_s``."""

    at_s: float
    until_s: float
    pod: int = 0
    factor: float = 5.0


Event = ScaleUp | ScaleDown | SlowPod


@dataclass(frozen=True)
class SimConfig:
    """Everything a run depends on. Times in seconds, sizes in products.

    ``rate`` is calls (product IDs) per second over all clients; ``None`` means
    ``rate_per_pod * pods`` (pods at the start). Routing settings default to lbcore's
    production defaults (:func:`lbcore.knobs.defaults`, the occupancy window
    :data:`lbcore.signals.DEFAULT_WINDOW_NS`) except ``balance_factor``: ``None`` (no
    bounded load) here, 1.25 in production, so a scenario switches bounded load on
    where it is part of the question. ``pod_speed_sigma`` puts pods on unequal nodes:
    each pod's service times are multiplied by a fixed lognormal factor of mean 1 and
    this shape (:func:`pod_speed_factors`); 0 (the default) keeps pods equal.
    """

    pods: int = 50
    catalogue: int = 1_000_000
    zipf: float = 1.0
    rate: float | None = None
    rate_per_pod: float = 700.0
    max_batch: int = 100
    cache_size: int = 2_000
    hit_s: float = 0.001
    miss_s: float = 0.015
    concurrency: int = 8
    pod_speed_sigma: float = 0.0
    fade: str = _KNOB["fade_mode"]
    fade_s: float = _KNOB["fade_duration_s"]
    fade_exponent: float = _KNOB["fade_exponent"]
    balance_factor: float | None = None
    signal: str = _KNOB["load_signal"]
    max_hops: int | None = _KNOB["max_hops"]
    bar_increment: str = "routed-call"
    clients: int = 8
    window_s: float = signals.DEFAULT_WINDOW_NS / 1e9
    bucket_s: float = 0.1
    tick_s: float = 0.01
    seconds: float = 120.0
    warmup_s: float = 15.0
    report_s: float = 1.0
    debounce_s: float = 2.0
    skipper_poll_s: float = 3.0
    vnodes: int = _KNOB["vnodes"]
    seed: int = 1
    events: tuple[Event, ...] = ()

    @property
    def total_rate(self) -> float:
        """Calls per second over all clients."""
        return self.rate if self.rate is not None else self.rate_per_pod * self.pods

    @property
    def total_pods(self) -> int:
        """Pods at the start plus every pod a scale-up adds."""
        return self.pods + sum(e.count for e in self.events if isinstance(e, ScaleUp))

    def memory_bytes(self) -> int:
        """Estimated size of the run's arrays, in bytes.

        Cache stamps (2 or 4 bytes per pod and product), cache cohorts (8 bytes per pod
        and tick), the future-completion ring (16 bytes per client host, pod and tick of
        :data:`HORIZON_S`) and every call's latency (8 bytes).
        """
        ticks = round((self.warmup_s + self.seconds) / self.tick_s)
        n = self.total_pods
        stamp_bytes = 2 if ticks + PREFILL_COHORTS + 1 < 65535 else 4
        horizon = 1 << math.ceil(math.log2(max(2, round(HORIZON_S / self.tick_s))))
        return int(
            n * self.catalogue * stamp_bytes
            + n * (ticks + PREFILL_COHORTS + 2) * 8
            + self.clients * n * horizon * 16
            + self.total_rate * self.seconds * 8
        )

    def validate(self) -> SimConfig:
        """Check every field; raise :class:`SimConfigError` naming the bad one.

        The balance factor is checked by :func:`lbcore.bounded.check_balance_factor`
        (raising :class:`lbcore.BalanceFactorError`), the rule production uses.
        """

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise SimConfigError(msg)

        def finite(name: str, low: float, *, strict: bool = True) -> None:
            v = getattr(self, name)
            ok = math.isfinite(v) and (v > low if strict else v >= low)
            need(ok, f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {v}")

        need(self.pods >= 1, f"pods must be >= 1, got {self.pods}")
        need(self.catalogue >= 1, f"catalogue must be >= 1 product, got {self.catalogue}")
        finite("zipf", 0, strict=False)
        need(
            math.isfinite(self.total_rate) and self.total_rate > 0,
            f"rate must be a finite number > 0 calls/s, got {self.total_rate}",
        )
        need(
            1 <= self.max_batch <= self.catalogue,
            f"max_batch must be 1..catalogue ({self.catalogue}) distinct products, "
            f"got {self.max_batch}",
        )
        need(self.cache_size >= 1, f"cache_size must be >= 1 product, got {self.cache_size}")
        finite("hit_s", 0)
        finite("miss_s", 0)
        need(self.concurrency >= 1, f"concurrency must be >= 1, got {self.concurrency}")
        finite("pod_speed_sigma", 0, strict=False)
        need(1 <= self.clients <= 64, f"clients must be 1..64 hosts, got {self.clients}")
        need(self.fade in FADE_MODES, f"fade must be one of {FADE_MODES}, got {self.fade!r}")
        finite("fade_s", 0, strict=False)
        finite("fade_exponent", 0)
        if self.balance_factor is not None:
            lbcore.bounded.check_balance_factor(self.balance_factor)
        need(self.signal in SIGNALS, f"signal must be one of {SIGNALS}, got {self.signal!r}")
        need(
            self.bar_increment in BAR_INCREMENTS,
            f"bar_increment must be one of {BAR_INCREMENTS}, got {self.bar_increment!r}",
        )
        need(
            self.max_hops is None or self.max_hops >= 1,
            f"max_hops must be >= 1 or None, got {self.max_hops}",
        )
        need(self.vnodes >= 1, f"vnodes must be >= 1, got {self.vnodes}")
        finite("tick_s", 0)
        for name in ("bucket_s", "report_s"):
            ratio = getattr(self, name) / self.tick_s
            need(
                math.isfinite(ratio) and ratio >= 1 and abs(ratio - round(ratio)) < 1e-9,
                f"{name} ({getattr(self, name)} s) must be a whole multiple of tick_s "
                f"({self.tick_s} s)",
            )
        need(
            math.isfinite(self.window_s) and self.window_s >= self.bucket_s,
            "window_s must be >= bucket_s",
        )
        need(
            math.isfinite(self.seconds) and self.seconds >= self.report_s,
            f"seconds must be a finite number >= report_s ({self.report_s:g} s, one report "
            f"interval), got {self.seconds}",
        )
        finite("warmup_s", 0, strict=False)
        finite("debounce_s", 0, strict=False)
        finite("skipper_poll_s", 0)
        active = self.pods
        for ev in sorted(self.events, key=lambda e: e.at_s):
            need(math.isfinite(ev.at_s), f"event time must be finite seconds, got {ev!r}")
            if isinstance(ev, ScaleUp):
                need(ev.count >= 1, f"scale-up must add >= 1 pod, got {ev.count}")
                need(
                    math.isfinite(ev.ready_spread_s) and ev.ready_spread_s >= 0,
                    f"ready_spread_s must be a finite number >= 0, got {ev.ready_spread_s}",
                )
                active += ev.count
            elif isinstance(ev, ScaleDown):
                need(ev.count >= 1, f"scale-down must remove >= 1 pod, got {ev.count}")
                need(
                    ev.count < active,
                    f"scale-down at {ev.at_s:g} s removes {ev.count} of {active} pods; "
                    "at least one must stay",
                )
                active -= ev.count
            elif isinstance(ev, SlowPod):
                need(0 <= ev.pod < self.pods, f"slow pod {ev.pod} is not a starting pod")
                need(
                    math.isfinite(ev.factor) and ev.factor > 0,
                    f"slow factor must be a finite number > 0, got {ev.factor}",
                )
                need(
                    math.isfinite(ev.until_s) and ev.until_s > ev.at_s,
                    "slow pod must end after it starts",
                )
            else:
                raise SimConfigError(f"unknown event {ev!r}")
        need(self.total_pods <= 65536 * 256, "too many pods (at most 16,777,216 addresses)")
        mem = self.memory_bytes()
        need(
            mem <= MEMORY_LIMIT_BYTES,
            f"this run would need about {mem / 2**30:.1f} GiB of arrays (limit "
            f"{MEMORY_LIMIT_BYTES / 2**30:g} GiB): use fewer seconds, pods, clients or "
            "products",
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, events tagged with their kind."""
        d = asdict(self)
        d["rate"] = self.total_rate
        d["events"] = [{"kind": type(e).__name__, **asdict(e)} for e in self.events]
        return d


@dataclass
class SimResult:
    """What one run measured.

    ``series`` holds one value per report interval (``t`` is the interval's start in
    seconds after warm-up); ``totals`` the figures over the whole measured run;
    ``pod_calls`` and ``pod_busy_s`` are ``(pods, intervals)`` matrices (calls routed to
    and busy seconds completed by each pod per interval); ``published`` lists when the
    routing table took in new pods (seconds after warm-up, pods), ``members`` the pods in
    it at the end; ``warnings`` says
    when the figures describe an overloaded fleet.
    """

    config: SimConfig
    series: dict[str, np.ndarray]
    totals: dict[str, Any]
    pod_calls: np.ndarray
    pod_busy_s: np.ndarray
    new_pods: np.ndarray
    wall_s: float
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    published: list[tuple[float, int]] = field(default_factory=list)
    members: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def to_dict(self, *, per_pod: bool = False) -> dict[str, Any]:
        """JSON-ready form (floats rounded to 6 significant digits)."""
        out: dict[str, Any] = {
            "label": self.label,
            "config": self.config.to_dict(),
            "wall_s": round(self.wall_s, 3),
            "totals": to_jsonable(self.totals),
            "series": {k: to_jsonable(v) for k, v in self.series.items()},
            "warnings": list(self.warnings),
            "published": [list(x) for x in self.published],
        }
        if self.extra:
            out["extra"] = to_jsonable(self.extra)
        if per_pod:
            out["pod_calls"] = self.pod_calls.tolist()
            out["pod_busy_s"] = to_jsonable(self.pod_busy_s)
        return out


def to_jsonable(v: Any) -> Any:
    """``v`` with NumPy values as Python ones, floats to 6 significant digits, NaN as None."""
    if isinstance(v, dict):
        return {k: to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return to_jsonable(v.tolist())
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if not math.isfinite(f) else float(f"{f:.6g}")
    return v
