"""The no-op baseline of the HTTP benchmark: a WSGI app that only parses a ``/route`` body.

It reads and parses a ``POST /route`` body exactly as the bundled app does (the same
:func:`workers.app.read_body` and :func:`workers.app.parse_route_request`, so JSON, text
and any body type the app accepts) and answers ``{"keys": N}``, without routing,
recording or naming endpoints. ``GET /healthz`` answers 200. Served by the same
``cslb serve`` command (``--app perf.noop_app:app``), its CPU per request is what gunicorn
and parsing cost; what the bundled app adds on top is routing and its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from workers.app import HTTPError, parse_route_request, read_body

MAX_BODY_BYTES = 16 << 20  # bytes; larger than any benchmark body
MAX_BATCH = 100_000


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Serve one request: parse ``POST /route``, answer the number of keys."""
    path = environ.get("PATH_INFO", "")
    try:
        if path == "/route" and environ.get("REQUEST_METHOD") == "POST":
            body = read_body(environ, MAX_BODY_BYTES)
            keys, _, _ = parse_route_request(
                body,
                environ.get("CONTENT_TYPE", ""),
                environ.get("QUERY_STRING", ""),
                max_batch=MAX_BATCH,
                check=False,
            )
            status, out = "200 OK", b'{"keys": %d}' % len(keys)
        elif path == "/healthz":
            status, out = "200 OK", b'{"ok": true}'
        else:
            status, out = "404 Not Found", b'{"error": "no such path"}'
    except HTTPError as exc:
        status, out = f"{exc.status} Error", str(exc.message).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
    )
    return [out]
