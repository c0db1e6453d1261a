"""The HTTP side of the fake API server: authentication, RBAC, faults, lists and watches."""

from __future__ import annotations

import json
import select
import socket
import ssl
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.json_http import send_json
from tests.kubeapi.faults import Fault, Request
from tests.kubeapi.objects import GROUPS, PATHS, kind_of, matches, selectors, status_body

if TYPE_CHECKING:
    from tests.kubeapi.server import FakeKubeAPI


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_api: FakeKubeAPI

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()
        self.server_api.connections.add(self.connection)

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, OSError):
            self.close_connection = True

    def finish(self) -> None:
        self.server_api.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # -- helpers -------------------------------------------------------------------------

    def _json(self, code: int, doc: Any) -> None:
        send_json(self, code, doc)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _close_hard(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- routing -------------------------------------------------------------------------

    def do_GET(self) -> None:
        api = self.server_api
        if api.closing.is_set():
            self._close_hard()  # accepted while stopping: as if never connected
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        # api/v1/namespaces/NS/RES or apis/GROUP/VERSION/namespaces/NS/RES
        try:
            i = parts.index("namespaces")
            prefix, ns, resource = "/".join(parts[:i]), parts[i + 1], parts[i + 2]
            PATHS[prefix][resource]
        except (ValueError, IndexError, KeyError):
            self._json(404, status_body(404, "NotFound", f"no route for {url.path}"))
            return
        watch = query.get("watch") in ("true", "1")
        op = "watch" if watch else "list"
        req = Request(
            op,
            resource,
            ns,
            query,
            {k.lower(): v for k, v in self.headers.items()},
            time.monotonic(),
        )
        api.requests.append(req)
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if api.rbac is not None:
            user = api.rbac.user(token) if scheme.lower() == "bearer" else None
        else:
            user = "tester" if (scheme.lower(), token) == ("bearer", api.token) else None
        if user is None:
            self._json(401, status_body(401, "Unauthorized", "Unauthorized"))
            return
        if api.rbac is not None:
            group = GROUPS[prefix]
            field_name = selectors(query).get("field:metadata.name")
            if not api.rbac.allows(user, op, group, resource, ns, field_name):
                api.forbidden.append(req)
                full = f"{resource}.{group}" if group else resource
                in_group = f' in API group "{group}"' if group else ' in API group ""'
                body = status_body(
                    403,
                    "Forbidden",
                    f'{full} is forbidden: User "{user}" cannot {op} resource "{resource}"'
                    f'{in_group} in the namespace "{ns}"',
                )
                body["details"] = {"group": group, "kind": resource}
                self._json(403, body)
                return
        fault = api.take_fault(op, resource)
        if fault is not None:
            if fault.action == "status":
                self._json(fault.code, status_body(fault.code, "InternalError", "injected failure"))
                return
            if fault.action == "reset":
                self._close_hard()
                return
            if fault.action == "gone":
                self._json(410, status_body(410, "Expired", "too old resource version"))
                return
            if fault.action == "hang":
                self._hold_open()
                return
            if fault.action == "expired" and watch:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                msg = "too old resource version: injected"
                ev = {"type": "ERROR", "object": status_body(410, "Expired", msg)}
                self._chunk(json.dumps(ev).encode() + b"\n")
                self._chunk(b"")
                return
            if fault.action == "bad-rv" and not watch:
                doc = api.list_doc(resource, ns, selectors(query))
                doc["metadata"]["resourceVersion"] = "not-a-number"
                self._json(200, doc)
                return
            if fault.action == "garbage" and not watch:
                body = b"<html>502 Bad Gateway</html>"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
        sel = selectors(query)
        if not watch:
            self._json(200, api.list_doc(resource, ns, sel))
            return
        self._watch(resource, ns, sel, query, fault)

    def _watch(
        self,
        resource: str,
        ns: str,
        sel: dict[str, str],
        query: dict[str, str],
        fault: Fault | None,
    ) -> None:
        api = self.server_api
        try:
            since = int(query.get("resourceVersion") or api.rv)
        except ValueError:
            self._json(400, status_body(400, "BadRequest", "resourceVersion is not a number"))
            return
        if since < api.compacted_rv and api.expired_as_http:
            self._json(410, status_body(410, "Expired", f"too old resource version: {since}"))
            return
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        kind, api_version = kind_of(resource)
        try:
            if since < api.compacted_rv:
                msg = f"too old resource version: {since} ({api.compacted_rv})"
                ev = {"type": "ERROR", "object": status_body(410, "Expired", msg)}
                self._chunk(json.dumps(ev).encode() + b"\n")
                self._chunk(b"")
                return
            deadline = time.monotonic() + timeout
            sent = 0
            pos = 0
            seen_bookmarks = api.bookmarks_sent
            next_auto = time.monotonic() + api.bookmark_every_s if api.bookmark_every_s else None
            while True:
                out: list[bytes] = []
                with api.cond:
                    while True:
                        if api.closing.is_set():
                            self._close_hard()
                            return
                        if since < api.compacted_rv:
                            # History was compacted under an open watch: the server
                            # ends it; resuming from `since` then gets 410.
                            break
                        new = [
                            h
                            for h in api.history[pos:]
                            if h[0] > since and h[1] == resource and h[2] == ns
                        ]
                        pos = len(api.history)
                        for rv, _, _, typ, obj in new:
                            if typ == "RAW":
                                out.append(obj)
                            elif matches(obj, sel):
                                out.append(json.dumps({"type": typ, "object": obj}).encode())
                            since = rv
                        now = time.monotonic()
                        bm = bookmarks and (
                            api.bookmarks_sent != seen_bookmarks
                            or (next_auto is not None and now >= next_auto)
                        )
                        if bm:
                            seen_bookmarks = api.bookmarks_sent
                            if next_auto is not None:
                                # bookmarks turned off meanwhile: none from now on (an
                                # interval of 0 would send one per loop, a storm)
                                every = api.bookmark_every_s
                                next_auto = now + every if every else None
                            out.append(
                                json.dumps(
                                    {
                                        "type": "BOOKMARK",
                                        "object": {
                                            "kind": kind,
                                            "apiVersion": api_version,
                                            "metadata": {
                                                "resourceVersion": str(api.rv),
                                                "creationTimestamp": None,
                                            },
                                        },
                                    }
                                ).encode()
                            )
                            since = max(since, api.rv)
                        if out or now >= deadline:
                            break
                        wait = deadline - now
                        if next_auto is not None:
                            wait = min(wait, max(next_auto - now, 0.001))
                        api.cond.wait(min(wait, 0.25))
                if since < api.compacted_rv and not out:
                    self._chunk(b"")
                    return
                for line in out:
                    if fault is not None and fault.action in ("silent", "drop"):
                        if sent >= fault.events:
                            self._misbehave(fault)
                            return
                    if fault is not None and fault.action == "garbage":
                        self._chunk(b"}}} not json {{{\n")
                        self._chunk(b"")
                        return
                    self._chunk(line + b"\n")
                    sent += 1
                if (
                    fault is not None
                    and fault.action in ("silent", "drop")
                    and (sent >= fault.events)
                ):
                    self._misbehave(fault)
                    return
                if time.monotonic() >= deadline:
                    self._chunk(b"")  # server-side timeout: a clean end of the stream
                    return
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _misbehave(self, fault: Fault) -> None:
        if fault.action == "drop":
            self.wfile.write(b'40\r\n{"type":"MODIF')  # half a chunk, then gone
            self.wfile.flush()
            self._close_hard()
            return
        self._hold_open()

    def _hold_open(self) -> None:
        """No data, no FIN, until the client gives up or the server stops."""
        api = self.server_api
        tls = isinstance(self.connection, ssl.SSLSocket)
        while not api.closing.is_set():
            try:
                if tls:  # no MSG_PEEK on TLS: wait for the socket, then read a record
                    ready, _, _ = select.select([self.connection], [], [], 0.1)
                    if ready and self.connection.recv(1) == b"":
                        break
                    continue
                self.connection.settimeout(0.1)
                if self.connection.recv(1, socket.MSG_PEEK) == b"":
                    break  # client closed its end
            except TimeoutError:
                continue
            except (OSError, ValueError):
                break
        self._close_hard()


# -- object builders ------------------------------------------------------------------------
