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
        "_e_end",
        "_e_kind",
        "_e_slot",
        "_e_start",
        "_failed_kinds",
        "_freed",
        "_in_flight",
        "_last_write",
        "_lock",
        "_open",
        "_recorder",
        "_s_slot",
        "_s_start",
        "_stats",
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
        self._lock = threading.Lock()  # the pending lists and the in-flight counts
        self._freed = threading.Condition(self._lock)  # an end lowered a count
        self._write_lock = threading.Lock()  # one write at a time, in order
        self._in_flight: dict[int, int] = {}
        self._open: dict[int, list[int]] = {}  # start times of the calls in flight, per slot
        self._s_slot: list[int] = []
        self._s_start: list[int] = []
        self._e_slot: list[int] = []
        self._e_start: list[int] = []
        self._e_end: list[int] = []
        self._e_kind: list[int] = []
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
            n = self._in_flight.get(slot, 0)
            if n >= cap:
                return -1
            self._in_flight[slot] = n + 1
            now = self._clock()
            self._open.setdefault(slot, []).append(now)
            self._s_slot.append(slot)
            self._s_start.append(now)
            if bound > self._bound:
                self._bound = bound
            due = len(self._s_slot) >= MAX_PENDING or now - self._last_write >= FLUSH_NS
        if due:
            self.flush()
        return now

    def wait_freed(self, slot: int, cap: int, until_ns: int) -> None:
        """Wait until ``slot`` has fewer than ``cap`` calls in flight, or until ``until_ns``."""
        with self._freed:
            while self._in_flight.get(slot, 0) >= cap:
                left = (until_ns - self._clock()) / 1e9
                if left <= 0:
                    return
                self._freed.wait(min(left, 0.05))

    def begin_many(self, slots: list[int], bound: int, cap: int) -> tuple[int, list[bool]]:
        """Calls to ``slots`` start together now: one step for all of them.

        Returns the start time (ns) and, per call, whether it was admitted (refused
        calls, over ``cap`` as in :meth:`begin`, are not recorded).
        """
        admitted = []
        with self._lock:
            now = self._clock()
            inf = self._in_flight
            for slot in slots:
                if slot < 0:  # not recordable (a fallback, or a table replaced since)
                    admitted.append(True)
                    continue
                n = inf.get(slot, 0)
                if n >= cap:
                    admitted.append(False)
                    continue
                inf[slot] = n + 1
                self._open.setdefault(slot, []).append(now)
                admitted.append(True)
                self._s_slot.append(slot)
                self._s_start.append(now)
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
            n = self._in_flight.get(slot, 0)
            if n <= 1:
                self._in_flight.pop(slot, None)
                self._open.pop(slot, None)
            else:
                self._in_flight[slot] = n - 1
                starts = self._open.get(slot)
                if starts and started_ns in starts:
                    starts.remove(started_ns)
            self._freed.notify_all()
            self._e_slot.append(slot)
            self._e_start.append(started_ns)
            self._e_end.append(now)
            self._e_kind.append(kind)
            if kind:
                self._failed_kinds = True
            due = len(self._e_slot) >= MAX_PENDING or now - self._last_write >= FLUSH_NS
        if due:
            self.flush()
        return now

    def tally(self, field: str, n: int = 1) -> None:
        """Add ``n`` to the row's lifetime total ``field`` (:data:`shm.layout.STATS_FIELDS`)."""
        with self._lock:
            self._stats[_STAT[field]] += n

    def in_flight(self, slot: int) -> int:
        """Calls this worker has in flight to ``slot`` now."""
        return self._in_flight.get(slot, 0)

    def oldest(self, slot: int) -> int | None:
        """Start time (ns) of the oldest call this worker has in flight to ``slot``."""
        with self._lock:
            starts = self._open.get(slot)
            return min(starts) if starts else None

    @property
    def pending(self) -> bool:
        """Events wait to be written."""
        return bool(self._s_slot or self._e_slot)

    # -- writing --------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending event into the counter row now (one step)."""
        with self._write_lock:
            with self._lock:
                if not (self._s_slot or self._e_slot or any(self._stats)):
                    return
                starts = (self._s_slot, self._s_start)
                ends = (self._e_slot, self._e_start, self._e_end, self._e_kind)
                failed = self._failed_kinds
                stats = self._stats
                bound = self._bound
                self._s_slot, self._s_start = [], []
                self._e_slot, self._e_start, self._e_end, self._e_kind = [], [], [], []
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
        starts: tuple[list[int], list[int]],
        ends: tuple[list[int], list[int], list[int], list[int]],
        failed: bool,
        stats: list[int],
        bound: int,
        now: int,
    ) -> None:
        if starts[0]:
            rec._record_start_trusted(
                np.array(starts[0], dtype=np.intp), np.array(starts[1], dtype=np.int64), bound
            )
        if ends[0]:
            start = np.array(ends[1], dtype=np.int64)
            durations = np.array(ends[2], dtype=np.int64) - start
            np.maximum(durations, 0, out=durations)  # (a clock is monotonic; be safe)
            kinds = np.array(ends[3], dtype=np.intp) if failed else None
            rec._record_end_trusted(
                np.array(ends[0], dtype=np.intp), start, durations, now, kinds, bound
            )
        for i, n in enumerate(stats):
            if n:
                rec._tally_trusted(i, n)
