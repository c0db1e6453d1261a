"""Control plane: discovery's build + publish, propagation to the workers, their memory.

For 100 / 1,000 / 5,000 / 20,000 endpoints, discovery's own path on a host whose
counters exist (as under the gunicorn master): :meth:`discovery.ringstate.RingState.transition`
to a scale-up or scale-down by 10 % (the new ring set, fading rings included), then
:meth:`discovery.publisher.Publisher.publish` (encode, write, checksum, switch).

1. *Build + publish*, alone on the host (no worker routing): the median of repeated
   membership changes after the first publish of a size (which grows the segments).
2. *Propagation*: one routing process per core, each a :class:`workers.Router` routing
   fresh 100-key batches (then ``track``) with a 0.5 ms pause between batches, while the
   same changes are published: the time from ``publish()`` returning until every worker
   has routed a batch on the new generation; the longest gap between two consecutive
   batches of any worker (a worker that waited for the publisher would show it); the
   cost of a worker's first batch on a new generation (mapping it, its new plan);
   and each worker's PSS (``/proc/<pid>/smaps_rollup``) with the table mapped. A gap
   is split, from the routing thread's ``/proc/thread-self/schedstat``, into its CPU
   time, its wait for a core (other processes of the host, two workers and the
   publisher on two cores) and the rest (sleeping, waiting for the GIL). The same is
   measured with ``Router(background=False)`` as the baseline of the run: mapping on
   the routing thread. Where a worker's time goes on a new generation (mapping, the
   first load read, the plan build) is measured apart (``plan_build_ms``: building the
   :class:`lbcore.Plan` of the published table, ``plan_first_ms``: the first one of a
   table with ejected endpoints, which parses the endpoints' hosts).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from perf.common import (
    endpoint_urls,
    full_route,
    make_skus,
    pss_bytes,
    unique_namespace,
    unlink_namespace,
)
from perf.forked import Forked

SIZES = (100, 1_000, 5_000, 20_000)
PAUSE_S = 0.0005  # between a worker's batches: a worker also serves its requests
STALL_LIMIT_S = 0.05  # a gap longer than this between batches counts as a stall


class _Discovery:
    """Discovery's state and publisher on a fresh namespace whose counters exist."""

    def __init__(self, namespace: str, n: int) -> None:
        import shm
        from discovery.publisher import Publisher
        from discovery.ringstate import RingState
        from discovery.static import EndpointSpec
        from lbcore.knobs import ROUTING_KNOBS, defaults

        self.namespace = namespace
        self.knobs = defaults(ROUTING_KNOBS)
        urls = endpoint_urls(n + max(n // 10, 1))
        self.sets = [
            [EndpointSpec(a, f"zone-{i % 3}", f"node-{i}") for i, a in enumerate(urls[:n])],
            [EndpointSpec(a, f"zone-{i % 3}", f"node-{i}") for i, a in enumerate(urls)],
        ]
        self.store = shm.CounterStore.create(namespace, rows=8)
        self.state = RingState()
        self.publisher: Publisher | None = None
        self.changes = 0
        self.cpu_s = 0.0

    def start(self) -> int:
        from discovery.publisher import Publisher

        self.publisher = Publisher(self.namespace)
        return self.change()[2]

    def change(self) -> tuple[float, float, int]:
        """The next membership change: (build seconds, publish seconds, generation).

        :attr:`cpu_s` is the process's CPU time of it (build + publish), in seconds.
        """
        assert self.publisher is not None
        specs = self.sets[self.changes % 2]
        self.changes += 1
        now = time.monotonic_ns()
        c0 = time.process_time()
        t0 = time.perf_counter()
        t = self.state.transition(specs, now)
        t1 = time.perf_counter()
        gen = self.publisher.publish(t, self.knobs, now)
        t2 = time.perf_counter()
        self.cpu_s = time.process_time() - c0
        self.state.commit(t)
        return t1 - t0, t2 - t1, int(gen)

    def close(self) -> None:
        try:
            if self.publisher is not None:
                self.publisher.close()
            self.store.close()
        finally:
            unlink_namespace(self.namespace)


def _worker(
    namespace: str, seed: int, go: Any, stop: Any, conn: Any, background: bool | None = None
) -> None:
    """Route until ``stop``, then send per-batch figures (nanoseconds).

    Per batch: end time, generation, duration, and the routing thread's CPU time and
    run-queue wait so far (``/proc/thread-self/schedstat``).

    ``background``: the :class:`workers.Router` argument (``False``: map new generations
    on the routing thread, the baseline).
    """
    from workers.routing.router import Router

    rng = np.random.default_rng(seed)
    pool = [make_skus(rng, 100) for _ in range(500)]
    conn.send("forked")
    if not go.wait(120):
        return
    router = Router(namespace, background=background)
    try:
        route = full_route(router)
        for b in pool[:20]:
            route(b)
        conn.send("ready")
        cap = 400_000
        ends = np.zeros(cap, np.int64)
        gens = np.zeros(cap, np.int64)
        took = np.zeros(cap, np.int64)
        sched = np.zeros((cap, 2), np.int64)
        i = 0
        clock = time.monotonic_ns
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        try:
            while not stop.is_set() and i < cap:
                t0 = clock()
                idx, table = router.route_table(pool[i % 500])
                with router.track(idx, table):
                    pass
                t1 = clock()
                ends[i], gens[i], took[i] = t1, table.generation, t1 - t0
                sched[i] = os.pread(fd, 64, 0).split()[:2]
                i += 1
                time.sleep(PAUSE_S)
        finally:
            os.close(fd)
        conn.send((ends[:i], gens[:i], took[:i], sched[:i]))
    finally:
        router.close()


def _build_publish(n: int, reps: int) -> dict[str, Any]:
    """Medians of ``reps`` scale-ups (+10 %) and ``reps`` scale-downs, alternating."""
    d = _Discovery(unique_namespace("cp"), n)
    times: dict[str, list[tuple[float, float]]] = {"up": [], "down": []}
    cpu: dict[str, list[float]] = {"up": [], "down": []}
    try:
        first = time.perf_counter()
        d.start()
        first = time.perf_counter() - first
        for k in range(2 * reps):
            b, p, _ = d.change()
            times["up" if k % 2 == 0 else "down"].append((b, p))
            cpu["up" if k % 2 == 0 else "down"].append(d.cpu_s)
    finally:
        d.close()
    out: dict[str, Any] = {"first_publish_ms": first * 1e3}
    for kind, got in times.items():
        out[f"{kind}_cpu_ms"] = statistics.median(cpu[kind]) * 1e3
        out[f"{kind}_build_ms"] = statistics.median(b for b, _ in got) * 1e3
        out[f"{kind}_publish_ms"] = statistics.median(p for _, p in got) * 1e3
        out[f"{kind}_total_ms"] = statistics.median(b + p for b, p in got) * 1e3
    # The figure the target is about: the slower kind of change.
    out["total_ms"] = max(out["up_total_ms"], out["down_total_ms"])
    return out


def _plan_costs(n: int, reps: int) -> dict[str, Any]:
    """What a worker spends on a new generation's plan (ms), beside mapping it.

    ``plan_build_ms``: :func:`workers.routing.snapshot.build_plan` on a mapped table (median,
    the endpoints' hosts parsed already); ``plan_first_ms``: the first plan of a table
    with an ejected endpoint mapped by the routing thread itself (which then parses
    every endpoint's host for the skip rule); ``plan_first_bg_ms``: the same table
    mapped by the reader's background thread, which parses them there.
    """
    import lbcore
    import shm
    from workers.routing.snapshot import build_plan

    ns = unique_namespace("cpl")
    store = shm.CounterStore.create(ns, rows=2)
    writer = shm.TableWriter(ns, counters=store)
    out: dict[str, Any] = {}
    try:
        urls = endpoint_urls(n + max(n // 10, 1))
        now = time.monotonic_ns()
        rs = lbcore.RingSet(urls[:n]).scale_up(urls[n:], now)
        writer.publish(rs)
        with shm.TableReader(ns) as reader:
            t = reader.table()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                build_plan(t, None, now)
                times.append(time.perf_counter() - t0)
            out["plan_build_ms"] = statistics.median(times) * 1e3
        ejected = np.zeros(len(rs.endpoints), dtype=np.bool_)
        ejected[0] = True
        writer.publish(rs, ejected=ejected)
        for key, background in (("plan_first_ms", False), ("plan_first_bg_ms", True)):
            with shm.TableReader(ns, background=background) as reader:
                t = reader.table()  # a fresh reader: no host parsed yet
                if background:
                    t = _remapped_in_background(reader, writer, rs, ejected)
                t0 = time.perf_counter()
                build_plan(t, None, now)
                out[key] = (time.perf_counter() - t0) * 1e3
    finally:
        writer.close()
        store.close()
        unlink_namespace(ns)
    return out


def _remapped_in_background(reader: Any, writer: Any, rs: Any, ejected: Any) -> Any:
    """Publish ``rs`` again; the table ``reader``'s background thread maps (≤ 30 s)."""
    import shm

    # (Other knobs than the last publish's: a new generation, not an unchanged table.)
    gen = writer.publish(rs, ejected=ejected, knobs=shm.Knobs(percentage=99.999))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = reader.table()
        if t.generation == gen:
            return t
        time.sleep(0.005)
    raise RuntimeError("the background map did not finish in 30 s")


def _propagation(
    n: int, changes: int, workers: int, background: bool | None = None
) -> dict[str, Any]:
    forked = Forked()  # forks before any publisher exists in this process
    d = _Discovery(unique_namespace("cq"), n)
    go, stop = forked.ctx.Event(), forked.ctx.Event()
    try:
        for k in range(workers):
            forked.start(_worker, lambda send, k=k: (d.namespace, k, go, stop, send, background))
        forked.expect("forked", 120, "start")
        d.start()
        go.set()
        forked.expect("ready", 120, "get ready")
        time.sleep(0.3)
        published: list[tuple[int, int]] = []  # (generation, monotonic ns publish returned)
        for _ in range(changes):
            _, _, gen = d.change()
            published.append((gen, time.monotonic_ns()))
            time.sleep(0.4)
        pss = [pss_bytes(p.pid) for p in forked.procs]
        pss_anon = [_rollup(p.pid, "Pss_Anon") for p in forked.procs]
        stop.set()
        runs = forked.receive(120, "report")
    finally:
        stop.set()
        go.set()
        forked.close()
        d.close()
    t_first = published[0][1] - 1  # the window in which publishes happened
    reach, firsts, gaps, steady = [], [], [], []
    for gen, done in published:
        worst = 0
        for ends, gens, took, _ in runs:
            on = np.flatnonzero(gens >= gen)
            if not on.size:
                worst = None
                break
            j = int(on[0])
            worst = max(worst, int(ends[j]) - done) if worst is not None else None
            firsts.append(int(took[j]))
        if worst is not None:
            reach.append(worst)
    worst_gap = (0, 0, 0)  # (wall, CPU, run-queue wait) of the longest gap, ns
    own = []  # per worker, the longest gap less its run-queue wait
    own_cpu = 0  # the routing thread's CPU time in the longest of those
    for ends, _gens, took, sched in runs:
        inside = np.flatnonzero(ends >= t_first)
        if inside.size > 1:
            wall = np.diff(ends[inside])
            cpu = np.diff(sched[inside, 0])
            wait = np.diff(sched[inside, 1])
            j = int(wall.argmax())
            gaps.append(int(wall[j]))
            if wall[j] > worst_gap[0]:
                worst_gap = (int(wall[j]), int(cpu[j]), int(wait[j]))
            mine = wall - wait
            k = int(mine.argmax())
            if not own or mine[k] > max(own):
                own_cpu = int(cpu[k])
            own.append(int(mine[k]))
        steady.append(float(np.median(took)))
    return {
        "reach_ms": statistics.median(reach) / 1e6 if reach else float("nan"),
        "reach_max_ms": max(reach) / 1e6 if reach else float("nan"),
        "missed": len(published) - len(reach),
        "first_batch_ms": statistics.median(firsts) / 1e6 if firsts else float("nan"),
        "batch_ms": statistics.median(steady) / 1e6,
        "max_gap_ms": max(gaps) / 1e6 if gaps else float("nan"),
        "max_gap_cpu_ms": worst_gap[1] / 1e6,
        "max_gap_runqueue_ms": worst_gap[2] / 1e6,
        "max_gap_own_ms": max(own) / 1e6 if own else float("nan"),
        "max_gap_own_cpu_ms": own_cpu / 1e6,
        "pss_mib": [x / 2**20 for x in pss],
        "pss_anon_mib": [x / 2**20 for x in pss_anon],
    }


def _rollup(pid: int, field: str) -> float:
    """A field of ``/proc/<pid>/smaps_rollup`` in bytes (NaN if the kernel has none)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024.0
    return float("nan")


def _profile(n: int, changes: int = 3) -> str:
    """Where a scale-up of ``n`` endpoints (+10 %) spends its time: cProfile's top frames.

    Own time per change (ms) of the ten costliest functions, after the first publish
    and one scale-up and scale-down of the size (as the medians above).
    """
    import cProfile
    import pstats

    d = _Discovery(unique_namespace("cpp"), n)
    prof = cProfile.Profile()
    try:
        d.start()
        d.change()
        d.change()
        for _ in range(changes):
            prof.enable()
            d.change()  # scale-up
            prof.disable()
            d.change()
    finally:
        d.close()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(
        ((tt, _where(file, name)) for (file, _, name), (_, _, tt, _, _) in stats.items()),
        reverse=True,
    )
    total = sum(tt for tt, _ in rows) / changes * 1e3
    top = "; ".join(f"{where} {tt / changes * 1e3:.1f}" for tt, where in rows[:10])
    return f"{total:.0f} ms per change under the profiler; own time, ms: {top}"


def _where(path: str, name: str) -> str:
    """A profiled function, short: its file from the package folder on, and its name."""
    if path == "~":  # a C function: "<method 'sort' of 'numpy.ndarray' objects>" and alike
        m = re.fullmatch(r"<method '(\w+)' of '([\w.]+)' objects>", name)
        if m:
            return f"{m[2]}.{m[1]}"
        return name.removeprefix("<built-in method ").removeprefix("<").removesuffix(">")
    return f"{_frame(path)}:{name}"


def _frame(path: str) -> str:
    """A profiled function's file, short: from the package folder on."""
    parts = Path(path).parts
    for root in ("lbcore", "shm", "discovery", "numpy", "perf"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root) :])
    return Path(path).name


def run(quick: bool = False, log: Any = print) -> dict[str, Any]:
    """Run the control-plane benchmark; returns ``{"rows": [...], "notes": [...]}``.

    Each row: ``endpoints``; per kind of change (``up``: +10 %, ``down``: -10 %)
    ``<kind>_build_ms``, ``<kind>_publish_ms``, ``<kind>_total_ms`` (medians);
    ``total_ms`` (the slower kind), ``first_publish_ms``, ``reach_ms`` / ``reach_max_ms`` (publish
    returned → every worker routed on it), ``first_batch_ms``, ``batch_ms``,
    ``max_gap_ms``, ``pss_mib`` and ``pss_anon_mib`` (per worker: all, and the
    process's own memory without the shared tables); ``max_gap_cpu_ms`` and
    ``max_gap_runqueue_ms``: of the longest gap, the routing thread's CPU time and its
    wait for a core (a busy host, not the worker); ``max_gap_own_ms``: the longest gap
    less its wait for a core, and ``max_gap_own_cpu_ms`` the routing thread's CPU time
    in it (the rest: the pause between batches, waits for the GIL). Not with
    ``quick``: the same propagation figures for ``Router(background=False)`` (mapping
    on the routing thread), prefixed ``fg_``.
    """
    sizes = (100, 1_000) if quick else SIZES
    workers = max(multiprocessing.cpu_count(), 1)
    rows = []
    for n in sizes:
        reps = 1 if quick else (5 if n <= 1_000 else 3)
        row: dict[str, Any] = {"endpoints": n}
        row.update(_build_publish(n, reps))
        row.update(_plan_costs(n, reps))
        row.update(_propagation(n, 2 if quick else 3, workers))
        if not quick:
            # The baseline in the same run: new generations mapped on the routing
            # thread (Router(background=False)).
            base = _propagation(n, 3, workers, background=False)
            row.update({f"fg_{k}": v for k, v in base.items()})
        rows.append(row)
        log(
            f"  control {n:>6} endpoints: scale-up {row['up_build_ms']:.1f} ms build + "
            f"{row['up_publish_ms']:.1f} ms publish, scale-down {row['down_build_ms']:.1f} + "
            f"{row['down_publish_ms']:.1f} ms; a worker's plan {row['plan_build_ms']:.2f} ms "
            f"(the first with hosts to parse {row['plan_first_ms']:.1f} ms on the routing "
            f"thread, {row['plan_first_bg_ms']:.2f} ms after the background map); every "
            "worker on it "
            f"{row['reach_ms']:.1f} ms later (max {row['reach_max_ms']:.1f}); longest gap "
            f"between batches {row['max_gap_ms']:.1f} ms ({row['max_gap_runqueue_ms']:.1f} of "
            f"it waiting for a core; {row['max_gap_own_ms']:.1f} without); PSS/worker "
            + ", ".join(f"{x:.1f}" for x in row["pss_mib"])
            + " MiB"
            + (
                f"; on the routing thread: every worker on it {row['fg_reach_ms']:.1f} ms "
                f"later, longest gap {row['fg_max_gap_ms']:.1f} ms "
                f"({row['fg_max_gap_own_ms']:.1f} without waits for a core)"
                if "fg_reach_ms" in row
                else ""
            )
        )
    biggest = rows[-1]
    notes = [
        "Build = RingState.transition (scale-up: +10 % endpoints fading in; scale-down: "
        "the same 10 % removed), publish = Publisher.publish into shared memory; medians "
        "of alternating changes after the first publish of a size, with no worker "
        f"routing. Propagation: {workers} "
        "routing processes (100-key batches, route_table + track, "
        f"{PAUSE_S * 1e3:g} ms pause between batches) while the same changes are published; "
        f"a gap over {STALL_LIMIT_S * 1e3:g} ms between two batches of a worker counts as "
        "a stall.",
        f"CPU time of build + publish at {biggest['endpoints']:,} endpoints (the process's "
        "user + system time, medians; the times above are wall-clock, so they also hold "
        f"waits for a core): scale-up {biggest['up_cpu_ms']:.0f} ms, scale-down "
        f"{biggest['down_cpu_ms']:.0f} ms. Profile of its scale-up (cProfile, which slows "
        f"Python frames more than NumPy's): {_profile(biggest['endpoints'])}.",
    ]
    return {"rows": rows, "notes": notes}
