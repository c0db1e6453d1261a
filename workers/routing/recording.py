"""The worker's counter row, as the router's parts record into it: one narrow handle.

A :class:`Recording` is made by the :class:`workers.Router` and handed to what records:
the :class:`workers.routing.tracker.Tracker` of :meth:`~workers.Router.track`, the
:class:`workers.fanout.ledger.CallLedger` of :meth:`~workers.Router.fanout` and the router's
own decision counts. They see the row through it only: the router gives it the row's
recorder when it claims one (a :class:`shm.LockedRecorder` under gthread, so the
process's threads share the row under the row's lock) and takes it away when the
counters are replaced or the router closes. The process's own totals (decisions,
fallbacks, moves, failures since attaching) are kept here too, under the same lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shm
from shm.counters.recorder import Starts
from workers.fanout.failurelog import FailureLog

__all__ = ["COUNTS_WARN", "Recording", "WarningThrottle"]

log = logging.getLogger("cslb.router")

#: A warning about records lost to shared memory is logged at most this often per process.
WARN_INTERVAL_NS = 60_000_000_000


class WarningThrottle:
    """One warning line per :data:`WARN_INTERVAL_NS` at most, per process and kind.

    For warnings a path can raise once per request (say, while the counters are shrunk
    under the worker until the master repairs them): the first is logged, the next ones
    within the interval are counted, and the next line logged says how many were not.
    Reads the clock only when there is something to warn about. Thread-safe.

    Parameters
    ----------
    what
        The warning's text before the exception's.
    clock
        CLOCK_MONOTONIC nanoseconds; the attribute of that name may be replaced (tests
        move time on with it).
    """

    __slots__ = ("_lock", "_next_ns", "_suppressed", "clock", "what")

    def __init__(self, what: str, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.what = what
        self.clock = clock
        self._lock = threading.Lock()
        self._next_ns = 0
        self._suppressed = 0

    def warn(self, logger: logging.Logger, exc: BaseException) -> None:
        """Log ``"<what>: <exc>"`` unless one was logged within the interval."""
        now = self.clock()
        with self._lock:
            if now < self._next_ns:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._next_ns = now + WARN_INTERVAL_NS
        logger.warning(
            "%s: %s (logged at most once a minute; %d not logged since the last)",
            self.what,
            exc,
            suppressed,
        )


#: The throttle of the "decision counts not recorded" warning (tests may swap in a fresh one).
COUNTS_WARN = WarningThrottle("decision counts not recorded")

_STATS = ("decisions", "fallbacks", "moves", "failures")


class Recording:
    """Records a worker's calls and routing decisions into its counter row.

    Thread-safe. Without a row (no counters yet, or replaced) nothing reaches shared
    memory; the process's totals still count.

    Parameters
    ----------
    clock
        CLOCK_MONOTONIC nanoseconds (call start and end times).
    recorder
        The row to record into at first (see :meth:`attach`).
    failure_log
        Where a failed call's line goes (:class:`workers.fanout.failurelog.FailureLog`;
        default: the ``cslb.router`` logger at the default rate).
    check
        Raises when the router may not be used here (closed, or a forked child's);
        called by :meth:`check` while :attr:`ok` is false.

    Attributes
    ----------
    clock : Callable[[], int]
        The clock.
    failure_log : FailureLog
        The failure log.
    ok : bool
        False once the router is closed or this is a forked child's copy.
    row : tuple[threading.Lock, shm.Recorder] or None
        The row's lock and recorder (``None``: no row), as one attribute so a fan-out
        that starts on one row ends on it even if the router attached another since:
        hold the lock around each call of the recorder.
    kernel_totals : memoryview
        The decisions, fallbacks and moves :attr:`lbcore.Plan.route_counted` counted
        into the row itself (``int64``, 3; it adds them holding the GIL, so no lock):
        part of the process's totals, with those :meth:`count` adds.
    """

    __slots__ = (
        "_check",
        "_lock",
        "_own_lock",
        "_row",
        "_totals",
        "clock",
        "failure_log",
        "kernel_totals",
        "ok",
        "row",
    )

    def __init__(
        self,
        clock: Callable[[], int] = time.monotonic_ns,
        recorder: shm.Recorder | shm.LockedRecorder | None = None,
        *,
        failure_log: FailureLog | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.failure_log = FailureLog(log, clock=clock) if failure_log is None else failure_log
        self._check = check
        self.ok = True
        self._own_lock = threading.Lock()
        self._lock = self._own_lock  # the row's lock while there is a locked row
        self._row: shm.Recorder | None = None
        self.row: tuple[threading.Lock, shm.Recorder] | None = None
        self._totals = [0, 0, 0, 0]
        self.kernel_totals = memoryview(np.zeros(3, dtype=np.int64))
        self.attach(recorder)

    # -- the row --------------------------------------------------------------------

    def attach(self, recorder: shm.Recorder | shm.LockedRecorder | None) -> None:
        """Record into ``recorder``'s row from now on (``None``: into no row)."""
        with self._lock:
            if isinstance(recorder, shm.LockedRecorder):
                self._row, self._lock = recorder.recorder, recorder.lock
            else:
                self._row, self._lock = recorder, self._own_lock
            self.row = None if self._row is None else (self._lock, self._row)

    @property
    def recording(self) -> bool:
        """Whether there is a row to record into."""
        return self._row is not None

    def check(self) -> None:
        """Raise the router's error if it may not be used here."""
        if not self.ok and self._check is not None:
            self._check()

    # -- decisions ------------------------------------------------------------------

    def count(self, decisions: int, fallbacks: int, moves: int) -> None:
        """Add a routed batch's keys, fallbacks and bounded-load moves (ints ``>= 0``)."""
        lock = self._lock
        lock.acquire()  # (acquire/release: cheaper than a with block, per batch)
        try:
            t = self._totals
            t[0] += decisions
            t[1] += fallbacks
            t[2] += moves
            row = self._row
            if row is not None:
                row.count(decisions, fallbacks, moves)
        except shm.ShmError as exc:  # released meanwhile, or the counters shrunk or damaged
            COUNTS_WARN.warn(log, exc)
        finally:
            lock.release()

    def stats(self) -> dict[str, int]:
        """The process's totals: ``decisions``, ``fallbacks``, ``moves``, ``failures``."""
        with self._lock:
            totals = self._totals.copy()
        for i, n in enumerate(self.kernel_totals):
            totals[i] += n
        return dict(zip(_STATS, totals, strict=True))

    # -- calls ----------------------------------------------------------------------

    def add_calls(
        self,
        ended: list[int],
        done: list[int],
        starts: Starts,
        now_ns: int,
        tallies: dict[str, int],
    ) -> None:
        """One step of a batching caller's calls (:meth:`shm.Recorder.add_calls`).

        ``ended``/``done``: flat ``slot, start, end, kind`` per call (starts written /
        not written); ``starts``: ``(slot, start) -> calls`` still out. Ends before
        starts, under one lock. Raises :class:`shm.ShmError` when the row was released
        meanwhile.
        """
        with self._lock:
            row = self._row
            if row is None:
                return
            row.add_calls(ended, done, starts, now_ns)
            for field, n in tallies.items():
                row.tally(field, n)

    def record_reports(
        self, reports: dict[int, tuple[float, float, int, int]], now_ns: int, expiry_ns: int
    ) -> None:
        """Store the pods' latest load reports in the row (:meth:`shm.Recorder.record_reports`).

        ``reports``: ``slot -> (value, utilization, kind, identity)``. Raises
        :class:`shm.ShmError` when the row was released meanwhile.
        """
        if not reports:
            return
        slots = list(reports)
        cols = list(zip(*reports.values(), strict=True))
        with self._lock:
            row = self._row
            if row is None:
                return
            row.record_reports(slots, cols[0], cols[1], cols[2], cols[3], now_ns, expiry_ns)

    def failed(self, fields: dict[str, Any]) -> None:
        """A call failed: its line to the failure log (rate-limited), one more failure."""
        self.failure_log.failed(fields)
        with self._lock:
            self._totals[3] += 1
