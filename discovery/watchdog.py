"""Telling a quiet watch from a stalled one, in well under client-go's time.

A watch over HTTP/1.1 that stops delivering (the connection open, no bytes, no FIN: a
dead peer behind a NAT, a stuck proxy, a wedged API server) looks exactly like a watch
on a Service where nothing changes. client-go answers this with an HTTP/2 ping after
30 s of silence; the Python client speaks HTTP/1.1 and cannot ping. A read timeout
short enough to notice a stall would also cut every quiet watch, whose bookmarks come
only about once a minute from kube-apiserver.

So :class:`StallCheck` asks the API instead: once the watch has been silent for
``idle_s``, ``verify()`` (a list of the same objects on another connection, served from
the API server's watch cache) says whether the watch missed anything. A watch that
missed nothing is quiet and is kept; one that missed something, or whose check fails,
is cut (``cut(reason)``) and the informer resumes it from its resource version at once.
A change is therefore delivered within about ``idle_s`` plus one check of when it
happened, however the connection died; a quiet watch costs one list per ``idle_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["StallCheck"]


class StallCheck:
    """Watches one informer's stream for silence and checks it (see the module docs).

    Parameters
    ----------
    idle_s
        Silence in seconds after which the stream is checked (and again every
        ``idle_s`` while it stays silent and checks out).
    verify
        Returns ``None`` if the watch missed nothing, else why it looks stalled. Runs on
        this object's thread; may block up to its request timeout.
    cut
        Ends the stream (called with the reason) so the informer resumes it.
    stop
        Set when the informer stops.
    grace_s
        How long a stream that looks stalled may still deliver before it is cut (an
        event may be on its way when the check lists it).
    name
        Thread name.
    """

    def __init__(
        self,
        *,
        idle_s: float,
        verify: Callable[[], str | None],
        cut: Callable[[str], None],
        stop: threading.Event,
        grace_s: float = 1.0,
        name: str = "watch-stall-check",
    ) -> None:
        self.idle_s = float(idle_s)
        self.grace_s = min(float(grace_s), self.idle_s)
        self.verify = verify
        self.cut = cut
        self._stop = stop
        self._name = name
        self._lock = threading.Lock()
        self._watching = 0  # which watch is open (0: none), so a late verdict is dropped
        self._rx = 0  # data events seen, ever
        self._quiet_since = 0.0  # monotonic: last data, watch start or good check
        self._thread: threading.Thread | None = None
        self.ident: int | None = None
        self.checks = 0
        self.cuts = 0

    def start(self) -> None:
        """Run the checks on a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread (after ``stop`` was set); True once it has ended."""
        t = self._thread
        if t is None:
            return True
        t.join(timeout_s)
        return not t.is_alive()

    def watch_started(self, n: int) -> None:
        """Watch number ``n`` (> 0) is open and streaming."""
        with self._lock:
            self._watching = n
            self._quiet_since = time.monotonic()

    def watch_ended(self) -> None:
        """No watch is open now."""
        with self._lock:
            self._watching = 0

    def received(self) -> None:
        """The open watch delivered something (an event or a bookmark)."""
        with self._lock:
            self._rx += 1
            self._quiet_since = time.monotonic()

    def _run(self) -> None:
        self.ident = threading.get_ident()
        tick = min(0.25, self.idle_s / 4)
        while not self._stop.wait(tick):
            with self._lock:
                watch, rx, since = self._watching, self._rx, self._quiet_since
            if not watch or time.monotonic() - since < self.idle_s:
                continue
            self.checks += 1
            why = self.verify()
            if self._stop.is_set():
                return
            with self._lock:
                moved = self._rx != rx or self._watching != watch
                if why is None and not moved:
                    self._quiet_since = time.monotonic()  # quiet, not stalled
            if why is None or moved:
                continue
            # An event the list saw may be on its way down the stream: a moment's grace.
            if self._stop.wait(self.grace_s):
                return
            with self._lock:
                if self._rx != rx or self._watching != watch:
                    continue
            self.cuts += 1
            self.cut(why)
