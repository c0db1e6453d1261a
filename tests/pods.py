"""Real product pods for fan-out tests: HTTP servers on 127.0.0.1, each its own process.

``python -m tests.pods --port P [--service-ms 2]`` serves (HTTP/1.1, keep-alive):

* ``GET /<key>`` -> ``{"key": key, "pod": P}`` after the service time;
* ``POST /batch`` with a JSON array of keys -> one such object per key, in order;
* ``POST /_mode`` ``{"status": 503}`` makes every product answer that status (``200``
  again: healthy; ``{"reset_max": true}`` zeroes ``max_active``; ``{"delay_ms": 30}``
  adds that much to every product's service time, ``0`` again: a latency fault); ``GET /_stats`` ->
  ``{"served": n, "status": s, "connections": c, "active": a, "max_active": m}``
  (products served, TCP connections accepted, product GETs being served now and at
  most at once).

:class:`PodFleet` starts several (``port=0`` picks free ports), and stops, SIGKILLs,
SIGSTOPs/SIGCONTs and restarts them by PID; every process it started is stopped by
:meth:`PodFleet.close`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from tests.json_http import send_json

REPO = Path(__file__).resolve().parent.parent


def serve(port: int, service_ms: float) -> None:
    state = {
        "served": 0,
        "status": 200,
        "connections": 0,
        "active": 0,
        "max_active": 0,
        "delay_ms": 0.0,
    }
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # (headers and body are two writes: no 40-ms stall)

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def setup(self) -> None:  # (one handler per accepted connection)
            super().setup()
            with lock:
                state["connections"] += 1

        def _answer(self, status: int, doc: object) -> None:
            send_json(self, status, doc)

        def _product(self, key: str) -> dict:
            return {"key": key, "pod": port}

        def do_GET(self) -> None:
            if self.path == "/_stats":
                with lock:
                    self._answer(200, dict(state))
                return
            with lock:  # (requests being served at once: do a caller's calls overlap?)
                state["active"] += 1
                state["max_active"] = max(state["max_active"], state["active"])
                delay_ms = state["delay_ms"]
            time.sleep((service_ms + delay_ms) / 1000.0)
            with lock:
                state["served"] += 1
                status = state["status"]
            if status != 200:
                self._answer(status, {"error": "unavailable"})
            else:
                self._answer(200, self._product(unquote(self.path[1:])))
            with lock:
                state["active"] -= 1

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            doc = json.loads(self.rfile.read(n) or b"null")
            if self.path == "/_mode":
                with lock:
                    state["status"] = int(doc.get("status", state["status"]))
                    if doc.get("reset_max"):
                        state["max_active"] = 0
                    if "delay_ms" in doc:
                        state["delay_ms"] = max(float(doc["delay_ms"]), 0.0)
                self._answer(200, {"status": state["status"]})
                return
            if self.path != "/batch":
                self._answer(404, {"error": "no such path"})
                return
            time.sleep(service_ms / 1000.0)
            with lock:
                state["served"] += len(doc)
                status = state["status"]
            if status != 200:
                self._answer(status, {"error": "unavailable"})
                return
            self._answer(200, [self._product(str(k)) for k in doc])

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

    httpd = Server(("127.0.0.1", port), Handler)
    print(f"pod listening on {httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


class Pod:
    """One pod process on a fixed port."""

    def __init__(self, port: int, service_ms: float, log_dir: Path) -> None:
        self.port = port
        self.service_ms = service_ms
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log_dir / f"pod-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.pods",
                "--port",
                str(self.port),
                "--service-ms",
                str(self.service_ms),
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def wait_up(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, http.client.HTTPException):
                self.request("GET", "/_stats", timeout_s=1.0)
                return
            assert self.proc is not None and self.proc.poll() is None, f"pod {self.port} exited"
            time.sleep(0.05)
        raise AssertionError(f"pod on port {self.port} did not come up")

    def request(self, method: str, path: str, doc: object = None, timeout_s: float = 2.0) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            body = None if doc is None else json.dumps(doc).encode()
            conn.request(method, path, body=body)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def served(self) -> int:
        return int(self.request("GET", "/_stats")["served"])

    def stats(self) -> dict:
        """``served`` (answers), ``connections`` (TCP connections accepted, this
        question's own included) and ``status`` so far."""
        return self.request("GET", "/_stats")

    def set_status(self, status: int) -> None:
        self.request("POST", "/_mode", {"status": status})

    def set_delay(self, ms: float) -> None:
        """Add ``ms`` to every product's service time (0: as started)."""
        self.request("POST", "/_mode", {"delay_ms": ms})

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the pod and reap it (its port closes)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


class PodFleet:
    """``n`` pods on free ports; :meth:`close` stops every one by PID."""

    def __init__(self, n: int, log_dir: Path, service_ms: float = 2.0) -> None:
        from tests.gunicorn_harness import free_port

        self.pods = [Pod(free_port(), service_ms, log_dir) for _ in range(n)]
        for p in self.pods:
            p.wait_up()

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.pods]

    def close(self) -> None:
        for p in self.pods:
            p.kill()

    def __enter__(self) -> PodFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--service-ms", type=float, default=2.0)
    a = ap.parse_args()
    serve(a.port, a.service_ms)
