"""A small Kubernetes API server for tests: EndpointSlices and ConfigMaps, list + watch.

It speaks the parts of the protocol the discovery informers use, the way kube-apiserver
does: JSON lists with ``metadata.resourceVersion``; watches as chunked HTTP responses of
one JSON event per line (``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``/``ERROR``),
resumable from a resource version, ended by the server after ``timeoutSeconds``;
"too old resource version" as a 410 ``ERROR`` event (or an HTTP 410) once history was
compacted; label (``k=v``) and field (``metadata.name=x``) selectors.

Events the informer cannot decode are sent with :meth:`FakeKubeAPI.raw_event` (any type,
any object, such as a resource version that is not a number) and
:meth:`FakeKubeAPI.raw_line` (a line that is not JSON); :meth:`FakeKubeAPI.put_unannounced`
changes an object without an event, as a lost one.

Faults are injected per request: HTTP errors with a Status body, garbage bodies, a
watch that goes silent (headers sent, then nothing, connection held open), a request
that is never answered at all, a watch dropped mid-stream, a watch expired by an
``ERROR`` event, and the whole server going away and coming back on the same port.

Optionally it serves TLS (``tls=(certfile, keyfile)``; :func:`make_test_ca` writes a
test CA and a server certificate for 127.0.0.1 with the ``openssl`` CLI) and enforces
RBAC (``rbac=``, an :class:`Rbac` built from the ServiceAccount, Role and RoleBinding
manifests): a token names a service account, and any request its Role does not allow
gets kube-apiserver's 403 ``Forbidden`` Status, naming the verb and the resource.

Only listens on 127.0.0.1 (a free port). ``stop()`` ends every handler thread.
"""

from __future__ import annotations

import copy
import json
import os
import select
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.json_http import send_json

SLICES = "endpointslices"
CONFIGMAPS = "configmaps"
_PATHS = {
    "apis/discovery.k8s.io/v1": {SLICES: ("EndpointSlice", "discovery.k8s.io/v1")},
    "api/v1": {CONFIGMAPS: ("ConfigMap", "v1")},
}
_GROUPS = {"apis/discovery.k8s.io/v1": "discovery.k8s.io", "api/v1": ""}


def make_test_ca(directory: str) -> tuple[str, str, str]:
    """A test CA and a server certificate for 127.0.0.1 / localhost, made with ``openssl``.

    Returns the paths of (CA certificate, server certificate, server key).
    """

    from tests.tools import need

    openssl = need("openssl")  # skips (or fails under CSLB_REQUIRE_TOOLS=1) without it

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    ca_key, ca_crt = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.crt")
    key, csr = os.path.join(directory, "server.key"), os.path.join(directory, "server.csr")
    crt, ext = os.path.join(directory, "server.crt"), os.path.join(directory, "server.ext")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", ca_key, "-out", ca_crt, "-days", "2",
        "-subj", "/CN=cslb test CA")
    run("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=kube-apiserver")
    with open(ext, "w", encoding="utf-8") as fh:
        fh.write(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n"
        )
    run("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
        "-out", crt, "-days", "2", "-extfile", ext)
    return ca_crt, crt, key


