"""A product pod under the serving middleware, for tests: WSGI ``app`` and ASGI ``asgi``.

``/sleep?s=<seconds>`` sleeps, ``/fail`` answers 500, anything else answers at once; every
answer's body is the worker's PID. Each call into the app appends ``<path> <pid>`` to the
file named by ``SERVINGPOD_LOG`` (when set), so tests can tell the app was (not) called.
"""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import parse_qs

from workers.serving import ASGILoadReportMiddleware, LoadReportMiddleware


def _log(path: str) -> None:
    name = os.environ.get("SERVINGPOD_LOG")
    if name:
        with open(name, "a") as f:
            f.write(f"{path} {os.getpid()}\n")


def _seconds(query: str) -> float:
    return float(parse_qs(query).get("s", ["0"])[0])


def wsgi(environ, start_response):
    path = environ["PATH_INFO"]
    _log(path)
    if path == "/sleep":
        time.sleep(_seconds(environ.get("QUERY_STRING", "")))
    status = "500 Internal Server Error" if path == "/fail" else "200 OK"
    start_response(status, [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]


async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rsplit(".", 1)[-1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    _log(path)
    if path == "/sleep":
        await asyncio.sleep(_seconds(scope.get("query_string", b"").decode()))
    status = 500 if path == "/fail" else 200
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": str(os.getpid()).encode()})


app = LoadReportMiddleware(wsgi)
asgi = ASGILoadReportMiddleware(asgi_app)
