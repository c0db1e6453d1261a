r"""A product-sets service that fans out with cslb: ``POST /sets`` with a JSON array of IDs.

Run three pods and the service (from the repository root, after the README's
``pip install -e .``)::

    for p in 8081 8082 8083; do python examples/product_pod.py --port $p & done
    CSLB_ENDPOINTS_FILE=examples/pods.json PYTHONPATH=examples \
        gunicorn -c python:workers.gunicorn_conf --threads 4 product_sets:app
    curl -s -H 'Content-Type: application/json' -d '["AD112G0AB-K11", 12345, "SKU-3"]' \
        http://127.0.0.1:8000/sets

The same service for an asyncio worker (uvicorn's, under the same config module; it
needs ``pip install -e '.[httpx]' uvicorn-worker``)::

    CSLB_ENDPOINTS_FILE=examples/pods.json PYTHONPATH=examples gunicorn \
        -c python:workers.gunicorn_conf -k uvicorn_worker.UvicornWorker product_sets:asgi_app

Each product comes from the pod Skipper would pick (one call per ID on the worker's
pool, one fast retry on the next pod if a call fails); IDs that could not be fetched
are listed under ``missing`` with the reason. Kill one pod's process and the next
requests still get every product, from the next pods; within seconds ``cslb inspect``
shows the pod ejected. ``/metrics`` (cslb's host-wide metrics with the service's own),
``/healthz``, ``/readyz`` and ``/status`` are cslb's, mounted into the app
(:mod:`workers.mount`); other paths answer 404.
"""

from __future__ import annotations

import json

from workers import Router
from workers.mount import mount, mount_asgi
from workers.senders import CurlSender

# GET <pod>/products/<id>; raises on 5xx and timeouts. One sender for both forms: every
# call of a batch in flight at once on libcurl (the thread's, or the event loop's).
SEND = CurlSender("/products/{key}")


def _body(ids: list, results: list) -> bytes:
    products = [r.value for r in results if r.ok]
    missing = {
        str(i): "send it through the ingress" if r.fallback else repr(r.error)
        for i, r in zip(ids, results, strict=True)
        if not r.ok
    }
    return json.dumps({"products": products, "missing": missing}).encode()


def _ids(raw: bytes) -> list | None:
    try:
        ids = json.loads(raw or b"[]")
    except ValueError:
        return None
    return ids if isinstance(ids, list) else None


def sets(environ, start_response):
    """WSGI (sync and gthread workers): ``router.fanout``."""
    if environ["PATH_INFO"] != "/sets" or environ["REQUEST_METHOD"] != "POST":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"POST /sets with a JSON array of product IDs\n"]
    ids = _ids(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
    if ids is None:
        start_response("400 Bad Request", [("Content-Type", "text/plain")])
        return [b"expected a JSON array of product IDs\n"]
    results = Router.attach().fanout(ids, SEND)
    start_response("200 OK", [("Content-Type", "application/json")])
    return [_body(ids, results)]


async def asgi_sets(scope, receive, send):
    """ASGI (uvicorn's worker): ``await router.afanout``."""
    if scope["type"] != "http":
        if scope["type"] == "lifespan":  # nothing to set up: acknowledge and wait
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        return
    raw, more = b"", True
    while more:
        msg = await receive()
        raw += msg.get("body", b"")
        more = msg.get("more_body", False)
    ctype = b"text/plain"
    if scope["path"] != "/sets" or scope["method"] != "POST":
        status, body = 404, b"POST /sets with a JSON array of product IDs\n"
    elif (ids := _ids(raw)) is None:
        status, body = 400, b"expected a JSON array of product IDs\n"
    else:
        results = await Router.attach().afanout(ids, SEND)
        status, body, ctype = 200, _body(ids, results), b"application/json"
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]}
    )
    await send({"type": "http.response.body", "body": body})


app = mount(sets)  # + cslb's /metrics (with your own metrics), /healthz, /readyz, /status
asgi_app = mount_asgi(asgi_sets)
