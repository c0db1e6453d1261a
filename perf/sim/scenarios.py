"""The three published situations, each as runs side by side on the same traffic.

* :func:`scale_up`: 50 → 100 pods with no fade-in, Skipper's probabilistic fade-in and
  cslb's N-ring fade-in;
* :func:`load_signal`: bounded load on in-flight counts (balance factor 1.10) versus
  occupancy (1.25 and 1.35): each variant's per-pod occupancy spread, normalised by its
  mean and absolute, with the bar a client host compares against, at the same pod count
  and at the pod count each needs to keep p99 latency under the same bound;
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

from lbcore.bounded import routed_call_load, target_load
from perf.sim.model import ScaleUp, SimConfig, SimResult, SlowPod, run

__all__ = [
    "SCALE_UP_MODES",
    "SCENARIOS",
    "ScenarioResult",
    "load_signal",
    "pods_needed",
    "scale_up",
    "slow_pod",
    "slow_pod_share",
]

#: ``progress(label, done, total)``: what :class:`perf.sim.progress.ProgressBar` takes.
Progress = Callable[[str, float, float], None]

#: The scale-up comparison's columns: no fade-in, Skipper's, N-ring (lbcore.knobs names).
SCALE_UP_MODES = ("off", "skipper", "n-ring")


@dataclass
class ScenarioResult:
    """Runs of one scenario and the figures that compare them.

    Attributes
    ----------
    name
        The scenario (``scale-up``, ``load-signal``, ``slow-pod``).
    runs
        Every run shown side by side, in column order.
    summary
        The comparison: one row of figures per run, plus scenario-wide values.
    wall_s
        Wall time of the whole scenario, in seconds.
    notes
        What the figures mean and how they were measured.
    warnings
        Why some figures may not mean what they seem (overload, a run too short).
    """

    name: str
    runs: list[SimResult]
    summary: dict[str, Any]
    wall_s: float
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: summary, notes, warnings and every run."""
        return {
            "scenario": self.name,
            "wall_s": round(self.wall_s, 3),
            "summary": self.summary,
            "notes": self.notes,
            "warnings": self.warnings,
            "runs": [r.to_dict() for r in self.runs],
        }


