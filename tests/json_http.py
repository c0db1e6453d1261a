"""JSON over HTTP in the tests: the answer their small servers send, the fan-out they post."""

from __future__ import annotations

import http.client
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


def post_fanout(conn: http.client.HTTPConnection, ids: list[str]) -> bytes:
    """``POST /fanout`` with ``ids`` as a JSON array on ``conn``; the answer's body."""
    conn.request(
        "POST", "/fanout", body=json.dumps(ids), headers={"Content-Type": "application/json"}
    )
    return conn.getresponse().read()
