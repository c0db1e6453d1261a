"""The three published situations, each as runs side by side on the same traffic.

* :func:`scale_up`: 50 → 100 pods with no fade-in, Skipper's probabilistic fade-in and
  cslb's N-ring fade-in;
* :func:`load_signal`: bounded load on in-flight counts (balance factor 1.10) versus
  occupancy (1.30), the per-pod occupancy spread of each and the pod count each needs
  to keep p99 latency under the same bound;
* :func:`slow_pod`: one pod turns slow; its traffic without bounded load, with bounded
  load on occupancy, and with latency weighting (lbcore's effective load).

Every variant of a scenario uses the same seed, so the same requests arrive in the same
order; only the routing differs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from perf.sim.model import ScaleUp, SimConfig, SimResult, SlowPod, run
from perf.sim.routing import FADE_MODES

__all__ = [
    "SCENARIOS",
    "ScenarioResult",
    "load_signal",
    "pods_needed",
    "scale_up",
    "slow_pod",
]

Progress = Callable[[str, float, float], None]


@dataclass
class ScenarioResult:
    """Runs of one scenario and the figures that compare them."""

    name: str
    runs: list[SimResult]
    summary: dict[str, Any]
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def run_by_label(self, label: str) -> SimResult:
        for r in self.runs:
            if r.label == label:
                return r
        raise KeyError(f"no run labelled {label!r}; have {[r.label for r in self.runs]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.name,
            "wall_s": round(self.wall_s, 3),
            "summary": self.summary,
            "notes": self.notes,
            "runs": [r.to_dict() for r in self.runs],
        }


def _runner(progress: Progress | None, label: str) -> Callable[[float, float], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(label, done, total)


# --------------------------------------------------------------------------------------
# 1. Scale-up.


def scale_up(
    base: SimConfig | None = None,
    *,
    add: int | None = None,
    at_s: float = 10.0,
    ready_spread_s: float = 20.0,
    modes: tuple[str, ...] = FADE_MODES,
    progress: Progress | None = None,
) -> ScenarioResult:
    """Scale from ``base.pods`` to twice as many (or ``+add``) at ``at_s``.

    The new pods become ready evenly over ``ready_spread_s`` seconds (an autoscaler's
    pods do not start in the same instant). The request rate stays what the starting
    fleet carried, so after the scale-up each pod has half the load.
    """
    base = base or SimConfig(pods=50, seconds=120.0)
    add = base.pods if add is None else add
    ev = ScaleUp(at_s, add, ready_spread_s)
    cfg = replace(base, rate=base.total_rate, events=(*base.events, ev))
    t0 = time.perf_counter()
    runs = [run(replace(cfg, fade=m), m, progress=_runner(progress, m)) for m in modes]
    rows = {}
    for r in runs:
        s, tot = r.series, r.totals
        window = (s["t"] >= at_s) & (s["t"] < at_s + ready_spread_s + base.fade_s + 30.0)
        before = s["t"] < at_s
        rows[r.label] = {
            "hit_rate_before": _ratio(s["hits"][before], s["calls"][before]),
            "hit_rate_min_1s": float(s["hit_rate"][window].min(initial=1.0)),
            "hit_rate_min_5s": _rolling_min_ratio(s["hits"], s["calls"], window, 5),
            "db_reads_per_s_before": float(s["db_reads_per_s"][before].mean())
            if before.any()
            else math.nan,
            "db_reads_per_s_peak_1s": float(s["db_reads_per_s"][window].max(initial=0.0)),
            "db_reads_after_event": int(s["db_reads"][window].sum()),
            "hit_rate_end": float(s["hit_rate"][-5:].mean()),
            "lat_p99_ms": tot["lat_p99_ms"],
            "batch_p99_ms": tot["batch_p99_ms"],
            "new_pod_share_end": tot["new_pod_share_end"],
            "keys_remapped_static": tot["keys_remapped_static"],
            "keys_moved": tot["keys_moved"],
            "moves": tot["moves"],
            "moves_per_moved_key": tot["moves"] / tot["keys_moved"] if tot["keys_moved"] else 0.0,
            "new_pod_fetches": tot["new_pod_fetches"],
            "new_pod_foreign_fetch_share": tot["new_pod_foreign_fetch_share"],
            "new_pod_cached_owned_share": tot.get("checkpoint", {}).get(
                "new_pod_cached_owned_share", math.nan
            ),
            "wall_s": r.wall_s,
        }
    notes = [
        f"{base.pods} -> {base.pods + add} pods at t={at_s:g} s, ready over "
        f"{ready_spread_s:g} s; fade {base.fade_s:g} s, exponent {base.fade_exponent:g}; "
        f"{cfg.total_rate:,.0f} calls/s throughout",
        "window = from the scale-up to 30 s after the last fade ends; "
        "owned share = share of the new pods' cache entries, at the end of the fade, "
        "that are keys they own in steady state",
    ]
    return ScenarioResult("scale-up", runs, {"by_mode": rows}, time.perf_counter() - t0, notes)


def _ratio(a: np.ndarray, b: np.ndarray) -> float:
    total = float(np.sum(b))
    return float(np.sum(a)) / total if total else math.nan


def _rolling_min_ratio(hits: np.ndarray, calls: np.ndarray, mask: np.ndarray, k: int) -> float:
    idx = np.flatnonzero(mask)
    if idx.size < k:
        return math.nan
    h = np.convolve(hits[idx], np.ones(k), "valid")
    c = np.convolve(calls[idx], np.ones(k), "valid")
    return float((h / np.maximum(c, 1)).min())


# --------------------------------------------------------------------------------------
# 2. Load signal.


def pods_needed(
    config: SimConfig,
    slo_p99_ms: float,
    *,
    seconds: float = 20.0,
    max_factor: float = 3.0,
    progress: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Fewest pods that keep call p99 latency within ``slo_p99_ms`` at the same rate.

    Bisects over the pod count (each probe a fresh, pre-warmed run of ``seconds``),
    assuming p99 latency does not improve when pods are taken away.

    Returns
    -------
    dict
        ``pods`` (the answer, or ``None`` if even ``max_factor`` times as many pods miss
        the bound) and ``probes``: ``[pods, p99_ms]`` for every run made.
    """
    rate = config.total_rate
    probes: list[list[float]] = []

    def p99(n: int) -> float:
        cfg = replace(config, pods=n, rate=rate, seconds=seconds, events=())
        value = run(cfg).totals["lat_p99_ms"]
        probes.append([n, value])
        if progress is not None:
            progress(n, value)
        return value

    hi = config.pods
    while p99(hi) > slo_p99_ms:
        if hi >= max_factor * config.pods:
            return {"pods": None, "probes": probes}
        hi = math.ceil(hi * 1.5)
    lo = max(1, hi // 2)
    while lo > 1 and p99(lo) <= slo_p99_ms:
        hi, lo = lo, max(1, lo // 2)
    # p99(lo) > slo (or lo == 1), p99(hi) <= slo
    step = max(1, round(config.pods * 0.02))
    while hi - lo > step:
        mid = (lo + hi) // 2
        if p99(mid) <= slo_p99_ms:
            hi = mid
        else:
            lo = mid
    return {"pods": hi, "probes": probes}


def load_signal(
    base: SimConfig | None = None,
    *,
    occupancy_factor: float = 1.30,
    in_flight_factor: float = 1.10,
    slo_p99_ms: float | None = 25.0,
    search_seconds: float = 20.0,
    progress: Progress | None = None,
) -> ScenarioResult:
    """Bounded load on in-flight counts versus occupancy, in steady state.

    Reports each variant's per-pod occupancy spread and, if ``slo_p99_ms`` is set, the
    pod count each needs to keep call p99 latency within it (:func:`pods_needed`).
    """
    base = base or SimConfig(pods=100, rate_per_pod=350.0, seconds=60.0)
    variants = [
        ("in-flight", in_flight_factor),
        ("occupancy", occupancy_factor),
    ]
    t0 = time.perf_counter()
    runs = []
    rows: dict[str, Any] = {}
    for signal, bf in variants:
        label = f"{signal} bf {bf:g}"
        cfg = replace(base, fade="off", signal=signal, balance_factor=bf, events=())
        r = run(cfg, label, progress=_runner(progress, label))
        runs.append(r)
        tot = r.totals
        row = {
            "signal": signal,
            "balance_factor": bf,
            "occupancy": tot["occupancy"],
            "occupancy_mean": tot["occupancy_mean"],
            "occupancy_p95_over_mean": tot["occupancy"]["p95"] / tot["occupancy_mean"],
            "hit_rate": tot["hit_rate"],
            "db_reads_per_s": tot["db_reads_per_s"],
            "lat_p50_ms": tot["lat_p50_ms"],
            "lat_p99_ms": tot["lat_p99_ms"],
            "batch_p99_ms": tot["batch_p99_ms"],
            "moves_per_s": tot["moves"] / cfg.seconds,
        }
        if slo_p99_ms is not None:
            cb = None
            if progress is not None:
                cb = _search_progress(progress, label, base.pods)
            row["pods_needed"] = pods_needed(cfg, slo_p99_ms, seconds=search_seconds, progress=cb)
        rows[label] = row
    notes = [
        f"{base.pods} pods, {base.total_rate:,.0f} calls/s, {base.clients} client hosts "
        "each with its own load counters, concurrency limit "
        f"{base.concurrency} per pod",
        "occupancy = busy-seconds per second per pod over the whole run "
        "(sum of the latencies of its calls / run length)",
    ]
    if slo_p99_ms is not None:
        notes.append(
            f"pods_needed: fewest pods keeping call p99 <= {slo_p99_ms:g} ms at the same "
            f"rate, bisected with {search_seconds:g}-s runs"
        )
    return ScenarioResult(
        "load-signal",
        runs,
        {"by_variant": rows, "slo_p99_ms": slo_p99_ms},
        time.perf_counter() - t0,
        notes,
    )


def _search_progress(progress: Progress, label: str, pods: int) -> Callable[[int, float], None]:
    count = [0]

    def cb(n: int, p99: float) -> None:
        count[0] += 1
        progress(f"{label}: search, {n} pods p99 {p99:.1f} ms", count[0], count[0] + 1)

    return cb


# --------------------------------------------------------------------------------------
# 3. A slow pod.


def slow_pod(
    base: SimConfig | None = None,
    *,
    factor: float = 5.0,
    at_s: float = 20.0,
    until_s: float = 50.0,
    pod: int = 0,
    balance_factor: float = 1.25,
    signals: tuple[str | None, ...] = (None, "occupancy", "effective"),
    progress: Progress | None = None,
) -> ScenarioResult:
    """Pod ``pod`` serves ``factor`` times slower from ``at_s`` to ``until_s``.

    Variants: no bounded load (``None``), bounded load on occupancy, and on lbcore's
    effective load ``max(in_flight, occupancy) × min(pod_latency / global_latency, 5)``.
    """
    base = base or SimConfig(pods=20, rate_per_pod=350.0, seconds=80.0)
    ev = SlowPod(at_s, until_s, pod, factor)
    t0 = time.perf_counter()
    runs = []
    rows: dict[str, Any] = {}
    for signal in signals:
        label = "no bounded load" if signal is None else f"{signal} bf {balance_factor:g}"
        cfg = replace(
            base,
            fade="off",
            signal=signal or base.signal,
            balance_factor=None if signal is None else balance_factor,
            events=(ev,),
        )
        r = run(cfg, label, progress=_runner(progress, label))
        runs.append(r)
        share = slow_pod_share(r, pod)
        t = r.series["t"]
        w = base.window_s  # the occupancy window needs this long to see a change
        phases = {
            "before": (t >= min(5.0, at_s / 2)) & (t < at_s),
            "slow": (t >= at_s + w) & (t < until_s),
            "after": t >= until_s + w,
        }
        row: dict[str, Any] = {}
        for name, mask in phases.items():
            row[f"share_{name}"] = float(share[mask].mean()) if mask.any() else math.nan
            row[f"lat_p99_ms_{name}"] = (
                float(np.nanmean(r.series["lat_p99_ms"][mask])) if mask.any() else math.nan
            )
        row["fair_share"] = 1.0 / base.pods
        row["lat_p99_ms"] = r.totals["lat_p99_ms"]
        row["batch_p99_ms"] = r.totals["batch_p99_ms"]
        row["hit_rate"] = r.totals["hit_rate"]
        r.extra["slow_pod_share"] = share
        rows[label] = row
    notes = [
        f"pod {pod} of {base.pods} serves {factor:g}x slower from t={at_s:g} s to "
        f"t={until_s:g} s; share = its fraction of all calls per second",
        f"phases: before = up to the start, slow = start+{base.window_s:g} s..end (the "
        f"occupancy window has caught up), after = end+{base.window_s:g} s..run end",
    ]
    return ScenarioResult(
        "slow-pod",
        runs,
        {"by_variant": rows, "pod": pod, "factor": factor},
        time.perf_counter() - t0,
        notes,
    )


def slow_pod_share(result: SimResult, pod: int) -> np.ndarray:
    """Fraction of all calls that went to ``pod`` in every report interval."""
    calls = result.pod_calls.sum(axis=0).astype(np.float64)
    return np.divide(result.pod_calls[pod], calls, out=np.zeros_like(calls), where=calls > 0)


SCENARIOS: dict[str, Callable[..., ScenarioResult]] = {
    "scale-up": scale_up,
    "load-signal": load_signal,
    "slow-pod": slow_pod,
}
