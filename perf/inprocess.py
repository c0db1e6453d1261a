"""In-process routing: the worker's full ``Router`` path next to what a user would otherwise write.

For rings of 10 / 100 / 1,000 endpoints × 100 virtual nodes, SKU strings (a list of
``str``, as JSON decoding gives them) and int64 IDs (a NumPy array), at batch sizes 1 to
100,000, in one run:

* ``cslb Router``: :meth:`workers.Router.route_table` then :meth:`~workers.Router.track`
  on a host whose table has a ring fading in (half-way), bounded load on the host-wide
  occupancy (another worker's row holds busy endpoints), the rollout gate on and the
  fan-out recorded in the shared counters: what a worker does per batch, on the
  native kernel;
* ``cslb Router, NumPy kernel``: the same with ``CSLB_KERNEL=numpy`` (what a machine
  without a C compiler runs);
* ``cslb route only``: ``route_table`` alone (what recording the fan-out adds is the
  difference);
* ``lbcore Plan.route``: the kernel alone, one call on the router's own plan;
* ``C floor``: XXH64 of each key's bytes plus one bucket-table load, in C
  (``lbcore._kernel.floor``; the keys' bytes prepared outside the timing);
* ``python loop``: ``xxhash.xxh64_intdigest`` + ``bisect`` per key on a list ring;
* ``uhashring``: ``HashRing.get_node`` per key (its defaults: md5, 160 vnodes).

Each figure is the median over repetitions, each on a batch never routed before (a CPU
that sees the same batch again learns it), in nanoseconds per key.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import lbcore
from perf.common import (
    KEY_MAKERS,
    LoadedHost,
    PythonLoopRing,
    as_python,
    full_route,
    measure,
    no_gc,
    unique_namespace,
)

FULL_BATCHES = (1, 10, 100, 1_000, 100_000)
FULL_RINGS = (10, 100, 1_000)


def _reps(batch: int, op: str, quick: bool) -> int:
    """Repetitions (fresh batches) per figure: enough for a stable median, bounded time."""
    if batch <= 10:
        reps = 500
    elif batch <= 100:
        reps = 300
    elif batch <= 1_000:
        reps = 80
    else:
        reps = 7
    if op in ("python loop", "uhashring", "cslb Router, NumPy kernel"):
        reps = max(reps // 3, 3)  # microseconds per key: fewer repetitions do
    if quick:
        reps = max(reps // 30, 2)
    return reps


def _uhashring(endpoints: list[str]) -> Any:
    try:
        from uhashring import HashRing
    except ImportError:
        return None
    ring = HashRing(nodes=endpoints)
    get = ring.get_node
    return lambda keys: [get(k) for k in keys]


def _floor(router: Any) -> tuple[Any, Any] | None:
    """The C floor on the router's newest ring, and its batch conversion (bytes, outside)."""
    native = lbcore.kernel.load_native()
    snap = router.snapshot()
    if native is None or snap is None or snap.table.ring_set.newest is None:
        return None
    ring = snap.table.ring_set.newest
    buckets = np.ascontiguousarray(ring.buckets)
    shift = 64 - ring.bucket_bits

    def convert(batch: Any) -> tuple[bytes, int]:
        texts = [k.encode() if isinstance(k, str) else str(k).encode() for k in as_python(batch)]
        width = max(len(t) for t in texts)
        return b"".join(t.ljust(width, b"0") for t in texts), width

    def floor(prepared: tuple[bytes, int]) -> int:
        return native.floor(prepared[0], prepared[1], buckets, shift)

    return floor, convert


def _on_kernel(name: str, router: Any, fn: Any) -> Any:
    """``fn`` measured on kernel ``name``: the router's next plan is built on it."""

    def run(keys: Any) -> Any:
        return fn(keys)

    run.kernel = name  # type: ignore[attr-defined]
    run.router = router  # type: ignore[attr-defined]
    return run


