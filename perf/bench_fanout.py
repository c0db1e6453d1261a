"""Benchmark of the fan-out helper: ``python perf/bench_fanout.py`` (perf part ``fanout``).

Prints, per fanned-out key, the process CPU time (every thread) of:

* ``router.fanout(keys, send)`` on its pool of 8 threads, next to the loop a user
  writes by hand in the same run: ``route_table`` + ``endpoints_of`` + ``track`` around
  ``ThreadPoolExecutor(8).map`` (the ratio is the helper's overhead);
* ``await router.afanout(keys, asend)``, next to ``route_table`` + ``track`` around
  ``asyncio.gather``;

for 100 keys per fan-out on 10 endpoints, with a send that returns at once (the
machinery alone) and one that sleeps 1 ms (threads really wait). Then the recording
of one call alone: :class:`workers.fanout.ledger.CallLedger` ``begin`` + ``end`` with its
batched writes, next to one ``record_start`` + ``record_end`` per call through the
worker's :class:`shm.LockedRecorder` (what recording each call on its own would cost).
Medians over repetitions on fresh key batches; absolute numbers drift by up to 2x on
shared machines, ratios less. About 30 s (``--quick``: a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import select
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

import lbcore
import shm
import shm.names
from perf.common import write_json
from workers.fanout.ledger import CallLedger
from workers.fanout.settings import FanoutSettings
from workers.routing.router import Router

PARTS = ("inprocess", "wire")
THREADS = 8
KEYS_PER_FANOUT = 100
EPS = [f"http://10.7.0.{i}:8080" for i in range(1, 11)]


def _batches(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10**9, (n, KEYS_PER_FANOUT))
    return [[f"AD{x:09d}-K11" for x in row] for row in ids]


def _cpu_per_key(run: Callable[[list[str]], Any], batches: list[list[str]], reps: int) -> float:
    """Median process CPU µs per key over ``reps`` runs of ``len(batches) // reps`` fan-outs."""
    per = len(batches) // reps
    out = []
    for r in range(reps):
        chunk = batches[r * per : (r + 1) * per]
        c0 = time.process_time()
        for keys in chunk:
            run(keys)
        out.append((time.process_time() - c0) / (len(chunk) * KEYS_PER_FANOUT) * 1e6)
    return statistics.median(out)


def _sends(sleep_s: float) -> tuple[Callable[..., Any], Callable[..., Any]]:
    def send(url: str, key: str, timeout: float | None = None) -> str:
        if sleep_s:
            time.sleep(sleep_s)
        return key

    async def asend(url: str, key: str, timeout: float | None = None) -> str:
        if sleep_s:
            await asyncio.sleep(sleep_s)
        return key

    return send, asend


def _hand_threads(router: Router, pool: ThreadPoolExecutor, send: Callable[..., Any]):
    def run(keys: list[str]) -> list[Any]:
        idx, table = router.route_table(keys)
        urls = router.endpoints_of(idx, table)
        with router.track(idx, table, keys=keys) as t:

            def call(i: int) -> Any:
                try:
                    return send(urls[i], keys[i], timeout=1.0)
                except Exception:
                    t.fail(i)
                    return None

            return list(pool.map(call, range(len(keys))))

    return run


def _hand_async(router: Router, asend: Callable[..., Any]):
    async def run(keys: list[str]) -> list[Any]:
        idx, table = router.route_table(keys)
        urls = router.endpoints_of(idx, table)
        with router.track(idx, table, keys=keys):
            return await asyncio.gather(
                *(asend(urls[i], keys[i], timeout=1.0) for i in range(len(keys))),
                return_exceptions=True,
            )

    return run


