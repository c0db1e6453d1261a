"""The fake API server: listening on 127.0.0.1 (optionally TLS), stopping and resuming on the
same port, a kubeconfig for clients, and the faults queued for the next requests."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from tests.kubeapi.faults import Fault, Request
from tests.kubeapi.handler import Handler
from tests.kubeapi.objects import SLICES
from tests.kubeapi.rbac import Rbac
from tests.kubeapi.store import Store


class FakeKubeAPI(Store):
    """The server over its :class:`Store`: a context manager, or :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        *,
        port: int = 0,
        token: str = "test-token",
        tls: tuple[str, str] | None = None,
        rbac: Rbac | None = None,
        bookmark_every_s: float | None = None,
    ) -> None:
        super().__init__()
        self.token = token
        self.port = port
        self.rbac = rbac
        self.forbidden: list[Request] = []
        self.ssl_context: ssl.SSLContext | None = None
        if tls is not None:
            self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ssl_context.load_cert_chain(*tls)
        self.expired_as_http = False  # 410 as an ERROR event (default) or an HTTP status
        self.faults: list[Fault] = []
        self.requests: list[Request] = []
        self.bookmark_every_s = bookmark_every_s  # None: bookmarks only when asked
        self.closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.connections: set[socket.socket] = set()  # the handlers' open connections

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeKubeAPI:
        """Listen on 127.0.0.1 (a free port the first time, the same port after a pause)."""
        api = self

        class Bound(Handler):
            server_api = api

        class Server(ThreadingHTTPServer):
            def get_request(self) -> tuple[Any, Any]:
                sock, addr = self.socket.accept()
                if api.ssl_context is not None:  # handshake in the handler's thread, not here
                    sock = api.ssl_context.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                return sock, addr

        srv = Server(("127.0.0.1", self.port), Bound)
        srv.daemon_threads = True
        self.port = srv.server_address[1]
        self.closing.clear()
        self._server = srv
        self._thread = threading.Thread(
            target=srv.serve_forever, args=(0.05,), name="fake-kube-api"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open connection (watches end abruptly)."""
        self.closing.set()
        with self.cond:
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for s in list(self.connections):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    pause = stop  # "API down": connections refused until resume()

    def resume(self) -> None:
        """Listen again on the same port."""
        for _ in range(50):
            try:
                self.start()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"cannot listen on 127.0.0.1:{self.port} again")

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def kubeconfig(self, path: str, namespace: str = "default") -> str:
        """Write a kubeconfig pointing at this server; returns the path."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "tester", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)  # JSON is YAML
        return path

    def fail(self, op: str, resource: str, action: str, **kw: Any) -> Fault:
        """Add a fault for the next matching request(s)."""
        f = Fault(op, resource, action, **kw)
        with self.cond:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self.cond:
            self.faults.clear()
            self.cond.notify_all()

    def take_fault(self, op: str, resource: str) -> Fault | None:
        with self.cond:
            for f in self.faults:
                if f.op in (op, "any") and f.resource == resource and f.times != 0:
                    if f.times > 0:
                        f.times -= 1
                    f.hits += 1
                    return f
        return None

    def requests_of(self, op: str, resource: str = SLICES) -> list[Request]:
        return [r for r in self.requests if r.op == op and r.resource == resource]

    def wait_for_requests(self, op: str, resource: str, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests_of(op, resource)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"expected {n} {op} requests for {resource}, got "
                    f"{len(self.requests_of(op, resource))}"
                )
            time.sleep(0.01)
