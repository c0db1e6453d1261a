"""The user service of ``perf/bench_fleet.py``: ``POST /fanout`` with a JSON array of IDs.

Runs under ``gunicorn -c python:workers.gunicorn_conf`` (WSGI ``app``). Each request
fans its IDs out with ``Router.attach().fanout(ids, SENDER)`` to ``GET <pod>/<id>``
and answers ``{"failed": N, "wrong": N, "took_s": S}``: keys that came back as errors,
keys whose value is not the pod's answer for that key, and the fan-out's wall time.
``GET /metrics``: cslb's host-wide metrics (:class:`workers.surfaces.collector.CslbCollector`).

``CSLB_FLEET_SENDER`` picks the sender: ``curl`` (default) ->
``CurlSender("/{key}")``, ``urllib3`` -> ``Urllib3Sender(maxsize=8)`` (the transport
before issue 17).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from workers import Router
from workers.surfaces.collector import CslbCollector

SENDER_NAME = os.environ.get("CSLB_FLEET_SENDER", "curl")
REGISTRY = CollectorRegistry()
REGISTRY.register(CslbCollector(os.environ.get("CSLB_SHM_NAMESPACE", "default")))


def _sender() -> Any:
    if SENDER_NAME == "curl":
        from workers.senders import CurlSender

        return CurlSender("/{key}")
    if SENDER_NAME == "urllib3":
        from workers.senders import Urllib3Sender

        return Urllib3Sender(maxsize=8)
    raise ValueError(f"CSLB_FLEET_SENDER: expected curl or urllib3, got {SENDER_NAME!r}")


SENDER = _sender()


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """``POST /fanout`` (the IDs as a JSON array) and ``GET /metrics``."""
    path = environ["PATH_INFO"]
    if path == "/metrics":
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
        return [generate_latest(REGISTRY)]
    if path != "/fanout" or environ["REQUEST_METHOD"] != "POST":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]
    n = int(environ.get("CONTENT_LENGTH") or 0)
    ids = json.loads(environ["wsgi.input"].read(n) or b"[]")
    t0 = time.monotonic()
    results = Router.attach().fanout(ids, SENDER)
    took = time.monotonic() - t0
    failed = sum(1 for r in results if not r.ok)
    wrong = sum(
        1
        for k, r in zip(ids, results, strict=True)
        if r.ok and not (isinstance(r.value, dict) and r.value.get("key") == k)
    )
    body = json.dumps({"failed": failed, "wrong": wrong, "took_s": took}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
