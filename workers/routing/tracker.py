"""One fan-out's load, recorded: what :meth:`workers.Router.track` returns.

On enter every routed call counts as in flight at its endpoint; on exit each call ends,
with its busy time from enter to its :meth:`Tracker.done` time (default: the exit),
and failed if :meth:`Tracker.fail` was called for it. Fallback calls (``-1``) went
through the ingress and are not recorded. The tracker writes through the worker's
:class:`workers.routing.recording.Recording` (its row's lock and recorder): one start and one
end for the whole fan-out.

:meth:`Tracker.fail` logs one line (rate-limited per endpoint,
:mod:`workers.fanout.failurelog`; the exit writes the summary lines of windows that ended
with lines left out) on the ``cslb.router`` logger at WARNING: a JSON object
with ``event`` = ``"cslb_call_failed"``, ``product_id``, ``endpoint``, ``pod_ip`` (the
endpoint's host), ``node``, ``zone``, ``attempt``, ``generation``, ``call`` (position
in the fan-out) and ``pid``; the same fields are attached to the record as
``record.cslb``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

import shm
from workers.fanout.failurelog import key_text, pod_ip
from workers.routing.errors import RouterInputError, RouterStateError
from workers.routing.recording import Recording, WarningThrottle

log = logging.getLogger("cslb.router")
#: The throttles of track()'s warnings, one per process: a row shrunk or replaced under
#: the worker fails every fan-out until repaired.
START_WARN = WarningThrottle("fan-out not recorded")
END_WARN = WarningThrottle("fan-out end not recorded")

__all__ = ["Tracker", "check_indices", "table_slots"]


class Tracker:
    """Records one fan-out (from :meth:`workers.Router.track`); use it as a context manager.

    An exception inside the block still records the end (the calls are not marked
    failed by it).

    Attributes
    ----------
    idx : numpy.ndarray
        Endpoint index per call (a private copy), ``-1`` for fallback calls.
    table : shm.Table
        The table the indices belong to.
    keys : Sequence or None
        The product IDs, one per call (for the failure log line).
    attempt : int
        The attempt these calls are.
    """

    __slots__ = (
        "_bound",
        "_calls",
        "_map",
        "_marks",
        "_rec",
        "_row",
        "_slots",
        "_start",
        "_state",
        "_view",
        "attempt",
        "idx",
        "keys",
        "table",
    )

    def __init__(
        self,
        recording: Recording,
        idx: np.ndarray,
        table: shm.Table,
        keys: Sequence[Any] | None,
        attempt: int,
        slots: np.ndarray | None,
        calls: np.ndarray | None,
        bound: int,
        slot_map: np.ndarray | None = None,
        slot_view: memoryview | None = None,
    ) -> None:
        self._rec = recording
        # A private copy: the caller may reuse its array while the calls are open, and
        # fail(i) must still name the endpoint call i went to.
        self.idx = idx.copy()
        self.table = table
        self.keys = keys
        self.attempt = attempt
        # Either the counter slot per routed call (int64; empty: none recorded) and their
        # positions in idx (None: all of them), or (slots None) the plan's slot per
        # endpoint: the kernel maps idx through it on enter and exit (one call each), and
        # the slots and positions are made only if done() or fail() need them.
        self._slots = slots
        self._calls = calls
        self._map = slot_map
        # The map as the kernel's newest-bucket call takes it for less (a memoryview).
        self._view = slot_map if slot_view is None else slot_view
        self._bound = bound  # every slot is below it
        self._state = 0  # 0: made, 1: recording, 2: ended
        self._row: Any = None  # (lock, recorder) the start went to: the end goes there too
        self._marks: list[Any] | None = None  # [end times or None, failed or None]

    def __enter__(self) -> Tracker:
        if self._state:
            raise RouterStateError("a tracker records one fan-out; call router.track() again")
        self._state = 1
        rec = self._rec
        if not rec.ok:
            rec.check()
        self._start = start = rec.clock()
        row = rec.row
        if self._slots is None:
            if row is None:
                self._routed()  # nothing to record into: still check the indices
                return self
            lock = row[0]
            lock.acquire()  # (acquire/release: cheaper than a with block, per fan-out)
            try:
                r = row[1]
                sink = r.newest_sink  # (its newest bucket: one kernel call, no frame)
                n = -1 if sink is None else r.record_newest(sink, self._view, self.idx, start)
                if n < 0:
                    n = r.record_start(self.idx, start, self._bound, self._map)
            except shm.ShmError as exc:  # released meanwhile (closed, counters replaced)
                if isinstance(exc, shm.CounterInputError):
                    self._routed()  # the indices, changed since routed: say so (raises)
                START_WARN.warn(log, exc)
                return self
            finally:
                lock.release()
            if n:
                self._row = row
            return self
        if row is not None and self._slots.size:
            lock = row[0]
            lock.acquire()
            try:
                row[1].record_start(self._slots, start, bound=self._bound)
            except shm.ShmError as exc:  # released meanwhile (closed, counters replaced)
                START_WARN.warn(log, exc)
                return self
            finally:
                lock.release()
            self._row = row
        return self

    def _routed(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The slots of the routed calls and their positions (made from the map once).

        Raises
        ------
        RouterInputError
            An index outside the table's endpoints (the caller changed the array
            :meth:`workers.Router.route_table` returned before handing it to track).
        """
        slots = self._slots
        if slots is None:
            idx = self.idx
            m = self._map
            n = m.size  # type: ignore[union-attr]
            if idx.size and (int(idx.min()) < -1 or int(idx.max()) >= n):
                raise RouterInputError(
                    f"endpoint indices must be in -1..{n - 1} for a table of {n} endpoints, "
                    f"got values from {int(idx.min())} to {int(idx.max())}"
                )
            routed = idx >= 0
            calls = None
            if int(np.count_nonzero(routed)) != idx.size:
                calls = np.flatnonzero(routed)
            slots = self._slots = m[idx[routed]]  # type: ignore[index]
            self._calls = calls
        return slots, self._calls

    def _position(self, i: Any) -> int | None:
        """Index of call ``i`` among the routed calls (``None``: a fallback call)."""
        if self._state != 1:
            raise RouterStateError("the tracker is not recording (use it inside its with block)")
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise RouterInputError(f"call number must be an integer, got {i!r}")
        n = self.idx.size
        if not -n <= i < n:
            raise RouterInputError(f"call {i} does not exist in a fan-out of {n} calls")
        i = int(i) % n
        if self.idx[i] < 0:
            return None
        calls = self._routed()[1]
        if calls is None:
            return i
        return int(np.searchsorted(calls, i))

    def _mark(self, what: int) -> np.ndarray:
        """The end times (``what`` 0) or failure flags (1) of the routed calls, made once."""
        marks = self._marks
        if marks is None:
            marks = self._marks = [None, None]
        m = marks[what]
        if m is None:
            calls = self._routed()[1]
            n = self.idx.size if calls is None else calls.size
            m = marks[what] = np.full(n, -1, np.int64) if what == 0 else np.zeros(n, np.bool_)
        return m

    def done(self, i: int) -> None:
        """Call ``i`` ended now (its busy time stops here instead of at the exit)."""
        j = self._position(i)
        if j is not None:
            self._mark(0)[j] = self._rec.clock()

    def fail(self, i: int) -> None:
        """Call ``i`` failed: counted as a failure of its endpoint, logged once.

        A fallback call (``-1``) is neither counted nor logged: it went through the
        ingress, not to one of our endpoints.
        """
        j = self._position(i)
        if j is None:
            return
        failed = self._mark(1)
        if failed[j]:
            return
        failed[j] = True
        i = int(i) % self.idx.size
        t = self.table
        e = int(self.idx[i])
        ep = t.endpoints[e]
        self._rec.failed(
            {
                "event": "cslb_call_failed",
                "product_id": None if self.keys is None else key_text(self.keys[i]),
                "endpoint": ep,
                "pod_ip": pod_ip(ep),
                "node": t.nodes[e],
                "zone": t.zones[e],
                "attempt": self.attempt,
                "generation": t.generation,
                "call": i,
                "pid": os.getpid(),
            }
        )

    def __exit__(self, *exc: object) -> None:
        if self._state != 1:
            return
        self._state = 2
        # Windows that ended with failure lines left out get their summary line now: with
        # track() alone nothing else writes it once the endpoint stops failing.
        self._rec.failure_log.tick()
        row = self._row
        if row is None:
            return
        end = self._rec.clock()
        start = self._start
        marks = self._marks
        if marks is None and self._slots is None:
            lock = row[0]
            lock.acquire()
            try:
                took = end - start if end > start else 0
                r = row[1]
                sink = r.newest_sink
                idx = self.idx
                if sink is None or r.record_newest(sink, self._view, idx, start, took, end) < 0:
                    r.record_end(idx, start, took, end, None, self._bound, self._map)
            except shm.ShmError as exc:  # released meanwhile: nothing to add to
                END_WARN.warn(log, exc)
            finally:
                lock.release()
            return
        failed = None
        if marks is None or marks[0] is None:
            durations: Any = end - start if end > start else 0  # every call: one int
        else:
            ends = marks[0]
            durations = np.maximum(np.where(ends < 0, end, ends) - start, 0)
        if marks is not None:
            failed = marks[1]
        lock = row[0]
        lock.acquire()
        try:
            slots = self._routed()[0]
            row[1].record_end(slots, start, durations, end, failed, bound=self._bound)
        except shm.ShmError as exc:  # released meanwhile: nothing to add to
            END_WARN.warn(log, exc)
        finally:
            lock.release()


