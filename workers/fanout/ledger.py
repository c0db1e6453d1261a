"""Per-call load accounting: each call counted from when it starts on the wire to its end.

:class:`CallLedger` is the one handle through which the fan-out helper
(:mod:`workers.fanout.threads`) records its calls into the worker's counter row. A call
:meth:`~CallLedger.begin` s right before its request is written and
:meth:`~CallLedger.end` s when its answer (or failure) is in, so time a call spends
queued in the worker's own pool is never counted as the pod's busy time, and in-flight
counts only calls really in flight.

Writing each start and end into shared memory on its own would cost a few NumPy calls
per call; instead events wait in short lists and reach the row together in one step:
when 64 are pending, when the last step is 2 ms old (checked at each event, and by a
pool thread that runs out of work), when a fan-out returns, and while a fan-out waits.
Other workers see a call at most that much later; its busy time is exact (start and
end times are taken when they happen, not when written). Calls that start together
(an asyncio fan-out's wave) go in with :meth:`~CallLedger.begin_many`: one step for
all.

A step never shows other workers a call that is not in flight: it writes the ends of
calls whose starts were written before first, then the calls that started and ended
since the last step as complete calls (their in-flight counts never touched), then the
starts of calls still out. A reader between two of these sees fewer calls in flight,
never more.

The ledger also holds the worker's per-endpoint count (and start times) of calls in
flight, which is what the fan-out's bulkhead caps: :meth:`~CallLedger.begin` refuses a
call to an endpoint that already has ``cap`` calls in flight from this worker (nothing
is recorded for it: a local rejection is not the pod's failure), and
:meth:`~CallLedger.oldest` tells a busy pod from a stuck one.

It writes through the worker's :class:`workers.routing.recording.Recording`, the same narrow
handle ``Router.track`` records through; each write is one step under the row's lock
(:meth:`shm.Recorder.add_calls`): the pending ends and starts, each with its own
times, worked out on the ledger's own lists and written with two
:func:`lbcore.scatter_add` calls whatever their number, and the stats deltas.
"""

from __future__ import annotations

import logging
import threading

import shm
from lbwire.orca import ResponseLoad
from shm.layout import STATS_FIELDS
from workers.fanout.reports import ReportBook
from workers.routing.recording import Recording, WarningThrottle

__all__ = ["CUT", "FLUSH_NS", "MAX_PENDING", "CallLedger"]

log = logging.getLogger("cslb.router")
_calls_lost = WarningThrottle("calls not recorded")  # once a minute per process

#: Longest time (ns) an event waits for the next write while calls keep coming.
FLUSH_NS = 2_000_000
#: Pending events that trigger a write at once.
MAX_PENDING = 64
#: The ``kind`` of a call the caller's deadline cut short: not the pod's success or failure.
CUT = -1

_STAT = frozenset(STATS_FIELDS)