def _runner(progress: Progress | None, label: str) -> Callable[[float, float], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(label, done, total)


def _run_warnings(runs: list[SimResult]) -> list[str]:
    return [f"{r.label}: {w}" for r in runs for w in r.warnings]


# --------------------------------------------------------------------------------------
# 1. Scale-up.


def scale_up(
    base: SimConfig | None = None,
    *,
    add: int | None = None,
    at_s: float = 10.0,
    ready_spread_s: float = 20.0,
    modes: tuple[str, ...] = SCALE_UP_MODES,
    progress: Progress | None = None,
) -> ScenarioResult:
    """Scale from ``base.pods`` to twice as many (or ``+add``) at ``at_s``.

    The new pods become ready evenly over ``ready_spread_s`` seconds (an autoscaler's
    pods do not start in the same instant). The request rate stays what the starting
    fleet carried, so after the scale-up each pod has half the load. When the routing
    table learns of the new pods depends on the mode: cslb's discovery debounces
    (trailing, ``base.debounce_s``), Skipper polls (``base.skipper_poll_s``).

    Parameters
    ----------
    base
        Everything but the fade-in mode and the event (default: 50 pods, 120 s).
    add
        Pods added (default: as many as ``base.pods``).
    at_s
        When the first new pod is ready, in seconds after warm-up.
    ready_spread_s
        The new pods become ready evenly over this many seconds.
    modes
        Fade-in modes to compare (each one of :data:`lbcore.knobs.FADE_MODES`).
    progress
        Called as ``progress(label, done_s, total_s)`` while each run goes.

    Returns
    -------
    ScenarioResult
        ``summary["by_mode"]``: one row of figures per mode.
    """
    base = base or SimConfig(pods=50, seconds=120.0)
    add = base.pods if add is None else add
    ev = ScaleUp(at_s, add, ready_spread_s)
    cfg = replace(base, rate=base.total_rate, events=(*base.events, ev))
    t0 = time.perf_counter()
    runs = [run(replace(cfg, fade=m), m, progress=_runner(progress, m)) for m in modes]
    rows = {}
    fade_end = 0.0
    for r in runs:
        s, tot = r.series, r.totals
        last_publish = max((t for t, _ in r.published), default=at_s + ready_spread_s)
        fade_end = max(fade_end, last_publish + base.fade_s)
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
            "first_publish_s": min((t for t, _ in r.published), default=math.nan),
            "last_publish_s": max((t for t, _ in r.published), default=math.nan),
            "publishes": len(r.published),
            "wall_s": r.wall_s,
        }
    bounded = (
        "bounded load off (production default: balance factor 1.25 on effective load)"
        if base.balance_factor is None
        else f"bounded load {base.balance_factor:g} on {base.signal}"
    )
    notes = [
        f"{base.pods} -> {base.pods + add} pods, ready from t={at_s:g} s over "
        f"{ready_spread_s:g} s; fade {base.fade_s:g} s, exponent {base.fade_exponent:g}; "
        f"{cfg.total_rate:,.0f} calls/s throughout; {bounded}",
        f"published: N-ring after a {base.debounce_s:g}-s trailing debounce (pods ready "
        f"less than {base.debounce_s:g} s apart form one event), Skipper at its "
        f"{base.skipper_poll_s:g}-s polls (each pod's clock starts at its own poll)",
        "window = from the first pod ready to 30 s after the fade would end; "
        "owned share = share of the new pods' cache entries, at the end of the fade, "
        "that are keys they own in steady state",
    ]
    warnings = _run_warnings(runs)
    if fade_end > base.seconds:
        warnings.append(
            f"the run ends at {base.seconds:g} s, before the last fade-in ends at "
            f"{fade_end:g} s: figures miss the end of the scale-up (use --seconds "
            f">= {math.ceil(fade_end + 30)})"
        )
    return ScenarioResult(
        "scale-up", runs, {"by_mode": rows}, time.perf_counter() - t0, notes, warnings
    )


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
    start: int | None = None,
    shrink: float = 0.5,
    progress: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """Fewest pods that keep call p99 latency within ``slo_p99_ms`` at the same rate.

    Brackets the answer from ``start`` (shrinking the pod count by ``shrink`` while the
    bound holds, growing it by half while it does not), then bisects (each probe a
    fresh, pre-warmed run of ``seconds``), assuming p99 latency does not improve when
    pods are taken away; the answer is within 2 % of ``config.pods`` (at least 1 pod)
    of the true boundary. A ``start`` near the answer (another variant's) with
    ``shrink`` near 1 needs fewer probes than halving from ``config.pods``.

    Parameters
    ----------
    config
        The fleet and traffic; ``pods`` is the first probe, ``rate`` is kept.
    slo_p99_ms
        The latency bound, in milliseconds.
    seconds
        Length of every probe run, in seconds.
    max_factor
        Give up above this many times ``config.pods``.
    start
        First pod count probed (default ``config.pods``).
    shrink
        Factor, ``0 < shrink < 1``, by which the count falls while the bound holds.
    progress
        Called as ``progress(pods, p99_ms)`` after each probe.

    Returns
    -------
    dict
        ``pods`` (the answer, or ``None`` if even ``max_factor`` times as many pods miss
        the bound), ``probes``: ``[pods, p99_ms]`` for every run made, and ``result``:
        the :class:`SimResult` of the probe at the answer (``None`` without one).
    """
    rate = config.total_rate
    probes: list[list[float]] = []
    results: dict[int, SimResult] = {}

    def p99(n: int) -> float:
        cfg = replace(config, pods=n, rate=rate, seconds=seconds, events=())
        r = run(cfg, f"{n} pods")
        results[n] = r
        value = r.totals["lat_p99_ms"]
        probes.append([n, value])
        if progress is not None:
            progress(n, value)
        return value

    if not 0.0 < shrink < 1.0:
        raise ValueError(f"shrink must be between 0 and 1 (exclusive), got {shrink!r}")
    hi = config.pods if start is None else max(1, int(start))
    lo = 0  # largest count known to miss the bound (0: none yet)
    while p99(hi) > slo_p99_ms:
        if hi >= max_factor * config.pods:
            return {"pods": None, "probes": probes, "result": None}
        lo, hi = hi, math.ceil(hi * 1.5)
    if not lo:
        lo = max(1, min(hi - 1, int(hi * shrink)))
        while lo > 1 and p99(lo) <= slo_p99_ms:
            hi, lo = lo, max(1, min(lo - 1, int(lo * shrink)))
    # p99(lo) > slo (or lo == 1), p99(hi) <= slo
    step = max(1, round(config.pods * 0.02))
    while hi - lo > step:
        mid = (lo + hi) // 2
        if p99(mid) <= slo_p99_ms:
            hi = mid
        else:
            lo = mid
    return {"pods": hi, "probes": probes, "result": results[hi]}


