"""A user service for the fan-out tests: ``POST /fanout`` with a JSON array of product IDs.

Fans them out with ``router.fanout`` (WSGI ``app``: sync and gthread workers) or
``await router.afanout`` (ASGI ``asgi_app``: uvicorn's gunicorn worker) to the pods on
``GET <pod>/<id>``, with CurlSender (or, ``FANOUT_SENDER=pool``, urllib3 / httpx),
and answers, per key, what came back and from where, so the tests
can see retries, endpoints and errors. ``GET /metrics``: cslb's host-wide metrics.
``POST /fanout?block=S`` (ASGI): the worker's event loop stalls for ``S`` seconds (at
most 2) just after the fan-out starts, as CPU-bound code in the caller would.
"""

import asyncio
import json
import os
import time

from prometheus_client import CollectorRegistry, generate_latest

from workers import Router
from workers.fanout.senders import CurlSender, HttpxSender, Urllib3Sender
from workers.surfaces.collector import CslbCollector

# FANOUT_SENDER: curl (default: CurlSender for both forms) or pool (urllib3 on the
# thread pool, httpx on the loop: the senders of a user's own client).
if os.environ.get("FANOUT_SENDER", "curl") == "pool":
    SEND = Urllib3Sender(maxsize=int(os.environ.get("CSLB_FANOUT_THREADS", "8")))
    ASEND = HttpxSender()
else:
    SEND = ASEND = CurlSender()
REGISTRY = CollectorRegistry()
REGISTRY.register(CslbCollector(os.environ.get("CSLB_SHM_NAMESPACE", "default")))


def _block_s(scope):
    """``?block=S``: seconds to stall the event loop for, once the fan-out started."""
    for part in scope.get("query_string", b"").decode().split("&"):
        name, _, value = part.partition("=")
        if name == "block":
            return min(float(value), 2.0)
    return 0.0


def _answer(ids, results, took):
    return json.dumps(
        {
            "pid": os.getpid(),
            "took_s": took,
            "results": [
                {
                    "ok": r.ok,
                    "value": r.value,
                    "endpoint": r.endpoint,
                    "attempts": r.attempts,
                    "kind": r.kind,
                    "error": None if r.error is None else type(r.error).__name__,
                }
                for r in results
            ],
        }
    ).encode()


def app(environ, start_response):
    if environ["PATH_INFO"] == "/metrics":
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
        return [generate_latest(REGISTRY)]
    n = int(environ.get("CONTENT_LENGTH") or 0)
    ids = json.loads(environ["wsgi.input"].read(n) or b"[]")
    t0 = time.monotonic()
    results = Router.attach().fanout(ids, SEND)
    body = _answer(ids, results, time.monotonic() - t0)
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


async def asgi_app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/metrics":
        body, ctype = generate_latest(REGISTRY), b"text/plain; version=0.0.4"
    else:
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        ids = json.loads(b"".join(chunks) or b"[]")
        t0 = time.monotonic()
        block = _block_s(scope)
        if block:  # a caller whose loop stalls (CPU-bound code) while its calls are out
            asyncio.get_running_loop().call_later(0.01, time.sleep, block)
        results = await Router.attach().afanout(ids, ASEND)
        body, ctype = _answer(ids, results, time.monotonic() - t0), b"application/json"
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]}
    )
    await send({"type": "http.response.body", "body": body})
