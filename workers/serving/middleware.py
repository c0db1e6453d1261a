"""WSGI and ASGI middleware that report the pod's load on every response (twins, one file).

Wrap the app: ``app = LoadReportMiddleware(app)`` (WSGI: Flask, Django, plain WSGI under
gunicorn) or ``app = ASGILoadReportMiddleware(app)`` (ASGI: Starlette, FastAPI under
uvicorn or gunicorn's uvicorn worker). Every response then carries

* ``endpoint-load-metrics: TEXT application_utilization=…, rps_fractional=…, eps=…,
  named_metrics.occupancy=…`` (:func:`workers.serving.orca.format_report`): the pod's
  occupancy across all its worker processes, over capacity, and its rates;
* ``Server-Timing: app;dur=<ms>``: this request's service time, from the call into the
  middleware until the app started its response (WSGI: ``start_response``; ASGI: the
  ``http.response.start`` message). Headers leave before the body, so a streamed body's
  time is in the occupancy (the request stays busy until its body is closed) but not in
  its own ``dur``.

Errors are 5xx responses and exceptions out of the app or its body. A ``GET`` or ``HEAD``
on :data:`LOAD_PATH` (``CSLB_POD_LOAD_PATH``) is answered here with the load header and
the same values as a small JSON body, without calling the app and without counting as a
request, so a caller can refresh the report of a pod it no longer calls. The app must not
set ``endpoint-load-metrics`` itself (two reports make the response's report malformed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from lbwire.orca import LOAD_HEADER, LOAD_PATH
from workers.serving.podload import PodLoad
from workers.serving.settings import PodSettings

__all__ = ["LOAD_PATH", "ASGILoadReportMiddleware", "LoadReportMiddleware"]

#: Default path of the load-only request.

_monotonic_ns = time.monotonic_ns
_LOAD_HEADER_B = LOAD_HEADER.encode()


def _load_body(load: PodLoad) -> tuple[str, bytes]:
    s = load.snapshot()
    header = load.header()
    body = {
        "application_utilization": round(s.utilization, 6),
        "rps_fractional": round(s.rps, 6),
        "eps": round(s.eps, 6),
        "occupancy": round(s.occupancy, 6),
        "capacity": s.capacity,
        "capacity_source": s.capacity_source,
        "open_requests": s.open_requests,
        "processes": s.processes,
    }
    return header, json.dumps(body, separators=(",", ":")).encode() + b"\n"


class _Body:
    """The app's response body, ending the request when the server closes it."""

    __slots__ = ("_body", "_error", "_load", "_start")

    def __init__(self, body: Iterable[bytes], load: PodLoad, start: int, error: bool) -> None:
        self._body, self._load, self._start, self._error = body, load, start, error

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._body
        except BaseException:
            self._error = True
            raise

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            if self._start:
                start, self._start = self._start, 0
                self._load.end(start, self._error)


class _Reporting:
    """What both middlewares hold: the app, the settings and the pod's recorder."""

    def __init__(
        self,
        app: Any,
        *,
        settings: PodSettings | None = None,
        load: PodLoad | None = None,
        **overrides: Any,
    ) -> None:
        self.app = app
        self.settings = settings if settings is not None else PodSettings.from_env(**overrides)
        self.load = load if load is not None else PodLoad(self.settings)
        self.load_path = self.settings.load_path


class LoadReportMiddleware(_Reporting):
    """WSGI middleware: report the pod's load on every response.

    Parameters
    ----------
    app
        The WSGI application.
    settings
        :class:`~workers.serving.settings.PodSettings` (default: from the environment,
        then ``overrides`` by name: ``capacity``, ``window_s``, ``refresh_s``, ``pool``,
        ``load_path``).
    load
        The recorder to use (default: a new :class:`~workers.serving.podload.PodLoad`).
    """

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one request."""
        if environ.get("PATH_INFO") == self.load_path:
            return self._load_only(environ, start_response)
        load = self.load
        start = load.begin()
        state = [False]

        def reporting_start_response(status: str, headers: list, exc_info: Any = None) -> Any:
            dur_ms = (_monotonic_ns() - start) / 1e6
            if status[:1] == "5":
                state[0] = True
            headers.append((LOAD_HEADER, load.header()))
            headers.insert(0, ("Server-Timing", f"app;dur={dur_ms:.3f}"))
            return start_response(status, headers, exc_info)

        try:
            body = self.app(environ, reporting_start_response)
        except BaseException:
            load.end(start, True)
            raise
        return _Body(body, load, start, state[0])

    def _load_only(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response(
                "405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Length", "0")]
            )
            return []
        header, body = _load_body(self.load)
        start_response(
            "200 OK",
            [
                (LOAD_HEADER, header),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [] if method == "HEAD" else [body]


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class ASGILoadReportMiddleware(_Reporting):
    """ASGI middleware: report the pod's load on every HTTP response.

    Parameters as :class:`LoadReportMiddleware`; ``app`` is an ASGI 3 application.
    Non-HTTP scopes pass through; on ``lifespan.shutdown`` this process's row is released
    (a server that skips lifespan leaves the pool to the next pool's sweep).
    """

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """Serve one connection scope."""
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == self.load_path:
            await self._load_only(scope, send)
            return
        load = self.load
        start = load.begin()
        error = False

        async def reporting_send(message: dict[str, Any]) -> None:
            nonlocal error
            if message["type"] == "http.response.start":
                dur_ms = (_monotonic_ns() - start) / 1e6
                error = message.get("status", 200) >= 500
                headers = [
                    (b"server-timing", b"app;dur=%.3f" % dur_ms),
                    *message.get("headers", ()),
                    (_LOAD_HEADER_B, load.header().encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, reporting_send)
        except BaseException:
            error = True
            raise
        finally:
            load.end(start, error)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        # uvicorn re-raises SIGTERM after its shutdown, so atexit never runs there: the
        # row is released (and the pool removed if last) when the server says it stops.
        async def lifespan_receive() -> dict[str, Any]:
            message = await receive()
            if message.get("type") == "lifespan.shutdown":
                self.load.close()
            return message

        return lifespan_receive

    async def _load_only(self, scope: dict[str, Any], send: Send) -> None:
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 405,
                    "headers": [(b"allow", b"GET, HEAD"), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        header, body = _load_body(self.load)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (_LOAD_HEADER_B, header.encode()),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