def occupancy_spread(result: SimResult) -> dict[str, float]:
    """Per-pod occupancy over a run: mean, and min/p5/p50/p95/max divided by the mean.

    Occupancy is busy-seconds per second (the summed latency of a pod's calls over the
    run length); dividing by the mean compares fleets of different sizes.
    ``abs_p5``/``abs_p95`` are the same percentiles undivided (busy-seconds per second),
    as Zalando's figures are: a smaller fleet carrying the same work raises them.
    """
    occ = result.pod_busy_s[result.members].sum(axis=1) / result.config.seconds
    mean = float(occ.mean())
    p5, p50, p95 = np.percentile(occ, [5, 50, 95]) / mean
    return {
        "mean": mean,
        "abs_p5": float(p5) * mean,
        "abs_p95": float(p95) * mean,
        "min": float(occ.min()) / mean,
        "p5": float(p5),
        "p50": float(p50),
        "p95": float(p95),
        "max": float(occ.max()) / mean,
        "p5_p95_width": float(p95 - p5),
    }


def load_signal(
    base: SimConfig | None = None,
    *,
    in_flight_factor: float = 1.10,
    occupancy_factors: tuple[float, ...] = (1.25, 1.35),
    slo_p99_ms: float | None = 25.0,
    search_seconds: float = 10.0,
    progress: Progress | None = None,
) -> ScenarioResult:
    """Bounded load on in-flight counts versus occupancy, in steady state.

    Every variant runs at ``base.pods``; if ``slo_p99_ms`` is set, :func:`pods_needed`
    then finds the pod count each variant needs to keep call p99 latency within it, and
    the spread is reported there too (from the search's run at that count), so fleets
    are compared as each would be sized. The first variant's search halves down from
    ``base.pods``; the others start at the answer before theirs and step down by 10 %
    (the same boundary, found with fewer probes).

    Parameters
    ----------
    base
        Fleet and traffic (default: 100 pods on unequal nodes, ``pod_speed_sigma`` 0.2,
        35,000 calls/s from 32 client hosts, 30 s, the bar counting the routed call as
        what it adds to the signal, ``bar_increment="routed-call"`` as everywhere).
    in_flight_factor
        Balance factor of the in-flight variant (Zalando's was 1.10).
    occupancy_factors
        Balance factors of the occupancy variants (Zalando's: 1.25 to 1.35).
    slo_p99_ms
        The p99 latency bound for the pods-needed search, in milliseconds; ``None``
        skips the search.
    search_seconds
        Length of each search run, in seconds.
    progress
        Called as ``progress(label, done, total)`` while runs go.

    Returns
    -------
    ScenarioResult
        ``summary["by_variant"]``: per variant the occupancy spread (absolute and over
        the mean), cache and latency figures, and ``pods_needed`` with the spread at
        that pod count (``at_pods_needed``).
    """
    base = base or SimConfig(
        pods=100,
        rate_per_pod=350.0,
        seconds=30.0,
        clients=32,
        pod_speed_sigma=0.2,
    )
    variants = [("in-flight", in_flight_factor)] + [("occupancy", f) for f in occupancy_factors]
    t0 = time.perf_counter()
    runs = []
    rows: dict[str, Any] = {}
    last_needed: int | None = None
    for signal, bf in variants:
        label = f"{signal} bf {bf:g}"
        cfg = replace(
            base, rate=base.total_rate, fade="off", signal=signal, balance_factor=bf, events=()
        )
        r = run(cfg, label, progress=_runner(progress, label))
        runs.append(r)
        tot = r.totals
        row: dict[str, Any] = {
            "signal": signal,
            "balance_factor": bf,
            "pods": cfg.pods,
            "occupancy": tot["occupancy"],
            "occupancy_mean": tot["occupancy_mean"],
            "over_mean": occupancy_spread(r),
            "hit_rate": tot["hit_rate"],
            "db_reads_per_s": tot["db_reads_per_s"],
            "lat_p50_ms": tot["lat_p50_ms"],
            "lat_p99_ms": tot["lat_p99_ms"],
            "batch_p99_ms": tot["batch_p99_ms"],
            "moves_per_s": tot["moves"] / cfg.seconds,
            **_host_bar(cfg, r, bf),
        }
        if slo_p99_ms is not None:
            cb = None if progress is None else _search_progress(progress, label)
            found = pods_needed(
                cfg,
                slo_p99_ms,
                seconds=search_seconds,
                progress=cb,
                **({"start": last_needed, "shrink": 0.9} if last_needed else {}),
            )
            last_needed = found["pods"]
            at = found.pop("result")
            row["pods_needed"] = found
            if at is not None:
                row["at_pods_needed"] = {
                    "pods": at.config.pods,
                    "over_mean": occupancy_spread(at),
                    "hit_rate": at.totals["hit_rate"],
                    **_host_bar(at.config, at, bf),
                    "lat_p99_ms": at.totals["lat_p99_ms"],
                }
                runs_warn = [f"{label} at {at.config.pods} pods: {w}" for w in at.warnings]
                row["warnings_at_pods_needed"] = runs_warn
        rows[label] = row
    notes = [
        f"{base.pods} pods, {base.total_rate:,.0f} calls/s, {base.clients} client hosts "
        f"each with its own load counters, concurrency limit {base.concurrency} per pod, "
        f"occupancy window {base.window_s:g} s, hop cap {base.max_hops}, pod speed "
        f"sigma {base.pod_speed_sigma:g}, bar increment {base.bar_increment}",
        "occupancy = busy-seconds per second per pod over the whole run (the summed "
        "latency of its calls / run length); '/ mean' divides by the fleet's mean so "
        "fleets of different sizes compare",
        "a host's bar: what lbcore compares a host's load per pod against on average, "
        "(inc + its summed load) / pods x bf; inc counts the call being routed: 1 for "
        "in-flight counts, and for occupancy 1 (bar increment 'skipper') or the call's "
        "mean latency / window (~0, 'routed-call'); in-flight counts under a bar below 1 "
        "spill on any open call, and occupancy is held near bar / mean x the mean",
    ]
    if slo_p99_ms is not None:
        notes.append(
            f"pods needed: fewest pods keeping call p99 <= {slo_p99_ms:g} ms at the same "
            f"rate, bisected with {search_seconds:g}-s runs; the spread 'at pods needed' "
            "is that run's"
        )
    warnings = _run_warnings(runs)
    for row in rows.values():
        warnings += row.pop("warnings_at_pods_needed", [])
    return ScenarioResult(
        "load-signal",
        runs,
        {"by_variant": rows, "slo_p99_ms": slo_p99_ms},
        time.perf_counter() - t0,
        notes,
        warnings,
    )


