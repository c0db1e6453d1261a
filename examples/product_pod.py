"""A product pod to fan out to: ``python examples/product_pod.py --port 8081``.

``GET /products/<id>`` answers ``{"id": ..., "name": ..., "pod": <port>}`` after a few
milliseconds (``--service-ms``), like a pod with a cache in front of a database;
``POST /products`` with a JSON array of IDs answers one product per ID, in order (the
fan-out helper's grouped form). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


def main() -> None:
    """Serve products until interrupted."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--service-ms", type=float, default=2.0)
    args = ap.parse_args()

    def product(pid: str) -> dict:
        return {"id": pid, "name": f"product {pid}", "pod": args.port}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the senders pool connections
        disable_nagle_algorithm = True

        def log_message(self, *a: object) -> None:
            pass

        def _json(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if not self.path.startswith("/products/"):
                self._json(404, {"error": "not found"})
                return
            time.sleep(args.service_ms / 1000)
            self._json(200, product(unquote(self.path[len("/products/") :])))

        def do_POST(self) -> None:
            ids = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            time.sleep(args.service_ms / 1000)
            self._json(200, [product(str(i)) for i in ids])

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # A caller opens its connections to a pod all at once (every call of a batch in
        # flight together): a listen backlog of 5 would drop SYNs and cost a 1-s retry.
        request_queue_size = 128

    server = Server(("127.0.0.1", args.port), Handler)
    print(f"product pod on http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
