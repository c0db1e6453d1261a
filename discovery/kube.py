"""Kubernetes list+watch informers (EndpointSlices of one Service, one ConfigMap).

Built on the official ``kubernetes`` client (configuration, authentication, TLS,
request building, connection pool); responses are read raw (``_preload_content=False``)
and decoded here, so one malformed object is skipped with a log line instead of failing
the client's model deserialization of a whole list, and so bookmark resource versions
are read from the event itself.

The loop follows client-go's reflector:

* **list** (a consistent read) to seed the store and get a ``resourceVersion``;
* **watch** from it with ``allowWatchBookmarks``; every event and bookmark advances the
  resource version; the server ends the watch after a jittered ``timeoutSeconds``
  (between the configured value and twice it) and the loop resumes from the last
  resource version without relisting;
* **410 Gone** / "too old resource version" (an ``ERROR`` event or an HTTP 410) relists:
  at once the first time, after the jittered backoff when the watch expires again before
  it delivered anything (client-go's reflector waits on its backoff manager before every
  relist; a server that expires every watch must not get a list per round trip);
* every request carries a client-side timeout (connect, read), so a connection that goes
  silent without a FIN cannot hang the watch forever; a watch silent for the whole read
  timeout is resumed at once (it already waited that long), not counted as an error;
* errors (API down, 5xx, garbage) are retried after a jittered exponential backoff; the
  store, and so the last good endpoint set, is kept meanwhile. A relist replaces the
  store in one step, so no empty intermediate state is ever reported;
* :meth:`ListWatch.stop` cuts the connection the informer thread is using (a list or a
  watch, even one whose server never answers), so a SIGTERM is not held up by a request
  timeout.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import ReadTimeoutError

from discovery.events import EventLog
from discovery.kube_client import RequestTracker
from discovery.watchdog import StallCheck

__all__ = ["Backoff", "ListWatch", "WatchTiming", "name_of"]

#: The repository's Role and RoleBinding for discovery, named in a 403's hint.
RBAC_MANIFEST = "deploy/kubernetes/base/rbac.yaml"

T = TypeVar("T")


class _StreamError(Exception):
    """A watch stream carried something that is not a watch event."""


class _ExpiredError(Exception):
    """The server no longer has the requested resource version: relist."""


class _UndecodableError(Exception):
    """A watch event cannot be used: relist past it.

    An unknown type, a line that is not JSON, a resource version that is not a number:
    resuming from the version before it would replay it forever.
    """


@dataclass(frozen=True, slots=True)
class WatchTiming:
    """Timeouts and backoff of an informer, in seconds.

    Attributes
    ----------
    connect_timeout_s
        Connecting to the API server.
    request_timeout_s
        Longest silence while reading a response (a list, or a watch between events).
    watch_timeout_s
        Server-side watch timeout; each watch asks for a random whole number of seconds
        in ``[t, 2t]`` (``timeoutSeconds`` is an integer).
    watch_idle_s
        Silence of a watch after which it is checked with a list (:mod:`discovery.watchdog`);
        the check's own request gets at most ``(4, 9)`` seconds (connect, read), so a
        stalled watch is replaced within about 30 s with the defaults.
    backoff_s, backoff_max_s
        First and longest retry delay after an error.
    """

    connect_timeout_s: float = 5.0
    request_timeout_s: float = 90.0
    watch_timeout_s: float = 300.0
    watch_idle_s: float = 15.0
    backoff_s: float = 0.8
    backoff_max_s: float = 30.0


class Backoff:
    """Jittered exponential backoff: ``b = min(max, first * 2**n)``, delay in ``[b/2, b)``.

    ("Equal jitter": retries of many hosts spread out even once the cap is reached.)

    Parameters
    ----------
    first_s, max_s
        First and longest delay, in seconds.
    rng
        Source of the jitter.
    """

    def __init__(self, first_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.first_s = first_s
        self.max_s = max(max_s, first_s)
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The delay before the next attempt (seconds); counts one more failure."""
        base = min(self.max_s, self.first_s * (2.0 ** min(self.failures, 60)))
        self.failures += 1
        return base * (0.5 + 0.5 * self._rng.random())

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self.failures = 0


