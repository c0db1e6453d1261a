"""Pod-reported load in the simulator: H client hosts, one pod made hot by other callers.

Each of ``hosts`` client hosts routes its share (1/H) of the calls with lbcore's plans and
bounded load on its own occupancy (busy-s/s over a 10 s window, lbcore's default), as a
worker does; from ``external_on_s`` to ``external_off_s`` callers that are not cslb add
``external`` busy-s/s to pod 0. A pod's latency grows with its total occupancy
(``service_s / (1 - occupancy / capacity)``: a queue), so a host does see the hot pod
slow down, through 1/H of its calls. With reports on, every call a host makes carries the
pod's own occupancy over ``pod_window_s`` (as the serving side's middleware reports it),
each host keeps them in a :class:`lbcore.reported.ReportState` and refreshes a pod it did
not call for ``refresh_s`` (the discovery process's load-only request), and bounded load
compares :func:`lbcore.reported.effective_loads`.

Fluid per tick: every call of a tick ends within it; pods serve what they are sent.
Run it: ``cslb simulate --scenario reports --seconds 80`` (the comparison and the
settings sweep); :func:`run` is one run, :func:`sweep` the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lbcore.bounded import in_call_units, routed_call_load
from lbcore.report_settings import ReportSettings
from lbcore.reported import (
    KIND_OCCUPANCY,
    SOURCE_REPORTED,
    ReportState,
    effective_loads,
    record_reports,
    refresh_due,
)
from perf.sim.routing import PlainRouter, RingOptions
from perf.sim.workload import catalogue_hashes

__all__ = ["ReportsConfig", "run", "sweep", "to_text"]

S = 1_000_000_000


@dataclass(frozen=True)
class ReportsConfig:
    """One run. Times in seconds, occupancy in busy-seconds per second."""

    pods: int = 20
    hosts: int = 4
    rate_per_pod: float = 200.0  # cslb calls/s per pod, all hosts together
    service_s: float = 0.005
    capacity: float = 8.0  # busy-s/s a pod serves (its workers × threads)
    external: float = 1.0  # other callers' busy-s/s on pod 0 while on
    external_on_s: float = 20.0
    external_off_s: float = 50.0
    seconds: float = 80.0
    tick_s: float = 0.1
    window_s: float = 10.0
    pod_window_s: float = 2.0
    balance_factor: float = 1.25
    max_hops: int = 10
    catalogue: int = 20_000
    reports: bool = False
    blackout_s: float = 10.0
    expiry_s: float = 30.0
    refresh_s: float | None = 5.0  # None: nobody refreshes a pod it does not call
    seed: int = 1

    @property
    def label(self) -> str:
        """``host-only`` or the report settings in short; ``healthy`` without external load."""
        r = "none" if self.refresh_s is None else f"{self.refresh_s:g}"
        name = f"b{self.blackout_s:g}/e{self.expiry_s:g}/r{r}" if self.reports else "host-only"
        return name if self.external > 0 else f"healthy {name}"


def run(cfg: ReportsConfig) -> dict[str, Any]:
    """One run: per-tick series and the figures that compare runs.

    Returns
    -------
    dict
        ``label``, ``spread_hot`` (max / mean pod occupancy while pod 0 is hot, from one
        window after the load starts), ``pod0_hot`` and ``pod0_hot_peak`` (pod 0's
        occupancy / mean, mean and peak over that phase), ``moved_healthy`` and
        ``moved_hot`` (share of decisions bounded load sent off the key's ring owner
        before and during the hot phase; without external load every tick past the
        first window is healthy), ``recovery_s`` (from
        the load's end until pod 0 takes 80 % of its fair share of calls again; NaN if
        it does not within the run), ``reported_share`` (share of host decisions on
        reported loads), and ``series``.
    """
    rng = np.random.default_rng(cfg.seed)
    p, h = cfg.pods, cfg.hosts
    keys = catalogue_hashes(cfg.catalogue)
    router = PlainRouter(range(p), RingOptions(cfg.balance_factor, cfg.max_hops, 100))
    owner = PlainRouter(range(p), RingOptions(None, None, 100)).route(keys, 0.0, None)
    ticks = round(cfg.seconds / cfg.tick_s)
    w, pw = round(cfg.window_s / cfg.tick_s), max(1, round(cfg.pod_window_s / cfg.tick_s))
    host_busy = np.zeros((w, h, p))
    host_done = np.zeros((w, h, p))
    pod_busy = np.zeros((pw, p))
    settings = ReportSettings(
        enabled=True,
        blackout_ns=round(cfg.blackout_s * S),
        expiry_ns=round(cfg.expiry_s * S),
        refresh_ns=round(cfg.expiry_s * S) // 2,  # unused here: the run refreshes itself
    )
    refresh_ns = None if cfg.refresh_s is None else round(cfg.refresh_s * S)
    states = [ReportState.empty(p) for _ in range(h)]
    per_tick = cfg.rate_per_pod * p / h * cfg.tick_s
    occ_series = np.zeros((ticks, p))
    calls_series = np.zeros((ticks, p))
    moved = np.zeros(ticks)
    decided = np.zeros(ticks)
    reported = 0
    for k in range(ticks):
        now_s = (k + 1) * cfg.tick_s
        now_ns = round(now_s * S)
        pod_occ = pod_busy.sum(axis=0) / (pw * cfg.tick_s)
        lat = cfg.service_s / (1.0 - np.minimum(pod_occ / cfg.capacity, 0.95))
        slot = k % w
        host_busy[slot] = 0.0
        host_done[slot] = 0.0
        for i in range(h):
            idx = rng.integers(cfg.catalogue, size=rng.poisson(per_tick))
            busy, done = host_busy[:, i].sum(axis=0), host_done[:, i].sum(axis=0)
            mean_lat = busy.sum() / done.sum() if done.sum() else math.nan
            inc = routed_call_load("occupancy", mean_lat, cfg.window_s)
            loads = busy / cfg.window_s
            if cfg.reports:
                folded = effective_loads(loads, states[i], now_ns, settings, inc)
                loads = folded.loads
                reported += int(np.count_nonzero(folded.source == SOURCE_REPORTED))
            pods = router.route(keys[idx], now_s, in_call_units(loads, inc))
            moved[k] += np.count_nonzero(pods != owner[idx])
            decided[k] += idx.size
            calls = np.bincount(pods, minlength=p).astype(np.float64)
            host_busy[slot, i] = calls * lat
            host_done[slot, i] = calls
            calls_series[k] += calls
        ext = np.zeros(p)
        if cfg.external_on_s <= now_s < cfg.external_off_s:
            ext[0] = cfg.external
        pod_busy[k % pw] = host_busy[slot].sum(axis=0) + ext * cfg.tick_s
        occ_series[k] = pod_busy.sum(axis=0) / (pw * cfg.tick_s)
        if cfg.reports:
            for i in range(h):
                called = host_done[slot, i] > 0
                if refresh_ns is not None:
                    called |= refresh_due(states[i], now_ns, refresh_ns)
                got = np.flatnonzero(called)
                states[i] = record_reports(
                    states[i],
                    got,
                    occ_series[k, got],
                    KIND_OCCUPANCY,
                    1,
                    now_ns,
                    settings.expiry_ns,
                )
    return _figures(cfg, occ_series, calls_series, moved, decided, reported / (ticks * h * p))


def _figures(
    cfg: ReportsConfig,
    occ: np.ndarray,
    calls: np.ndarray,
    moved: np.ndarray,
    decided: np.ndarray,
    reported_share: float,
) -> dict[str, Any]:
    t = (np.arange(occ.shape[0]) + 1) * cfg.tick_s
    hot = (t >= cfg.external_on_s + cfg.window_s) & (t < cfg.external_off_s)
    if cfg.external > 0:
        healthy = (t >= cfg.window_s) & (t < cfg.external_on_s)
    else:  # a healthy fleet throughout: every tick past the first window
        healthy, hot = t >= cfg.window_s, np.zeros(t.size, bool)
    mean = occ.mean(axis=1)
    spread = occ.max(axis=1) / mean

    def share(mask: np.ndarray) -> float:
        return float(moved[mask].sum() / decided[mask].sum()) if decided[mask].sum() else math.nan

    # pod 0's share of calls over the last second (trailing), against its fair share
    per_s = max(1, round(1.0 / cfg.tick_s))
    kernel = np.ones(per_s)
    n = t.size
    c0 = np.convolve(calls[:, 0], kernel)[:n] / np.maximum(
        np.convolve(calls.sum(axis=1), kernel)[:n], 1.0
    )
    back = np.flatnonzero((t >= cfg.external_off_s) & (c0 >= 0.8 / cfg.pods))
    return {
        "label": cfg.label,
        "spread_hot": float(spread[hot].mean()) if hot.any() else math.nan,
        "pod0_hot": float((occ[hot, 0] / mean[hot]).mean()) if hot.any() else math.nan,
        "pod0_hot_peak": float((occ[hot, 0] / mean[hot]).max()) if hot.any() else math.nan,
        "moved_healthy": share(healthy),
        "moved_hot": share(hot),
        "recovery_s": float(t[back[0]] - cfg.external_off_s) if back.size else math.nan,
        "reported_share": reported_share,
        "series": {"t": t, "occupancy": occ, "calls": calls, "pod0_call_share": c0},
    }


def sweep(base: ReportsConfig) -> list[dict[str, Any]]:
    """Host-only against reports, then each report setting varied from the defaults."""
    on = replace(base, reports=True)
    variants = [
        base,
        on,
        replace(on, refresh_s=1.0),
        replace(on, refresh_s=15.0),
        replace(on, refresh_s=None),
        replace(on, refresh_s=None, expiry_s=180.0),
        replace(on, expiry_s=3.0),
        replace(on, expiry_s=15.0),
        replace(on, expiry_s=180.0),
        replace(on, blackout_s=0.0),
        replace(on, blackout_s=30.0),
        replace(base, external=0.0),
        replace(on, external=0.0),
    ]
    return [run(v) for v in variants]


_ROWS = (
    ("max/mean occupancy, hot", "spread_hot", "{:.2f}"),
    ("pod 0 / mean, hot", "pod0_hot", "{:.2f}"),
    ("pod 0 / mean, hot peak", "pod0_hot_peak", "{:.2f}"),
    ("keys moved, healthy", "moved_healthy", "{:.1%}"),
    ("keys moved, hot", "moved_hot", "{:.1%}"),
    ("pod 0 back to 80% share, s", "recovery_s", "{:.1f}"),
    ("decisions on reports", "reported_share", "{:.0%}"),
)


def to_text(rows: list[dict[str, Any]], cfg: ReportsConfig) -> str:
    """The runs side by side, one column each (``b``lackout/``e``xpiry/``r``efresh, s)."""
    width = max(len(r[0]) for r in _ROWS)
    cols = [max(len(r["label"]), 8) for r in rows]
    out = [
        " " * width + "  " + "  ".join(r["label"].rjust(c) for r, c in zip(rows, cols, strict=True))
    ]
    for name, key, fmt in _ROWS:
        cells = [
            ("n/a" if math.isnan(r[key]) else fmt.format(r[key])).rjust(c)
            for r, c in zip(rows, cols, strict=True)
        ]
        out.append(name.ljust(width) + "  " + "  ".join(cells))
    out.append(
        f"* {cfg.pods} pods, {cfg.hosts} hosts, {cfg.rate_per_pod:g} calls/s per pod of "
        f"{cfg.service_s * 1e3:g} ms, capacity {cfg.capacity:g} busy-s/s; pod 0 gets "
        f"{cfg.external:g} busy-s/s from other callers from {cfg.external_on_s:g} s to "
        f"{cfg.external_off_s:g} s; balance factor {cfg.balance_factor:g}; pod window "
        f"{cfg.pod_window_s:g} s, host window {cfg.window_s:g} s, {cfg.seconds:g} s, seed "
        f"{cfg.seed}"
    )
    return "\n".join(out)