def _bench_fanout(router: Router, quick: bool, log: Callable[[str], None]) -> list[dict]:
    rows = []
    reps = 3 if quick else 7
    per = 3 if quick else 20
    pool = ThreadPoolExecutor(THREADS)
    loop = asyncio.new_event_loop()
    try:
        for sleep_s in (0.0, 0.001):
            send, asend = _sends(sleep_s)
            kind = "returns at once" if not sleep_s else "sleeps 1 ms"
            batches = _batches(reps * per * 4, seed=int(sleep_s * 1e4) + 1)
            parts = [batches[i::4] for i in range(4)]
            # Warm both paths (threads started, plans built) before measuring.
            router.fanout(batches[0], send)
            _hand_threads(router, pool, send)(batches[0])
            helper = _cpu_per_key(lambda k, s=send: router.fanout(k, s), parts[0], reps)
            hand = _cpu_per_key(_hand_threads(router, pool, send), parts[1], reps)
            hand_a = _hand_async(router, asend)
            ahelper = _cpu_per_key(
                lambda k, s=asend: loop.run_until_complete(router.afanout(k, s)), parts[2], reps
            )
            ahand = _cpu_per_key(lambda k, h=hand_a: loop.run_until_complete(h(k)), parts[3], reps)
            for form, a, b, base in (
                ("threads", helper, hand, "route + track + ThreadPoolExecutor(8).map"),
                ("asyncio", ahelper, ahand, "route + track + asyncio.gather"),
            ):
                row = {
                    "form": form,
                    "send": kind,
                    "helper_us_per_key": a,
                    "hand_us_per_key": b,
                    "ratio": a / b,
                    "baseline": base,
                }
                rows.append(row)
                log(
                    f"  {form:8s} send {kind:16s} helper {a:6.1f} µs/key   by hand {b:6.1f} "
                    f"µs/key   ratio {a / b:4.2f}  ({base})"
                )
    finally:
        pool.shutdown()
        loop.close()
    return rows


