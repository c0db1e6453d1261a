"""Per-call load accounting: each call counted from when it starts on the wire to its end.

:class:`CallLedger` is the one handle through which the fan-out helper
(:mod:`workers.fanout`) records its calls into the worker's counter row. A call
:meth:`~CallLedger.begin` s right before its request is written and
:meth:`~CallLedger.end` s when its answer (or failure) is in, so time a call spends
queued in the worker's own pool is never counted as the pod's busy time, and in-flight
counts only calls really in flight.

Writing each start and end into shared memory on its own would cost a few NumPy calls
per call; instead events wait in two short lists and reach the row together in one step
(one ``record_start`` with each call's own start time, one ``record_end``, the stats
deltas): when 64 are pending, when the last step is 2 ms old, when a pool thread runs
out of work, when a fan-out returns, and while a fan-out waits. Other workers see a
call at most that much later; its busy time is exact (start and end times are taken
when they happen, not when written). Calls that start together (an asyncio fan-out's
wave) go in with :meth:`~CallLedger.begin_many`: one step for all.

The ledger also holds the worker's per-endpoint count (and start times) of calls in
flight, which is what the fan-out's bulkhead caps: :meth:`~CallLedger.begin` refuses a
call to an endpoint that already has ``cap`` calls in flight from this worker (nothing
is recorded for it: a local rejection is not the pod's failure), and
:meth:`~CallLedger.oldest` tells a busy pod from a stuck one.

This is the seam a native scatter-add replaces: :meth:`CallLedger._write` turns the
pending events into the recorder's two trusted calls and is the only place that does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shm
from shm.layout import STATS_FIELDS

__all__ = ["FLUSH_NS", "MAX_PENDING", "CallLedger"]

log = logging.getLogger("cslb.router")

#: Longest time (ns) an event waits for the next write while calls keep coming.
FLUSH_NS = 2_000_000
#: Pending events that trigger a write at once.
MAX_PENDING = 64

_STAT = {name: i for i, name in enumerate(STATS_FIELDS)}


class CallLedger:
    """Records one worker's calls into its counter row, in batched steps.

    Thread-safe: pool threads and the request thread share it.

    Parameters
    ----------
    recorder
        Returns the worker's recorder now (``None``: no counters; calls are then
        counted for the bulkhead only). Asked at each write, so a router that
        attached new counters meanwhile writes into those.
    clock
        CLOCK_MONOTONIC nanoseconds.
    """

    __slots__ = (
        "_bound",
        "_clock",
        "_ends",
        "_failed_kinds",
        "_freed",
        "_last_write",
        "_lock",
        "_open",
        "_recorder",
        "_starts",
        "_stats",
        "_waiting",
        "_warned",
        "_write_lock",
    )

    def __init__(
        self,
        recorder: Callable[[], Any],
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._recorder = recorder
        self._clock = clock
        self._lock = threading.Lock()  # the pending events and the calls in flight
        self._write_lock = threading.Lock()  # one write at a time, in order
        self._freed = threading.Condition(self._lock)  # an end lowered a count
        self._waiting = 0  # threads in wait_freed (an end notifies only then)
        self._open: dict[int, list[int]] = {}  # per slot: start times of its calls in flight
        self._starts: list[tuple[int, int]] = []  # (slot, start)
        self._ends: list[tuple[int, int, int, int]] = []  # (slot, start, end, kind)
        self._failed_kinds = False
        self._stats = [0] * len(STATS_FIELDS)
        self._bound = 0
        self._last_write = 0
        self._warned = False

    # -- events ---------------------------------------------------------------------

    def begin(self, slot: int, bound: int, cap: int) -> int:
        """A call to ``slot`` starts now: its start time (ns), or ``-1`` if refused.

        Parameters
        ----------
        slot
            The endpoint's counter slot (from the table the call was routed on).
        bound
            That table's ``n_slots`` (every slot is below it).
        cap
            Most calls this worker may have in flight to the slot; at the cap the call
            is refused and nothing is recorded.
        """
        with self._lock:
            out = self._open.get(slot)
            if out is None:
                now = self._clock()
                self._open[slot] = [now]
            elif len(out) >= cap:
                return -1
            else:
                now = self._clock()
                out.append(now)
            self._starts.append((slot, now))
            if bound > self._bound:
                self._bound = bound
            due = len(self._starts) >= MAX_PENDING or now - self._last_write >= FLUSH_NS
        if due:
            self.flush()
        return now

    def wait_freed(self, slot: int, cap: int, until_ns: int) -> None:
        """Wait until ``slot`` has fewer than ``cap`` calls in flight, or until ``until_ns``."""
        with self._freed:
            self._waiting += 1
            try:
                while len(self._open.get(slot, ())) >= cap:
                    left = (until_ns - self._clock()) / 1e9
                    if left <= 0:
                        return
                    self._freed.wait(min(left, 0.05))
            finally:
                self._waiting -= 1

    def begin_many(self, slots: list[int], bound: int, cap: int) -> tuple[int, list[bool]]:
        """Calls to ``slots`` start together now: one step for all of them.

        Returns the start time (ns) and, per call, whether it was admitted (refused
        calls, over ``cap`` as in :meth:`begin`, are not recorded).
        """
        admitted = []
        with self._lock:
            now = self._clock()
            opened = self._open
            for slot in slots:
                if slot < 0:  # not recordable (a fallback, or a table replaced since)
                    admitted.append(True)
                    continue
                out = opened.setdefault(slot, [])
                if len(out) >= cap:
                    admitted.append(False)
                    continue
                out.append(now)
                admitted.append(True)
                self._starts.append((slot, now))
            if bound > self._bound:
                self._bound = bound
        self.flush()
        return now, admitted

    def end(self, slot: int, started_ns: int, kind: int = 0) -> int:
        """The call to ``slot`` that :meth:`begin` started at ``started_ns`` ended now.

        ``kind``: how it failed (:mod:`lbcore.outlier`'s ``FAIL_*`` code; 0: it did
        not). Returns the end time (ns).
        """
        with self._lock:
            now = self._clock()
            out = self._open.get(slot)
            if out is not None:
                if len(out) <= 1:
                    del self._open[slot]
                elif started_ns in out:
                    out.remove(started_ns)
                else:
                    out.pop()
            if self._waiting:
                self._freed.notify_all()
            self._ends.append((slot, started_ns, now, kind))
            if kind:
                self._failed_kinds = True
            due = len(self._ends) >= MAX_PENDING or now - self._last_write >= FLUSH_NS
        if due:
            self.flush()
        return now

    def tally(self, field: str, n: int = 1) -> None:
        """Add ``n`` to the row's lifetime total ``field`` (:data:`shm.layout.STATS_FIELDS`)."""
        with self._lock:
            self._stats[_STAT[field]] += n

    def in_flight(self, slot: int) -> int:
        """Calls this worker has in flight to ``slot`` now."""
        return len(self._open.get(slot, ()))

    def oldest(self, slot: int) -> int | None:
        """Start time (ns) of the oldest call this worker has in flight to ``slot``."""
        with self._lock:
            out = self._open.get(slot)
            return min(out) if out else None

    @property
    def pending(self) -> bool:
        """Events wait to be written."""
        return bool(self._starts or self._ends)

    # -- writing --------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending event into the counter row now (one step)."""
        with self._write_lock:
            with self._lock:
                if not (self._starts or self._ends or any(self._stats)):
                    return
                starts, ends, stats = self._starts, self._ends, self._stats
                failed = self._failed_kinds
                bound = self._bound
                self._starts, self._ends = [], []
                self._failed_kinds = False
                self._stats = [0] * len(STATS_FIELDS)
                self._last_write = now = self._clock()
            rec = self._recorder()
            if rec is None:
                return
            try:
                self._write(rec, starts, ends, failed, stats, bound, now)
            except shm.ShmError as exc:  # released meanwhile (closed, counters replaced)
                if not self._warned:
                    self._warned = True
                    log.warning("calls not recorded: %s", exc)

    @staticmethod
    def _write(
        rec: Any,
        starts: list[tuple[int, int]],
        ends: list[tuple[int, int, int, int]],
        failed: bool,
        stats: list[int],
        bound: int,
        now: int,
    ) -> None:
        if starts:
            s = np.array(starts, dtype=np.int64)
            rec._record_start_trusted(s[:, 0].astype(np.intp), s[:, 1].copy(), bound)
        if ends:
            e = np.array(ends, dtype=np.int64)
            started = e[:, 1].copy()
            durations = e[:, 2] - started
            np.maximum(durations, 0, out=durations)  # (a clock is monotonic; be safe)
            kinds = e[:, 3].astype(np.intp) if failed else None
            rec._record_end_trusted(e[:, 0].astype(np.intp), started, durations, now, kinds, bound)
        for i, n in enumerate(stats):
            if n:
                rec._tally_trusted(i, n)
