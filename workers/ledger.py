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

It writes through the worker's :class:`workers.recording.Recording`, the same narrow
handle ``Router.track`` records through; each write is one step under the row's lock:
the pending starts (each with its own start time), the pending ends and the stats
deltas, each a few :func:`lbcore.scatter_add` calls whatever their number.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

import shm
from shm.layout import STATS_FIELDS
from workers.recording import Recording

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
    recording
        The worker's recording handle (its clock is the ledger's). Without a row
        (no counters) calls are counted for the bulkhead only; a router that attached
        new counters meanwhile has the handle write into those.
    """

    __slots__ = (
        "_clock",
        "_due",
        "_e_end",
        "_e_kind",
        "_e_slot",
        "_e_start",
        "_freed",
        "_lock",
        "_open",
        "_rec",
        "_s_slot",
        "_s_time",
        "_stats",
        "_waiting",
        "_warned",
        "_write_lock",
    )

    def __init__(self, recording: Recording) -> None:
        self._rec = recording
        self._clock = recording.clock
        self._lock = threading.Lock()  # the pending events and the calls in flight
        self._write_lock = threading.Lock()  # one write at a time, in order
        self._freed = threading.Condition(self._lock)  # an end lowered a count
        self._waiting = 0  # threads in wait_freed (an end notifies only then)
        self._open: dict[int, list[int]] = {}  # per slot: start times of its calls in flight
        # Pending events, one list of ints per field (cheaper to append to, and to turn
        # into arrays, than tuples): starts (slot, time), ends (slot, start, end, kind).
        self._s_slot, self._s_time = _buffer(), _buffer()
        self._e_slot, self._e_start, self._e_end, self._e_kind = (
            _buffer(),
            _buffer(),
            _buffer(),
            _buffer(),
        )
        self._stats = [0] * len(STATS_FIELDS)
        self._due = 0  # when pending events are written at the latest (the last write + FLUSH_NS)
        self._warned = False

    # -- events ---------------------------------------------------------------------

    def begin(self, slot: int, cap: int) -> int:
        """A call to ``slot`` starts now: its start time (ns), or ``-1`` if refused.

        Parameters
        ----------
        slot
            The endpoint's counter slot (from the table the call was routed on).
        cap
            Most calls this worker may have in flight to the slot; at the cap the call
            is refused and nothing is recorded.
        """
        lock = self._lock  # (acquire/release: cheaper than a with block, per call)
        lock.acquire()
        try:
            out = self._open.get(slot)
            if out is None:
                out = self._open[slot] = []
            elif len(out) >= cap:
                return -1
            now = self._clock()
            out.append(now)
            self._s_slot.append(slot)
            times = self._s_time
            times.append(now)
            due = len(times) >= MAX_PENDING or now >= self._due
        finally:
            lock.release()
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

    def begin_many(self, slots: list[int], cap: int) -> tuple[int, list[bool]]:
        """Calls to ``slots`` start together now: one step for all of them.

        Returns the start time (ns) and, per call, whether it was admitted (refused
        calls, over ``cap`` as in :meth:`begin`, are not recorded).
        """
        admitted = []
        with self._lock:
            now = self._clock()
            opened = self._open
            s_slot, s_time = self._s_slot, self._s_time
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
                s_slot.append(slot)
                s_time.append(now)
        self.flush()
        return now, admitted

    def end(self, slot: int, started_ns: int, kind: int = 0) -> int:
        """The call to ``slot`` that :meth:`begin` started at ``started_ns`` ended now.

        ``kind``: how it failed (:mod:`lbcore.outlier`'s ``FAIL_*`` code; 0: it did
        not). Returns the end time (ns).
        """
        lock = self._lock
        lock.acquire()
        try:
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
            self._e_slot.append(slot)
            self._e_start.append(started_ns)
            self._e_kind.append(kind)
            ends = self._e_end
            ends.append(now)
            due = len(ends) >= MAX_PENDING or now >= self._due
        finally:
            lock.release()
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
        return bool(self._s_slot or self._e_slot)

    # -- writing --------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending event into the counter row now (one step)."""
        with self._write_lock:
            with self._lock:
                if not (self._s_slot or self._e_slot or any(self._stats)):
                    return
                s_slot, s_time = self._s_slot, self._s_time
                e_slot, e_start, e_end, e_kind = (
                    self._e_slot,
                    self._e_start,
                    self._e_end,
                    self._e_kind,
                )
                stats = self._stats
                self._s_slot, self._s_time = _buffer(), _buffer()
                self._e_slot, self._e_start, self._e_end, self._e_kind = (
                    _buffer(),
                    _buffer(),
                    _buffer(),
                    _buffer(),
                )
                self._stats = [0] * len(STATS_FIELDS)
                now = self._clock()
                self._due = now + FLUSH_NS
            s = e = None
            if s_slot:
                s = (_array(s_slot), _array(s_time))
            if e_slot:
                began = _array(e_start)
                durations = _array(e_end) - began
                np.maximum(durations, 0, out=durations)  # (a clock is monotonic; be safe)
                kinds = _array(e_kind)
                e = (_array(e_slot), began, durations, kinds if kinds.any() else None)
            tallies = {STATS_FIELDS[i]: n for i, n in enumerate(stats) if n}
            try:
                self._rec.calls(s, e, now, tallies)
            except shm.ShmError as exc:  # released meanwhile (closed, counters replaced)
                if not self._warned:
                    self._warned = True
                    log.warning("calls not recorded: %s", exc)


def _buffer() -> list[int]:
    return []


def _array(values: list[int]) -> np.ndarray:
    return np.fromiter(values, np.int64, len(values))