def _bench_recording(router: Router, quick: bool, log: Callable[[str], None]) -> list[dict]:
    ledger = CallLedger(router.recording)
    rec = router.recorder
    n = 20_000 if quick else 200_000
    slots = np.random.default_rng(3).integers(0, len(EPS), n).tolist()
    bound = int(router.table().n_slots)

    def batched() -> None:
        for s in slots:
            t = ledger.begin(s, 1 << 30)
            ledger.end(s, t)
        ledger.flush()

    one = [np.array([s], dtype=np.int64) for s in slots[: n // 10]]

    def unbatched() -> None:
        for s in one:
            t = time.monotonic_ns()
            rec.record_start(s, t, bound=bound)
            rec.record_end(s, t, 1000, time.monotonic_ns(), None, bound=bound)

    times_b, times_u = [], []
    for _ in range(3 if quick else 5):
        t0 = time.perf_counter_ns()
        batched()
        times_b.append((time.perf_counter_ns() - t0) / n)
        t0 = time.perf_counter_ns()
        unbatched()
        times_u.append((time.perf_counter_ns() - t0) / len(one))
    b, u = statistics.median(times_b), statistics.median(times_u)
    log(
        f"  recording one call: CallLedger begin + end (batched writes) {b:,.0f} ns/call; "
        f"record_start + record_end per call {u:,.0f} ns/call (ratio {b / u:.2f})"
    )
    return [{"op": "recording", "ledger_ns_per_call": b, "per_call_ns": u, "ratio": b / u}]


# ------------------------------------------------------------------------------------
# On the wire: five C pods answering in 2 ms (perf/wirepods.py), one fan-out at a time.

WIRE_PODS = 5
WIRE_SERVICE_MS = 2.0
WIRE_SIZES = (100, 1_000)
#: The floor's libcurl multi: per-pod connection cap and the connection cache.
PER_HOST = 20
#: Issue 17's bar: fanout / afanout (and grouped) within 1.3x the floor's wall and CPU.
WIRE_BAR = 1.3


def _pin_threads(cpus: set[int]) -> dict[int, set[int]]:
    """Pin every thread of this process to ``cpus``; their affinities before."""
    before = {}
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass
    return before


def _unpin_threads(before: dict[int, set[int]]) -> None:
    everything = os.sched_getaffinity(0) | set().union(*before.values()) if before else None
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, before.get(tid) or everything or os.sched_getaffinity(0))
        except OSError:
            pass


class CurlFloor:
    """libcurl multi from Python with nothing else: the fan-out's floor client.

    One ``pycurl.CurlMulti`` for every fan-out, easy handles reused, at most
    :data:`PER_HOST` connections per pod and a connection cache that keeps them all;
    every call of a fan-out added at once, then driven either by ``perform()`` +
    ``select()`` (``"select"``) or by ``socket_action`` with an epoll and libcurl's timer
    (``"epoll"``). Each body is collected, its status checked and its JSON decoded.
    """

    def __init__(self, pods: int, drive: str = "select") -> None:
        import pycurl

        self.pycurl = pycurl
        self.drive = drive
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, PER_HOST)
        self.multi.setopt(pycurl.M_MAXCONNECTS, PER_HOST * pods * 2)
        self.handles: list[Any] = []
        self.epoll: select.epoll | None = None
        self.timeout_ms = -1
        if drive == "epoll":
            self.epoll = select.epoll()
            self.watched: dict[int, int] = {}
            self.multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
            self.multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)

    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        pc = self.pycurl
        assert self.epoll is not None
        if what == pc.POLL_REMOVE:
            if self.watched.pop(fd, None) is not None:
                with contextlib.suppress(OSError):
                    self.epoll.unregister(fd)
            return
        mask = {pc.POLL_IN: select.EPOLLIN, pc.POLL_OUT: select.EPOLLOUT}.get(
            what, select.EPOLLIN | select.EPOLLOUT
        )
        if fd in self.watched:
            self.epoll.modify(fd, mask)
        else:
            self.epoll.register(fd, mask)
        self.watched[fd] = mask

    def _on_timer(self, ms: int) -> None:
        self.timeout_ms = ms

    def _handle(self, i: int) -> Any:
        while len(self.handles) <= i:
            h = self.pycurl.Curl()
            h.setopt(self.pycurl.NOSIGNAL, 1)
            h.setopt(self.pycurl.TIMEOUT_MS, 5000)
            self.handles.append(h)
        return self.handles[i]

    def calls(self, urls: list[str], bodies: list[bytes] | None = None) -> tuple[list[Any], int]:
        """GET each URL (or POST ``bodies[i]`` to it); the decoded answers and the failures."""
        pc = self.pycurl
        n = len(urls)
        bufs = []
        for i in range(n):
            h = self._handle(i)
            b = io.BytesIO()
            bufs.append(b)
            h.setopt(pc.URL, urls[i])
            h.setopt(pc.WRITEDATA, b)
            if bodies is not None:
                h.setopt(pc.POSTFIELDS, bodies[i])
            elif h.getinfo(pc.EFFECTIVE_METHOD) != "GET":
                h.setopt(pc.HTTPGET, 1)
            self.multi.add_handle(h)
        failed: set[int] = set()
        if self.drive == "epoll":
            self._drive_epoll(n, failed)
        else:
            self._drive_select(n, failed)
        out: list[Any] = []
        for i in range(n):
            h = self.handles[i]
            if i in failed or h.getinfo(pc.RESPONSE_CODE) != 200:
                failed.add(i)
                out.append(None)
                continue
            try:
                out.append(json.loads(bufs[i].getvalue()))
            except ValueError:
                failed.add(i)
                out.append(None)
        return out, len(failed)

    def _drain(self, failed: set[int]) -> int:
        done = 0
        while True:
            queued, ok, err = self.multi.info_read()
            for h in ok:
                self.multi.remove_handle(h)
            for h, _code, _msg in err:
                self.multi.remove_handle(h)
                failed.add(self.handles.index(h))
            done += len(ok) + len(err)
            if not queued:
                return done

    def _drive_select(self, n: int, failed: set[int]) -> None:
        left = n
        for _ in range(10_000_000):
            while True:
                ret, _running = self.multi.perform()
                if ret != self.pycurl.E_CALL_MULTI_PERFORM:
                    break
            left -= self._drain(failed)
            if left <= 0:
                return
            t = self.multi.timeout()  # libcurl's next timer (ms; -1: none set)
            if t != 0:
                self.multi.select(1.0 if t < 0 else min(t, 1000) / 1000.0)

    def _drive_epoll(self, n: int, failed: set[int]) -> None:
        pc = self.pycurl
        assert self.epoll is not None
        left = n
        self.multi.socket_action(pc.SOCKET_TIMEOUT, 0)
        left -= self._drain(failed)
        for _ in range(10_000_000):
            if left <= 0:
                return
            t = self.timeout_ms
            events = self.epoll.poll(-1 if t < 0 else t / 1000.0)
            if not events:
                self.multi.socket_action(pc.SOCKET_TIMEOUT, 0)
            for fd, ev in events:
                flags = (pc.CSELECT_IN if ev & select.EPOLLIN else 0) | (
                    pc.CSELECT_OUT if ev & select.EPOLLOUT else 0
                )
                if ev & (select.EPOLLERR | select.EPOLLHUP):
                    flags |= pc.CSELECT_ERR
                self.multi.socket_action(fd, flags)
            left -= self._drain(failed)

    def close(self) -> None:
        for h in self.handles:
            h.close()
        self.multi.close()
        if self.epoll is not None:
            self.epoll.close()


