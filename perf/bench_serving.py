"""Benchmark of the serving middleware and of reading reports (``python perf/bench_serving.py``).

Prints, each next to its baseline measured in the same run:

1. per-request cost of :class:`workers.serving.LoadReportMiddleware` around a trivial WSGI
   app, against the bare app: with the report cached (the default refresh) and recomputed
   for every response (``refresh_s=0``); and :meth:`PodLoad.begin` + :meth:`PodLoad.end`
   alone (the shared-memory row writes);
2. the same for :class:`workers.serving.ASGILoadReportMiddleware` (one event loop turn per
   request in both columns);
3. the caller's cost of reading a response's headers from a raw header block
   (:func:`lbwire.orca.parse_header_block`) without and with the two headers.

``python -m perf --only serving`` writes them to ``perf/RESULTS.md``.

Times are the best of several medians of repeated loops; absolute numbers drift on
shared machines, ratios less. Runs in well under a minute.
"""

from __future__ import annotations

import asyncio
import statistics
import timeit

from workers.serving import ASGILoadReportMiddleware, LoadReportMiddleware
from workers.serving.orca import parse_header_block
from workers.serving.podload import PodLoad
from workers.serving.settings import PodSettings

ENVIRON = {"PATH_INFO": "/x", "REQUEST_METHOD": "GET"}


def wsgi_app(environ: dict, start_response) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def _start_response(status: str, headers: list, exc_info: object = None) -> None:
    return None


def serve_wsgi(app) -> None:
    body = app(ENVIRON, _start_response)
    for _ in body:
        pass
    close = getattr(body, "close", None)
    if close is not None:
        close()


async def asgi_app(scope: dict, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
    await send({"type": "http.response.body", "body": b"ok"})


def per_call_us(fn, number: int = 20_000, repeat: int = 7) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeat)
    return min(statistics.median(times[i : i + 3]) for i in range(repeat - 2)) / number * 1e6


def asgi_per_call_us(app, number: int = 20_000, repeat: int = 5) -> float:
    scope = {"type": "http", "path": "/x", "method": "GET"}

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message: dict) -> None:
        return None

    async def loop() -> None:
        for _ in range(number):
            await app(scope, receive, send)

    best = float("inf")
    for _ in range(repeat):
        t = timeit.timeit(lambda: asyncio.run(loop()), number=1)
        best = min(best, t)
    return best / number * 1e6


BLOCK_PLAIN = (
    b"HTTP/1.1 200 OK\r\nServer: gunicorn\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
    b"Connection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: 120\r\n\r\n"
)
BLOCK_REPORT = BLOCK_PLAIN[:-2] + (
    b"endpoint-load-metrics: TEXT application_utilization=0.41, rps_fractional=120, eps=0, "
    b"named_metrics.occupancy=0.82\r\nServer-Timing: app;dur=1.930\r\n\r\n"
)


def measure(quick: bool = False) -> list[dict]:
    """The figures: ``{"what", "us", "baseline_us"}`` per row (µs per request or response)."""
    n = 2_000 if quick else 20_000
    cached = LoadReportMiddleware(wsgi_app, settings=PodSettings(pool="process"))
    fresh = LoadReportMiddleware(wsgi_app, settings=PodSettings(pool="process", refresh_s=0.0))
    load = PodLoad(PodSettings(pool="process"))

    def begin_end() -> None:
        load.end(load.begin())

    try:
        bare_us = per_call_us(lambda: serve_wsgi(wsgi_app), n)
        rows = [
            ("WSGI bare app", bare_us, bare_us),
            (
                "WSGI middleware (report cached)",
                per_call_us(lambda: serve_wsgi(cached), n),
                bare_us,
            ),
            (
                "WSGI middleware (report every response)",
                per_call_us(lambda: serve_wsgi(fresh), max(n // 10, 200)),
                bare_us,
            ),
            ("PodLoad.begin + end alone", per_call_us(begin_end, n), 0.0),
        ]
        a_bare = asgi_per_call_us(asgi_app, n)
        a_mw = asgi_per_call_us(
            ASGILoadReportMiddleware(asgi_app, settings=PodSettings(pool="process")), n
        )
        rows += [
            ("ASGI bare app", a_bare, a_bare),
            ("ASGI middleware (report cached)", a_mw, a_bare),
        ]
        for name, block in (
            ("caller: parse_header_block, no report headers", BLOCK_PLAIN),
            ("caller: parse_header_block, TEXT report + Server-Timing", BLOCK_REPORT),
        ):
            rows.append((name, per_call_us(lambda b=block: parse_header_block(b), n * 2), 0.0))
    finally:
        for m in (cached, fresh):
            m.load.close()
        load.close()
    return [{"serving": True, "what": w, "us": us, "baseline_us": b} for w, us, b in rows]


def run(quick: bool = False, log=print) -> dict:
    """The ``serving`` part of ``python -m perf``: the middleware's cost per request."""
    rows = measure(quick)
    for r in rows:
        extra = f"  (+{r['us'] - r['baseline_us']:.2f} us)" if r["baseline_us"] else ""
        log(f"  {r['what']:55s} {r['us']:8.2f} us{extra}")
    return {
        "rows": rows,
        "notes": [
            "In-process, per request: the middleware around a trivial app against the bare "
            "app (the same loop, the same run); the pool is the process's own "
            "(pool=process).",
        ],
    }


def main() -> None:
    """Print the figures."""
    run()


if __name__ == "__main__":
    main()