def name_of(obj: Any) -> str:
    """``metadata.name`` of an API object (``""`` when it has none)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _rv_of(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) else ""


def _describe(exc: BaseException) -> tuple[str, int | None]:
    """A one-line description of a request failure and its HTTP status (if any)."""
    if isinstance(exc, ApiException):
        body = (exc.body or b"") if isinstance(exc.body, (bytes, str)) else b""
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        msg = ""
        try:
            msg = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            msg = body[:200]
        return f"HTTP {exc.status} {exc.reason or ''}: {msg}".strip().rstrip(":"), exc.status
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}", None


class ListWatch(Generic[T]):
    """Keeps a store of one kind of object in sync with the API (list, then watch).

    Parameters
    ----------
    kind
        Object kind for logs (``EndpointSlice``, ``ConfigMap``).
    resource
        The resource as RBAC names it (``endpointslices.discovery.k8s.io``,
        ``configmaps``), for errors and the publisher's status.
    list_call
        The client's list function, e.g. ``DiscoveryV1Api(c).list_namespaced_endpoint_slice``.
    namespace
        Namespace to list and watch.
    selectors
        ``label_selector`` / ``field_selector`` keyword arguments of ``list_call``.
    parse
        Validates one object and returns what the store keeps; raises ``ValueError``
        naming the problem for a malformed object (which is then skipped and logged; an
        object already in the store keeps its previous good version).
    on_change
        Called with a copy of the store (name -> parsed object) after the first list and
        after every change; ``reason`` says why (``list``, ``relist``, ``ADDED`` ...).
    log
        Where events go.
    timing
        Timeouts and backoff.
    rng
        Randomness for jitter (backoff, watch timeouts).
    requests
        The API client's :class:`RequestTracker` (:func:`track_requests`), so that
        :meth:`stop` can cut a request that is waiting for an answer.
    """

    def __init__(
        self,
        *,
        kind: str,
        resource: str = "",
        list_call: Callable[..., Any],
        namespace: str,
        selectors: Mapping[str, str],
        parse: Callable[[dict[str, Any]], T],
        on_change: Callable[[dict[str, T], str], None],
        log: EventLog,
        timing: WatchTiming,
        rng: random.Random | None = None,
        requests: RequestTracker | None = None,
    ) -> None:
        self.kind = kind
        self.resource = resource or kind.lower() + "s"
        self.list_call = list_call
        self.namespace = namespace
        self.selectors = dict(selectors)
        self.parse = parse
        self.on_change = on_change
        self.log = log
        self.timing = timing
        self._rng = rng or random.Random()
        self.backoff = Backoff(timing.backoff_s, timing.backoff_max_s, self._rng)
        self.store: dict[str, T] = {}
        self.resource_version: str | None = None
        self.synced = threading.Event()
        self.stats = {"lists": 0, "watches": 0, "events": 0, "bookmarks": 0, "errors": 0}
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self._thread_ident: int | None = None
        self._requests = requests
        # Expirations since the watch last delivered something: the first relists at
        # once, the next ones wait on the backoff.
        self._expired_in_a_row = 0
        # Resource version of every object the list and the watch delivered, valid or
        # not: what a stall check compares a fresh list with.
        self._rvs: dict[str, str] = {}
        self._problem: tuple[str, int] | None = None  # (what fails, since: monotonic ns)
        self._stalled: str | None = None  # set by the stall check when it cuts the watch
        # The stall check's list showed objects the watch did not deliver: relist.
        self._stall_differs = False
        self.stall_check = StallCheck(
            idle_s=timing.watch_idle_s,
            verify=self._verify,
            cut=self._cut_stalled,
            stop=self._stop,
            name=f"stall-check-{kind}",
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Run the list+watch loop in a daemon thread (and its stall check in another)."""
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()
        self.stall_check.start()

    def problem(self) -> tuple[str, int] | None:
        """What keeps this informer from following the API, and since when.

        ``(description, CLOCK_MONOTONIC ns of the first failure in a row)``, or ``None``
        while its last request succeeded.
        """
        return self._problem

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the loop and wait for its thread (at most ``timeout_s`` seconds).

        Returns True if the thread has ended.
        """
        self.signal_stop()
        return self.join(timeout_s)

    def signal_stop(self) -> None:
        """Ask the loop to stop and cut the request it is blocked in; does not wait."""
        self._stop.set()
        self._interrupt()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the stopped loop's thread; True if it ended.

        Cuts the thread's request again while waiting: a connection being opened when
        :meth:`signal_stop` ran had no socket to shut down yet.
        """
        thread = self._thread
        if thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        while thread.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            thread.join(min(left, 0.05))
            if self._stop.is_set():
                self._interrupt()
        checker = self.stall_check.join(max(deadline - time.monotonic(), 0.0))
        return not thread.is_alive() and checker

    def _interrupt(self) -> None:
        resp = self._resp
        if resp is not None:
            _shutdown(resp)
        if self._requests is not None and self._thread_ident is not None:
            self._requests.interrupt(self._thread_ident)
        if self._requests is not None and self.stall_check.ident is not None:
            self._requests.interrupt(self.stall_check.ident)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()

    def is_running(self) -> bool:
        """True while the loop's thread (started by :meth:`start`) is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def expired_in_a_row(self) -> int:
        """Relists in a row for a resource version gone or unusable (0 after a working watch)."""
        return self._expired_in_a_row

    def run(self) -> None:
        """The loop (blocking): list, watch, resume, relist, back off; until stopped."""
        self._thread_ident = threading.get_ident()
        while not self._stop.is_set():
            op = "list" if self.resource_version is None else "watch"
            try:
                if self.resource_version is None:
                    self._list()
                else:
                    self._watch()
                continue
            except _ExpiredError as exc:
                self._expired(str(exc))
                continue
            except _UndecodableError as exc:
                self._expired(str(exc), event="watch_undecodable")
                continue
            except Exception as exc:
                if self._stop.is_set():
                    break
                if op == "watch" and self._stalled is not None:
                    why, self._stalled = self._stalled, None
                    if self._stall_differs:
                        # The API has what the watch never delivered: resuming from the
                        # same version would not bring it, a list does.
                        self._stall_differs = False
                        self._expired(why, event="watch_missed_changes")
                    continue  # otherwise cut by the stall check (logged there): resume
                desc, status = _describe(exc)
                if status == 410:
                    self._expired(desc)
                    continue
                if status == 400 and op == "watch":
                    # The server refuses to resume from our version (garbage it sent us,
                    # or one it no longer parses): only a list gives a usable one.
                    self._expired(desc, event="watch_refused")
                    continue
                if op == "watch" and _is_read_timeout(exc):
                    # No data, not even a bookmark, for the whole read timeout: a dead
                    # connection. It already waited that long; resume at once.
                    self.log.info(
                        "watch_silent",
                        kind=self.kind,
                        silent_s=self.timing.request_timeout_s,
                        action="resume",
                        resource_version=self.resource_version,
                    )
                    continue
                delay = self.backoff.next()
                self.stats["errors"] += 1
                fields: dict[str, Any] = {}
                what = f"cannot {op} {self.resource} in namespace {self.namespace}: {desc}"
                if status == 403:
                    fields = {
                        "forbidden": {
                            "verb": op,
                            "resource": self.resource,
                            "namespace": self.namespace,
                        },
                        "hint": f"RBAC: the service account needs verb '{op}' on "
                        f"'{self.resource}' in namespace '{self.namespace}' (a Role and "
                        f"RoleBinding, see {RBAC_MANIFEST})",
                    }
                    what = (
                        f"forbidden to {op} {self.resource} in namespace {self.namespace} "
                        f"(RBAC: grant verb '{op}' on '{self.resource}'): {desc}"
                    )
                since = self._problem[1] if self._problem else time.monotonic_ns()
                self._problem = (f"{what} ({self.backoff.failures} failures)", since)
                self.log.error(
                    "api_error",
                    kind=self.kind,
                    op=op,
                    resource=self.resource,
                    error=desc,
                    status=status,
                    failures=self.backoff.failures,
                    retry_in_s=round(delay, 3),
                    resource_version=self.resource_version,
                    keeping=f"last good state ({len(self.store)} objects)",
                    **fields,
                )
                self._stop.wait(delay)

    def _expired(self, error: str, event: str = "watch_expired") -> None:
        """The resource version is gone or unusable: relist.

        At once the first time in a row, then on the backoff, so a server that keeps
        sending garbage is not hammered.
        """
        self._expired_in_a_row += 1
        delay = 0.0 if self._expired_in_a_row == 1 else self.backoff.next()
        self.log.warning(
            event,
            kind=self.kind,
            resource_version=self.resource_version,
            error=error,
            action="relist",
            expired_in_a_row=self._expired_in_a_row,
            retry_in_s=round(delay, 3),
        )
        self.resource_version = None
        if delay > 0:
            self._stop.wait(delay)

    # -- list ------------------------------------------------------------------------------

    def _timeout(self) -> tuple[float, float]:
        return (self.timing.connect_timeout_s, self.timing.request_timeout_s)

    def _list(self) -> None:
        t0 = time.monotonic()
        resp = self.list_call(
            self.namespace,
            **self.selectors,
            _preload_content=False,
            _request_timeout=self._timeout(),
        )
        try:
            raw = resp.data
        finally:
            resp.release_conn()
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise _StreamError(f"list response is not JSON: {exc}; body {raw[:80]!r}") from None
        if not isinstance(doc, dict):
            raise _StreamError(f"list response is a {type(doc).__name__}, expected an object")
        items = doc.get("items", ())
        if items is None:
            items = []
        rv = _rv_of(doc)
        if not isinstance(items, list) or not rv:
            raise _StreamError(
                "list response lacks an 'items' list or a metadata.resourceVersion "
                f"(keys: {sorted(doc)})"
            )
        if not (rv.isascii() and rv.isdigit() and len(rv) <= 20):
            # A watch from it would be refused (400) and relist into the same answer.
            raise _StreamError(f"list resourceVersion {rv[:40]!r} is not a number")
        store: dict[str, T] = {}
        self._rvs = {name_of(o): _rv_of(o) for o in items if name_of(o)}
        self._problem = None
        for obj in items:
            name = name_of(obj)
            try:
                store[name] = self._parse(obj)
            except ValueError as exc:
                self._invalid(name, exc, "list")
                if name and name in self.store:
                    store[name] = self.store[name]
        first = self.resource_version is None and not self.synced.is_set()
        self.store = store
        self.resource_version = rv
        self.stats["lists"] += 1
        if not self._expired_in_a_row:
            # Inside a run of expirations the backoff keeps growing until a watch works.
            self.backoff.reset()
        self.log.info(
            "api_list",
            kind=self.kind,
            objects=len(store),
            resource_version=rv,
            duration_s=round(time.monotonic() - t0, 3),
        )
        self.synced.set()
        self.on_change(dict(store), "list" if first else "relist")

    def _parse(self, obj: Any) -> T:
        if not isinstance(obj, dict):
            raise ValueError(f"{self.kind} must be a JSON object, got {type(obj).__name__}")
        if not name_of(obj):
            raise ValueError(f"{self.kind} has no metadata.name")
        return self.parse(obj)

    def _invalid(self, name: str, exc: Exception, during: str) -> None:
        self.log.warning(
            "object_invalid",
            kind=self.kind,
            name=name or None,
            during=during,
            error=str(exc),
            action="ignored; previous version kept" if name in self.store else "ignored",
        )

    # -- watch -----------------------------------------------------------------------------

    def watch_timeout(self) -> int:
        """The server-side timeout of the next watch: whole seconds, uniform in [t, 2t].

        Jittered like client-go's reflector (``minWatchTimeout * (1 + rand)``), rounded
        rather than truncated so short timeouts keep their spread.
        """
        t = self.timing.watch_timeout_s
        return max(1, round(self._rng.uniform(t, 2.0 * t)))

    def _watch(self) -> None:
        self._stalled = None
        server_timeout = self.watch_timeout()
        rv = self.resource_version
        t0 = time.monotonic()
        resp = self.list_call(
            self.namespace,
            **self.selectors,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=rv,
            timeout_seconds=server_timeout,
            _preload_content=False,
            _request_timeout=self._timeout(),
        )
        self._resp = resp
        self._problem = None  # the watch is open: the API answers us
        self.stats["watches"] += 1
        events = 0
        self.log.debug("watch_start", kind=self.kind, resource_version=rv, timeout_s=server_timeout)
        self.stall_check.watch_started(self.stats["watches"])
        try:
            if self._stop.is_set():
                return
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return
                self.stall_check.received()
                if not line.strip():
                    continue
                self._event(line)
                events += 1
                if events == 1:
                    self.backoff.reset()
                    self._expired_in_a_row = 0
        finally:
            self.stall_check.watch_ended()
            self._resp = None
            resp.release_conn()
            resp.close()
        elapsed = time.monotonic() - t0
        self.log.debug(
            "watch_end",
            kind=self.kind,
            events=events,
            duration_s=round(elapsed, 3),
            resource_version=self.resource_version,
        )
        if events == 0 and elapsed < 1.0 and not self._stop.is_set():
            # The server ended a watch at once without a word: do not spin.
            raise _StreamError("watch ended immediately without events")

    def _event(self, line: str) -> None:
        try:
            ev = json.loads(line)
        except ValueError:
            raise _UndecodableError(f"watch stream line is not JSON: {line[:80]!r}") from None
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            raise _UndecodableError(f"watch stream line is not an event: {line[:80]!r}")
        kind, obj = ev["type"], ev.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            msg = obj.get("message", "") if isinstance(obj, dict) else ""
            reason = obj.get("reason", "") if isinstance(obj, dict) else ""
            if code == 410 or reason in ("Expired", "Gone") or "too old" in str(msg):
                raise _ExpiredError(f"{code} {reason}: {msg}")
            raise _StreamError(f"watch ERROR event: {code} {reason}: {msg}")
        rv = _rv_of(obj)
        if rv and not (rv.isascii() and rv.isdigit() and len(rv) <= 20):
            # Opaque by contract, a number in every API server: one that is not would be
            # sent back on the next resume and refused (400) forever.
            raise _UndecodableError(
                f"{kind} event with resourceVersion {rv[:40]!r}, not a number"
            )
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
                self.stats["bookmarks"] += 1
                self.log.debug("watch_bookmark", kind=self.kind, resource_version=rv)
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise _UndecodableError(f"unknown watch event type {kind[:40]!r}")
        self.stats["events"] += 1
        name = name_of(obj)
        if name:
            if kind == "DELETED":
                self._rvs.pop(name, None)
            else:
                self._rvs[name] = rv
        if kind == "DELETED":
            if not name:
                self._invalid("", ValueError("DELETED event without metadata.name"), kind)
            elif self.store.pop(name, None) is not None:
                self._changed(kind, rv)
                return
        else:
            try:
                parsed = self._parse(obj)
            except ValueError as exc:
                self._invalid(name, exc, kind)
            else:
                self.store[name] = parsed
                self._changed(kind, rv)
                return
        if rv:
            self.resource_version = rv

    def _changed(self, reason: str, rv: str) -> None:
        if rv:
            self.resource_version = rv
        self.on_change(dict(self.store), reason)

    # -- stall check (discovery.watchdog) ---------------------------------------------------

    def _verify(self) -> str | None:
        """None if a list (from the API server's watch cache) shows what the watch has."""
        seen = dict(self._rvs)
        timeout = (min(self.timing.connect_timeout_s, 4.0), min(self.timing.request_timeout_s, 9.0))
        try:
            resp = self.list_call(
                self.namespace,
                **self.selectors,
                resource_version="0",
                _preload_content=False,
                _request_timeout=timeout,
            )
            try:
                doc = json.loads(resp.data)
            finally:
                resp.release_conn()
            items = doc.get("items") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                raise _StreamError("the list has no 'items'")
        except Exception as exc:
            if self._stop.is_set():
                return None
            return f"the check list failed: {_describe(exc)[0]}"
        now = {name_of(o): _rv_of(o) for o in items if name_of(o)}
        if now == seen:
            self.log.debug("watch_quiet", kind=self.kind, objects=len(now))
            return None
        changed = sorted(n for n in now.keys() | seen.keys() if now.get(n) != seen.get(n))
        self._stall_differs = True
        return (
            f"a list shows {len(changed)} object(s) the watch did not deliver: "
            + ", ".join(changed[:5])
        )

    def _cut_stalled(self, why: str) -> None:
        """End a watch that has gone silent while the API moved on (resumed at once)."""
        resp = self._resp
        if resp is None:
            return
        self._stalled = why
        self.log.info(
            "watch_stalled",
            kind=self.kind,
            silent_s=self.timing.watch_idle_s,
            why=why,
            action="relist" if self._stall_differs else "resume",
            resource_version=self.resource_version,
        )
        _shutdown(resp)


def _is_read_timeout(exc: BaseException) -> bool:
    """True for a read that waited the whole client-side read timeout.

    (urllib3 raises :class:`ReadTimeoutError` both while waiting for the headers and
    while reading the stream; a connect timeout is a different error and backs off.)
    """
    return isinstance(exc, ReadTimeoutError)


def _shutdown(resp: Any) -> None:
    """Unblock a thread reading ``resp`` (a urllib3 response) by shutting its socket."""
    conn = getattr(resp, "connection", None)
    sock = getattr(conn, "sock", None) if conn is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