def _floor_calls(floor: CurlFloor, urls: list[str]):
    def run(keys: list[str], _prep: Any) -> tuple[list[Any], int]:
        n = len(keys)
        return floor.calls([f"{urls[i % len(urls)]}/{keys[i]}" for i in range(n)])

    return run


def _floor_grouped(floor: CurlFloor):
    def run(keys: list[str], groups: list[tuple[str, list[int]]]) -> tuple[list[Any], int]:
        got, failed = floor.calls(
            [url + "/batch" for url, _ in groups],
            [json.dumps([keys[i] for i in ix]).encode() for _, ix in groups],
        )
        out: list[Any] = [None] * len(keys)
        for (_, ix), vals in zip(groups, got, strict=True):
            if vals is None or len(vals) != len(ix):
                failed += len(ix)
                continue
            for i, v in zip(ix, vals, strict=True):
                out[i] = v
        return out, failed

    return run


#: The first error of a failed key, per fan-out helper row (for the notes).
_FIRST_ERROR: dict[str, str] = {}


def _results(results: list[Any], name: str = "") -> tuple[list[Any], int]:
    bad = 0
    for r in results:
        if not r.ok:
            bad += 1
            if name not in _FIRST_ERROR:
                _FIRST_ERROR[name] = f"{type(r.error).__name__}: {r.error}"[:300]
    return [r.value for r in results], bad