class CallLedger:
    """Records one worker's calls into its counter row, in batched steps.

    Thread-safe: pool threads and the request thread share it.

    Parameters
    ----------
    recording
        The worker's recording handle (its clock is the ledger's). Without a row
        (no counters) calls are counted for the bulkhead only; a router that attached
        new counters meanwhile has the handle write into those.
    book
        Where the pods' load reports wait for the next write (``None``: reports off;
        :meth:`end` then never looks at an answer's headers).
    """

    __slots__ = (
        "_book",
        "_clock",
        "_done",
        "_due",
        "_ends",
        "_freed",
        "_lock",
        "_open",
        "_rec",
        "_starts",
        "_stats",
        "_waiting",
        "_write_lock",
    )

    def __init__(self, recording: Recording, book: ReportBook | None = None) -> None:
        self._rec = recording
        self._book = book
        self._clock = recording.clock
        self._lock = threading.Lock()  # the pending events and the calls in flight
        self._write_lock = threading.Lock()  # one write at a time, in order
        self._freed = threading.Condition(self._lock)  # an end lowered a count
        self._waiting = 0  # threads in wait_freed (an end notifies only then)
        self._open: dict[int, list[int]] = {}  # per slot: start times of its calls in flight
        # Pending events. Starts not written yet: (slot, start) -> calls. Ends, as flat
        # lists of ints (slot, start, end, kind per call; cheaper to append to and to
        # turn into one array than tuples): of calls whose starts were written, and of
        # calls that started since the last write (complete calls).
        self._starts: dict[tuple[int, int], int] = {}
        self._ends: list[int] = []
        self._done: list[int] = []
        self._stats: dict[str, int] = {}  # stats totals to add (only those tallied)
        self._due = 0  # when pending events are written at the latest (the last write + FLUSH_NS)

    # -- events ---------------------------------------------------------------------

    def begin(self, slot: int, cap: int, stuck_ns: int = 0) -> int:
        """A call to ``slot`` starts now: its start time (ns), or ``-1`` if refused.

        Parameters
        ----------
        slot
            The endpoint's counter slot (from the table the call was routed on).
        cap
            Most calls this worker may have in flight to the slot; at the cap the call
            is refused and nothing is recorded.
        stuck_ns
            If > 0, the call is refused too while the slot's oldest call in flight has
            been out this long (ns): a pod that looks stuck.
        """
        lock = self._lock  # (acquire/release: cheaper than a with block, per call)
        lock.acquire()
        try:
            out = self._open.get(slot)
            now = self._clock()
            if out is None:
                out = self._open[slot] = []
            elif len(out) >= cap or (stuck_ns and now - out[0] >= stuck_ns):
                return -1  # (out[0]: the oldest, as calls are appended in time order)
            out.append(now)
            starts = self._starts
            key = (slot, now)
            starts[key] = starts.get(key, 0) + 1
            due = len(starts) >= MAX_PENDING or now >= self._due
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

    def begin_many(self, slots: list[int], cap: int, stuck_ns: int = 0) -> tuple[int, list[bool]]:
        """Calls to ``slots`` start together now: one step for all of them.

        Returns the start time (ns) and, per call, whether it was admitted (refused
        calls, over ``cap`` or to a stuck slot as in :meth:`begin`, are not recorded).
        """
        admitted = []
        with self._lock:
            now = self._clock()
            opened = self._open
            starts = self._starts
            for slot in slots:
                if slot < 0:  # not recordable (a fallback, or a table replaced since)
                    admitted.append(True)
                    continue
                out = opened.setdefault(slot, [])
                if len(out) >= cap or (stuck_ns and out and now - out[0] >= stuck_ns):
                    admitted.append(False)
                    continue
                out.append(now)
                admitted.append(True)
                key = (slot, now)
                starts[key] = starts.get(key, 0) + 1
        self.flush()
        return now, admitted

    def answered(self, slot: int, url: str, load: ResponseLoad, busy_ns: int | None) -> int | None:
        """Note the load headers of an answer from ``slot``; the busy time to :meth:`end` with.

        The pod's ``Server-Timing`` duration when present, else ``busy_ns``. Its report
        is written to the row with the next step (:class:`workers.fanout.reports.ReportBook`).
        """
        book = self._book
        if book is None:
            return busy_ns
        with self._lock:
            return book.take(slot, url, load, busy_ns, self._clock())

    def end(self, slot: int, started_ns: int, kind: int = 0, busy_ns: int | None = None) -> int:
        """The call to ``slot`` that :meth:`begin` started at ``started_ns`` ended now.

        ``kind``: how it failed (:mod:`lbcore.outlier`'s ``FAIL_*`` code; 0: it did
        not; :data:`CUT`: the caller's deadline cut it short, neither a success nor a
        failure: only its busy time counts). ``busy_ns``: the call's busy time as the
        transport measured it on the wire (libcurl's timings), recorded instead of the
        time since ``started_ns`` (which also holds the time the answer waited for this
        process); ``None``: that time. Returns the recorded end time (ns).
        """
        lock = self._lock
        lock.acquire()
        try:
            now = self._clock()
            ended = now
            if busy_ns is not None and started_ns + busy_ns < now:
                ended = started_ns + max(int(busy_ns), 0)
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
            # Its start not written yet: it goes in as a complete call instead. (Calls
            # with the same slot and start are alike to the row: which one it is does
            # not matter.)
            starts = self._starts
            key = (slot, started_ns)
            c = starts.get(key)
            if c is None:
                ends = self._ends
            else:
                if c == 1:
                    del starts[key]
                else:
                    starts[key] = c - 1
                ends = self._done
            ends += (slot, started_ns, ended, kind)
            due = len(ends) >= 4 * MAX_PENDING or now >= self._due
        finally:
            lock.release()
        if due:
            self.flush()
        return ended

    def tally(self, field: str, n: int = 1) -> None:
        """Add ``n`` to the row's lifetime total ``field`` (:data:`shm.layout.STATS_FIELDS`)."""
        with self._lock:
            if field not in _STAT:
                raise KeyError(f"no stats field {field!r} (see shm.layout.STATS_FIELDS)")
            stats = self._stats
            stats[field] = stats.get(field, 0) + n

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
        return bool(self._starts or self._ends or self._done)

    # -- writing --------------------------------------------------------------------

    def flush(self) -> None:
        """Write every pending event into the counter row now (one step)."""
        book = self._book
        with self._write_lock:
            with self._lock:
                reported = book is not None and book.pending
                if not (self._starts or self._ends or self._done or self._stats or reported):
                    return
                starts, ends, done, stats = self._starts, self._ends, self._done, self._stats
                self._starts, self._ends, self._done = {}, [], []
                self._stats = {}
                reports: dict[int, tuple[float, float, int, int]] = {}
                if reported:
                    assert book is not None
                    reports, malformed = book.drain()
                    if malformed:
                        stats["reports_malformed"] = stats.get("reports_malformed", 0) + malformed
                now = self._clock()
                self._due = now + FLUSH_NS
            try:
                self._rec.add_calls(ends, done, starts, now, stats)
                if reports:
                    assert book is not None
                    self._rec.record_reports(reports, now, book.settings.expiry_ns)
            except shm.ShmError as exc:  # released meanwhile, or the counters shrunk or damaged
                _calls_lost.warn(log, exc)

    def flush_due(self) -> None:
        """:meth:`flush` if the last write is :data:`FLUSH_NS` old (a pool thread's check)."""
        if (self._starts or self._ends or self._done) and self._clock() >= self._due:
            self.flush()