def run(quick: bool = False, log: Any = print) -> dict[str, Any]:
    """Run the in-process benchmark; returns ``{"rows": [...], "notes": [...], ...}``.

    With the native kernel also ``breakdown`` and ``profile`` (:func:`_where_the_time_goes`).

    Each row: ``endpoints``, ``keys`` (``sku``/``int``), ``batch``, ``op``,
    ``ns_per_key`` (median, nanoseconds) and ``mkeys_per_s`` (millions of keys per second).
    """
    from workers.routing.router import Router

    batches = (1, 100, 10_000) if quick else FULL_BATCHES
    rng = np.random.default_rng(20261129)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    where: dict[str, Any] = {}
    native = lbcore.kernel.load_native() is not None
    if not native:
        notes.append("the native kernel is not built here: the native columns are missing")
    for n_eps in FULL_RINGS:
        with LoadedHost(unique_namespace("ip"), n_eps) as host:
            router = Router(host.namespace)
            try:
                ring = lbcore.Ring(host.endpoints)
                ops: dict[str, Any] = {}
                if native:
                    lbcore.use_kernel("native")
                    router.refresh()
                    full_route(router)(KEY_MAKERS["sku"](rng, 10))
                    plan = router.snapshot().plan
                    ops["cslb Router"] = (full_route(router), None)
                    ops["cslb route only"] = (router.route_table, None)
                    ops["lbcore Plan.route"] = (plan.route, None)
                ops["cslb Router, NumPy kernel"] = (
                    _on_kernel("numpy", router, full_route(router)),
                    None,
                )
                floor = _floor(router) if native else None
                if floor is not None:
                    ops["C floor"] = floor
                ops["python loop"] = (PythonLoopRing(ring).lookup, as_python)
                uh = _uhashring(host.endpoints)
                if uh is not None:
                    ops["uhashring"] = (uh, as_python)
                elif "uhashring" not in " ".join(notes):
                    notes.append(
                        "uhashring is not installed (pip install 'cslb[bench]'): no column"
                    )
                # A worker routes many batches on one load snapshot: warm it the way
                # serving would.
                for _ in range(20):
                    full_route(router)(KEY_MAKERS["sku"](rng, 100))
                with no_gc():
                    for kind, maker in KEY_MAKERS.items():
                        for n in batches:
                            for op, (fn, convert) in ops.items():
                                reps = _reps(n, op, quick)
                                data = [maker(rng, n) for _ in range(reps + 1)]
                                kernel = getattr(fn, "kernel", None)
                                old = lbcore.use_kernel(kernel) if kernel else None
                                if kernel:
                                    fn.router.refresh()  # its next plan: on that kernel
                                try:
                                    ns = measure(fn, data, n, convert)
                                finally:
                                    if old is not None:
                                        lbcore.use_kernel(old)
                                        fn.router.refresh()
                                rows.append(
                                    {
                                        "endpoints": n_eps,
                                        "keys": kind,
                                        "batch": n,
                                        "op": op,
                                        "ns_per_key": ns,
                                        "mkeys_per_s": 1e3 / ns,
                                    }
                                )
                                log(
                                    f"  inprocess {n_eps:>5} eps {kind:>3} batch {n:>7,} "
                                    f"{op:<26} {ns:>10.1f} ns/key"
                                )
                if native and n_eps == 100:
                    lbcore.use_kernel("native")
                    router.refresh()
                    with no_gc():
                        where = _where_the_time_goes(router, rng, quick)
            finally:
                router.close()
    notes.append(
        "cslb Router = route_table + track (enter/exit) per batch on a table with 10 % of "
        "the endpoints fading in (30 s window, half-way), bounded load (factor 1.25, "
        "max 10 hops) on the host-wide occupancy with 10 % of the endpoints busy, "
        "the rollout gate at 100 %; on the native kernel unless named. The C floor is "
        "XXH64 of each key's bytes plus one bucket-table load (no Python object touched)."
    )
    return {"rows": rows, "notes": notes, **where}


def _where_the_time_goes(router: Any, rng: np.random.Generator, quick: bool) -> dict[str, Any]:
    """The Router's per-batch path in parts (100×100, SKU keys), and a cProfile of it.

    ``breakdown``: median nanoseconds per batch of the whole path and of each part
    measured alone (``depth`` 1: a part of the row above); ``profile``: the functions
    with the most own time over batch-1 ``route_table`` + ``track`` calls (cProfile's
    own overhead inflates short functions: read it for shares, not for times).
    """
    import cProfile
    import pstats

    follow, rec = router._follow, router.recording
    snap = router.snapshot()
    plan, row = snap.plan, rec.row[1] if rec.row is not None else None
    view, totals = snap.slot_view, rec.kernel_totals

    def routed(keys: Any) -> Any:
        return plan.route(keys)[0].copy()

    def route_counted(keys: Any) -> Any:
        return snap.route_counted(keys, 0, row.count_sink if row else None, totals)

    def start_end(idx: Any) -> None:
        # As the tracker writes them: one kernel call each (in the newest bucket).
        r: Any = row
        now, end = time.monotonic_ns(), time.monotonic_ns()
        if r.record_newest(r.newest_sink, view, idx, now) < 0:
            r.record_start(idx, now, plan.n_slots, plan.slots)
        if r.record_newest(r.newest_sink, view, idx, now, end - now, end) < 0:
            r.record_end(idx, now, end - now, end, None, plan.n_slots, plan.slots)

    parts: list[tuple[str, int, Any, Any]] = [
        ("Router: route_table + track (enter, exit)", 0, full_route(router), None),
        ("route_table", 1, router.route_table, None),
        ("snapshot still current (Follower.current)", 2, lambda _k: follow.current(), None),
        ("the kernel, decision count included (Plan.route_counted)", 2, route_counted, None),
    ]
    if row is not None:
        parts.append(("the row's start + end (kernel calls, bare)", 1, start_end, routed))
    reps = 30 if quick else 600
    rows = []
    for n in (1, 100):
        for label, depth, fn, convert in parts:
            data = [KEY_MAKERS["sku"](rng, n) for _ in range(reps + 1)]
            ns = measure(fn, data, n, convert) * n
            rows.append({"batch": n, "part": label, "depth": depth, "ns_per_batch": ns})
    # Own time per function over batch-1 calls of the whole path.
    calls = 2_000 if quick else 20_000
    data = [KEY_MAKERS["sku"](rng, 1) for _ in range(calls)]
    run = full_route(router)
    prof = cProfile.Profile()
    prof.enable()
    for keys in data:
        run(keys)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    top = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:14]
    total = sum(v[2] for v in stats.values())
    profile = [
        {
            "function": _frame_name(key),
            "calls_per_batch": v[1] / calls,
            "own_share": v[2] / total if total else 0.0,
        }
        for key, v in top
    ]
    return {"breakdown": rows, "profile": profile}


def _frame_name(key: tuple[str, int, str]) -> str:
    """``module.py:line(function)`` with the path from the checkout (or a builtin's name)."""
    path, line, name = key
    if path == "~":
        return name
    for root in ("/workers/", "/shm/", "/lbcore/", "/perf/"):
        i = path.rfind(root)
        if i >= 0:
            path = path[i + 1 :]
            break
    else:
        path = path.rsplit("/", 1)[-1]
    return f"{path}:{line}({name})"