def _host_bar(cfg: SimConfig, result: SimResult, bf: float) -> dict[str, float]:
    """What one client host's bounded load compares, on average, at ``cfg.pods`` pods.

    A host sees only its own calls: per pod, ``occupancy_mean / clients`` busy-seconds
    per second, which by Little's law is also its mean count of open calls per pod.
    lbcore's bar is ``(inc + Σ load) / pods × bf`` (:func:`lbcore.bounded.target_load`),
    so the bar over the mean load is ``bf × (1 + inc / Σ load)``. ``inc`` counts the
    call being routed: 1.0 for in-flight counts, and for occupancy 1.0 with
    ``bar_increment="skipper"`` or the call's mean latency over the window with
    ``"routed-call"`` (:func:`lbcore.bounded.routed_call_load`). For in-flight counts a
    bar below 1 means any open call from the host puts a pod over it; for occupancy
    with Skipper's 1.0 a host whose summed load is a few busy-seconds per second gets a
    bar well above ``bf`` times the mean.
    """
    occupancy_mean = result.totals["occupancy_mean"]
    host_load = occupancy_mean / cfg.clients
    inc = 1.0
    if cfg.bar_increment == "routed-call":
        calls = result.totals["calls"]
        mean_latency = occupancy_mean * cfg.pods * cfg.seconds / calls if calls else None
        inc = routed_call_load(cfg.signal, mean_latency, cfg.window_s)
    loads = np.full(cfg.pods, host_load)
    bar = target_load(loads, np.ones(cfg.pods, dtype=np.bool_), bf, inc)
    return {
        "host_load_per_pod": host_load,
        "host_bar": bar,
        "host_bar_over_mean": bar / host_load if host_load > 0 else math.nan,
        "bar_increment": inc,
    }