_umax = np.maximum.reduce
_NO_SLOTS = np.empty(0, dtype=np.int64)


def check_indices(idx: Any, n: int) -> np.ndarray:
    """Validated endpoint indices (``route``'s own ``int32`` arrays pass without a copy)."""
    arr = idx if type(idx) is np.ndarray else np.asarray(idx)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise RouterInputError(
            f"endpoint indices must be a 1-D integer array, got {arr.dtype} of shape {arr.shape}"
        )
    if arr.dtype != np.int32 and arr.dtype != np.int64:
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= n:
            # Checked before the conversion: 2**64 - 1 as int64 would be -1 (fallback).
            raise RouterInputError(
                f"endpoint indices must be in -1..{n - 1} for a table of {n} endpoints, got "
                f"{int(arr.max())}"
            )
        arr = arr.astype(np.int64)  # unsigned or narrow: compare and index safely
    # -1 <= i < n for all i, in one reduction: i + 1 as unsigned is below n + 1.
    if arr.size and int(_umax((arr + 1).view(np.uint32 if arr.itemsize == 4 else np.uint64))) > n:
        raise RouterInputError(
            f"endpoint indices must be in -1..{n - 1} for a table of {n} endpoints, got "
            f"values from {int(arr.min())} to {int(arr.max())}"
        )
    return arr


def table_slots(t: shm.Table, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Counter slots of the routed calls of ``arr`` from ``t`` itself (not the current plan).

    Empty when ``t``'s buffer was reused since: its slots are gone, and not recording
    beats recording onto other endpoints' columns.
    """
    routed = arr >= 0
    calls = None
    if int(np.count_nonzero(routed)) != arr.size:
        calls = np.flatnonzero(routed)
        arr = arr[routed]
    slots = t.slots.take(arr).astype(np.int64)
    if slots.size and (not t.valid() or int(slots.max()) >= t.n_slots or int(slots.min()) < 0):
        log.warning(
            "fan-out on table generation %d not recorded: that table was replaced twice "
            "since it was routed on",
            t.generation,
        )
        return _NO_SLOTS, calls
    return slots, calls
