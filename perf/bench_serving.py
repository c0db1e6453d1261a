"""Benchmark of the serving middleware and of reading reports (``python perf/bench_serving.py``).

Prints, each next to its baseline measured in the same run:

1. per-request cost of :class:`workers.serving.LoadReportMiddleware` around a trivial WSGI
   app, against the bare app: with the report cached (the default refresh) and recomputed
   for every response (``refresh_s=0``); and :meth:`PodLoad.begin` + :meth:`PodLoad.end`
   alone (the shared-memory row writes);
2. the same for :class:`workers.serving.ASGILoadReportMiddleware` (one event loop turn per
   request in both columns);
3. the caller's cost of reading a response's headers from a raw header block
   (:func:`workers.serving.orca.parse_header_block`) without and with the two headers.

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


def main() -> None:
    cached = LoadReportMiddleware(wsgi_app, settings=PodSettings(pool="process"))
    fresh = LoadReportMiddleware(wsgi_app, settings=PodSettings(pool="process", refresh_s=0.0))
    load = PodLoad(PodSettings(pool="process"))

    def begin_end() -> None:
        load.end(load.begin())

    bare_us = per_call_us(lambda: serve_wsgi(wsgi_app))
    rows = [
        ("WSGI bare app", bare_us),
        ("WSGI middleware (report cached)", per_call_us(lambda: serve_wsgi(cached))),
        ("WSGI middleware (report every response)", per_call_us(lambda: serve_wsgi(fresh), 2000)),
        ("PodLoad.begin + end alone", per_call_us(begin_end)),
    ]
    print("1. WSGI, per request (us; ratio to the bare app)")
    for name, us in rows:
        print(f"   {name:42s} {us:8.2f} us  x{us / bare_us:6.2f}  (+{us - bare_us:.2f} us)")

    a_bare = asgi_per_call_us(asgi_app)
    a_mw = asgi_per_call_us(
        ASGILoadReportMiddleware(asgi_app, settings=PodSettings(pool="process"))
    )
    print("2. ASGI, per request (us)")
    print(f"   {'ASGI bare app':42s} {a_bare:8.2f} us")
    print(
        f"   {'ASGI middleware (report cached)':42s} {a_mw:8.2f} us  x{a_mw / a_bare:6.2f}  "
        f"(+{a_mw - a_bare:.2f} us)"
    )

    print("3. Caller: parse_header_block per response (us)")
    for name, block in (
        ("no report headers", BLOCK_PLAIN),
        ("TEXT report + Server-Timing", BLOCK_REPORT),
    ):
        us = per_call_us(lambda b=block: parse_header_block(b), 50_000)
        print(f"   {name:42s} {us:8.2f} us")
    for m in (cached, fresh):
        m.load.close()
    load.close()


if __name__ == "__main__":
    main()