def _search_progress(progress: Progress, label: str) -> Callable[[int, float], None]:
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
    effective load ``max(in_flight, occupancy) × min(pod_latency / global_latency, 5)``,
    all at the same balance factor.

    Parameters
    ----------
    base
        Fleet and traffic (default: 20 pods, 7,000 calls/s, 80 s).
    factor
        Service-time multiplier of the slow pod.
    at_s, until_s
        When the pod is slow, in seconds after warm-up.
    pod
        Which starting pod turns slow.
    balance_factor
        Balance factor of every bounded-load variant.
    signals
        Variants: ``None`` (no bounded load) or a load signal
        (:data:`lbcore.signals.LOAD_SIGNALS`).
    progress
        Called as ``progress(label, done_s, total_s)`` while each run goes.

    Returns
    -------
    ScenarioResult
        ``summary["by_variant"]``: the slow pod's share of calls and p99 latency before,
        while and after it is slow.
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
        f"bar increment {base.bar_increment}: the bar counts the routed call as "
        + (
            "its mean latency / window for occupancy, 1 for effective load (as cslb's router)"
            if base.bar_increment == "routed-call"
            else "1 whatever the signal (Skipper's formula)"
        ),
    ]
    warnings = _run_warnings(runs)
    if at_s + base.window_s >= base.seconds:
        warnings.append(
            f"the run ends at {base.seconds:g} s, before the 'slow' phase "
            f"({at_s + base.window_s:g} s on) begins: its and the 'after' phase's "
            "figures are empty"
        )
    elif until_s + base.window_s >= base.seconds:
        warnings.append(
            f"the run ends at {base.seconds:g} s, before the 'after' phase "
            f"({until_s + base.window_s:g} s on) begins"
        )
    return ScenarioResult(
        "slow-pod",
        runs,
        {"by_variant": rows, "pod": pod, "factor": factor},
        time.perf_counter() - t0,
        notes,
        warnings,
    )


def slow_pod_share(result: SimResult, pod: int) -> np.ndarray:
    """Fraction of all calls that went to ``pod`` in every report interval.

    Parameters
    ----------
    result
        A run.
    pod
        Global pod number.
    """
    calls = result.pod_calls.sum(axis=0).astype(np.float64)
    return np.divide(result.pod_calls[pod], calls, out=np.zeros_like(calls), where=calls > 0)


SCENARIOS: dict[str, Callable[..., ScenarioResult]] = {
    "scale-up": scale_up,
    "load-signal": load_signal,
    "slow-pod": slow_pod,
}
