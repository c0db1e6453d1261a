r"""A product-sets service that fans out with cslb: ``POST /sets`` with a JSON array of IDs.

Run three pods and the service (from the repository root)::

    for p in 8081 8082 8083; do python examples/product_pod.py --port $p & done
    CSLB_ENDPOINTS_FILE=examples/pods.json PYTHONPATH=examples \
        gunicorn -c python:workers.gunicorn_conf --threads 4 product_sets:app
    curl -s --json '["AD112G0AB-K11", 12345, "SKU-3"]' localhost:8000/sets

The same service for an asyncio worker (uvicorn's, under the same config module)::

    CSLB_ENDPOINTS_FILE=examples/pods.json PYTHONPATH=examples gunicorn \
        -c python:workers.gunicorn_conf -k uvicorn_worker.UvicornWorker product_sets:asgi_app

Each product comes from the pod Skipper would pick (one call per ID on the worker's
pool, one fast retry on the next pod if a call fails); IDs that could not be fetched
are listed under ``missing`` with the reason. ``GET /metrics`` serves cslb's host-wide
metrics next to the service's own.
"""

from __future__ import annotations

import json
import os

from prometheus_client import CollectorRegistry, generate_latest

from workers import Router
from workers.metrics import CslbCollector
from workers.senders import HttpxSender, Urllib3Sender

SEND = Urllib3Sender("/products/{key}")  # GET <pod>/products/<id>; raises on 5xx, timeouts
ASEND = HttpxSender("/products/{key}")
REGISTRY = CollectorRegistry()
REGISTRY.register(CslbCollector(os.environ.get("CSLB_SHM_NAMESPACE", "default")))


def _body(ids: list, results: list) -> bytes:
    products = [r.value for r in results if r.ok]
    missing = {
        str(i): "send it through the ingress" if r.fallback else repr(r.error)
        for i, r in zip(ids, results, strict=True)
        if not r.ok
    }
    return json.dumps({"products": products, "missing": missing}).encode()


def app(environ, start_response):
    """WSGI (sync and gthread workers): ``router.fanout``."""
    if environ["PATH_INFO"] == "/metrics":
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
        return [generate_latest(REGISTRY)]
    ids = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
    results = Router.attach().fanout(ids, SEND)
    start_response("200 OK", [("Content-Type", "application/json")])
    return [_body(ids, results)]


async def asgi_app(scope, receive, send):
    """ASGI (uvicorn's worker): ``await router.afanout``."""
    if scope["type"] != "http":
        if scope["type"] == "lifespan":  # nothing to set up: acknowledge and wait
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/metrics":
        body, ctype = generate_latest(REGISTRY), b"text/plain; version=0.0.4"
    else:
        raw, more = b"", True
        while more:
            msg = await receive()
            raw += msg.get("body", b"")
            more = msg.get("more_body", False)
        ids = json.loads(raw or b"[]")
        results = await Router.attach().afanout(ids, ASEND)
        body, ctype = _body(ids, results), b"application/json"
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]}
    )
    await send({"type": "http.response.body", "body": body})
