"""The simulation: clients routing batch requests through lbcore to pods with LRU caches.

Time advances in ticks (default 10 ms). In every tick:

1. calls that completed in the previous tick are booked: in-flight counts fall, their
   latency is added to the pod's busy time (what cslb's ``track()`` records when a call
   returns);
2. scheduled events apply (pods published into the routing table, pods deleted, a pod
   turning slow or recovering);
3. if bounded load is on, every client host takes one load snapshot of its own
   counters (cslb pools the workers of a host, not hosts): in-flight counts, occupancy
   (:func:`lbcore.signals.occupancy` over the busy-time buckets of the last window,
   weighted by :func:`lbcore.signals.window_weights`) and per-pod and host-wide mean
   latency (:func:`lbcore.signals.mean_latency`), turned into the load of the
   configured signal by :func:`lbcore.signals.load_for` (:func:`client_loads`), and
   (``bar_increment="routed-call"``, the default, as cslb's worker router does) each
   host's loads are re-expressed by :func:`lbcore.bounded.in_call_units` so that the
   bar counts the routed call as what it adds to the signal
   (:func:`lbcore.bounded.routed_call_load` with the host's mean latency over the
   window: for occupancy its latency's share of the window), not as 1.0;
4. the tick's batch requests arrive (Poisson batches of 1..100 distinct product IDs
   with Zipf popularity, each from one of ``clients`` hosts) and all calls of a host are
   routed at once on its snapshot by lbcore;
5. each pod's cache answers hit or miss (a miss is a database read); the service time
   is the hit or miss time, times the pod's fixed speed factor (pods on unequal nodes,
   :func:`pod_speed_factors`; 1 unless ``pod_speed_sigma`` is set) and its slow factor
   while a :class:`SlowPod` event lasts; each pod serves at most
   ``concurrency`` calls at once and queues the rest (FIFO);
6. everything is counted into the report interval the tick belongs to.

A warm-up (default 15 s, longer than the 10-s occupancy window) runs first with caches
pre-filled by each pod's most popular keys; reported time 0 is its end.

Completions more than :data:`HORIZON_S` ahead are booked at the horizon, and pods whose
queues outgrow :data:`BACKLOG_WARN_S` are named: both end up in
:attr:`SimResult.warnings`, never silently in the figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import lbcore
from lbcore import bounded, signals
from perf.sim import config
from perf.sim.cache import TickLRU
from perf.sim.config import *  # noqa: F403  (the settings and results: names of this module too)
from perf.sim.config import (
    BACKLOG_WARN_S,
    HORIZON_S,
    PREFILL_COHORTS,
    ScaleDown,
    ScaleUp,
    SimConfig,
    SimResult,
)
from perf.sim.pods import PodQueues
from perf.sim.routing import Router, endpoint_name, make_router
from perf.sim.workload import Batches, Catalogue

__all__ = ["Simulation", "client_loads", "pod_speed_factors", "run", *config.__all__]


@dataclass
class _Schedule:
    """Event times resolved to ticks: what the routing table and pods do when."""

    initial: list[int]
    final: list[int]
    new_pods: list[int]
    table: list[tuple[float, str, list[int]]]  # (time, "publish"|"remove", pods)
    slow: list[tuple[float, float, int, float]]
    last_publish_s: float | None


def _schedule(cfg: SimConfig) -> _Schedule:
    initial = list(range(cfg.pods))
    active = list(initial)
    next_pod = cfg.pods
    table: list[tuple[float, str, list[int]]] = []
    slow: list[tuple[float, float, int, float]] = []
    new_pods: list[int] = []
    for ev in sorted(cfg.events, key=lambda e: e.at_s):
        if isinstance(ev, ScaleUp):
            pods = list(range(next_pod, next_pod + ev.count))
            next_pod += ev.count
            new_pods += pods
            active += pods
            ready = [ev.at_s + ev.ready_spread_s * i / ev.count for i in range(ev.count)]
            table += _detections(cfg, pods, ready)
        elif isinstance(ev, ScaleDown):
            gone = active[-ev.count :]  # validate() keeps at least one pod
            active = [p for p in active if p not in gone]
            table.append((ev.at_s, "remove", gone))
        else:
            slow.append((ev.at_s, ev.until_s, ev.pod, ev.factor))
    table.sort(key=lambda x: x[0])
    publishes = [t for t, kind, _ in table if kind == "publish"]
    return _Schedule(initial, active, new_pods, table, slow, max(publishes) if publishes else None)


def _detections(
    cfg: SimConfig, pods: list[int], ready: list[float]
) -> list[tuple[float, str, list[int]]]:
    """When the balancer learns about pods that become ready at ``ready`` times.

    cslb's discovery debounces (trailing, ``debounce_s``): pods that become ready less
    than ``debounce_s`` apart form one published event, published ``debounce_s`` after
    the last of them. Skipper's Kubernetes data client polls every ``skipper_poll_s``
    and detects each pod at the first poll after it is ready, so its fade-in clocks
    start per poll.
    """
    out: list[tuple[float, str, list[int]]] = []
    if cfg.fade == "skipper":
        groups: dict[float, list[int]] = {}
        for p, r in zip(pods, ready, strict=True):
            t = math.ceil(r / cfg.skipper_poll_s - 1e-9) * cfg.skipper_poll_s
            groups.setdefault(t, []).append(p)
        return [(t, "publish", ps) for t, ps in sorted(groups.items())]
    group: list[int] = []
    last = -math.inf
    for p, r in zip(pods, ready, strict=True):
        if group and r - last >= cfg.debounce_s:
            out.append((last + cfg.debounce_s, "publish", group))
            group = []
        group.append(p)
        last = r
    out.append((last + cfg.debounce_s, "publish", group))
    return out


class Simulation:
    """One run of the model; :meth:`run` returns a :class:`SimResult`.

    Parameters
    ----------
    config
        The run's settings.
    label
        A name for reports (for example the fade-in mode).
    progress
        Called as ``progress(done_s, total_s)`` about every simulated second.
    """

    def __init__(
        self,
        config: SimConfig,
        label: str = "",
        progress: Callable[[float, float], None] | None = None,
    ) -> None:
        self.cfg = config.validate()
        self.label = label or config.fade
        self.progress = progress

    # ---------------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Run the whole simulation once and return what it measured."""
        cfg = self.cfg
        wall0 = time.perf_counter()
        dt = cfg.tick_s
        sched = _schedule(cfg)
        n_pods = cfg.pods + len(sched.new_pods)
        cat = Catalogue(cfg.catalogue, cfg.zipf)
        # Separate streams: the workload is identical whichever way it is routed.
        work_rng = np.random.default_rng([cfg.seed, 0])
        route_rng = np.random.default_rng([cfg.seed, 1])

        warm_ticks = round(cfg.warmup_s / dt)
        run_ticks = round(cfg.seconds / dt)
        total_ticks = warm_ticks + run_ticks
        per_report = round(cfg.report_s / dt)
        n_intervals = math.ceil(run_ticks / per_report)
        per_bucket = round(cfg.bucket_s / dt)
        bucket_ns = round(cfg.bucket_s * 1e9)
        window_ns = round(cfg.window_s * 1e9)
        n_buckets = math.ceil(cfg.window_s / cfg.bucket_s) + 1
        horizon = 1 << math.ceil(math.log2(max(2, round(HORIZON_S / dt))))  # ticks

        router = make_router(
            cfg.fade,
            sched.initial,
            balance_factor=cfg.balance_factor,
            max_hops=cfg.max_hops,
            vnodes=cfg.vnodes,
            fade_s=cfg.fade_s,
            fade_exponent=cfg.fade_exponent,
            rng=route_rng,
        )
        cache = TickLRU(n_pods, cat.size, cfg.cache_size, PREFILL_COHORTS + total_ticks + 1)
        self._prefill(cache, cat, sched.initial, work_rng)
        final_owner = _owners(sched.final, cat.hashes, cfg.vnodes)
        initial_owner = _owners(sched.initial, cat.hashes, cfg.vnodes)
        queues = PodQueues(n_pods, cfg.concurrency)

        is_new = np.zeros(n_pods, dtype=np.bool_)
        is_new[sched.new_pods] = True
        # Pods on unequal nodes: a fixed service-time multiplier per pod (mean 1).
        speed = pod_speed_factors(n_pods, cfg.pod_speed_sigma, cfg.seed)
        slow_factor = speed.copy()
        # Every client host keeps its own counters (cslb pools a host's workers, not hosts):
        # a "lane" is one (client, pod) pair, lane = client * n_pods + pod.
        n_cl = cfg.clients
        n_lanes = n_cl * n_pods
        arrived = np.zeros(n_lanes, dtype=np.int64)
        completed = np.zeros(n_lanes, dtype=np.int64)
        fut_busy = np.zeros((n_lanes, horizon))
        fut_count = np.zeros((n_lanes, horizon), dtype=np.int64)
        busy_buckets = np.zeros((n_lanes, n_buckets))  # ns
        count_buckets = np.zeros((n_lanes, n_buckets))
        bucket_starts = np.full(n_buckets, -(10**18), dtype=np.int64)
        cur_bucket = -1
        last_pod = np.full(cat.size, -1, dtype=np.int32)
        moved = np.zeros(cat.size, dtype=np.bool_)
        clamped = 0  # calls whose completion lay beyond the horizon
        peak_wait = (0.0, -1, 0.0)  # longest queue wait seen (s), its pod, when (s)

        # Per-interval accumulators.
        pod_calls = np.zeros((n_pods, n_intervals), dtype=np.int64)
        pod_busy = np.zeros((n_pods, n_intervals))
        ser: dict[str, list[float]] = {
            k: []
            for k in (
                "t",
                "calls",
                "hits",
                "db_reads",
                "moves",
                "new_pod_calls",
                "lat_p50_ms",
                "lat_p99_ms",
                "batch_p50_ms",
                "batch_p99_ms",
                "occ_min",
                "occ_p5",
                "occ_p50",
                "occ_p95",
                "occ_max",
            )
        }
        lat_parts: list[np.ndarray] = []
        batch_parts: list[np.ndarray] = []
        all_lat: list[np.ndarray] = []
        all_batch: list[np.ndarray] = []
        acc = {"calls": 0, "hits": 0, "db": 0, "moves": 0, "new": 0}
        new_fetch = {"all": 0, "foreign": 0}
        checkpoint_s = None
        if sched.last_publish_s is not None:
            checkpoint_s = sched.last_publish_s + cfg.fade_s
        checkpoint: dict[str, Any] = {}
        table_events = list(sched.table)
        published: list[tuple[float, int]] = []  # (reported time s, pods) per publish
        slow_events = sorted(sched.slow)
        stamp0 = PREFILL_COHORTS + 1
        occ_now = np.zeros(n_pods)

        for m in range(total_ticks):
            t_abs = m * dt
            t = t_abs - cfg.warmup_s  # reported time
            now_ns = round(t_abs * 1e9)

            # 1. book completions of the previous tick.
            if m:
                slot = (m - 1) % horizon
                done_n = fut_count[:, slot]
                done_b = fut_busy[:, slot]
                completed += done_n
                b = (m - 1) // per_bucket
                if b != cur_bucket:
                    cur_bucket = b
                    bslot = b % n_buckets
                    busy_buckets[:, bslot] = 0.0
                    count_buckets[:, bslot] = 0.0
                    bucket_starts[bslot] = b * bucket_ns
                bslot = b % n_buckets
                busy_buckets[:, bslot] += done_b
                count_buckets[:, bslot] += done_n
                if m - 1 >= warm_ticks:
                    pod_busy[:, (m - 1 - warm_ticks) // per_report] += (
                        done_b.reshape(n_cl, n_pods).sum(axis=0) * 1e-9
                    )
                fut_count[:, slot] = 0
                fut_busy[:, slot] = 0.0

            # 2. events.
            while table_events and table_events[0][0] <= t + 1e-9:
                _, kind, pods = table_events.pop(0)
                if kind == "publish":
                    router.publish(pods, t_abs)
                    published.append((t, len(pods)))
                else:
                    router.remove(pods, t_abs)
                    for p in pods:
                        cache.drop(p)
            for at, until, pod, factor in slow_events:
                slow_factor[pod] = speed[pod] * (factor if at <= t + 1e-9 < until else 1.0)

            # 3. load snapshot.
            need_occ = cfg.balance_factor is not None or (m - warm_ticks + 1) % per_report == 0
            if need_occ:
                weights = signals.window_weights(bucket_starts, bucket_ns, now_ns, window_ns)
                occ_now = (
                    signals.occupancy(busy_buckets, window_ns, weights)
                    .reshape(n_cl, n_pods)
                    .sum(axis=0)
                )
            loads = None
            if cfg.balance_factor is not None:
                loads = client_loads(
                    cfg.signal,
                    (arrived - completed).reshape(n_cl, n_pods),
                    (busy_buckets @ weights).reshape(n_cl, n_pods),
                    (count_buckets @ weights).reshape(n_cl, n_pods),
                    window_ns,
                    bar_increment=cfg.bar_increment,
                )

            # 4.-5. arrivals, routing, caches, service.
            batch = Batches.draw(work_rng, cat, cfg.total_rate, cfg.max_batch, t_abs, dt, n_cl)
            keys = batch.keys
            n = keys.size
            if n:
                hashes = cat.hashes[keys]
                if loads is None or n_cl == 1:
                    pods = router.route(hashes, t_abs, None if loads is None else loads[0])
                else:
                    pods = np.empty(n, dtype=np.int64)
                    for c in np.unique(batch.client).tolist():
                        rows = np.flatnonzero(batch.client == c)
                        pods[rows] = router.route(hashes[rows], t_abs, loads[c])
                lanes = batch.client * n_pods + pods
                hit = cache.access(pods, keys, stamp0 + m)
                service = np.where(hit, cfg.hit_s, cfg.miss_s) * slow_factor[pods]
                done_at = queues.serve(pods, batch.arrival, service)
                latency = done_at - batch.arrival
                ctick = np.floor(done_at / dt).astype(np.int64)
                late = ctick > m + horizon - 1
                if late.any():  # booked early, at the horizon; counted and reported
                    clamped += int(late.sum())
                    ctick[late] = m + horizon - 1
                np.add.at(fut_busy, (lanes, ctick % horizon), latency * 1e9)
                np.add.at(fut_count, (lanes, ctick % horizon), 1)
                arrived += np.bincount(lanes, minlength=n_lanes)
                per_pod = np.bincount(pods, minlength=n_pods)

                # Key moves: consecutive requests of a key served by different pods.
                order = np.argsort(keys, kind="stable")
                ks, ps = keys[order], pods[order]
                same = ks[1:] == ks[:-1]
                firsts = np.concatenate(([True], ~same))
                lasts = np.concatenate((~same, [True]))
                prev = last_pod[ks[firsts]]
                moved_first = (prev >= 0) & (prev != ps[firsts])
                moved_next = same & (ps[1:] != ps[:-1])
                last_pod[ks[lasts]] = ps[lasts]

                if m >= warm_ticks:
                    i = (m - warm_ticks) // per_report
                    pod_calls[:, i] += per_pod
                    miss = ~hit
                    acc["calls"] += n
                    acc["hits"] += int(hit.sum())
                    acc["db"] += n - int(hit.sum())
                    acc["moves"] += int(moved_first.sum() + moved_next.sum())
                    acc["new"] += int(per_pod[is_new].sum())
                    moved[ks[firsts][moved_first]] = True
                    moved[ks[1:][moved_next]] = True
                    new_miss = miss & is_new[pods]
                    if new_miss.any():
                        new_fetch["all"] += int(new_miss.sum())
                        new_fetch["foreign"] += int(
                            (final_owner[keys[new_miss]] != pods[new_miss]).sum()
                        )
                    lat_parts.append(latency.astype(np.float32))
                    batch_parts.append(
                        np.maximum.reduceat(latency, batch.starts).astype(np.float32)
                    )

            # 6. close a report interval.
            if m >= warm_ticks and (m - warm_ticks + 1) % per_report == 0:
                wait = queues.free.min(axis=1) - (t_abs + dt)  # what a new call would wait
                worst = int(wait.argmax())
                if wait[worst] > peak_wait[0]:
                    peak_wait = (float(wait[worst]), worst, t + dt)
                self._close_interval(
                    ser, acc, t + dt - cfg.report_s, lat_parts, batch_parts, occ_now, router
                )
                all_lat += lat_parts
                all_batch += batch_parts
                lat_parts, batch_parts = [], []
                acc = dict.fromkeys(acc, 0)
                if self.progress is not None:
                    self.progress(t + dt, cfg.seconds)
            if checkpoint_s is not None and not checkpoint and t + dt > checkpoint_s - 1e-9:
                checkpoint = self._cache_check(cache, sched.new_pods, final_owner, t + dt)

        if lat_parts:  # a last partial interval
            t_end = cfg.seconds
            self._close_interval(
                ser,
                acc,
                t_end - (run_ticks % per_report) * dt,
                lat_parts,
                batch_parts,
                occ_now,
                router,
            )
            all_lat += lat_parts
            all_batch += batch_parts

        series = {k: np.asarray(v) for k, v in ser.items()}
        calls = series["calls"].astype(np.float64)
        series["hit_rate"] = np.divide(
            series["hits"], calls, out=np.zeros_like(calls), where=calls > 0
        )
        series["db_reads_per_s"] = series["db_reads"] / cfg.report_s
        series["new_pod_share"] = np.divide(
            series["new_pod_calls"], calls, out=np.zeros_like(calls), where=calls > 0
        )
        lat = np.concatenate(all_lat) if all_lat else np.zeros(1)
        blat = np.concatenate(all_batch) if all_batch else np.zeros(1)
        total_calls = int(calls.sum())
        pod_occ = pod_busy.sum(axis=1) / cfg.seconds
        members = router.members
        occ_members = pod_occ[members]
        totals: dict[str, Any] = {
            "calls": total_calls,
            "hit_rate": float(series["hits"].sum() / max(total_calls, 1)),
            "db_reads": int(series["db_reads"].sum()),
            "db_reads_per_s": float(series["db_reads"].sum() / cfg.seconds),
            "db_reads_per_s_peak": float(series["db_reads_per_s"].max(initial=0.0)),
            "hit_rate_min": float(series["hit_rate"].min(initial=1.0)),
            "lat_p50_ms": float(np.percentile(lat, 50) * 1e3),
            "lat_p99_ms": float(np.percentile(lat, 99) * 1e3),
            "batch_p50_ms": float(np.percentile(blat, 50) * 1e3),
            "batch_p99_ms": float(np.percentile(blat, 99) * 1e3),
            "occupancy": _spread(occ_members),
            "occupancy_mean": float(occ_members.mean()),
            "keys_moved": int(moved.sum()),
            "moves": int(series["moves"].sum()),
            "keys_remapped_static": float((initial_owner != final_owner).mean()),
            "keys_remapped_static_weighted": float(
                cat.popularity[initial_owner != final_owner].sum()
            ),
            "new_pod_share_end": float(series["new_pod_share"][-1]) if calls.size else 0.0,
            "new_pod_fetches": new_fetch["all"],
            "new_pod_foreign_fetch_share": (
                new_fetch["foreign"] / new_fetch["all"] if new_fetch["all"] else 0.0
            ),
            "in_flight_end": int((arrived - completed).sum()),
            "routed": int(arrived.sum()),
            "completed": int(completed.sum()),
            "cache_max_size": int(cache.size.max()),
        }
        if checkpoint:
            totals["checkpoint"] = checkpoint
        backlog = np.maximum(queues.free.min(axis=1) - total_ticks * dt, 0.0)
        queued = (arrived - completed).reshape(n_cl, n_pods).sum(axis=0)
        totals["backlog_end_s_max"] = float(backlog.max())
        totals["queue_wait_peak_s"] = peak_wait[0]
        totals["calls_booked_at_horizon"] = clamped
        warnings = _overload_warnings(backlog, queued, peak_wait, clamped, cfg)
        return SimResult(
            config=cfg,
            series=series,
            totals=totals,
            pod_calls=pod_calls,
            pod_busy_s=pod_busy,
            new_pods=np.array(sched.new_pods, dtype=np.int64),
            wall_s=time.perf_counter() - wall0,
            label=self.label,
            warnings=warnings,
            published=published,
            members=np.array(members, dtype=np.int64),
        )

    # ---------------------------------------------------------------------------------

    def _prefill(
        self, cache: TickLRU, cat: Catalogue, pods: list[int], rng: np.random.Generator
    ) -> None:
        """Warm start in LRU's steady state.

        Under independent Poisson requests the time since a key's last request is
        exponential with its request rate, independently per key, and an LRU cache of
        size ``C`` holds exactly the ``C`` keys requested most recently. So drawing one
        age per key and keeping each pod's ``C`` youngest owned keys is a draw from the
        cache's stationary state; recency is kept at the granularity of
        ``PREFILL_COHORTS`` equal-sized cohorts.
        """
        owner = _owners(pods, cat.hashes, self.cfg.vnodes)
        rate = self.cfg.total_rate * cat.popularity
        age = rng.exponential(1.0, cat.size) / rate
        size = cache.capacity
        for p in pods:
            own = np.flatnonzero(owner == p)
            if not own.size:
                continue
            if own.size > size:
                own = own[np.argpartition(age[own], size - 1)[:size]]
            own = own[np.argsort(-age[own], kind="stable")]  # oldest first
            stamps = 1 + (np.arange(own.size) * PREFILL_COHORTS) // own.size
            cache.prefill(p, own, stamps)

    def _close_interval(
        self,
        ser: dict[str, list[float]],
        acc: dict[str, int],
        t0: float,
        lat_parts: list[np.ndarray],
        batch_parts: list[np.ndarray],
        occ: np.ndarray,
        router: Router,
    ) -> None:
        ser["t"].append(t0)
        ser["calls"].append(acc["calls"])
        ser["hits"].append(acc["hits"])
        ser["db_reads"].append(acc["db"])
        ser["moves"].append(acc["moves"])
        ser["new_pod_calls"].append(acc["new"])
        if lat_parts:
            lat = np.concatenate(lat_parts)
            blat = np.concatenate(batch_parts)
            p = np.percentile(lat, [50, 99]) * 1e3
            q = np.percentile(blat, [50, 99]) * 1e3
        else:
            p = q = np.array([np.nan, np.nan])
        ser["lat_p50_ms"].append(float(p[0]))
        ser["lat_p99_ms"].append(float(p[1]))
        ser["batch_p50_ms"].append(float(q[0]))
        ser["batch_p99_ms"].append(float(q[1]))
        spread = _spread(occ[router.members])
        for k in ("min", "p5", "p50", "p95", "max"):
            ser[f"occ_{k}"].append(spread[k])

    def _cache_check(
        self, cache: TickLRU, new_pods: list[int], final_owner: np.ndarray, t: float
    ) -> dict[str, Any]:
        """At the end of the fade: how much of the new pods' caches they keep for good."""
        total = kept = 0
        for p in new_pods:
            keys = cache.contents(p)
            total += keys.size
            kept += int((final_owner[keys] == p).sum())
        return {
            "t": t,
            "new_pod_cached": total,
            "new_pod_cached_owned_share": kept / total if total else 1.0,
        }