def _wire_variants(
    router: Router,
    before: Router,
    urls: list[str],
    loop: asyncio.AbstractEventLoop,
    notes: list[str],
) -> tuple[dict[str, Callable[..., Any]], list[Any]]:
    """The clients compared, by row name: ``run(keys, groups) -> (values, failed keys)``.

    ``router`` makes the CurlSender rows' fan-outs, ``before`` the urllib3 and httpx
    rows' (two routers on the same tables, so the transports share no fan-out state).
    """
    closers: list[Any] = []
    floor = CurlFloor(len(urls), "select")
    floor_ep = CurlFloor(len(urls), "epoll")
    floor_g = CurlFloor(len(urls), "select")
    closers += [floor, floor_ep, floor_g]
    v: dict[str, Callable[..., Any]] = {
        "floor": _floor_calls(floor, urls),
        "floor (socket_action + epoll)": _floor_calls(floor_ep, urls),
        "floor grouped": _floor_grouped(floor_g),
    }
    try:
        from workers.senders import CurlSender
    except ImportError as exc:
        notes.append(f"CurlSender rows not measured: `from workers.senders import CurlSender` "
                     f"failed ({exc}).")  # fmt: skip
    else:
        curl = CurlSender("/{key}")
        curl_a = CurlSender("/{key}")
        curl_g = CurlSender("/{key}")
        curl_ga = CurlSender("/{key}")
        closers += [curl, curl_a, curl_g, curl_ga]
        v["CurlSender sync"] = lambda k, _g: _results(router.fanout(k, curl), "CurlSender sync")
        v["CurlSender asyncio"] = lambda k, _g: _results(
            loop.run_until_complete(router.afanout(k, curl_a)), "CurlSender asyncio"
        )
        v["CurlSender grouped sync"] = lambda k, _g: _results(
            router.fanout(k, curl_g.group, grouped=True), "CurlSender grouped sync"
        )
        v["CurlSender grouped asyncio"] = lambda k, _g: _results(
            loop.run_until_complete(router.afanout(k, curl_ga.group, grouped=True)),
            "CurlSender grouped asyncio",
        )
    from workers.senders import HttpxSender, Urllib3Sender

    u3 = Urllib3Sender("/{key}")
    hx = HttpxSender("/{key}")
    closers += [u3, hx]
    v["urllib3 (defaults)"] = lambda k, _g: _results(before.fanout(k, u3), "urllib3 (defaults)")
    v["httpx (defaults)"] = lambda k, _g: _results(
        loop.run_until_complete(before.afanout(k, hx)), "httpx (defaults)"
    )
    return v, closers


#: Fan-outs measured per variant and size (full run; --quick: a fifth). The slow
#: clients are capped so that a run takes about a minute (urllib3 ~0.4 s and httpx
#: ~1.5-3 s per 1,000-ID fan-out).
WIRE_REPS = {100: 60, 1_000: 20}
WIRE_CAPS = {("urllib3 (defaults)", 1_000): 8, ("httpx (defaults)", 1_000): 4,
             ("httpx (defaults)", 100): 30}  # fmt: skip


