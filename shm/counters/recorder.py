"""Recording a worker's calls into its own counter row: :class:`Recorder`."""

from __future__ import annotations

import itertools
import os
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from lbcore.errors import ArgumentError, MappingFaultError
from lbcore.fence import fence
from lbcore.kernel import calls_adder, newest_recorder, scatter_adder, scatter_adder_routed
from lbcore.outlier import FAIL_OTHER, FAILURE_KINDS
from shm.counters.matrix import C_CURRENT, Matrix
from shm.counters.reports import write_reports
from shm.errors import CounterInputError, SegmentSizeError, SlotOwnershipError
from shm.layout import KIND_FIELDS, STATS_FIELDS
from shm.seams import seam
from shm.segment import intact, kernel_guarded, words_are

if TYPE_CHECKING:
    from shm.counters.store import CounterStore

# What a fan-out's end adds to per call in its bucket column, in the order of the values
# ``Recorder._end`` passes; then ``requests_total``.
_END_FIELDS = ("open", "open_start_sum", "busy_ns", "completed", "latency_ns")
_NO_SLOTS = np.empty(0, dtype=np.int64)
_NO_CALLS: list[int] = []  # (add_calls only reads its lists)
#: :meth:`Recorder.add_calls`'s ``starts``: ``{(slot, start_ns): calls}`` still out.
Starts = dict[tuple[int, int], int]
_NO_STARTS: Starts = {}
# Up to this many calls, add_calls's list is built in Python; beyond, through NumPy.
_SMALL = 8
_I64 = np.dtype(np.int64)
_max = np.maximum.reduce
_min = np.minimum.reduce
_STAT_INDEX = {name: i for i, name in enumerate(STATS_FIELDS)}
_KIND_LIST = ", ".join(f"{c} {k}" for c, k in enumerate(FAILURE_KINDS, 1))


def _failure_codes(failed: Any, n: int) -> np.ndarray | None:
    """Failure code per call (``int64``, 0 = success) from flags or kinds; ``None``: no flags.

    Booleans count as :data:`~lbcore.outlier.FAIL_OTHER` (what a failure was before kinds).

    Raises
    ------
    CounterInputError
        Not one entry per call, not booleans or integers, or codes that name no kind.
    """
    if failed is None:
        return None
    f = failed if type(failed) is np.ndarray else np.asarray(failed)
    if f.shape != (n,):
        raise CounterInputError(f"failure flags have shape {f.shape}, expected ({n},)")
    if f.dtype == np.bool_:
        return f.astype(np.int64) * FAIL_OTHER
    if f.dtype.kind not in "iu":
        if n == 0:
            return None
        raise CounterInputError(
            f"failure flags must be booleans or integer failure kinds, got a {f.dtype} array"
        )
    if n and (_min(f) < 0 or _max(f) > FAIL_OTHER):
        bad = sorted({int(v) for v in f[(f < 0) | (f > FAIL_OTHER)].tolist()})
        raise CounterInputError(
            f"unknown failure kinds {bad[:10]}: expected 0 (success) or {_KIND_LIST}"
        )
    return f.astype(np.int64, copy=False)


def _counts(values: tuple[Any, ...], what: str) -> tuple[int, ...]:
    """Counts as Python ints ``>= 0`` (NumPy integers accepted, ``bool`` not)."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise CounterInputError(f"{what} must be integers >= 0, got {v!r}")
    return tuple(int(v) for v in values)


def _starts_at(slots: list[int], start_ns: int) -> Starts:
    """:func:`lbcore.kernel.add_calls`'s ``starts`` of calls to ``slots`` that started at once."""
    if len(slots) == 1:
        return {(slots[0], start_ns): 1}
    starts = dict.fromkeys(zip(slots, itertools.repeat(start_ns)), 1)
    if len(starts) != len(slots):  # repeated slots: their calls add up
        starts = dict.fromkeys(starts, 0)
        for s in slots:
            starts[(s, start_ns)] += 1
    return starts