def _overload_warnings(
    backlog_s: np.ndarray,
    queued: np.ndarray,
    peak_wait: tuple[float, int, float],
    clamped: int,
    cfg: SimConfig,
) -> list[str]:
    """Say when the figures describe pods that could not keep up.

    Parameters
    ----------
    backlog_s
        Per pod, how long a call arriving at the end would wait for a slot (seconds).
    queued
        Per pod, calls not yet finished at the end.
    peak_wait
        The longest such wait at any report boundary: (seconds, pod, time in seconds).
    clamped
        Calls whose completion was booked at the horizon.
    cfg
        The run's settings.
    """
    out = []
    capacity = (
        f"{cfg.concurrency} slots serve at most {cfg.concurrency / cfg.hit_s:,.0f} cache hits/s"
    )
    over = np.flatnonzero(backlog_s > BACKLOG_WARN_S)
    if over.size:
        worst = int(over[np.argmax(backlog_s[over])])
        out.append(
            f"{over.size} pod(s) overloaded at the end: their queues grew faster than they "
            f"drained, and a new call would wait up to {backlog_s[worst]:.1f} s (pod {worst}, "
            f"{int(queued[worst]):,} calls still queued; {capacity}); latency and occupancy "
            "figures describe an overloaded fleet"
        )
    elif peak_wait[0] > BACKLOG_WARN_S:
        wait, pod, when = peak_wait
        out.append(
            f"pod {pod} was overloaded for a while: at t={when:g} s a new call would have "
            f"waited {wait:.1f} s for a slot ({capacity}); its queue drained by the end"
        )
    if clamped:
        out.append(
            f"{clamped:,} calls would finish more than {HORIZON_S:g} s after they arrived; "
            f"their completions were booked at {HORIZON_S:g} s, so busy time and in-flight "
            "counts of those pods are early"
        )
    return out