@dataclass(frozen=True)
class Rule:
    """One rule of a Role."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()

    def allows(self, verb: str, group: str, resource: str, name: str | None) -> bool:
        if not ({"*", group} & set(self.api_groups)):
            return False
        if not ({"*", resource} & set(self.resources)):
            return False
        if not ({"*", verb} & set(self.verbs)):
            return False
        # resourceNames authorize a list or watch only with a metadata.name field
        # selector naming one of them (as kube-apiserver's RBAC authorizer does).
        return not self.resource_names or name in self.resource_names


class Rbac:
    """Service-account tokens and the Roles bound to them, as kube-apiserver enforces.

    Build it with :meth:`from_manifests` from the decoded ServiceAccount, Role and
    RoleBinding objects (e.g. ``kubectl kustomize`` output).
    """

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}  # token -> user
        self.rules: dict[tuple[str, str], list[Rule]] = {}  # (user, namespace) -> rules

    @classmethod
    def from_manifests(cls, docs: list[dict[str, Any]], tokens: dict[str, str]) -> Rbac:
        """``tokens``: token -> ``namespace/serviceaccount`` it authenticates as."""
        rbac = cls()
        accounts = {
            f"{d['metadata']['namespace']}/{d['metadata']['name']}"
            for d in docs
            if d.get("kind") == "ServiceAccount"
        }
        for token, sa in tokens.items():
            assert sa in accounts, f"no ServiceAccount {sa} in the manifests"
            ns, name = sa.split("/")
            rbac.tokens[token] = f"system:serviceaccount:{ns}:{name}"
        roles = {
            (d["metadata"]["namespace"], d["metadata"]["name"]): [
                Rule(
                    tuple(r.get("apiGroups") or ()),
                    tuple(r.get("resources") or ()),
                    tuple(r.get("verbs") or ()),
                    tuple(r.get("resourceNames") or ()),
                )
                for r in d.get("rules") or ()
            ]
            for d in docs
            if d.get("kind") == "Role"
        }
        for d in docs:
            if d.get("kind") != "RoleBinding":
                continue
            ns = d["metadata"]["namespace"]
            ref = d["roleRef"]
            assert ref["kind"] == "Role", ref
            for subject in d.get("subjects") or ():
                if subject.get("kind") != "ServiceAccount":
                    continue
                user = f"system:serviceaccount:{subject.get('namespace', ns)}:{subject['name']}"
                rbac.rules.setdefault((user, ns), []).extend(roles.get((ns, ref["name"]), []))
        return rbac

    def user(self, token: str) -> str | None:
        return self.tokens.get(token)

    def allows(
        self, user: str, verb: str, group: str, resource: str, ns: str, name: str | None
    ) -> bool:
        return any(r.allows(verb, group, resource, name) for r in self.rules.get((user, ns), ()))


@dataclass
class Fault:
    """What to do instead of answering normally.

    ``action``: ``status`` (HTTP ``code`` with a Status body), ``garbage`` (200 with a
    body that is not JSON / a watch line that is not JSON), ``silent`` (watch: headers,
    ``events`` real events, then nothing while holding the connection), ``drop`` (watch:
    headers, ``events`` events, half a chunk, then close), ``reset`` (close without an
    answer), ``gone`` (HTTP 410), ``expired`` (watch: a 200 whose stream is one 410
    ``ERROR`` event), ``hang`` (read the request, then answer nothing, not even headers,
    while holding the connection), ``bad-rv`` (list: a resourceVersion that is not a
    number).
    """

    op: str  # "list" | "watch" | "any"
    resource: str
    action: str
    code: int = 500
    times: int = 1  # -1: until cleared
    events: int = 0
    hits: int = 0


@dataclass
class Request:
    """One request the server received."""

    op: str
    resource: str
    namespace: str
    query: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)
    t: float = 0.0


class FakeKubeAPI:
    """The server. Use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        *,
        port: int = 0,
        token: str = "test-token",
        tls: tuple[str, str] | None = None,
        rbac: Rbac | None = None,
        bookmark_every_s: float | None = None,
    ) -> None:
        self.token = token
        self.port = port
        self.rbac = rbac
        self.forbidden: list[Request] = []
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ssl.load_cert_chain(*tls)
        self.rv = 100
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []
        self.compacted_rv = 0
        self.expired_as_http = False  # 410 as an ERROR event (default) or an HTTP status
        self.faults: list[Fault] = []
        self.requests: list[Request] = []
        self.bookmark_every_s = bookmark_every_s  # None: bookmarks only when asked
        self.cond = threading.Condition()
        self._bookmarks = 0
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeKubeAPI:
        """Listen on 127.0.0.1 (a free port the first time, the same port after a pause)."""
        api = self

        class Handler(_Handler):
            server_api = api

        class Server(ThreadingHTTPServer):
            def get_request(self) -> tuple[Any, Any]:
                sock, addr = self.socket.accept()
                if api._ssl is not None:  # handshake in the handler's thread, not here
                    sock = api._ssl.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                return sock, addr

        srv = Server(("127.0.0.1", self.port), Handler)
        srv.daemon_threads = True
        self.port = srv.server_address[1]
        self._closing.clear()
        self._server = srv
        self._thread = threading.Thread(
            target=srv.serve_forever, args=(0.05,), name="fake-kube-api"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open connection (watches end abruptly)."""
        self._closing.set()
        with self.cond:
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for s in list(self._conns):
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
        scheme = "https" if self._ssl is not None else "http"
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

    # -- state ---------------------------------------------------------------------------

    def _record(self, resource: str, ns: str, kind: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, resource, ns, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def put(self, resource: str, ns: str, obj: dict[str, Any]) -> int:
        """Create or replace an object (an ADDED or MODIFIED event); returns its new RV."""
        with self.cond:
            obj = copy.deepcopy(obj)
            name = obj["metadata"]["name"]
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            obj["metadata"].setdefault("namespace", ns)
            key = (resource, ns, name)
            kind = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = obj
            self._record(resource, ns, kind, obj)
            return self.rv

    def put_many(self, resource: str, ns: str, objs: list[dict[str, Any]]) -> None:
        for o in objs:
            self.put(resource, ns, o)

    def delete(self, resource: str, ns: str, name: str) -> int:
        """Delete an object (a DELETED event)."""
        with self.cond:
            obj = self.objects.pop((resource, ns, name))
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._record(resource, ns, "DELETED", obj)
            return self.rv

    def raw_event(self, resource: str, ns: str, kind: str, obj: Any) -> None:
        """Send an event with an arbitrary (possibly malformed) object; not stored."""
        with self.cond:
            self.rv += 1
            self.history.append((self.rv, resource, ns, kind, obj))
            self.cond.notify_all()

    def put_unannounced(self, resource: str, ns: str, obj: dict[str, Any]) -> int:
        """Change an object without an event: a watch never hears of it (as when an API
        server's watch cache loses one); only a list shows it."""
        with self.cond:
            obj = copy.deepcopy(obj)
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            obj["metadata"].setdefault("namespace", ns)
            self.objects[(resource, ns, obj["metadata"]["name"])] = obj
            return self.rv

    def raw_line(self, resource: str, ns: str, line: bytes) -> None:
        """Send ``line`` verbatim on the watches (an event that is not JSON, say)."""
        with self.cond:
            self.rv += 1
            self.history.append((self.rv, resource, ns, "RAW", line))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget history: watches from an older resource version get 410."""
        with self.cond:
            self.compacted_rv = self.rv
            self.cond.notify_all()

    def bookmark(self) -> None:
        """Send a BOOKMARK with the current resource version on every open watch."""
        with self.cond:
            self._bookmarks += 1
            self.cond.notify_all()

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

    def list_doc(self, resource: str, ns: str, sel: dict[str, str]) -> dict[str, Any]:
        with self.cond:
            items = [
                copy.deepcopy(o)
                for (r, n, _), o in sorted(self.objects.items())
                if r == resource and n == ns and _matches(o, sel)
            ]
            kind = _kind_of(resource)[0]
            return {
                "kind": f"{kind}List",
                "apiVersion": _kind_of(resource)[1],
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }


def _kind_of(resource: str) -> tuple[str, str]:
    for table in _PATHS.values():
        if resource in table:
            return table[resource]
    raise KeyError(resource)


def _selectors(query: dict[str, str]) -> dict[str, str]:
    sel: dict[str, str] = {}
    for part in filter(None, query.get("labelSelector", "").split(",")):
        k, _, v = part.partition("=")
        sel["label:" + k] = v
    for part in filter(None, query.get("fieldSelector", "").split(",")):
        k, _, v = part.partition("=")
        sel["field:" + k] = v
    return sel


def _matches(obj: Any, sel: dict[str, str]) -> bool:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return True  # malformed: deliver it, the client must cope
    labels = meta.get("labels") or {}
    for k, v in sel.items():
        if k.startswith("label:") and labels.get(k[6:]) != v:
            return False
        if k == "field:metadata.name" and meta.get("name") != v:
            return False
    return True


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
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
        self.server_api._conns.add(self.connection)

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, OSError):
            self.close_connection = True

    def finish(self) -> None:
        self.server_api._conns.discard(self.connection)
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
        if api._closing.is_set():
            self._close_hard()  # accepted while stopping: as if never connected
            return
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        # api/v1/namespaces/NS/RES or apis/GROUP/VERSION/namespaces/NS/RES
        try:
            i = parts.index("namespaces")
            prefix, ns, resource = "/".join(parts[:i]), parts[i + 1], parts[i + 2]
            _PATHS[prefix][resource]
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
            group = _GROUPS[prefix]
            field_name = _selectors(query).get("field:metadata.name")
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
                doc = api.list_doc(resource, ns, _selectors(query))
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
        sel = _selectors(query)
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
        kind, api_version = _kind_of(resource)
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
            seen_bookmarks = api._bookmarks
            next_auto = time.monotonic() + api.bookmark_every_s if api.bookmark_every_s else None
            while True:
                out: list[bytes] = []
                with api.cond:
                    while True:
                        if api._closing.is_set():
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
                            elif _matches(obj, sel):
                                out.append(json.dumps({"type": typ, "object": obj}).encode())
                            since = rv
                        now = time.monotonic()
                        bm = bookmarks and (
                            api._bookmarks != seen_bookmarks
                            or (next_auto is not None and now >= next_auto)
                        )
                        if bm:
                            seen_bookmarks = api._bookmarks
                            if next_auto is not None:
                                next_auto = now + (api.bookmark_every_s or 0)
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
        while not api._closing.is_set():
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


def endpoint(
    ip: str,
    *,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
    node: str | None = None,
    zone: str | None = "eu-central-1a",
    pod: str | None = None,
) -> dict[str, Any]:
    cond: dict[str, Any] = {}
    if ready is not None:
        cond["ready"] = ready
    cond["serving"] = ready if serving is None else serving
    if terminating is not None:
        cond["terminating"] = terminating
    ep: dict[str, Any] = {"addresses": [ip], "conditions": cond}
    if node is not None:
        ep["nodeName"] = node
    if zone is not None:
        ep["zone"] = zone
    if pod is not None:
        ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "default"}
    return ep


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[dict[str, Any]],
    *,
    ports: list[tuple[str, int]] | None = (("http", 8080),),  # type: ignore[assignment]
    address_type: str = "IPv4",
) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": None
        if ports is None
        else [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
    }


def configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name}, "data": data}