def _ends(s: np.ndarray, started: Any, d: Any, kinds: Any) -> list[int]:
    """:func:`lbcore.kernel.add_calls`'s flat ``slot, start, end, kind`` per call.

    ``started``, ``d`` (durations) and ``kinds``: an ``int`` for every call or an
    ``int64`` array each.
    """
    if s.size <= _SMALL and started.__class__ is int and d.__class__ is int:
        if kinds.__class__ is int:
            end = started + d
            return [v for x in s.tolist() for v in (x, started, end, kinds)]
    calls = np.empty((s.size, 4), dtype=np.int64)
    calls[:, 0] = s
    calls[:, 1] = started
    calls[:, 2] = calls[:, 1]
    calls[:, 2] += d
    calls[:, 3] = kinds
    return calls.reshape(-1).tolist()


_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for rec in list(_RECORDERS):
        rec._epoch = -1  # the next call fails: a forked child must claim its own slot
        rec._current = int  # (int() is 0: never current)
        rec.count_sink = rec.newest_sink = None  # (the kernel's own epoch checks: gone too)
        rec._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class Recorder:
    """Records one worker's requests into its own row of the counter matrix.

    Not thread-safe: one thread per recorder (see :class:`ThreadRecorder` and
    :class:`LockedRecorder` for gthread workers). Obtained from
    :meth:`CounterStore.claim`.

    The row's protocol (which bucket column a call's open entry, busy time, completion
    and failure go to) is written in :func:`lbcore.kernel.add_calls`, and
    :meth:`add_calls` is the general way into it: :meth:`record_start` and
    :meth:`record_end` (a whole fan-out, by slots or by endpoints through a plan's slot
    map) build its input. One shortcut stands beside it, on purpose: their common case,
    a fan-out that starts, or starts and ends without failures, within the newest bucket,
    is one :func:`lbcore.scatter_add` of the same cells (add_calls takes its calls as
    Python lists, which costs several times more at a hundred calls: perf/bench_shm.py);
    its cell offsets come from the same layout, and tests/shm_tests/test_counters_calls.py
    holds the two paths to the same row, cell for cell. Slots are checked first (one
    pass), unless the caller says they are in range (``bound``); the kernel checks every
    cell against the row either way. :meth:`count`, :meth:`tally` (lifetime totals) and
    :meth:`record_reports` (the pods' reports) write the row's other cells.

    Attributes
    ----------
    row : int
        The worker slot (row) this recorder writes.
    count_sink, newest_sink, record_newest : tuple, tuple, Callable or None
        The row as the native kernel's one-call writes take it (``None`` on the NumPy
        kernel or once released): :attr:`lbcore.Plan.route_counted` adds the cells of
        :meth:`count`; ``record_newest`` (:func:`lbcore.kernel.newest_recorder`) those of
        :meth:`record_start` / :meth:`record_end` in the newest bucket (read
        ``newest_sink`` under the row's lock; ``-1``: call those).
    """

    def __init__(self, store: CounterStore, row: int) -> None:
        self.row = row
        self._store = store
        ctl = store._ctl
        self._cw = ctl.cw
        self._bucket_ns = ctl.bucket_ns
        self._k = ctl.buckets
        self._period = -(1 << 62)
        self._released = False
        self._forked = False
        self._matrix: Matrix | None = None
        self._epoch = -1
        self._bind(ctl.current())
        _RECORDERS.add(self)

    def _bind(self, m: Matrix) -> None:
        f = m.fields[self.row]
        k = self._k
        self._matrix = m
        self._ctl_seg = self._store._ctl.seg
        self._data_seg = m.seg
        self._cols = m.columns
        self._open_old = f[0]
        self._open = f[1 : 1 + k]
        self._open_sum = f[1 + k : 1 + 2 * k]
        self._busy = f[1 + 2 * k : 1 + 3 * k]
        self._completed = f[1 + 3 * k : 1 + 4 * k]
        self._latency = f[1 + 4 * k : 1 + 5 * k]
        self._failures = f[1 + 5 * k : 1 + 6 * k]
        nk = len(KIND_FIELDS)
        self._kinds = f[1 + 6 * k : 1 + (6 + nk) * k].reshape(nk, k, -1)  # (kind, bucket, slot)
        self._periods = m.periods[self.row]
        self._stats = memoryview(m.stats[self.row])  # item updates, no NumPy call
        # The whole row as one flat view; per bucket column the word offsets (in it) of
        # what a start and an end in that column add (the fast paths).
        self._row_words = m.rows2d[self.row]
        self._add = scatter_adder()  # the recording hot path's one call, resolved here
        self._add_routed = scatter_adder_routed()
        self.record_newest = newest_recorder()
        self._add_calls = calls_adder()
        lay = m.layout
        cols = m.columns
        # (Tuples of ints: the kernel takes a few offsets and values without a buffer.)
        self._start_offsets = [
            (lay["open"] + j * cols, lay["open_start_sum"] + j * cols) for j in range(k)
        ]
        self._end_offsets = [
            (*(lay[name] + j * cols for name in _END_FIELDS), lay["requests_total"])
            for j in range(k)
        ]
        # add_calls's geometry, but for the newest period (known per step).
        nb, kinds = self._k, len(KIND_FIELDS)
        kind0, total0 = lay[KIND_FIELDS[0]], lay[f"{KIND_FIELDS[0]}_total"]
        if any(
            lay[KIND_FIELDS[c]] != kind0 + c * nb * cols
            or lay[f"{KIND_FIELDS[c]}_total"] != total0 + c * cols
            for c in range(kinds)
        ):
            raise AssertionError("add_calls expects each failure kind's blocks side by side")
        self._geometry = (
            (self._bucket_ns, nb, cols),
            (
                kinds,
                *(lay[f] for f in ("open", "open_start_sum", "open_old", "busy_ns", "completed")),
                *(lay[f] for f in ("latency_ns", "requests_total", "failures", "failures_total")),
                kind0,
                total0,
            ),
        )
        self._count_cells = np.arange(3, dtype=np.int64) + lay["stats"]  # decisions..moves
        self._epoch = m.epoch
        # Per batch, "still this epoch's matrix" (1): under the kernel's SIGBUS guard where
        # its writes are too (no frame, no size probe; a fault: _faulted), else probed.
        self._guarded = kernel_guarded()
        self._current = partial(words_are, self._cw, C_CURRENT, m.epoch)
        self._stats_at = int(lay["stats"])
        if not self._guarded:
            self._current = self._probed
        self._sinks()

    def _probed(self) -> int:
        return int(intact(self._ctl_seg, self._data_seg) and self._cw[C_CURRENT] == self._epoch)

    def _faulted(self, exc: MappingFaultError) -> NoReturn:
        """A guarded write faulted: raise the verdict of the segments' sizes."""
        self._ctl_seg.check_size()
        self._data_seg.check_size()
        raise SegmentSizeError(self._data_seg.name, f"not written: {exc}")

    def _moved(self) -> bool:
        """Whether the matrix moved to another epoch (then :meth:`_follow` it).

        Checks first that neither segment was shrunk under its mapping, so a recording
        is refused (:class:`SegmentSizeError`) instead of faulting.
        """
        if intact(self._ctl_seg, self._data_seg):  # (the common case: two lseeks, no frame)
            return self._cw[C_CURRENT] != self._epoch
        self._ctl_seg.check_size()
        if self._cw[C_CURRENT] != self._epoch:
            return True  # a shrunk old matrix is left behind, not copied
        self._data_seg.check_size()
        return False

    def _follow(self) -> None:
        if self._forked:
            raise SlotOwnershipError(
                f"recorder of row {self.row} was claimed by process {self._store._pid}; "
                "a forked child must claim its own slot"
            )
        if self._released:
            raise SlotOwnershipError(f"recorder of row {self.row} was released")
        old = self._matrix
        new = self._store._ctl.current()
        if old is not None and new.epoch != old.epoch and old.seg.shrunk_to() is None:
            new.copy_row(old, self.row)  # ours is the authoritative copy of this row
        self._bind(new)

    def _rotate(self, period: int) -> None:
        """Make the bucket columns hold the ``buckets`` periods ending at ``period``.

        Requests still open that started in a recycled column's period are older than
        every bucket kept now, hence than the window: they move to ``open_old``.
        """
        if self._guarded and not intact(self._ctl_seg, self._data_seg):
            # (NumPy writes: unguarded. Rare, once per bucket: probed here, not per call.)
            self._ctl_seg.check_size()
            self._data_seg.check_size()
        k = self._k
        periods = self._periods
        # Columns of periods up to self._period are stamped already (one writer per row).
        for q in range(max(period - k + 1, self._period + 1), period + 1):
            j = q % k
            if periods[j] != q:
                seam("counters.rotate")  # once per bucket and row, not per call
                if self._open[j].any():
                    self._open_old += self._open[j]  # counted twice, never zero times
                    self._open[j] = 0
                    self._open_sum[j] = 0
                self._busy[j] = 0
                self._completed[j] = 0
                self._latency[j] = 0
                self._failures[j] = 0
                self._kinds[:, j] = 0
                fence()
                periods[j] = q
        self._period = period
        self._sinks()

    def _sinks(self) -> None:
        """The sinks for this binding and newest bucket (the row as a memoryview: cheaper)."""
        self.count_sink = self.newest_sink = None
        if self._guarded and self.record_newest is not None and self._epoch >= 0:
            row, q, j = memoryview(self._row_words), self._period, self._period % self._k
            head = (row, self._cw, C_CURRENT, self._epoch)
            self.count_sink = (row, self._stats_at, *head[1:])
            lo, offsets = q * self._bucket_ns, (self._start_offsets[j], self._end_offsets[j])
            self.newest_sink = (*head, self._cols, lo, lo + self._bucket_ns, *offsets)

    def _slots(self, slots: Any) -> np.ndarray:
        """``slots`` as a checked, contiguous 1-D ``int64`` array (the slow way).

        Follows a matrix that grew meanwhile before calling a slot out of range.
        """
        s = np.asarray(slots)
        if s.dtype != _I64:
            if s.size == 0 and s.dtype.kind in "iuf":
                return _NO_SLOTS  # an empty fan-out (say, every key went to fallback)
            if s.dtype.kind not in "iu" or s.dtype.itemsize > 8:
                raise CounterInputError(
                    f"endpoint slots must be integers, got a {s.dtype} array {s!r:.80}"
                )
            if s.dtype.kind == "u" and s.size and int(_max(s)) >= 1 << 62:
                raise CounterInputError(
                    f"endpoint slots must be in 0..{self._cols - 1} (the counter matrix has "
                    f"{self._cols} columns), got {int(_max(s))}"
                )
            s = s.astype(np.int64)
        if s.ndim != 1:
            raise CounterInputError(f"endpoint slots must be one-dimensional, got shape {s.shape}")
        s = np.ascontiguousarray(s)
        # One reduction checks both bounds: negative slots become huge as unsigned.
        if s.size and _max(s.view(np.uint64)) >= self._cols:
            if s.min() >= 0 and self._moved():
                self._follow()  # grown meanwhile: check against the new width
                return self._slots(s)
            raise CounterInputError(
                f"endpoint slots must be in 0..{self._cols - 1} (the counter matrix has "
                f"{self._cols} columns), got values from {int(s.min())} to {int(s.max())}"
            )
        return s

    def record_start(
        self, slots: Any, now_ns: int, bound: int | None = None, slot_map: Any = None
    ) -> int:
        """Record the start of one call per entry of ``slots`` (a whole fan-out).

        Builds :meth:`add_calls`'s ``starts``; a fan-out that starts at one time within
        a bucket the row holds is one scatter-add of the same cells instead.

        Parameters
        ----------
        slots
            Endpoint slot of each call (repeats allowed); with ``slot_map``, the
            endpoint index of each call (``-1``: a fallback, not recorded).
        now_ns
            CLOCK_MONOTONIC start time in nanoseconds, of every call (an ``int``) or of
            each call (an integer array, one per slot: calls that started apart and are
            recorded in one step); pass the same to :meth:`record_end` as ``started_ns``.
        bound
            The caller's promise that ``slots`` is a contiguous 1-D ``int64`` array of
            slots in ``0 .. bound - 1`` (say, a plan's counter slots and its
            ``n_slots``): then the slots are not checked here, only ``bound`` against
            the row's columns. Default: every slot is checked.
        slot_map
            Counter slot per endpoint (``int64``; a plan's :attr:`~lbcore.Plan.slots`,
            with ``bound`` its :attr:`~lbcore.Plan.n_slots`): ``slots`` are endpoint
            indices mapped through it, in one kernel call. (``bound`` and ``slot_map``
            may be passed by position: a fan-out's hot path saves the keywords' cost.)

        Returns
        -------
        int
            The calls recorded: pass the fan-out to :meth:`record_end` if not zero.

        Raises
        ------
        CounterInputError
            Slots (or endpoints) that are not integers in range, or start times that
            are not one integer per call; nothing is recorded then.
        """
        if slot_map is not None:
            if self._current() != 1 and self._moved():  # (once per fan-out)
                self._follow()
            if bound is not None and bound <= self._cols and now_ns.__class__ is int:
                b = self._bucket_ns
                q = now_ns // b
                if q > self._period:
                    self._rotate(q)
                try:  # one kernel call maps and adds
                    if q > self._period - self._k:  # a bucket this row holds
                        return self._add_routed(
                            self._row_words,
                            slot_map,
                            slots,
                            (1, now_ns - q * b),
                            self._start_offsets[q % self._k],
                        )
                    return self._add_routed(self._open_old, slot_map, slots, 1)
                except (IndexError, TypeError) as exc:
                    raise CounterInputError(str(exc)) from None
                except MappingFaultError as exc:
                    self._faulted(exc)
            slots, bound = self._routed_slots(slot_map, slots), None
        if self._moved():
            self._follow()
        s = slots if bound is not None and bound <= self._cols else self._slots(slots)
        if now_ns.__class__ is not int and isinstance(now_ns, np.integer):
            now_ns = int(now_ns)
        if now_ns.__class__ is int:
            b = self._bucket_ns
            q = now_ns // b
            if q > self._period:
                self._rotate(q)
            if q > self._period - self._k:  # the fast path: a bucket this row holds
                self._add(self._row_words, s, (1, now_ns - q * b), self._start_offsets[q % self._k])
            else:  # a thread that took long to get the row's lock: older than every bucket
                self._write(_NO_CALLS, _NO_CALLS, _starts_at(s.tolist(), now_ns), now_ns)
        else:
            t = np.asarray(now_ns)
            if t.dtype.kind not in "iu" or t.shape != s.shape:
                raise CounterInputError(
                    f"start times must be one integer per call ({s.size}), got a "
                    f"{t.dtype} array of shape {t.shape}"
                )
            if s.size:
                starts: Starts = {}
                for key in zip(s.tolist(), t.astype(np.int64).tolist(), strict=True):
                    starts[key] = starts.get(key, 0) + 1
                self._write(_NO_CALLS, _NO_CALLS, starts, int(_max(t)))
        return int(s.size)

    def add_calls(self, ended: list[int], done: list[int], starts: Starts, now_ns: int) -> None:
        """Add calls to the row: their ends, then their starts (the general write).

        The cells :meth:`record_end` of each part and :meth:`record_start` with a time
        per call record, in one :func:`lbcore.kernel.add_calls` call on the caller's
        own lists (this rotates the row's buckets and follows grown counters first):
        everything checked before anything is added, then the ends, a release fence,
        the starts, so a reader never sees a call in flight that is not.

        Parameters
        ----------
        ended
            Calls whose starts were recorded, flat: ``slot, start_ns, end_ns, kind``
            per call (``kind``: 0 success, a failure code of
            :data:`lbcore.outlier.FAILURE_KINDS` from 1, or ``-1``: cut short by the
            caller's deadline: busy time only, as ``completed=False``).
        done
            Calls that started and ended since the last step (their starts never
            recorded: ``opened=False``), flat as ``ended``.
        starts
            ``{(slot, start_ns): calls}`` of calls still out.
        now_ns
            CLOCK_MONOTONIC time now, in nanoseconds (no call ended later).

        Raises
        ------
        CounterInputError
            A slot outside the row, an unknown failure kind or a bad time; nothing is
            recorded then.
        """
        if self._moved():
            self._follow()
        if ended or done:
            self._write(ended, done, starts, int(now_ns))
        elif starts:
            self._write(ended, done, starts, max(t for _, t in starts))

    def _write(self, ended: list[int], done: list[int], starts: Starts, now_ns: int) -> None:
        """Add calls to the row with :func:`lbcore.kernel.add_calls` (see :meth:`add_calls`).

        Rotates the row's buckets up to ``now_ns`` first (the newest time of the calls);
        the caller has followed a moved matrix already.
        """
        period = now_ns // self._bucket_ns
        if period > self._period:
            self._rotate(period)
        if not (ended or done or starts):
            return
        try:
            head, tail = self._geometry
            self._add_calls(self._row_words, ended, done, starts, (*head, self._period, *tail))
        except (ArgumentError, TypeError, OverflowError) as exc:
            if self._moved():  # grown meanwhile: check again
                self._follow()
                return self._write(ended, done, starts, now_ns)
            raise CounterInputError(str(exc)) from None

    def _routed_slots(self, slot_map: np.ndarray, endpoints: np.ndarray) -> np.ndarray:
        """The checked slots of routed calls (the general paths of a slot map's records)."""
        e = np.asarray(endpoints)
        m = np.asarray(slot_map)
        if e.ndim != 1 or (e.size and e.dtype.kind not in "iu"):
            raise CounterInputError(f"endpoints must be a 1-D integer array, got {e.dtype}")
        e = e[e >= 0]
        if e.size and int(e.max()) >= m.size:
            raise CounterInputError(
                f"endpoint {int(e.max())} is not in the slot map's 0..{m.size - 1}"
            )
        return self._slots(m[e] if e.size else _NO_SLOTS)

    def record_end(
        self,
        slots: Any,
        started_ns: Any,
        durations_ns: Any,
        now_ns: int,
        failed: Any = None,
        bound: int | None = None,
        slot_map: Any = None,
        *,
        opened: bool = True,
        completed: bool = True,
    ) -> None:
        """Record the end of calls started by :meth:`record_start` (a whole fan-out).

        Builds :meth:`add_calls`'s ``ended`` (or ``done``); calls that all started and
        ended within the newest bucket, none failed, are one scatter-add of the same
        cells instead.

        Call ``i`` was busy from ``started_ns[i]`` to ``started_ns[i] + durations_ns[i]``;
        that busy time is spread over the time buckets it overlaps, and the call counts
        as completed (with its latency, and as a failure if ``failed[i]``) in the bucket
        where it ended.

        Parameters
        ----------
        slots
            Endpoint slot of each call, as given to :meth:`record_start`.
        started_ns
            Start time of each call (an array) or of all of them (an ``int``), in
            CLOCK_MONOTONIC nanoseconds, as given to :meth:`record_start`.
        durations_ns
            Duration in nanoseconds, ``>= 0``: of each call (an array) or of all of
            them (an ``int``).
        now_ns
            CLOCK_MONOTONIC time now, in nanoseconds (no call ended later).
        failed
            Optional, one per call: booleans (``True``: failed, counted as
            :data:`lbcore.outlier.FAIL_OTHER`) or integer failure kinds (``0``: success,
            :data:`~lbcore.outlier.FAIL_CONNECT` … :data:`~lbcore.outlier.FAIL_OTHER`).
        bound
            As in :meth:`record_start`: ``slots`` are known to be in ``0 .. bound - 1``.
        slot_map
            As in :meth:`record_start`: ``slots`` are endpoint indices mapped through it.
        opened
            ``False``: these calls' starts were never recorded (they started and ended
            between two writes of a batching caller): they are recorded as complete
            calls, and the in-flight counts, which never counted them, are left alone.
        completed
            ``False``: the caller abandoned these calls (its deadline cut them short):
            their busy time counts, they count neither as successes nor as failures
            (no completion, latency or failure; ``failed`` is ignored).

        Raises
        ------
        CounterInputError
            Mismatched lengths, slots out of range, negative durations or unknown
            failure kinds; nothing is recorded then.
        """
        if slot_map is not None:
            if self._current() != 1 and self._moved():  # (once per fan-out)
                self._follow()
            d = durations_ns
            if (
                failed is None
                and opened
                and completed
                and d.__class__ is int
                and started_ns.__class__ is int
                and d >= 0
                and bound is not None
                and bound <= self._cols
            ):
                b = self._bucket_ns
                period = now_ns // b
                if period > self._period:
                    self._rotate(period)
                if period > self._period - self._k and started_ns >= period * b:
                    # The fast path of _end as one kernel call: every call started in this
                    # bucket.
                    try:
                        self._add_routed(
                            self._row_words,
                            slot_map,
                            slots,
                            (-1, period * b - started_ns, d, 1, d, 1),
                            self._end_offsets[period % self._k],
                        )
                    except (IndexError, TypeError) as exc:
                        raise CounterInputError(str(exc)) from None
                    except MappingFaultError as exc:
                        self._faulted(exc)
                    return
            slots, bound = self._routed_slots(slot_map, slots), None
        if self._moved():
            self._follow()
        s = slots if bound is not None and bound <= self._cols else self._slots(slots)
        n = s.size
        d = durations_ns
        if d.__class__ is int and started_ns.__class__ is int and failed is None:
            if d < 0:
                raise CounterInputError(f"durations must be >= 0 ns, got {d}")
            if n:
                self._end(s, started_ns, d, int(now_ns), None, opened, completed)
            return
        if d.__class__ is not int:
            if isinstance(d, np.integer):
                d = int(d)
            else:
                d = np.asarray(d)
                if d.dtype.kind not in "iu" and not (d.size == 0 and d.dtype.kind == "f"):
                    raise CounterInputError(f"durations must be integer nanoseconds, got {d.dtype}")
                d = d.astype(np.int64)
                if d.shape != (n,):
                    raise CounterInputError(f"durations have shape {d.shape}, expected ({n},)")
                if n and _min(d) < 0:
                    raise CounterInputError(f"durations must be >= 0 ns, got {int(d.min())}")
        if d.__class__ is int and d < 0:
            raise CounterInputError(f"durations must be >= 0 ns, got {d}")
        if failed is not None:
            failed = _failure_codes(failed, n)
        started = started_ns
        if started.__class__ is not int:
            if isinstance(started, np.integer):
                started = int(started)
            else:
                started = np.asarray(started, dtype=np.int64)
                if started.shape != (n,):
                    raise CounterInputError(
                        f"start times have shape {started.shape}, expected ({n},)"
                    )
        if n:
            self._end(s, started, d, int(now_ns), failed, opened, completed)

    def _end(
        self,
        s: np.ndarray,
        started: int | np.ndarray,
        d: int | np.ndarray,
        now_ns: int,
        failed: np.ndarray | None,
        opened: bool = True,
        completed: bool = True,
    ) -> None:
        """Record the end of ``s.size > 0`` calls (see :meth:`record_end`).

        ``started`` and ``d`` are an ``int`` for every call or an ``int64`` array each;
        ``failed``: ``None`` or checked failure codes (``int64``, 0 = success);
        ``opened``: whether their starts were recorded (their open entries to take out);
        ``completed``: whether they count as completed (not abandoned).
        """
        b = self._bucket_ns
        period = now_ns // b
        if period > self._period:
            self._rotate(period)
        scalar_start = started.__class__ is int
        if not completed:
            failed = None
        elif failed is not None and not failed.any():
            failed = None
        # Threads sharing a row (LockedRecorder) may record slightly out of time order:
        # a period the row has moved past is still fine while its bucket is retained.
        if (
            failed is None
            and period > self._period - self._k
            and (started >= period * b if scalar_start else int(_min(started)) >= period * b)
        ):
            # The fast path: every call started in this bucket (and ended by now_ns), so
            # its busy time, its completion and its open entry are all in this column:
            # the cells add_calls would add, as one scatter_add.
            j = period % self._k
            # The fields an end adds to: open entries (unless never opened), busy time,
            # completion and latency and the lifetime total (unless abandoned).
            lo, hi = (0 if opened else 2), (6 if completed else 3)
            offsets = self._end_offsets[j][lo:hi]
            if scalar_start and d.__class__ is int:
                vals: Any = (-1, period * b - started, d, 1, d, 1)[lo:hi]
                self._add(self._row_words, s, vals, offsets)
            else:
                vals = np.empty((6, s.size), dtype=np.int64)
                vals[0] = -1
                vals[1] = period * b - started  # (an array for calls that started apart)
                vals[2] = d
                vals[3] = 1
                vals[4] = d
                vals[5] = 1
                self._add(self._row_words, s, vals[lo:hi].reshape(-1), offsets)
            return
        # Calls spanning buckets, ending in older retained buckets, or failed.
        kinds: Any = -1 if not completed else (0 if failed is None else failed)
        calls = _ends(s, started, d, kinds)
        if opened:
            self._write(calls, _NO_CALLS, _NO_STARTS, now_ns)
        else:
            self._write(_NO_CALLS, calls, _NO_STARTS, now_ns)

    def count(self, decisions: int, fallbacks: int = 0, moves: int = 0) -> None:
        """Add one routed batch to the row's lifetime decision totals.

        Parameters
        ----------
        decisions
            Keys routed (fallbacks included).
        fallbacks
            Keys returned as fallback (``-1``).
        moves
            Keys bounded load moved off their ring owner.

        Raises
        ------
        CounterInputError
            A negative or non-integer count; nothing is counted then.
        """
        if (
            decisions.__class__ is not int
            or fallbacks.__class__ is not int
            or moves.__class__ is not int
            or (decisions | fallbacks | moves) < 0
        ):
            decisions, fallbacks, moves = _counts((decisions, fallbacks, moves), "decision counts")
        if self._current() != 1 and self._moved():  # (once per batch or fan-out)
            self._follow()
        try:
            self._add(self._row_words, self._count_cells, (decisions, fallbacks, moves))
        except MappingFaultError as exc:
            self._faulted(exc)

    def tally(self, field: str, n: int) -> None:
        """Add ``n`` to the row's lifetime total ``field`` (one of :data:`STATS_FIELDS`).

        Raises
        ------
        CounterInputError
            An unknown field or a count that is not an integer ``>= 0``.
        """
        i = _STAT_INDEX.get(field)
        if i is None:
            raise CounterInputError(
                f"unknown stats field {field!r}, expected one of {STATS_FIELDS}"
            )
        if n.__class__ is not int or n < 0:
            (n,) = _counts((n,), "counts")
        if self._moved():
            self._follow()
        self._stats[i] += n

    def record_reports(
        self,
        slots: Any,
        values: Any,
        utils: Any,
        kinds: Any,
        identities: Any,
        now_ns: int,
        expiry_ns: int,
    ) -> None:
        """Store the pods' latest load reports in this row (:mod:`shm.counters.reports`).

        Parameters
        ----------
        slots
            Endpoint slot of each report, each at most once.
        values, kinds
            :func:`lbcore.reported.report_value` of each report.
        utils
            Each report's ``application_utilization`` (NaN: not sent).
        identities
            Each pod's :func:`lbcore.reported.pod_identity`.
        now_ns
            When they arrived (CLOCK_MONOTONIC ns).
        expiry_ns
            The report expiry (:class:`lbcore.report_settings.ReportSettings`).

        Raises
        ------
        CounterInputError
            A slot out of range or given twice; nothing is stored then.
        """
        if self._moved():
            self._follow()
        s = self._slots(slots)
        if np.unique(s).size != s.size:
            raise CounterInputError("a slot may be given one report per call")
        m = self._matrix
        assert m is not None
        write_reports(m.reports[self.row], s, (values, utils, kinds, identities), now_ns, expiry_ns)

    def release(self, now_ns: int | None = None) -> None:
        """Give the slot back (its in-flight counts are zeroed, history stays)."""
        if self._released or self._forked:
            return
        self._store._release_row(self, now_ns)
        self._released = True
        self._epoch = -1
        self.count_sink = self.newest_sink = None
