"""The callers' cost of reading the pods' load reports (``python -m perf --only reports``).

Two measurements, each next to its baseline in the same run:

1. In-process, per answer: what :class:`workers.fanout.reports.BlockReader` costs on a
   raw libcurl header block without the two headers, with them (the report's parse
   memoized: the steady state, a pod's report changing every 100 ms or so), and
   :func:`lbwire.orca.parse_header_block` on the same block unmemoized; and
   :meth:`workers.fanout.reports.ReportBook.take` (the per-pod bookkeeping).
2. On the wire: ``router.fanout`` of 100 keys with :class:`CurlSender` to five C pods
   (``perf/podserver.c``), process CPU per call, three ways: pods without report headers
   and ``CSLB_LOAD_REPORTS=off`` (today), pods sending both headers with reports off (the
   headers arrive, nothing reads them), and with reports on (libcurl collects the header
   lines, each block is read once, reports go to shared memory, ``Server-Timing`` is the
   recorded busy time). Configurations interleaved, best of several medians.
"""

from __future__ import annotations

import os
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import lbcore
import shm
from lbcore.report_settings import ReportSettings
from lbwire.orca import parse_header_block
from perf.bench_serving import BLOCK_PLAIN, BLOCK_REPORT
from workers.fanout import curl_transport
from workers.fanout.reports import BlockReader, ReportBook
from workers.fanout.senders import CurlSender
from workers.fanout.settings import FanoutSettings
from workers.routing import reported
from workers.routing.router import Router

__all__ = ["run"]

KEYS = 100
PODS = 5
SERVICE_MS = 0.2


def _per_call_us(fn: Callable[[], Any], number: int, repeat: int = 7) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeat)
    return min(statistics.median(times[i : i + 3]) for i in range(repeat - 2)) / number * 1e6


def _inprocess(quick: bool) -> list[dict[str, Any]]:
    n = 5_000 if quick else 50_000
    reader = BlockReader()
    book = ReportBook(ReportSettings(enabled=True))
    load = reader(BLOCK_REPORT)
    now = [0]

    def take() -> None:
        now[0] += 1000  # (1 µs apart: the report is stored again every RESTAMP_NS only)
        book.take(3, "http://10.0.0.3:8080", load, 1000, now[0])

    rows = [
        ("BlockReader, no report headers", lambda: reader(BLOCK_PLAIN)),
        ("BlockReader, report + Server-Timing (memoized)", lambda: reader(BLOCK_REPORT)),
        ("parse_header_block, report + Server-Timing", lambda: parse_header_block(BLOCK_REPORT)),
        ("ReportBook.take (per answer)", take),
    ]
    return [
        {"reports": "inprocess", "what": name, "us": _per_call_us(fn, n)} for name, fn in rows
    ]


def _configure(reports: bool) -> None:
    """Set the process's report setting from now on (new transports, new routers)."""
    os.environ["CSLB_LOAD_REPORTS"] = "on" if reports else "off"
    reported.report_settings.cache_clear()
    curl_transport.forget_reactors()  # (the thread's transport is made anew)


def _wire(quick: bool, log: Callable[[str], None]) -> list[dict[str, Any]]:
    from perf.common import unique_namespace, unlink_namespace
    from perf.wirepods import WirePods

    fanouts = 30 if quick else 200
    rounds = 3 if quick else 7
    saved = os.environ.get("CSLB_LOAD_REPORTS")
    configs = [("plain pods, reports off", False, False),
               ("pods with reports, reports off", True, False),
               ("pods with reports, reports on", True, True)]  # fmt: skip
    cpu: dict[str, list[float]] = {c[0]: [] for c in configs}
    wall: dict[str, list[float]] = {c[0]: [] for c in configs}
    try:
        with WirePods(PODS, SERVICE_MS) as plain, WirePods(PODS, SERVICE_MS, reports=True) as rep:
            serial = iter(range(10**9))
            for _ in range(rounds):
                for name, headers, on in configs:
                    pods = rep if headers else plain
                    _configure(on)
                    ns = unique_namespace("rp")
                    store = shm.CounterStore.create(ns, rows=8)
                    writer = shm.TableWriter(ns, counters=store)
                    router = None
                    try:
                        writer.publish(lbcore.RingSet(pods.urls), knobs=shm.Knobs())
                        router = Router(ns, fanout_settings=FanoutSettings(timeout_s=5.0))
                        sender = CurlSender()
                        failed = 0

                        def batch() -> list[str]:
                            base = next(serial) * KEYS
                            return [f"AD{base + i:010d}-K11" for i in range(KEYS)]

                        for _ in range(10):  # warm: connections, plans
                            router.fanout(batch(), sender)
                        c0, w0 = time.process_time(), time.perf_counter()
                        for _ in range(fanouts):
                            failed += sum(not r.ok for r in router.fanout(batch(), sender))
                        c1, w1 = time.process_time(), time.perf_counter()
                        cpu[name].append((c1 - c0) / (fanouts * KEYS) * 1e6)
                        wall[name].append((w1 - w0) / fanouts * 1e3)
                        if failed:
                            log(f"  {name}: {failed} failed keys")
                    finally:
                        if router is not None:
                            router.close()
                        writer.close()
                        store.close()
                        unlink_namespace(ns)
    finally:
        if saved is None:
            os.environ.pop("CSLB_LOAD_REPORTS", None)
        else:
            os.environ["CSLB_LOAD_REPORTS"] = saved
        reported.report_settings.cache_clear()
        curl_transport.forget_reactors()
    base = statistics.median(cpu[configs[0][0]])
    rows = []
    for name, _, _ in configs:
        c = statistics.median(cpu[name])
        rows.append(
            {
                "reports": "wire",
                "what": name,
                "cpu_us_per_call": c,
                "extra_us_per_call": c - base,
                "wall_ms_per_fanout": statistics.median(wall[name]),
            }
        )
    return rows


def run(quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The ``reports`` part of ``python -m perf``: rows of figures and notes."""
    rows = _inprocess(quick)
    for r in rows:
        log(f"  {r['what']:50s} {r['us']:7.2f} us")
    try:
        wrows = _wire(quick, log)
    except Exception as exc:  # no C compiler, no pycurl: the in-process figures still stand
        log(f"  wire: not run: {exc}")
        return {"rows": rows, "notes": [f"The wire part was not run: {exc}"]}
    for r in wrows:
        log(
            f"  {r['what']:50s} {r['cpu_us_per_call']:7.2f} us CPU per call "
            f"(+{r['extra_us_per_call']:.2f}), {r['wall_ms_per_fanout']:.2f} ms per fan-out"
        )
    notes = [
        f"On the wire: router.fanout of {KEYS} keys with CurlSender to {PODS} C pods "
        f"answering in {SERVICE_MS:g} ms, one fan-out at a time; process CPU per call "
        "(median of rounds, configurations interleaved), the extra over plain pods with "
        "reports off.",
    ]
    return {"rows": rows + wrows, "notes": notes}


if __name__ == "__main__":
    run()
