"""The fan-out's native transport: every call of a batch in flight at once on libcurl's multi.

A :class:`Transport` owns one ``pycurl.CurlMulti`` handle and the keep-alive connections
libcurl keeps under it, with reusable easy handles. It is driven through libcurl's socket
API (``socket_action``: no ``select()`` limit at 1,024 descriptors) on an ``epoll`` of
its own, by one of two reactors: :class:`SyncReactor` (run by the thread that waits for
the fan-out: one transport per worker thread, no thread pool) and :class:`LoopReactor`
(the running asyncio loop: one ``add_reader`` on that ``epoll`` and a loop timer for
libcurl's; one transport per loop, no thread). Both give the same two things to the
fan-out: start a call, and call a function later.

A call's outcome comes back as ``(value, exception, busy_ns, load)``; ``busy_ns`` is libcurl's
own measure of the call, from just before the request was sent to the last byte of the
answer (``TOTAL_TIME_T - PRETRANSFER_TIME_T``; the whole call when it never got a
connection), taken inside libcurl as it moves the bytes, so the time an answer then waits
for Python (the GIL, a busy loop, the other answers of the batch) is not counted as the
pod's busy time. ``load`` is what the answer's ``endpoint-load-metrics`` and
``Server-Timing`` headers said (:class:`lbwire.orca.ResponseLoad`) when load
reports are on (``CSLB_LOAD_REPORTS``): libcurl then hands each header line to a list's
``append`` (C, no Python frame per line), and the block is read once per call
(:class:`workers.fanout.reports.BlockReader`); with reports off no header is collected.

Connections are HTTP/1.1 keep-alive, at most ``connections_per_pod`` per pod (libcurl's
``CURLMOPT_MAX_HOST_CONNECTIONS``: calls beyond it wait inside libcurl for a free
connection, without a new one) and a connection cache sized to keep them all, so a
steady stream of fan-outs opens no new connections once warm.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import pycurl

__all__ = [
    "LoopReactor",
    "Reactor",
    "SyncReactor",
    "Transport",
    "forget_reactors",
    "loop_reactor",
    "thread_reactor",
]

#: What a finished call gives back: the value, the exception (``None``: success),
#: libcurl's busy time of the call (ns), and the answer's load headers (``None``: load
#: reports off, or no answer).
Outcome = tuple[Any, BaseException | None, int, Any]

log = logging.getLogger("cslb.router")

# libcurl's error codes (CURLcode) that mean the connection failed or broke, so the call
# never got a whole answer: the pod's transport failure, worth a retry elsewhere.
_CONNECT_CODES = frozenset(
    (
        1,  # CURLE_UNSUPPORTED_PROTOCOL: an answer that is not HTTP/1.x ("HTTP/0.9")
        pycurl.E_COULDNT_RESOLVE_HOST,
        pycurl.E_COULDNT_CONNECT,
        8,  # CURLE_WEIRD_SERVER_REPLY: the pod did not speak HTTP
        pycurl.E_PARTIAL_FILE,
        pycurl.E_GOT_NOTHING,
        pycurl.E_SEND_ERROR,
        pycurl.E_RECV_ERROR,
    )
)

# Connections libcurl may cache beyond the pods' caps (the ingress, pods of a new table).
_CACHE_SLACK = 64


class Request(Protocol):
    """What a sender builds for the transport (see :class:`workers.fanout.senders.CurlSender`)."""

    headers_list: list[str]
    post_headers: list[str]
    max_body_bytes: int

    def finish(self, status: int, body: bytes, url: str, what: Any, grouped: bool) -> Any:
        """The call's value from its answer, or raise the call's error."""
        ...


class Transport:
    """One libcurl multi handle, its connections and its calls in flight.

    Used by one thread at a time (the worker thread running a fan-out, or the event
    loop's thread).

    Parameters
    ----------
    connections_per_pod
        Most connections to one pod (``host:port``); more calls wait for one.
    reports
        Collect and read the answers' load headers (``None``: as
        :func:`workers.fanout.reports.report_settings` says).
    """

    def __init__(self, connections_per_pod: int, reports: bool | None = None) -> None:
        from workers.fanout.reports import BlockReader, report_settings

        self.connections_per_pod = int(connections_per_pod)
        if reports is None:
            reports = report_settings().enabled
        self._read_block = BlockReader() if reports else None
        m = self.multi = pycurl.CurlMulti()
        m.setopt(pycurl.M_MAX_HOST_CONNECTIONS, self.connections_per_pod)
        m.setopt(pycurl.M_MAXCONNECTS, self.connections_per_pod * 16 + _CACHE_SLACK)
        self.reactor: Reactor | None = None
        self._free_get: list[Any] = []
        self._free_post: list[Any] = []
        self._calls: dict[Any, tuple[Callable[[Outcome], None], Any, str, Any, bool]] = {}
        self._pods = 16

    # -- calls --------------------------------------------------------------------------

    def start(
        self,
        request: Request,
        url: str,
        what: Any,
        body: bytes | None,
        timeout_s: float,
        on_done: Callable[[Outcome], None],
        grouped: bool = False,
    ) -> Any:
        """Start a call: ``GET url`` (``body`` ``None``) or ``POST url`` with ``body``.

        ``on_done(outcome)`` is called once, from the reactor, when it ends (not if
        :meth:`cancel` ed first). Returns the handle :meth:`cancel` takes.
        """
        post = body is not None
        free = self._free_post if post else self._free_get
        e = free.pop() if free else self._easy(post)
        headers = request.post_headers if post else request.headers_list
        if e.cslb_headers is not headers:
            e.setopt(pycurl.HTTPHEADER, headers)
            e.cslb_headers = headers
        if e.cslb_limit != request.max_body_bytes:
            e.setopt(pycurl.MAXFILESIZE_LARGE, request.max_body_bytes)
            e.cslb_limit = request.max_body_bytes
        e.setopt(pycurl.URL, url)
        ms = max(1, int(timeout_s * 1000.0 + 0.5))
        if e.cslb_timeout != ms:  # (the same for every call but those near the deadline)
            e.setopt(pycurl.TIMEOUT_MS, ms)
            e.cslb_timeout = ms
        if post:
            e.setopt(pycurl.POSTFIELDS, body)
        self._calls[e] = (on_done, request, url, what, grouped)
        self.multi.add_handle(e)
        return e

    def cancel(self, handle: Any) -> None:
        """Stop a call in flight (its connection is closed); its ``on_done`` is not called."""
        if self._calls.pop(handle, None) is None:
            return
        self.multi.remove_handle(handle)  # (libcurl closes its connection)
        handle.cslb_chunks.clear()
        if handle.cslb_hdrs is not None:
            handle.cslb_hdrs.clear()
        self._release(handle)

    def _release(self, e: Any) -> None:
        (self._free_post if e.cslb_post else self._free_get).append(e)

    @property
    def in_flight(self) -> int:
        """Calls started and not yet ended."""
        return len(self._calls)

    def _easy(self, post: bool) -> Any:
        e = pycurl.Curl()
        chunks: list[bytes] = []
        e.cslb_chunks = chunks
        e.cslb_headers = None
        e.cslb_limit = None
        e.cslb_timeout = None
        e.cslb_post = post
        e.setopt(pycurl.WRITEFUNCTION, chunks.append)
        e.cslb_hdrs = None
        if self._read_block is not None:
            hdrs: list[bytes] = []
            e.cslb_hdrs = hdrs
            e.setopt(pycurl.HEADERFUNCTION, hdrs.append)
        e.setopt(pycurl.NOSIGNAL, 1)
        e.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        e.setopt(pycurl.PROXY, "")  # pods are called directly, whatever the environment says
        e.setopt(pycurl.FOLLOWLOCATION, 0)
        e.setopt(pycurl.TCP_NODELAY, 1)
        if not post:
            e.setopt(pycurl.HTTPGET, 1)
        return e

    def set_connections(self, connections_per_pod: int) -> None:
        """Apply a new per-pod connection cap (from then on)."""
        if connections_per_pod != self.connections_per_pod:
            self.connections_per_pod = int(connections_per_pod)
            self.multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, self.connections_per_pod)
            n, self._pods = self._pods, 0
            self.expect_pods(n)

    def expect_pods(self, n: int) -> None:
        """Keep room in the connection cache for ``n`` pods' connections.

        So no connection is closed for room while a table holds ``n`` pods.
        """
        if n > self._pods:
            self._pods = n
            self.multi.setopt(
                pycurl.M_MAXCONNECTS, self.connections_per_pod * max(16, n) + _CACHE_SLACK
            )

    # -- libcurl's callbacks and the reactor ------------------------------------------------

    def bind(self, reactor: Reactor, on_socket: Callable[[int, int, Any, Any], None]) -> None:
        """Have ``reactor`` drive this transport.

        libcurl calls ``on_socket(what, fd, multi, socketp)`` and
        ``reactor.curl_timer(ms)`` directly: one Python frame per callback, a few per call.
        """
        self.reactor = reactor
        self.multi.setopt(pycurl.M_SOCKETFUNCTION, on_socket)
        self.multi.setopt(pycurl.M_TIMERFUNCTION, reactor.curl_timer)

    def act(self, fd: int, mask: int) -> None:
        """Let libcurl move the bytes of ``fd`` (``SOCKET_TIMEOUT``: run its timers).

        Calls that end are timed by libcurl here; their owners hear of them at the next
        :meth:`collect`. A reactor acts on every ready descriptor first and collects
        once after, so one answer's Python work never delays the timing of the next.
        """
        self.multi.socket_action(fd, mask)

    def collect(self) -> None:
        """Hand the calls that ended to their owners (their ``on_done``)."""
        if not self._calls:
            return
        m = self.multi
        while True:
            left, ok, failed = m.info_read()
            ended = [(e, 0) for e in ok] + [(e, code) for e, code, _msg in failed]
            for e, code in ended:
                try:
                    self._end(e, code)
                except Exception:  # a bug in an owner: the other calls still end
                    log.exception("a finished call's owner failed")
            if not left:
                return

    def _end(self, e: Any, code: int) -> None:
        call = self._calls.pop(e, None)
        self.multi.remove_handle(e)
        chunks = e.cslb_chunks
        hdrs = e.cslb_hdrs
        if call is None:  # (not ours: cancelled meanwhile)
            chunks.clear()
            if hdrs is not None:
                hdrs.clear()
            return
        on_done, request, url, what, grouped = call
        total = e.getinfo(pycurl.TOTAL_TIME_T)
        sent = e.getinfo(pycurl.PRETRANSFER_TIME_T)
        busy_ns = (total - sent if sent else total) * 1000
        value: Any = None
        exc: BaseException | None = None
        load: Any = None
        if hdrs is not None:
            if hdrs and not code:
                load = self._read_block(b"".join(hdrs))  # type: ignore[misc]
            hdrs.clear()
        if code:
            exc = _failure(code, e.errstr(), url, total / 1e6, request.max_body_bytes)
            if code == pycurl.E_OPERATION_TIMEDOUT and not e.getinfo(pycurl.PRIMARY_IP):
                # Timed out waiting inside libcurl for a connection to the pod (its
                # per-pod cap; a connect under way has the pod's address already): the
                # pod never saw the call. Not its failure, and no busy time of its.
                exc.local = True  # type: ignore[attr-defined]
                busy_ns = 0
            chunks.clear()
            self._release(e)
        else:
            status = e.getinfo(pycurl.RESPONSE_CODE)
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self._release(e)
            try:
                value = request.finish(status, body, url, what, grouped)
            except Exception as err:
                exc = err
        on_done((value, exc, busy_ns, load))

    def close(self) -> None:
        """Stop every call (none gets an outcome) and close the connections."""
        for e in list(self._calls):
            self.cancel(e)
        self.multi.close()
        for e in self._free_get + self._free_post:
            e.close()
        self._free_get.clear()
        self._free_post.clear()


def _failure(code: int, message: str, url: str, took_s: float, limit: int) -> BaseException:
    from workers.fanout.senders import CallConnectError, CallError, CallTimeoutError

    if code == pycurl.E_OPERATION_TIMEDOUT:
        return CallTimeoutError(f"{url}: no answer within {took_s:.3g} s ({message})", url)
    if code in _CONNECT_CODES:
        return CallConnectError(f"{url}: {message}", url)
    if code == pycurl.E_FILESIZE_EXCEEDED:
        return CallError(f"{url}: answer larger than max_body_bytes={limit}", url)
    return CallError(f"{url}: libcurl error {code}: {message}", url)


# ------------------------------------------------------------------------------------
# Reactors: what waits for the sockets and the timers.


class Reactor(Protocol):
    """Drives a :class:`Transport` and runs functions later (the fan-out's sleeps)."""

    transport: Transport

    def curl_timer(self, ms: int) -> None:
        """Run libcurl's timers in ``ms`` (``-1``: no timer), as it asks."""
        ...

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Any:
        """Run ``fn`` after ``delay_s``; the returned handle has ``cancel()``."""
        ...


class _Timer:
    __slots__ = ("cancelled", "fn", "when")

    def __init__(self, when: int, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


_EPOLL_OF = {
    pycurl.POLL_IN: select.EPOLLIN,
    pycurl.POLL_OUT: select.EPOLLOUT,
    pycurl.POLL_INOUT: select.EPOLLIN | select.EPOLLOUT,
}
_IN = select.EPOLLIN


class _Poller:
    """libcurl's sockets on an ``epoll`` of the transport's own.

    Both reactors wait on it: a worker thread in :meth:`poll`, an event loop through
    one reader on :meth:`fileno`. Watching is lazy for reading: a keep-alive connection
    between two calls stays registered for input (libcurl asks for it again with the
    next call on it), so a call costs no ``epoll_ctl``; input on a descriptor libcurl
    does not want (the pod closed an idle connection) unregisters it then. Output is
    never kept (a writable socket would wake the loop forever). A descriptor libcurl
    closed leaves the epoll by itself; its number reused later is registered anew.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._ep = select.epoll()
        self._fds: dict[int, int] = {}  # registered with the epoll (as far as we know)
        self._want: dict[int, int] = {}  # what libcurl wants watched

    def fileno(self) -> int:
        """The epoll's descriptor (readable while a socket is ready)."""
        return self._ep.fileno()

    def on_socket(self, what: int, fd: int, multi: Any, socketp: Any) -> None:
        """Watch ``fd`` for ``what`` (``POLL_*``), as libcurl asks (its socket callback)."""
        want = 0 if what == pycurl.POLL_REMOVE else _EPOLL_OF.get(what, 0)
        self._want[fd] = want
        old = self._fds.get(fd, 0)
        new = want | (old & _IN)
        if new != old:
            self._set(fd, old, new)

    def _set(self, fd: int, old: int, new: int) -> None:
        ep = self._ep
        if not new:
            self._fds.pop(fd, None)
            try:
                ep.unregister(fd)
            except OSError:
                pass  # (closed already: the epoll dropped it)
            return
        self._fds[fd] = new
        try:
            try:
                if old:
                    ep.modify(fd, new)
                else:
                    ep.register(fd, new)
            except FileNotFoundError:  # closed and the number reused: not registered
                ep.register(fd, new)
            except FileExistsError:  # registered under an earlier life of the number
                ep.modify(fd, new)
        except OSError:
            # (a descriptor closed under libcurl: nothing to watch; its call ends at its
            # timeout. An exception here would fail libcurl's whole socket_action.)
            self._fds.pop(fd, None)

    def poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for ready sockets and let libcurl move their bytes."""
        act = self.transport.act
        want = self._want
        for fd, ev in self._ep.poll(timeout_s):
            if not want.get(fd, 0):  # an idle connection kept registered: closed by the pod
                self._set(fd, self._fds.get(fd, 0), 0)
                continue
            mask = 0
            if ev & (select.EPOLLIN | select.EPOLLHUP):
                mask |= pycurl.CSELECT_IN
            if ev & select.EPOLLOUT:
                mask |= pycurl.CSELECT_OUT
            if ev & select.EPOLLERR:
                mask |= pycurl.CSELECT_ERR
            act(fd, mask)

    def close(self) -> None:
        """Close the epoll."""
        self._ep.close()


class SyncReactor:
    """A worker thread's reactor: the poller and a timer heap, run while a fan-out waits.

    Parameters
    ----------
    transport
        The thread's transport.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.clock = time.monotonic_ns  # (real waits, whatever clock a router records by)
        self._poller = _Poller(transport)
        self._timers: list[tuple[int, int, _Timer]] = []
        self._seq = itertools.count()
        self._curl_due: int | None = None
        transport.bind(self, self._poller.on_socket)

    def curl_timer(self, ms: int) -> None:
        """See :meth:`Reactor.curl_timer`."""
        self._curl_due = None if ms < 0 else self.clock() + ms * 1_000_000

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> _Timer:
        """See :meth:`Reactor.call_later`."""
        t = _Timer(self.clock() + max(int(delay_s * 1e9), 0), fn)
        heapq.heappush(self._timers, (t.when, next(self._seq), t))
        return t

    def run(self, done: Callable[[], bool], until_ns: int) -> None:
        """Move calls and run timers until ``done()`` or ``until_ns`` (CLOCK_MONOTONIC ns).

        Every ready socket is acted on before any ended call goes back to its job, so
        one answer's Python work never delays the next answer's libcurl timing.
        """
        tr = self.transport
        timers = self._timers
        clock = self.clock
        poll = self._poller.poll
        while not done():
            now = clock()
            while timers and timers[0][0] <= now:
                t = heapq.heappop(timers)[2]
                if not t.cancelled:
                    t.fn()
            due = self._curl_due
            if due is not None and due <= now:
                self._curl_due = None
                tr.act(pycurl.SOCKET_TIMEOUT, 0)
                tr.collect()
                continue
            if done() or now >= until_ns:
                return
            wake = until_ns
            if timers and timers[0][0] < wake:
                wake = timers[0][0]
            if due is not None and due < wake:
                wake = due
            poll(max(wake - now, 0) / 1e9)
            tr.collect()

    def close(self) -> None:
        """Close the transport and the poller."""
        self.transport.close()
        self._poller.close()


class LoopReactor:
    """An event loop's reactor: one loop reader on the poller, and a loop timer (no thread).

    Parameters
    ----------
    transport
        The loop's transport.
    loop
        The running loop.
    """

    def __init__(self, transport: Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self._poller = _Poller(transport)
        self._curl_handle: asyncio.TimerHandle | None = None
        self._curl_when = 0.0  # (loop time; uvloop's handles do not say)
        transport.bind(self, self._poller.on_socket)
        loop.add_reader(self._poller.fileno(), self._ready)

    def _ready(self) -> None:
        # Every ready socket first, then the ended calls' jobs (see SyncReactor.run).
        self._poller.poll(0)
        self.transport.collect()

    def curl_timer(self, ms: int) -> None:
        """See :meth:`Reactor.curl_timer`.

        libcurl moves its timer a few times per call; a loop timer costs more than an
        early wake-up (libcurl then just asks again), so the loop's timer is only ever
        brought forward, never cancelled or pushed back.
        """
        if ms < 0:
            return
        when = self.loop.time() + ms / 1000.0
        h = self._curl_handle
        if h is not None:
            if self._curl_when <= when:
                return
            h.cancel()
        # (never socket_action from inside this callback: libcurl forbids it)
        self._curl_handle = self.loop.call_at(when, self._fire)
        self._curl_when = when

    def _fire(self) -> None:
        self._curl_handle = None
        self.transport.act(pycurl.SOCKET_TIMEOUT, 0)
        if self._curl_handle is None:
            # (a libcurl that does not report an unchanged timer again after an early
            # wake-up: ask it when to come back, so call timeouts still fire)
            ms = self.transport.multi.timeout()
            if ms >= 0:
                self.curl_timer(ms)
        self.transport.collect()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        """See :meth:`Reactor.call_later`."""
        return self.loop.call_later(delay_s, fn)

    def close(self) -> None:
        """Stop the loop's reader and timer; close the transport and the poller."""
        if not self.loop.is_closed():
            self.loop.remove_reader(self._poller.fileno())
        if self._curl_handle is not None:
            self._curl_handle.cancel()
        self.transport.close()
        self._poller.close()


# ------------------------------------------------------------------------------------
# One reactor per worker thread, one per event loop.

_local = threading.local()
_loops: dict[int, LoopReactor] = {}
_loops_lock = threading.Lock()


def thread_reactor(connections_per_pod: int | None = None) -> SyncReactor:
    """The calling thread's reactor (made on first use; a forked child makes its own).

    ``connections_per_pod``: the per-pod cap to apply (``None``: keep the reactor's, or
    :data:`workers.fanout.settings.FANOUT_CONNECTIONS`' default for a new one).
    """
    r: SyncReactor | None = getattr(_local, "reactor", None)
    if r is None or _local.pid != os.getpid():
        if connections_per_pod is None:
            from workers.fanout.settings import FANOUT_CONNECTIONS

            connections_per_pod = int(FANOUT_CONNECTIONS.default)
        r = SyncReactor(Transport(connections_per_pod))
        _local.reactor = r
        _local.pid = os.getpid()
    elif connections_per_pod is not None:
        r.transport.set_connections(connections_per_pod)
    return r


def loop_reactor(connections_per_pod: int) -> LoopReactor:
    """The running loop's reactor (made on first use; one loop per worker)."""
    loop = asyncio.get_running_loop()
    with _loops_lock:
        r = _loops.get(id(loop))
        if r is None or r.loop is not loop:
            for k in [k for k, old in _loops.items() if old.loop.is_closed()]:
                _loops.pop(k).close()
            r = _loops[id(loop)] = LoopReactor(Transport(connections_per_pod), loop)
        else:
            r.transport.set_connections(connections_per_pod)
    return r


def forget_reactors() -> None:
    """Drop this thread's reactor and the loops' ones: the next use makes new ones.

    New transports read the settings they depend on (load reports) anew. Dropped ones
    are not closed: their descriptors close when they are collected.
    """
    _local.reactor = None
    _loops.clear()


# The parent's transports are not a forked child's: it makes its own on first use.
os.register_at_fork(after_in_child=forget_reactors)
