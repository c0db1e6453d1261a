"""Benchmark of the bundled WSGI app (``python perf/bench_app.py``), in process.

What ``POST /route`` adds on top of routing: each figure is the median cost of one
request made by calling ``workers.app.CslbApp`` with a WSGI environ (no server, no
socket), next to its baselines measured in the same run: ``Router.route_table`` on the
same, already decoded keys, and ``json.loads`` of the same body. Every request carries a
fresh batch of 100 13-character SKUs (a CPU that sees the same batch again learns it),
on a 100-endpoint table with loads recorded. Also the cost of a ``/metrics`` scrape and
a ``/status`` page (summing the counter rows of 8 workers), and of ``/healthz``; the
``/metrics`` figure next to prometheus_client's own ``generate_latest`` of the same registry.

gunicorn itself costs ~280 µs of CPU per request on this machine kind (PERF-NOTES), so
the app's share is what these figures add to that. Runs in about 15 s.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client import generate_latest

import lbcore
import shm
from shm.names import list_segments, unlink_name
from workers.app import CslbApp, pack_keys
from workers.surfaces.body import parse_binary, parse_json, parse_text


def _eps(n: int) -> list[str]:
    return [f"http://10.1.{i // 250}.{i % 250 + 1}:8080" for i in range(n)]


def _batches(count: int, size: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[f"AD{x:09d}-K11" for x in rng.integers(0, 10**9, size)] for _ in range(count)]


def _environ(method: str, path: str, body: bytes, ctype: str, query: str = "") -> dict[str, Any]:
    return {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "CONTENT_TYPE": ctype,
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }


def _start_response(status: str, headers: list[tuple[str, str]]) -> None:
    if not status.startswith("200"):
        raise RuntimeError(f"benchmark request failed: {status}")


def _per_call_us(fn: Callable[[Any], Any], inputs: list[Any], repeat: int = 5) -> float:
    """Median over ``repeat`` passes of the mean µs per call over ``inputs``."""
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for x in inputs:
            fn(x)
        runs.append((time.perf_counter() - t) / len(inputs) * 1e6)
    return statistics.median(runs)


def _interleaved(
    cases: dict[str, tuple[Callable[[Any], Any], list[Any]]], repeat: int = 5, piece: int = 100
) -> dict[str, float]:
    """:func:`_per_call_us` of several cases, passes cut in pieces taken in turns.

    Pieces of ``piece`` calls of each case alternate, so a neighbour's load on this
    shared machine hits every case alike and the ratios between them hold (whole passes
    one after the other drifted by up to 2x between cases).
    """
    runs: dict[str, list[float]] = {name: [] for name in cases}
    longest = max(len(inputs) for _, inputs in cases.values())
    for _ in range(repeat):
        spent = dict.fromkeys(cases, 0.0)
        for lo in range(0, longest, piece):
            for name, (fn, inputs) in cases.items():
                part = inputs[lo : lo + piece]
                t = time.perf_counter()
                for x in part:
                    fn(x)
                spent[name] += time.perf_counter() - t
        for name, (_, inputs) in cases.items():
            runs[name].append(spent[name] / len(inputs) * 1e6)
    return {name: statistics.median(r) for name, r in runs.items()}


def _length_before_each_key(body: bytes) -> list[bytes]:
    """Baseline: the other binary layout, a uint16 length before each key.

    It needs a Python step per key to parse.
    """
    out = []
    i, n = 0, len(body)
    while i < n:
        j = i + 2 + (body[i] | body[i + 1] << 8)
        if j > n:
            raise ValueError("truncated")
        out.append(body[i + 2 : j])
        i = j
    return out


def _parsers(seed: int) -> None:
    """Body parsers alone, 100 and 1,000 keys, against json.loads and the other layout."""
    rng = np.random.default_rng(seed)
    for size, count in ((100, 2000), (1000, 300)):
        batches = [
            [f"AD{x:09d}-K11".encode() for x in rng.integers(0, 10**9, size)] for _ in range(count)
        ]
        mixed = [[k[: 5 + i % 11] for i, k in enumerate(b)] for b in batches]
        as_json = [json.dumps([k.decode() for k in b]).encode() for b in batches]
        fig = _interleaved(
            {
                "json.loads (baseline)": (json.loads, as_json),
                "JSON (app)": (lambda b: parse_json(b, 10**7), as_json),
                "text/plain (app)": (
                    lambda b: parse_text(b, None, 10**7),
                    [b"\n".join(b) for b in batches],
                ),
                "octet-stream (app)": (
                    lambda b: parse_binary(b, 10**7),
                    [pack_keys(b) for b in batches],
                ),
                "octet-stream, mixed lengths (app)": (
                    lambda b: parse_binary(b, 10**7),
                    [pack_keys(b) for b in mixed],
                ),
                "length before each key (baseline)": (
                    _length_before_each_key,
                    [b"".join(len(k).to_bytes(2, "little") + k for k in b) for b in batches],
                ),
            },
            piece=50,
        )
        print(f"parsing a body of {size} keys (13-15 bytes; mixed: 5-15)")
        for name, us in fig.items():
            ratio = us / fig["json.loads (baseline)"]
            print(f"  {name:<36} {us:8.1f} µs   {ratio:4.2f}x json.loads")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000, help="requests per pass")
    args = p.parse_args(argv)
    n = args.requests
    ns = f"benchapp{uuid.uuid4().hex[:8]}"
    store = shm.CounterStore.create(ns, rows=8, columns=128)
    writer = shm.TableWriter(ns, counters=store)
    app = CslbApp(ns)
    try:
        writer.publish(lbcore.RingSet(_eps(100)))
        now = time.monotonic_ns()
        recs = [store.claim() for _ in range(7)]  # 7 other workers with recorded load
        rng = np.random.default_rng(0)
        for rec in recs:
            slots = rng.integers(0, 100, 400)
            rec.record_start(slots, now - 3_000_000_000)
            rec.record_end(slots, now - 3_000_000_000, rng.integers(1e6, 5e7, 400), now)
            rec.count(400, 4, 10)
        batches = _batches(5 * n, 100, 1)
        bodies = [json.dumps(b).encode() for b in batches]
        texts = ["\n".join(b).encode() for b in batches]
        binaries = [pack_keys(b) for b in batches]
        groups = [json.dumps({"keys": b, "group": True}).encode() for b in batches]
        router = app.router()
        for b in batches[:200]:  # warm up: map the table, first load snapshot
            router.route_table(b)

        def chunks(items: list[Any], k: int) -> list[Any]:
            return items[k * n : (k + 1) * n]

        def post(ctype: str) -> Callable[[bytes], Any]:
            return lambda b: app(_environ("POST", "/route", b, ctype), _start_response)

        fig = _interleaved(
            {
                "loads": (json.loads, chunks(bodies, 0)),
                "route": (router.route_table, chunks(batches, 1)),
                "JSON array": (post("application/json"), chunks(bodies, 2)),
                "text/plain": (post("text/plain"), chunks(texts, 3)),
                "octet-stream": (post("application/octet-stream"), chunks(binaries, 0)),
                "group (JSON)": (post("application/json"), chunks(groups, 4)),
            }
        )
        loads, route = fig["loads"], fig["route"]
        get = [_environ("GET", "/", b"", "")] * 50
        other = _interleaved(
            {
                "metrics": (lambda e: app({**e, "PATH_INFO": "/metrics"}, _start_response), get),
                "library": (lambda e: generate_latest(app.registry), get),
                "status": (lambda e: app({**e, "PATH_INFO": "/status"}, _start_response), get),
            },
            repeat=3,
            piece=10,
        )
        metrics, library, status = other["metrics"], other["library"], other["status"]
        writer.heartbeat()  # a slow run must not outlive CSLB_STALE_AFTER (5 s)
        health = _per_call_us(
            lambda e: app({**e, "PATH_INFO": "/healthz"}, _start_response), get * 20, repeat=3
        )
        print(f"POST /route, 100 keys per request, 100 endpoints ({n} requests per pass)")
        print(f"  baseline json.loads(body)           {loads:8.1f} µs")
        print(f"  baseline Router.route_table(keys)   {route:8.1f} µs")
        for name in ("JSON array", "text/plain", "octet-stream", "group (JSON)"):
            us = fig[name]
            print(
                f"  app, {name:<12}                  {us:8.1f} µs   "
                f"{us / route:4.2f}x routing, app's own share {us - route:5.1f} µs"
            )
        print("other paths (8 counter rows, 100 endpoints)")
        print(f"  GET /metrics                         {metrics:8.1f} µs")
        print(
            f"  baseline generate_latest(registry)   {library:8.1f} µs   "
            f"(the writer's share of /metrics: {library / metrics:4.2f})"
        )
        print(f"  GET /status                          {status:8.1f} µs")
        print(f"  GET /healthz                         {health:8.1f} µs")
        _parsers(2)
    finally:
        app.close()
        writer.close()
        store.close(unlink=True)
        for name in list_segments(ns):
            unlink_name(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