#: Warm-up fan-outs per client and size (3 for the capped, slow ones): a router spreads
#: 100 IDs unevenly over 5 pods, so a pool grows towards its per-pod cap over the first
#: fan-outs; those connections are the warm-up's, not churn.
WIRE_WARMUP = 10


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _bench_wire(quick: bool, log: Callable[[str], None]) -> tuple[list[dict], list[str]]:
    from perf.common import unique_namespace, unlink_namespace
    from perf.wirepods import WirePods

    notes: list[str] = []
    cpus = sorted(os.sched_getaffinity(0))
    pod_cpu = cpus[-1] if len(cpus) > 1 else None
    rows: list[dict] = []
    ns = unique_namespace("fw")
    store = writer = router = before = None
    closers: list[Any] = []
    pinned: dict[int, set[int]] = {}
    loop_name = os.environ.get("CSLB_PERF_LOOP", "uvloop")
    try:
        if loop_name != "uvloop":
            raise ImportError
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
        loop_name = "asyncio"
    try:
        with WirePods(WIRE_PODS, WIRE_SERVICE_MS, cpu=pod_cpu) as pods:
            if pod_cpu is not None:
                pinned = _pin_threads(set(cpus[:-1]))
            store = shm.CounterStore.create(ns, rows=8)
            writer = shm.TableWriter(ns, counters=store)
            writer.publish(lbcore.RingSet(pods.urls), knobs=shm.Knobs())
            router = Router(ns, fanout_settings=FanoutSettings(timeout_s=5.0))
            before = Router(ns, fanout_settings=FanoutSettings(timeout_s=5.0))
            variants, closers = _wire_variants(router, before, pods.urls, loop, notes)
            names = list(variants)
            log(
                f"on the wire: {WIRE_PODS} C pods answering in {WIRE_SERVICE_MS:g} ms"
                + (f" (pinned to core {pod_cpu}, the client to {cpus[:-1]})" if pinned else "")
                + f", asyncio on {loop_name}; one fan-out at a time, variants interleaved"
            )
            serial = iter(range(10**9))
            for n in WIRE_SIZES:
                reps = max(3, WIRE_REPS[n] // (5 if quick else 1))
                caps = {v: min(reps, WIRE_CAPS.get((v, n), reps)) for v in names}
                if quick:
                    caps = {
                        v: max(2, c // 2) if (v, n) in WIRE_CAPS else c for v, c in caps.items()
                    }

                def batch(n: int = n) -> tuple[list[str], list[tuple[str, list[int]]]]:
                    base = next(serial) * n
                    keys = [f"AD{base + i:010d}-K11" for i in range(n)]
                    idx, table = router.route_table(keys)
                    by: dict[str, list[int]] = {}
                    for i, url in enumerate(router.endpoints_of(idx, table)):
                        by.setdefault(url, []).append(i)
                    return keys, list(by.items())

                raised = dict.fromkeys(names, 0)
                errors: dict[str, str] = {}

                def call(
                    v: str, keys: list[str], groups: Any, raised=raised, errors=errors
                ) -> tuple[list[Any], int]:
                    """One fan-out of variant ``v``; one that raises fails all its keys."""
                    try:
                        return variants[v](keys, groups)
                    except Exception as exc:
                        raised[v] += 1
                        errors.setdefault(v, f"{type(exc).__name__}: {exc}"[:300])
                        return [None] * len(keys), len(keys)

                _FIRST_ERROR.clear()
                for v in names:  # warm-up: connections opened, plans built, threads started
                    for _ in range(3 if (v, n) in WIRE_CAPS else WIRE_WARMUP):
                        call(v, *batch())
                walls: dict[str, list[float]] = {v: [] for v in names}
                cpu: dict[str, list[float]] = {v: [] for v in names}
                conns = dict.fromkeys(names, 0)
                closed = dict.fromkeys(names, 0)
                failed = dict.fromkeys(names, 0)
                wrong = dict.fromkeys(names, 0)
                pods.reset()
                for r in range(reps):
                    order = names[r % len(names) :] + names[: r % len(names)]
                    for v in order:
                        if len(walls[v]) >= caps[v] or raised[v] >= 3:
                            continue  # capped, or broken (raised 3 times: not run again)
                        keys, groups = batch()
                        a0, o0 = pods.connections()
                        c0 = time.process_time()
                        t0 = time.perf_counter()
                        values, bad = call(v, keys, groups)
                        if bad and v not in errors and v in _FIRST_ERROR:
                            errors[v] = _FIRST_ERROR[v]
                        t1 = time.perf_counter()
                        c1 = time.process_time()
                        a1, o1 = pods.connections()
                        conns[v] += a1 - a0
                        closed[v] += (a1 - a0) - (o1 - o0)
                        walls[v].append((t1 - t0) * 1e3)
                        cpu[v].append((c1 - c0) * 1e3)
                        failed[v] += bad
                        wrong[v] += sum(
                            1
                            for k, val in zip(keys, values, strict=True)
                            if val is not None
                            and (not isinstance(val, dict) or val.get("key") != k)
                        )
                log(f"  {n:,} IDs per fan-out")
                log(f"    {'client':30s} {'fan-outs':>8s} {'p50 ms':>8s} {'p90 ms':>8s} "
                    f"{'CPU ms':>8s} {'new conns':>9s} {'closed':>6s} {'failed':>6s}")  # fmt: skip
                for v in names:
                    k = len(walls[v])
                    if v in errors:
                        what = (f"raised {raised[v]} time(s) (its keys counted as failed)"
                                if raised[v] else "first failed key")  # fmt: skip
                        notes.append(f"{v}, {n:,} IDs: {what}: {errors[v]}")
                    row = {
                        "wire": True,
                        "variant": v,
                        "ids": n,
                        "fanouts": k,
                        "raised": raised[v],
                        "p50_ms": statistics.median(walls[v]) if k else math.nan,
                        "p90_ms": _pct(walls[v], 0.9),
                        "cpu_ms": statistics.median(cpu[v]) if k else math.nan,
                        "cpu_p90_ms": _pct(cpu[v], 0.9),
                        "new_conns_per_fanout": conns[v] / k if k else math.nan,
                        "closed_conns_per_fanout": closed[v] / k if k else math.nan,
                        "failed_keys": failed[v],
                        "wrong_values": wrong[v],
                    }
                    rows.append(row)
                    bad = failed[v] + wrong[v]
                    log(f"    {v:30s} {k:8d} {row['p50_ms']:8.2f} {row['p90_ms']:8.2f} "
                        f"{row['cpu_ms']:8.2f} {row['new_conns_per_fanout']:9.2f} "
                        f"{row['closed_conns_per_fanout']:6.2f} {bad:6d}")  # fmt: skip
            st = pods.stats()
            notes.append(
                f"Pods: the C server of perf/podserver.c ({WIRE_PODS} ports, one process"
                + (f", pinned to core {pod_cpu}; this process to the others" if pinned else "")
                + f"), answers {WIRE_SERVICE_MS:g} ms after parsing a request; most requests in "
                f"service at once during the 1,000-ID round: {st['max_concurrent']['total']}."
            )
    finally:
        if pinned:
            _unpin_threads(pinned)
        for c in closers:
            with contextlib.suppress(Exception):
                if hasattr(c, "aclose"):
                    loop.run_until_complete(c.aclose())
                elif hasattr(c, "close"):
                    c.close()
        loop.close()
        for r in (router, before):
            if r is not None:
                r.close()
        if writer is not None:
            writer.close()
        if store is not None:
            store.close()
        unlink_namespace(ns)
    rows += _wire_targets(rows, notes)
    notes += [
        f"Wire: one fan-out at a time, the variants interleaved round-robin in one run "
        f"(each round starts with the next one), fresh keys per fan-out; p50/p90 wall time "
        f"and the process CPU time (time.process_time: every thread) per fan-out; new TCP "
        f"connections per fan-out from the pods' accepted counter (and closed ones: accepted "
        f"less the growth of the open ones) after {WIRE_WARMUP} warm-up "
        f"fan-outs per variant (3 for the capped urllib3 and httpx rows). Floor: one "
        f"pycurl.CurlMulti reused, easy handles reused, the IDs spread evenly (ID i to pod "
        f"i mod 5: 20 calls per pod at 100 IDs), "
        f"{PER_HOST} connections per pod, every GET added at once; floor grouped: one POST "
        f"/batch per pod, the IDs grouped by router.route_table (outside the timed part). "
        f"CurlSender, urllib3 and httpx go through router.fanout / router.afanout (the "
        f"CurlSender rows on one Router, urllib3 and httpx on another of the same tables) with "
        f"FanoutSettings(timeout_s=5.0), the other settings at their defaults; asyncio "
        f"forms on {loop_name}.",
    ]
    return rows, notes


def _wire_targets(rows: list[dict], notes: list[str]) -> list[dict]:
    """Issue 17's bars as ratios to the floor of the same run, one row per check."""
    out = []
    pairs = [
        ("CurlSender sync", "floor"),
        ("CurlSender asyncio", "floor"),
        ("CurlSender grouped sync", "floor grouped"),
        ("CurlSender grouped asyncio", "floor grouped"),
    ]
    for n in WIRE_SIZES:
        for mine, base in pairs:
            a = next((r for r in rows if r.get("wire") and r["variant"] == mine
                      and r["ids"] == n), None)  # fmt: skip
            b = next((r for r in rows if r.get("wire") and r["variant"] == base
                      and r["ids"] == n), None)  # fmt: skip
            if a is None or b is None:
                continue
            wall, cpu = a["p50_ms"] / b["p50_ms"], a["cpu_ms"] / b["cpu_ms"]
            bad = a["failed_keys"] + a["wrong_values"]
            met = wall <= WIRE_BAR and cpu <= WIRE_BAR and bad == 0
            out.append({"wire_target": True, "variant": mine, "floor": base, "ids": n,
                        "wall_ratio": wall, "cpu_ratio": cpu, "failed_keys": bad,
                        "bar": WIRE_BAR, "met": met})  # fmt: skip
    for t in out:
        notes.append(
            f"Issue 17 target, {t['ids']:,} IDs: {t['variant']} / {t['floor']}: wall "
            f"{t['wall_ratio']:.2f}×, CPU {t['cpu_ratio']:.2f}× (bar {WIRE_BAR}×), failed keys "
            f"{t['failed_keys']}: {'met' if t['met'] else 'MISSED'}."
        )
    if not out:
        notes.append("Issue 17's targets: not measured (no CurlSender rows).")
    return out


def run(
    quick: bool = False, log: Callable[[str], None] = print, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    """The ``fanout`` part of ``python -m perf``: rows of figures and notes.

    ``parts``: ``"inprocess"`` (the helper's CPU next to hand-written loops, and the
    recording cost) and ``"wire"`` (real calls to C pods: the floor, CurlSender, urllib3
    and httpx, with issue 17's targets).
    """
    rows: list[dict] = []
    notes: list[str] = []
    if "inprocess" in parts:
        rows, notes = _inprocess(quick, log)
    if "wire" in parts:
        from perf.wirepods import CompilerMissingError

        try:
            wrows, wnotes = _bench_wire(quick, log)
        except (CompilerMissingError, ModuleNotFoundError) as exc:
            wrows, wnotes = [], [f"The wire part was not run: {exc}"]
            log(f"  wire: not run: {exc}")
        rows += wrows
        notes += wnotes
    return {"rows": rows, "notes": notes}


def _inprocess(quick: bool, log: Callable[[str], None]) -> tuple[list[dict], list[str]]:
    ns = f"perffo{uuid.uuid4().hex[:10]}"
    store = shm.CounterStore.create(ns, rows=8)
    writer = shm.TableWriter(ns, counters=store)
    router = None
    try:
        writer.publish(lbcore.RingSet(EPS), knobs=shm.Knobs())
        # Wide deadlines: a loaded machine must not turn the benchmark into timeouts.
        router = Router(
            ns,
            fanout_settings=FanoutSettings(threads=THREADS, timeout_s=5.0, endpoint_cap=THREADS),
        )
        log(f"fan-out of {KEYS_PER_FANOUT} keys over {len(EPS)} endpoints, {THREADS} threads")
        rows = _bench_fanout(router, quick, log)
        rows += _bench_recording(router, quick, log)
    finally:
        if router is not None:
            router.close()
        writer.close()
        store.close()
        for name in shm.list_segments(ns):
            shm.names.unlink_name(name)
    notes = [
        "Process CPU time (all threads) per key; each pair measured in the same run, the "
        "ratio is the helper's cost over the hand-written loop (which records with one "
        "track() per fan-out, from its entry: queue time counted as busy time).",
    ]
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures (``--json FILE`` writes them too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    ap.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default=os.environ.get("CSLB_PERF_LOOP", "uvloop"),
        help="event loop of the asyncio rows (default uvloop when it imports; the suite "
        "reads CSLB_PERF_LOOP)",
    )
    ap.add_argument(
        "--only",
        default=",".join(PARTS),
        help="comma-separated parts: inprocess (the helper's CPU in-process), wire (real "
        "calls to C pods; needs a C compiler and pycurl); default both",
    )
    args = ap.parse_args(argv)
    parts = tuple(p.strip() for p in args.only.split(",") if p.strip())
    if not parts or any(p not in PARTS for p in parts):
        ap.error(f"--only: expected a comma-separated list of {', '.join(PARTS)}")
    os.environ["CSLB_PERF_LOOP"] = args.loop
    got = run(quick=args.quick, parts=parts)
    write_json(args.json, got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
