"""The answer the tests' small HTTP servers (fake pods, fake Kubernetes API) send."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send_json(handler: BaseHTTPRequestHandler, status: int, doc: object) -> None:
    """Answer ``status`` with ``doc`` as a JSON body of known length."""
    body = json.dumps(doc).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
