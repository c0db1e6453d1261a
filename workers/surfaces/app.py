r"""The bundled WSGI app that ``cslb serve`` runs: routing as an HTTP service.

``workers.app:app`` answers

* ``POST /route``: which endpoint serves each product ID of a batch;
* ``GET /metrics``: the host's routing metrics for Prometheus (any worker answers for
  the whole host, read from shared memory; see :mod:`workers.surfaces.collector`);
* ``GET /healthz``: 200 while a table with endpoints is published and its publisher is
  alive, else 503 with the reason (JSON both ways): for people and alerts;
* ``GET /readyz``: 200 whenever this worker answers (JSON: whether keys route
  client-side or fall back to the ingress, and why). A worker that falls back still
  serves, so this, not ``/healthz``, is what a Kubernetes readiness or liveness probe
  asks: an empty backend or a discovery outage must not take the client pods out of
  their Service;
* ``GET /status``: an HTML page for people (:mod:`workers.surfaces.status`).

The bodies ``POST /route`` takes (JSON, text, binary) and the answer it gives are
described once, in :mod:`workers.surfaces.body`.

Errors are JSON ``{"error": message, "status": code}``: 400 bad input (invalid JSON,
keys that are not strings or integers, keys over 4096 bytes, bad ``attempt``, a
malformed binary or chunked body), 404 unknown path, 405 wrong method (with ``Allow``),
411 chunked body without a terminated input stream, 413 body or batch over the limits,
415 unsupported content type, 503 this worker cannot attach its router (no counters, no
free counter row). Bad input never costs more than its own request.

The app attaches its :class:`~workers.routing.router.Router` on the first ``/route`` request,
never at import, so a gunicorn master that preloads it forks no shared-memory state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

import shm
from lbcore import KeyEncodingError, KeyTooLongError, KeyTypeError
from lbcore.knobs import Knob, from_mapping
from lbcore.logformat import Event
from workers.surfaces import status
from workers.surfaces.body import (
    JSON_MEDIA_TYPE,
    MAX_ATTEMPT,
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_KEY_BYTES,
    TEXT_CHARSETS,
    HTTPError,
    check_keys,
    pack_keys,
    parse_route_request,
    read_body,
)
from workers.surfaces.collector import METRICS_MAX_ENDPOINTS, CslbCollector
from workers.surfaces.hosts import STALE_AFTER, HostMonitor

if TYPE_CHECKING:
    from workers.routing.router import Router

__all__ = [
    "APP_KNOBS",
    "MAX_ATTEMPT",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_KEY_BYTES",
    "TEXT_CHARSETS",
    "CslbApp",
    "HTTPError",
    "LazyApp",
    "app",
    "check_keys",
    "pack_keys",
    "parse_route_request",
    "read_body",
]

log = logging.getLogger("cslb.workers.app")

#: The app's own settings (the namespace is :data:`shm.SHM_NAMESPACE`).
APP_KNOBS: tuple[Knob, ...] = (MAX_BODY_BYTES, MAX_BATCH, STALE_AFTER, METRICS_MAX_ENDPOINTS)

_STATUS_TEXT = {
    200: "200 OK",
    400: "400 Bad Request",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    411: "411 Length Required",
    413: "413 Content Too Large",
    415: "415 Unsupported Media Type",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}
# One traceback per path and exception type per this many ns (see CslbApp._log_failure).
_FAILURE_LOG_NS = 60_000_000_000
_DECIMAL = re.compile(r"[0-9]{1,5}(?:\.[0-9]{1,3})?")



# --------------------------------------------------------------------------------------
# The app.


#: Most padding the fixed-width answer pieces may add, as a share of the bytes the
#: endpoints' JSON strings need without it; beyond that the answer is joined per key.
_MAX_PADDING = 0.25


class _Answers:
    """The pieces of the ``/route`` answers on one table, built once per generation.

    ``enc``: the JSON text of each endpoint and ``"null"`` last (so that index -1, the
    fallback, takes it), for the group form. ``pieces``: the same as one fixed-width
    ``bytes`` array, each entry ``,"endpoint"`` padded with spaces (JSON whitespace) to
    the longest, so that an answer of ``n`` keys is one ``take`` and one ``tobytes``
    (no Python step per key); ``None`` when the endpoints' lengths differ so much that
    the padding would add over :data:`_MAX_PADDING` to the answer's size (then the
    strings are joined per key).
    """

    __slots__ = ("enc", "generation", "head", "pieces", "table")

    def __init__(self, table: Any) -> None:
        self.table = table
        self.generation = int(table.generation) if table is not None else 0
        endpoints = () if table is None else table.endpoints
        # json.dumps escapes every non-ASCII character: the text is ASCII.
        self.enc = [*map(json.dumps, endpoints), "null"]
        self.head = b'{"generation": %d, "endpoints": [' % self.generation
        raw = [b"," + e.encode("ascii") for e in self.enc]
        width = max(map(len, raw))
        need = sum(map(len, raw[:-1])) or 1
        self.pieces: np.ndarray | None = None
        if len(raw) == 1 or width * (len(raw) - 1) <= need * (1.0 + _MAX_PADDING):
            self.pieces = np.array([r.ljust(width) for r in raw], dtype=f"S{width}")

    def plain(self, idx: np.ndarray) -> bytes:
        """The answer ``{"generation": G, "endpoints": [...]}`` for indices ``idx``."""
        if not idx.size:
            return self.head + b"]}"
        pieces = self.pieces
        if pieces is not None:
            body = pieces.take(idx).tobytes()
            # Drop the comma of the first entry, in the same copy as the head and tail.
            return b"".join((self.head, memoryview(body)[1:], b"]}"))
        enc = self.enc
        return b"%b%b]}" % (self.head, ", ".join([enc[i] for i in idx.tolist()]).encode())


class CslbApp:
    """The WSGI app: ``/route``, ``/metrics``, ``/healthz``, ``/status``.

    Parameters
    ----------
    namespace
        Shared-memory namespace of the host's tables and counters.
    max_body_bytes
        Largest ``/route`` body, in bytes.
    max_batch
        Most keys in one ``/route`` request.
    stale_after_s
        Heartbeat age in seconds beyond which the publisher counts as dead.

    Attributes
    ----------
    registry
        The registry ``/metrics`` writes: cslb's collector; register more collectors
        in it to serve their metrics alongside (:func:`workers.surfaces.mount.mount` does).
    """

    def __init__(
        self,
        namespace: str,
        *,
        max_body_bytes: int = MAX_BODY_BYTES.default,
        max_batch: int = MAX_BATCH.default,
        stale_after_s: float = STALE_AFTER.default,
        metrics_max_endpoints: int = METRICS_MAX_ENDPOINTS.default,
    ) -> None:
        self.namespace = namespace
        self.max_body_bytes = int(max_body_bytes)
        self.max_batch = int(max_batch)
        self.monitor = HostMonitor(namespace, stale_after_s=stale_after_s)
        self.collector = CslbCollector(
            namespace, monitor=self.monitor, max_endpoints=metrics_max_endpoints
        )
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self._router: Router | None = None
        self._lock = threading.Lock()
        # (path, exception type) -> [monotonic ns of the next traceback, lines not logged]
        self._failures: dict[tuple[str, str], list[int]] = {}
        # The pieces of the answers on the table routed last (rebuilt per generation).
        self._answers = _Answers(None)
        self._routes: dict[str, dict[str, Callable[[dict[str, Any]], tuple]]] = {
            "/route": {"POST": self._route},
            "/metrics": {"GET": self._metrics},
            "/healthz": {"GET": self._healthz},
            "/readyz": {"GET": self._readyz},
            "/status": {"GET": self._status},
            "/": {"GET": self._index},
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> CslbApp:
        """The app configured from ``CSLB_*`` variables (defaults for the rest).

        Raises
        ------
        lbcore.knobs.KnobError
            A variable is set to an invalid value (the message names it).
        """
        env = os.environ if environ is None else environ
        knobs = (shm.SHM_NAMESPACE, *APP_KNOBS)
        values = {k.name: k.default for k in knobs}
        values.update(from_mapping(env, knobs, source="environment"))
        return cls(
            values["shm_namespace"],
            max_body_bytes=values["max_body_bytes"],
            max_batch=values["max_batch"],
            stale_after_s=values["stale_after_s"],
            metrics_max_endpoints=values["metrics_max_endpoints"],
        )

    # -- WSGI --------------------------------------------------------------------------

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one request."""
        method = environ.get("REQUEST_METHOD", "GET").upper()
        path = environ.get("PATH_INFO", "") or "/"
        try:
            handlers = self._routes.get(path)
            if handlers is None:
                raise HTTPError(
                    404,
                    f"no such path {path[:200]!r}; try /route, /metrics, /healthz, /readyz or "
                    "/status",
                )
            handler = handlers.get("GET" if method == "HEAD" else method)
            if handler is None:
                allowed = ", ".join(sorted({*handlers, *(["HEAD"] if "GET" in handlers else [])}))
                raise HTTPError(
                    405, f"{path} does not take {method[:20]}; use {allowed}", [("Allow", allowed)]
                )
            status, ctype, body, headers = handler(environ)
        except HTTPError as exc:
            status, ctype, headers = exc.status, JSON_MEDIA_TYPE, exc.headers
            body = json.dumps({"error": exc.message, "status": exc.status}).encode()
        except Exception as exc:
            self._log_failure(method, path, exc)
            status, ctype, headers = 500, JSON_MEDIA_TYPE, []
            body = b'{"error": "internal error (logged by the worker)", "status": 500}'
        start_response(
            _STATUS_TEXT[status],
            [("Content-Type", ctype), ("Content-Length", str(len(body))), *headers],
        )
        return [b""] if method == "HEAD" else [body]

    def failures_not_logged(self, path: str, error: str) -> int:
        """Unexpected errors of type ``error`` on ``path`` not logged since the last traceback."""
        entry = self._failures.get((path[:200], error))
        return 0 if entry is None else entry[1]

    def _log_failure(self, method: str, path: str, exc: Exception) -> None:
        """Log an unexpected error with its traceback, once a minute per path and type.

        Any client can repeat the request that caused it: one traceback per request
        would let it flood the log. The lines of that minute are counted instead and
        the count goes with the next traceback.
        """
        key = (path[:200], type(exc).__name__)
        now = time.monotonic_ns()
        entry = self._failures.get(key)
        if entry is not None and now < entry[0]:
            entry[1] += 1
            return
        if len(self._failures) > 256:
            self._failures.clear()  # (paths reaching a handler are few; a safety cap)
        self._failures[key] = [now + _FAILURE_LOG_NS, 0]
        log.exception(
            Event(
                "request_failed",
                method=method[:20],
                path=path[:200],
                same_failures_not_logged=0 if entry is None else entry[1],
                next_traceback_after_s=_FAILURE_LOG_NS / 1e9,
            )
        )

    # -- /route ------------------------------------------------------------------------

    def router(self) -> Router:
        """The router of this process, attached on first use.

        Raises
        ------
        HTTPError
            503 when the namespace has no tables or counters, or no free counter slot.
        """
        r = self._router
        if r is not None:
            return r
        with self._lock:
            if self._router is None:
                from workers.routing.router import Router  # here: never in the master

                try:
                    self._router = Router.attach(self.namespace)
                except shm.ShmError as exc:
                    raise HTTPError(503, f"cannot route: {exc}") from None
                except Exception as exc:
                    # Say, user code in this worker attached the process's router to
                    # another namespace: this worker cannot route, the next may.
                    log.exception(Event("router_attach_failed", shm_namespace=self.namespace))
                    raise HTTPError(503, f"cannot attach the router: {exc}") from None
            return self._router

    def _route(self, environ: dict[str, Any]) -> tuple:
        body = read_body(environ, self.max_body_bytes)
        keys, attempt, group = parse_route_request(
            body,
            environ.get("CONTENT_TYPE", ""),
            environ.get("QUERY_STRING", ""),
            max_batch=self.max_batch,
            check=False,
        )
        router = self._router if self._router is not None else self.router()
        try:
            idx, table = router.route_table(keys, attempt=attempt)
        except (KeyTypeError, KeyEncodingError, KeyTooLongError) as exc:
            check_keys(keys)  # a bad key: say which, in JSON's words if it is one of those
            raise HTTPError(400, str(exc)) from None
        except shm.ShmError as exc:
            raise HTTPError(503, f"cannot route: {exc}") from None
        answers = self._answers
        if answers.table is not table:
            answers = self._answers = _Answers(table)
        if group:
            out = self._grouped(idx, answers.generation, answers.enc).encode()
        else:
            out = answers.plain(idx)
        return 200, JSON_MEDIA_TYPE, out, []

    @staticmethod
    def _grouped(idx: np.ndarray, generation: int, enc: list[str]) -> str:
        """The group form: positions per endpoint (table order), fallback positions apart."""
        if not idx.size:
            return f'{{"generation": {generation}, "groups": {{}}, "fallback": []}}'
        order = np.argsort(idx, kind="stable")
        ranked = idx[order]
        cuts = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), idx.size]
        pos = list(map(str, order.tolist()))
        heads = ranked[cuts[:-1]].tolist()
        groups = [
            f"{enc[e]}: [{', '.join(pos[lo:hi])}]"
            for e, lo, hi in zip(heads, cuts, cuts[1:], strict=False)
            if e >= 0
        ]
        fallback = ", ".join(pos[: cuts[1]]) if heads[0] < 0 else ""  # -1 sorts first
        return (
            f'{{"generation": {generation}, "groups": {{{", ".join(groups)}}}, '
            f'"fallback": [{fallback}]}}'
        )

    # -- the rest ----------------------------------------------------------------------

    def _metrics(self, environ: dict[str, Any]) -> tuple:
        encoder, ctype = choose_encoder(environ.get("HTTP_ACCEPT"))
        return 200, ctype, encoder(self.registry), []

    def _worker_problem(self) -> str | None:
        """Why this worker cannot route the published table (``None``: it can, or untried)."""
        router = self._router
        if router is None:
            return None
        try:
            router.snapshot()  # the verdict of now, not of the last batch
        except Exception:  # a closed router: nothing this endpoint can do about it
            return None
        problem = router.routing_problem()
        return None if problem is None else f"this worker (pid {os.getpid()}): {problem}"

    def _healthz(self, environ: dict[str, Any]) -> tuple:
        h = self.monitor.health()
        worker = self._worker_problem()
        if h.ok and worker is not None:
            h = dataclasses.replace(h, ok=False, reason=f"workers cannot route: {worker}")
        doc = {
            "status": "ok" if h.ok else "unavailable",
            "reason": h.reason,
            "namespace": self.namespace,
            "generation": h.generation,
            "heartbeat_age_s": None if h.heartbeat_age_s is None else round(h.heartbeat_age_s, 3),
            "publisher_pid": h.writer_pid,
            "discovery_problem": h.problem or None,
        }
        return (200 if h.ok else 503), JSON_MEDIA_TYPE, json.dumps(doc).encode(), []

    def _readyz(self, environ: dict[str, Any]) -> tuple:
        h = self.monitor.health()
        worker = self._worker_problem()
        client_side = bool(h.generation and h.endpoints) and worker is None
        if h.ok and worker is not None:
            h = dataclasses.replace(h, ok=False, reason=f"workers cannot route: {worker}")
        doc = {
            "status": "serving",
            "routing": "client-side" if client_side else "fallback",
            "healthz": "ok" if h.ok else "unavailable",
            "reason": h.reason,
            "generation": h.generation,
        }
        return 200, JSON_MEDIA_TYPE, json.dumps(doc).encode(), []

    def _status(self, environ: dict[str, Any]) -> tuple:
        refresh: float | None = 5.0
        query = environ.get("QUERY_STRING", "")
        if query:
            values = parse_qs(query, keep_blank_values=True).get("refresh", [])
            if len(values) > 1:
                raise HTTPError(400, f"query parameter refresh is given {len(values)} times")
            if values:
                raw = values[0].strip()
                # Plain decimal only: float() would take "1_0", "nan" and "1e3" too.
                refresh = float(raw) if _DECIMAL.fullmatch(raw) else -1.0
                if not 0.0 <= refresh <= 86400.0:
                    raise HTTPError(
                        400,
                        "refresh must be a number of seconds from 0 (never) to 86400, "
                        f"got {raw[:32]!r}",
                    )
        page = status.render(self.monitor.snapshot(), refresh_s=refresh)
        return 200, "text/html; charset=utf-8", page.encode(), [("Cache-Control", "no-store")]

    def _index(self, environ: dict[str, Any]) -> tuple:
        text = (
            f"cslb routing service (namespace {self.namespace})\n"
            "POST /route    route a batch of product IDs (JSON array or text/plain lines)\n"
            "GET  /metrics  Prometheus metrics of the whole host\n"
            "GET  /healthz  200 while the routing table is fresh\n"
            "GET  /readyz   200 while this worker serves (routing or falling back)\n"
            "GET  /status   status page\n"
        )
        return 200, "text/plain; charset=utf-8", text.encode(), []

    def close(self) -> None:
        """Release the router's counter slot and the monitor's mappings."""
        with self._lock:
            if self._router is not None:
                self._router.close()
                self._router = None
        self.monitor.close()


class LazyApp:
    """``workers.app:app``: the :class:`CslbApp` configured from the environment.

    Built on the first request (in the worker), so importing this module in a gunicorn
    master maps nothing; the settings are checked at import all the same, so a bad
    ``CSLB_*`` value stops the server at start-up with a message naming it.
    """

    def __init__(self) -> None:
        self._app: CslbApp | None = None
        self._lock = threading.Lock()
        CslbApp.from_environ()  # validate now; cheap, attaches nothing

    @property
    def built(self) -> bool:
        """True once the app was built (by a request or :meth:`get`)."""
        return self._app is not None

    def get(self) -> CslbApp:
        """The app, built on first use."""
        a = self._app
        if a is None:
            with self._lock:
                if self._app is None:
                    self._app = CslbApp.from_environ()
                a = self._app
        return a

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one request."""
        a = self._app
        return (a if a is not None else self.get())(environ, start_response)


app = LazyApp()
