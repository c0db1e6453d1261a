"""Zones in the simulator: cross-zone calls against cache locality, per routing strategy.

Three availability zones hold pods (unequal, 2/5/5, or even) and callers (caller hosts
per zone; a zone's traffic is in proportion to them). Every tick each zone's callers
send Zipf-popular product IDs that a strategy (:mod:`perf.sim.zone_routing`) routes
with lbcore; each pod answers from its LRU cache (:class:`perf.sim.cache.TickLRU`) or
reads the database. A call's latency is the network's round trip (local or
cross-zone) plus its service time (hit or miss) stretched by the pod's queue,
``service_s / (1 - occupancy / concurrency)``, occupancy over the last second (a
fluid queue, as :mod:`perf.sim.reports`). Bounded load compares each zone's own view
(its callers' busy time per pod over ``window_s``, as a host's counters; one view per
child balancer of the strategy), in the units of :func:`lbcore.bounded.in_call_units`.

The cache footprint, two ways: the hot set of a zone is the distinct products its pods
were asked for in the last ``hot_window_s`` of the run (``zones_per_hot_key``: the summed
hot sets over their union); at the end, ``cached_distinct`` counts the distinct products
in any pod's cache and ``zones_per_cached_key`` how many zones' caches hold one on
average (1 without zones, up to the number of zones when every zone caches every
product it serves).

:func:`run` is one run, :func:`sweep` every strategy over ``x``, both fleets;
``cslb simulate --scenario zones`` prints the table (:mod:`perf.sim.zones_report`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import numpy as np

from lbcore.bounded import in_call_units, routed_call_load
from lbcore.fade import fade_share
from perf.sim.cache import TickLRU
from perf.sim.workload import Catalogue
from perf.sim.zone_routing import (
    STRATEGIES,
    KeySplit,
    Layout,
    Strategy,
    make_strategy,
)

__all__ = ["SHARES", "SPREADS", "TickDriver", "ZonesConfig", "run", "strategy_for", "sweep"]

#: The x values the split strategies are swept over.
SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The fleets compared: an unequal pod spread and an even one.
SPREADS = ((2, 5, 5), (4, 4, 4))


@dataclass(frozen=True)
class ZonesConfig:
    """One run. Times in seconds, rates in calls per second, sizes in products.

    ``share`` is ``x`` (the wanted local share before the cap) for the split
    strategies; ``ramp`` (``(at_s, ramp_s, exponent)``) raises cslb's ``x`` from 0 to
    ``share`` along :func:`lbcore.fade.fade_share`'s curve from ``at_s`` instead of
    starting at it (:mod:`perf.sim.zone_ramp`). ``slow`` (``(zone, factor, from_s,
    to_s)``) multiplies the service time of that zone's pods by ``factor`` from
    ``from_s`` to ``to_s`` after warm-up: a latency fault (:mod:`perf.sim.zone_control`).
    """

    strategy: str = "no zones"
    share: float = 1.0
    pods: tuple[int, ...] = (2, 5, 5)
    callers: tuple[float, ...] = (1.0, 1.0, 1.0)
    rate_per_pod: float = 500.0
    catalogue: int = 200_000
    zipf: float = 1.0
    cache_size: int = 2_000
    hit_s: float = 0.001
    miss_s: float = 0.015
    local_rtt_s: float = 0.0002
    cross_rtt_s: float = 0.0015
    concurrency: int = 8
    balance_factor: float | None = 1.25
    max_hops: int | None = 10
    vnodes: int = 100
    min_pods: int = 3
    window_s: float = 10.0
    tick_s: float = 0.1
    warmup_s: float = 20.0
    seconds: float = 60.0
    hot_window_s: float = 10.0
    ramp: tuple[float, float, float] | None = None
    slow: tuple[int, float, float, float] | None = None
    seed: int = 1

    @property
    def spread(self) -> str:
        """Pods per zone, ``2/5/5``."""
        return "/".join(str(p) for p in self.pods)

    def validate(self) -> ZonesConfig:
        """Check the fields a run divides by or sizes arrays with; raise ``ValueError``."""
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {self.share}")
        if len(self.pods) != len(self.callers) or min(self.pods) < 0 or sum(self.pods) < 1:
            raise ValueError(f"pods {self.pods} / callers {self.callers}: one count per zone")
        if min(self.callers) < 0 or sum(self.callers) <= 0:
            raise ValueError(f"callers must be >= 0 with some > 0, got {self.callers}")
        for name in ("tick_s", "window_s", "seconds", "hot_window_s", "rate_per_pod"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if self.ramp is not None and self.strategy != "cslb":
            raise ValueError(f"a ramp moves cslb's x; strategy {self.strategy!r} has none")
        if self.slow is not None and not (
            0 <= self.slow[0] < len(self.pods) and self.slow[1] > 0 and self.slow[2] <= self.slow[3]
        ):
            raise ValueError(f"slow must be (zone, factor > 0, from_s, to_s), got {self.slow}")
        if self.seconds < self.hot_window_s:
            raise ValueError(f"seconds ({self.seconds}) must be >= hot_window_s")
        return self


class TickDriver(Protocol):
    """Moves a strategy's shares from what each tick's calls measured."""

    def tick(
        self,
        strategy: Strategy,
        t_s: float,
        caller: np.ndarray,
        pods: np.ndarray,
        latency: np.ndarray,
    ) -> None:
        """Take one tick's calls; ``t_s``: its end, in seconds after warm-up.

        ``caller`` (zone), ``pods`` (the pod called) and ``latency`` (seconds) have one
        entry per call; ``t_s`` is negative during the warm-up.
        """


def strategy_for(cfg: ZonesConfig) -> Strategy:
    """The routing strategy of ``cfg`` (cslb's at ``x`` 0 while a ramp waits to start)."""
    return make_strategy(
        cfg.strategy,
        Layout(cfg.pods, cfg.callers),
        share=0.0 if cfg.ramp is not None else cfg.share,
        balance_factor=cfg.balance_factor,
        max_hops=cfg.max_hops,
        vnodes=cfg.vnodes,
        min_pods=cfg.min_pods,
    )


def run(cfg: ZonesConfig, driver: TickDriver | None = None) -> dict[str, Any]:
    """One run: the figures the table compares, and per-second series.

    ``driver``, when given, is told every tick's calls and may move the strategy's
    shares before the next (:class:`TickDriver`).

    Returns
    -------
    dict
        ``label``, ``strategy``, ``share``, ``spread``, ``config``; ``cross_share``
        (cross-zone calls / calls) and ``by_zone`` (per zone: its callers'
        ``cross_share`` and ``calls``, its pods' ``hot_set``); ``hit_rate``,
        ``db_reads_per_s``, ``lat_mean_ms``, ``lat_p99_ms``; ``hot_set`` (mean distinct
        products per zone's pods over the last ``hot_window_s``),
        ``zones_per_hot_key``, ``cached_distinct``, ``zones_per_cached_key``;
        ``shares`` (each zone's ``x_z`` at the end, split strategies); ``series`` (per
        second: ``t``, ``db_reads``, ``hit_rate``, ``cross_share``, ``x`` of zone 0
        where cslb ramps); ``wall_s``.
    """
    cfg.validate()
    t0 = time.perf_counter()
    layout = Layout(cfg.pods, cfg.callers)
    strategy = strategy_for(cfg)
    zone_of = layout.zone_of
    n, zones = zone_of.size, layout.zones
    cat = Catalogue(cfg.catalogue, cfg.zipf)
    traffic = np.random.default_rng(cfg.seed)  # the same calls for every strategy
    draws = np.random.default_rng([cfg.seed, 1])  # per-request splits
    warm = round(cfg.warmup_s / cfg.tick_s)
    ticks = warm + round(cfg.seconds / cfg.tick_s)
    per_s = max(1, round(1.0 / cfg.tick_s))
    cache = TickLRU(n, cfg.catalogue, cfg.cache_size, ticks + 1)
    w = max(1, round(cfg.window_s / cfg.tick_s))
    views = strategy.views
    # each zone's callers' own busy time per pod, per child balancer
    view_busy = np.zeros((w, zones, views, n))
    view_done = np.zeros((w, zones, views, n))
    pod_busy = np.zeros((per_s, n))  # the pods' own, over the last second
    caller_rate = cfg.rate_per_pod * n * np.asarray(cfg.callers) / sum(cfg.callers)
    last_seen = np.zeros((zones, cfg.catalogue), dtype=np.int32)
    seconds = ticks // per_s + 1
    s_reads, s_calls, s_hits, s_cross = (np.zeros(seconds) for _ in range(4))
    s_x = np.full(seconds, math.nan)
    zone_calls, zone_cross = np.zeros(zones), np.zeros(zones)
    latencies: list[np.ndarray] = []
    for k in range(ticks):
        now_s = (k + 1) * cfg.tick_s
        if cfg.ramp is not None:  # the share of this tick's start, after warm-up
            _ramp(strategy, cfg, (k - warm) * cfg.tick_s)
        occ = pod_busy.sum(axis=0)
        queue = 1.0 / (1.0 - np.minimum(occ / cfg.concurrency, 0.95))
        slot = k % w
        view_busy[slot] = 0.0
        view_done[slot] = 0.0
        pods_parts, keys_parts, zone_parts, view_parts = [], [], [], []
        for z in range(zones):
            count = traffic.poisson(caller_rate[z] * cfg.tick_s)
            keys = cat.sample(traffic, count)
            loads = _view_loads(view_busy[:, z], view_done[:, z], cfg)
            pods, view = strategy.route(z, cat.hashes[keys], now_s, loads, draws)
            pods_parts.append(pods)
            keys_parts.append(keys)
            zone_parts.append(np.full(count, z))
            view_parts.append(np.zeros(count, dtype=np.int8) if view is None else view)
        pods = np.concatenate(pods_parts)
        keys = np.concatenate(keys_parts)
        caller = np.concatenate(zone_parts)
        via = np.concatenate(view_parts)
        hit = cache.access(pods, keys, k + 1)
        service = np.where(hit, cfg.hit_s, cfg.miss_s)
        if cfg.slow is not None and cfg.slow[2] <= (k - warm) * cfg.tick_s < cfg.slow[3]:
            service = np.where(zone_of[pods] == cfg.slow[0], service * cfg.slow[1], service)
        cross = zone_of[pods] != caller
        # the pod works the service time; the caller waits for the queue and the trip too
        latency = service * queue[pods] + np.where(cross, cfg.cross_rtt_s, cfg.local_rtt_s)
        pod_busy[k % per_s] = np.bincount(pods, weights=service, minlength=n)
        for z in range(zones):
            for v in range(views):
                mine = (caller == z) & (via == v)
                view_busy[slot, z, v] = np.bincount(pods[mine], weights=latency[mine], minlength=n)
                view_done[slot, z, v] = np.bincount(pods[mine], minlength=n)
        last_seen[zone_of[pods], keys] = k + 1
        if driver is not None:
            driver.tick(strategy, (k + 1 - warm) * cfg.tick_s, caller, pods, latency)
        if k < warm:
            continue
        sec = (k - warm) // per_s
        s_calls[sec] += pods.size
        s_hits[sec] += hit.sum()
        s_reads[sec] += pods.size - hit.sum()
        s_cross[sec] += cross.sum()
        if strategy.shares is not None:
            s_x[sec] = float(strategy.shares[0])
        zone_calls += np.bincount(caller, minlength=zones)
        zone_cross += np.bincount(caller[cross], minlength=zones)
        latencies.append(latency)
    used = round(cfg.seconds)
    lat = np.concatenate(latencies) if latencies else np.zeros(1)
    hot = last_seen > ticks - round(cfg.hot_window_s / cfg.tick_s)
    hot_by_zone = hot.sum(axis=1)
    union = int(hot.any(axis=0).sum())
    calls = float(s_calls.sum())
    cached = cache.stamps.reshape(n, cfg.catalogue) >= cache.cutoff[:, None]
    cached_zone = np.stack([cached[zone_of == z].any(axis=0) for z in range(zones)])
    distinct = int(cached_zone.any(axis=0).sum())
    return {
        "label": strategy.label,
        "strategy": cfg.strategy,
        "share": cfg.share if cfg.strategy in ("request split", "cslb") else None,
        "spread": cfg.spread,
        "config": asdict(cfg),
        "cross_share": float(s_cross.sum() / calls) if calls else math.nan,
        "by_zone": {
            name: {
                "calls": int(zone_calls[z]),
                "cross_share": float(zone_cross[z] / zone_calls[z]) if zone_calls[z] else math.nan,
                "hot_set": int(hot_by_zone[z]),
            }
            for z, name in enumerate(layout.names)
        },
        "hit_rate": float(s_hits.sum() / calls) if calls else math.nan,
        "db_reads_per_s": float(s_reads.sum() / cfg.seconds),
        "lat_mean_ms": float(lat.mean() * 1e3),
        "lat_p99_ms": float(np.percentile(lat, 99) * 1e3),
        "hot_set": float(hot_by_zone.mean()),
        "zones_per_hot_key": float(hot_by_zone.sum() / union) if union else math.nan,
        "cached_distinct": distinct,
        "zones_per_cached_key": float(cached_zone.sum() / distinct) if distinct else math.nan,
        "shares": strategy.shares,
        "series": {
            "t": np.arange(used, dtype=np.float64),
            "db_reads": s_reads[:used],
            "hit_rate": np.divide(
                s_hits[:used], s_calls[:used], out=np.zeros(used), where=s_calls[:used] > 0
            ),
            "cross_share": np.divide(
                s_cross[:used], s_calls[:used], out=np.zeros(used), where=s_calls[:used] > 0
            ),
            "x": s_x[:used],
        },
        "wall_s": time.perf_counter() - t0,
    }


def _view_loads(busy: np.ndarray, done: np.ndarray, cfg: ZonesConfig) -> np.ndarray | None:
    """A zone's loads per view and pod in call units: occupancy over its window.

    ``busy`` and ``done`` are ``(window ticks, views, pods)``; each view (child balancer)
    is a host's counters of its own calls only.
    """
    if cfg.balance_factor is None:
        return None
    out = np.empty(busy.shape[1:])
    for v in range(busy.shape[1]):
        total_busy, total_done = busy[:, v].sum(), done[:, v].sum()
        mean = total_busy / total_done if total_done else math.nan
        inc = routed_call_load("occupancy", mean, cfg.window_s)
        out[v] = in_call_units(busy[:, v].sum(axis=0) / cfg.window_s, inc)
    return out


def _ramp(strategy: Strategy, cfg: ZonesConfig, t_s: float) -> None:
    """Set cslb's ``x`` to its value ``t_s`` seconds after warm-up on the ramp (0 before)."""
    assert cfg.ramp is not None
    at_s, ramp_s, exponent = cfg.ramp
    share = 0.0
    if t_s >= at_s:
        elapsed_ns, ramp_ns = round((t_s - at_s) * 1e9), round(ramp_s * 1e9)
        share = cfg.share * float(fade_share(elapsed_ns, ramp_ns, exponent))
    assert isinstance(strategy, KeySplit)  # checked by ZonesConfig.validate
    if strategy.share != share:
        strategy.set_share(share)


def sweep(
    base: ZonesConfig,
    *,
    spreads: tuple[tuple[int, ...], ...] = SPREADS,
    shares: tuple[float, ...] = SHARES,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every strategy on every fleet, the split ones at every ``x``; same traffic in each."""
    rows = []
    for pods in spreads:
        callers = base.callers if len(base.callers) == len(pods) else (1.0,) * len(pods)
        fleet = replace(base, pods=pods, callers=callers)
        for name in STRATEGIES:
            for x in shares if name in ("request split", "cslb") else (math.nan,):
                cfg = replace(fleet, strategy=name, share=1.0 if math.isnan(x) else x)
                if progress is not None:
                    progress(f"{cfg.spread} {name}" + ("" if math.isnan(x) else f" x={x:g}"))
                rows.append(run(cfg))
    return rows