def _spread(values: np.ndarray) -> dict[str, float]:
    """min, p5, p50, p95 and max of ``values`` (NaN for none)."""
    if values.size == 0:
        return dict.fromkeys(("min", "p5", "p50", "p95", "max"), float("nan"))
    p = np.percentile(values, [5, 50, 95])
    return {
        "min": float(values.min()),
        "p5": float(p[0]),
        "p50": float(p[1]),
        "p95": float(p[2]),
        "max": float(values.max()),
    }


def client_loads(
    signal: str,
    in_flight: np.ndarray,
    busy_ns: np.ndarray,
    completed: np.ndarray,
    window_ns: int,
    *,
    bar_increment: str = "routed-call",
) -> np.ndarray:
    """The load every client host's bounded load compares, from its own counters.

    Inputs are ``(clients, pods)`` matrices over the occupancy window (each bucket
    weighted by :func:`lbcore.signals.window_weights`); lbcore does the rest:
    :func:`~lbcore.signals.occupancy`, :func:`~lbcore.signals.mean_latency` per pod and
    over the host's pods, and :func:`~lbcore.signals.load_for` for ``signal``.

    Parameters
    ----------
    signal
        One of :data:`lbcore.signals.LOAD_SIGNALS`.
    in_flight
        Calls sent and not yet returned.
    busy_ns
        Summed latency of the calls that returned in the window, in nanoseconds.
    completed
        Number of calls that returned in the window.
    window_ns
        The occupancy window, in nanoseconds.
    bar_increment
        ``"routed-call"`` (the default, as cslb's worker router routes): each host's
        loads divided by what one call adds to its signal
        (:func:`lbcore.bounded.routed_call_load` with the host's mean latency,
        :func:`lbcore.bounded.in_call_units`), so the bar adds that instead of 1.0;
        ``"skipper"``: the loads as the signal reads them (the bar adds 1.0 for the
        routed call: Skipper's formula, what cslb did for occupancy before).

    Returns
    -------
    numpy.ndarray
        ``(clients, pods)`` loads.
    """
    busy_s = busy_ns * 1e-9
    pod_latency = signals.mean_latency(busy_s, completed)
    host_latency = signals.mean_latency(busy_s.sum(axis=1), completed.sum(axis=1))
    rows = []
    for c in range(in_flight.shape[0]):
        load = signals.load_for(
            signal,
            in_flight[c],
            signals.occupancy(busy_ns[c], window_ns),
            pod_latency[c],
            float(host_latency[c]),
        )
        if bar_increment == "routed-call":
            inc = bounded.routed_call_load(signal, float(host_latency[c]), window_ns * 1e-9)
            load = bounded.in_call_units(load, inc)
        rows.append(load)
    return np.stack(rows)


def pod_speed_factors(pods: int, sigma: float, seed: int) -> np.ndarray:
    """Every pod's fixed service-time multiplier: lognormal with mean 1 and shape ``sigma``.

    Pods of one deployment land on nodes of different CPU generations and share them
    with different neighbours, so the same call takes longer on some pods than on
    others. ``sigma`` 0 gives identical pods. Drawn from its own stream of ``seed``, so
    a run's workload is the same with and without it.
    """
    if sigma == 0:
        return np.ones(pods)
    z = np.random.default_rng([seed, 2]).standard_normal(pods)
    return np.exp(sigma * z - sigma * sigma / 2)


def _owners(pods: list[int], hashes: np.ndarray, vnodes: int) -> np.ndarray:
    """Steady-state owner (global pod) of every product: lbcore's plain ring lookup."""
    ring = lbcore.Ring([endpoint_name(p) for p in pods], vnodes=vnodes)
    return np.asarray(pods, dtype=np.int32)[ring.lookup(None, hashes=hashes)]


def run(config: SimConfig, label: str = "", **kw: Any) -> SimResult:
    """Run one simulation (see :class:`Simulation`)."""
    return Simulation(config, label, **kw).run()
