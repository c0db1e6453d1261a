"""Per-worker load counters in shared memory, summed host-wide by readers.

The counter matrix has one row per *worker slot* and one column per *endpoint slot*
(the stable counter slot a :class:`~shm.tables.TableWriter` gives each endpoint). Each
row has exactly one writer, the process (or thread) that claimed it, so cells are plain
aligned ``int64`` words updated without locks or atomics; readers sum the rows.

Per cell (row, endpoint slot), per time bucket (``bucket_ns`` wide; ``window_buckets``
of them span the occupancy window, two more are kept so a bucket is recycled only once
it is out of every reader's window):

* ``open``, ``open_start_sum``: requests started in the bucket and not yet ended, and
  the sum of their start times relative to the bucket's start, so readers can count the
  busy time of open requests, each at most for the window (a request open for minutes
  counts one window, not its age);
* ``busy_ns`` (time spent waiting on the endpoint inside the bucket), ``completed``,
  ``latency_ns`` (summed durations of requests that ended in the bucket) and
  ``failures``, and the failures of each kind (``failures_connect``,
  ``failures_timeout``, ``failures_status``, ``failures_other``: the codes of
  :mod:`lbcore.outlier`), which sum to ``failures``;

and ``open_old``: open requests that started before every bucket the row holds (older
than the window, so each counts one full window).

Each row also records which time bucket each of its bucket columns holds
(``periods``). The row's writer recycles a bucket column (moves its open requests to
``open_old``, zeroes it, then stamps the new period) when time moves on; readers weigh
every bucket by the share of it inside the window
(:func:`lbcore.signals.window_weights`), so buckets of idle or dead workers age out
without anyone writing to them. Time is CLOCK_MONOTONIC nanoseconds, passed in.

Readers take no lock and see each cell's value indivisibly, but not a cross-cell
snapshot: a sum read while a worker records may count a request's ``completed``
without yet its ``latency_ns``. These are load signals; such skew lasts microseconds.

Worker slots are claimed and released under a lock (``flock``, released by the kernel
if the holder dies): rare operations, never on the recording path. An owner is a PID
plus that process's start time, so a reused PID is not mistaken for the owner. A slot
whose owner died (SIGKILL, OOM) is reclaimed by :meth:`CounterStore.reap` or by the
next :meth:`CounterStore.claim` that needs it: its in-flight counts are released
(zeroed), its busy history stays until it ages out of the window.

The matrix grows when the tables need more endpoint slots
(:meth:`CounterStore.ensure_columns`): a new data segment ``/cslb.<ns>.counters.<n>``
receives a copy of every row and the control segment then names it. Each recorder
notices the new epoch on its next call (one shared-memory load per call) and copies
its own row over again, since it may have recorded into the old segment after the
grower copied it; rows of idle or dead workers keep the grower's copy.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lbcore.bounded import routed_call_load
from lbcore.errors import ArgumentError
from lbcore.kernel import calls_adder, scatter_add, scatter_adder, scatter_adder_routed
from lbcore.outlier import FAIL_OTHER, FAILURE_KINDS
from lbcore.signals import (
    DEFAULT_LATENCY_CAP,
    DEFAULT_WINDOW_NS,
    LOAD_SIGNALS,
    effective_load,
    load_for,
    window_weights,
    with_failures,
)
from lbcore.signals import mean_latency as _mean_latency
from lbcore.signals import occupancy as _occupancy
from shm.errors import (
    CapacityError,
    CounterInputError,
    NoFreeSlotError,
    SegmentCorruptError,
    SegmentExistsError,
    SegmentLayoutError,
    SegmentMissingError,
    SegmentSizeError,
    SlotOwnershipError,
)
from shm.layout import (
    BUCKET_FIELDS,
    COUNTER_FIELDS,
    COUNTERS_CONTROL,
    COUNTERS_DATA,
    KIND_FIELDS,
    LAYOUT_VERSION,
    MAGIC_COUNTERS_CONTROL,
    MAGIC_COUNTERS_DATA,
    SLOT,
    SLOT_CLAIMED,
    SLOT_FREE,
    SLOT_RESERVED,
    STATS_FIELDS,
    TOTAL_FIELDS,
    align,
    cell_words,
    row_layout,
    word,
)
from shm.segment import (
    Segment,
    attach_initialized,
    check_header,
    current_inode,
    epoch_segments,
    fence,
    own_start_ticks,
    process_alive,
    seam,
    segment_lock,
    segment_name,
    unlink_name,
    unlink_stale_epochs,
    unreaped_child,
)

__all__ = [
    "DEFAULT_ROWS",
    "DEFAULT_WINDOW_BUCKETS",
    "CounterReader",
    "CounterStore",
    "HostLoads",
    "LockedRecorder",
    "Recorder",
    "SlotInfo",
    "ThreadRecorder",
    "bucket_weights",
]

#: Default number of worker slots (rows): workers x threads of one host, with room.
DEFAULT_ROWS = 32
#: Default number of time buckets spanning the occupancy window (1 s each for 10 s).
DEFAULT_WINDOW_BUCKETS = 10
_MAX_ROWS = 4096
_MAX_COLUMNS = 1 << 22
_HEADER_BYTES = 4096
_PAGE = 4096

_C_MAGIC = word(COUNTERS_CONTROL, "magic")
_C_CURRENT = word(COUNTERS_CONTROL, "current")
#: Data epochs a control segment may name: 1 up to (not including) this. Any other value
#: in the ``current`` word was written by something else (the counters are shared with
#: every process of the user) and would overflow the next epoch's header.
_MAX_EPOCH = 1 << 62


def _epoch_word(seg: Segment, value: int) -> int:
    """``value`` (the control segment's ``current`` word) if it is a plausible epoch.

    Raises
    ------
    SegmentCorruptError
        It is not (0, or at least 2**62).
    """
    epoch = int(value)
    if not 1 <= epoch < _MAX_EPOCH:
        raise SegmentCorruptError(seg.name, f"names data epoch {epoch}, out of range")
    return epoch


def _columns_for(n: int) -> int:
    return max(8, align(int(n), 8))


# ------------------------------------------------------------------------------------
# Segment views.


class _Matrix:
    """Zero-copy views of one counters data segment."""

    def __init__(self, seg: Segment, epoch: int, rows: int, buckets: int) -> None:
        hdr = check_header(seg, COUNTERS_DATA, MAGIC_COUNTERS_DATA, "a cslb counters data segment")
        h = hdr[0]
        cols, k, row_words, off = (
            int(h["columns"]),
            int(h["buckets"]),
            int(h["row_words"]),
            int(h["rows_offset"]),
        )
        if int(h["epoch"]) != epoch or int(h["rows"]) != rows or k != buckets:
            raise SegmentLayoutError(
                seg.name,
                f"header says epoch {int(h['epoch'])}, {int(h['rows'])} rows, {k} buckets; "
                f"the control segment says epoch {epoch}, {rows} rows, {buckets} buckets",
            )
        layout = row_layout(cols, k) if 0 < cols <= _MAX_COLUMNS and cols % 8 == 0 else None
        if (
            layout is None
            or row_words != layout["row_words"]
            or off < COUNTERS_DATA.itemsize
            or off % 64
            or off + rows * row_words * 8 > seg.size
        ):
            raise SegmentLayoutError(
                seg.name,
                f"{rows} rows of {row_words} words for {cols} columns at offset {off} do not "
                f"fit a {seg.size}-byte segment",
            )
        self.seg = seg
        self.epoch = epoch
        self.columns = cols
        self.buckets = k
        self.layout = layout
        self.rows2d = seg.array(np.int64, off, rows * row_words).reshape(rows, row_words)
        p = layout["open_old"]
        # (rows, 1 + len(BUCKET_FIELDS) * buckets, columns): open_old, then the bucket fields.
        self.fields = self.rows2d[:, p : p + cell_words(k) * cols].reshape(
            rows, cell_words(k), cols
        )
        self.periods = self.rows2d[:, :k]
        st = layout["stats"]
        self.stats = self.rows2d[:, st : st + 8]
        t = layout[TOTAL_FIELDS[0]]
        # (rows, len(TOTAL_FIELDS), columns): requests_total, failures_total, then per kind.
        self.totals = self.rows2d[:, t : t + len(TOTAL_FIELDS) * cols].reshape(
            rows, len(TOTAL_FIELDS), cols
        )

    def block(self, row: int, name: str) -> np.ndarray:
        """View of one part of row ``row``.

        ``open_old`` (``[columns]``) or one of :data:`~shm.layout.BUCKET_FIELDS`
        (``[buckets][columns]``).
        """
        if name == "open_old":
            return self.fields[row, 0]
        i = 1 + BUCKET_FIELDS.index(name) * self.buckets
        return self.fields[row, i : i + self.buckets]

    def copy_row(self, src: _Matrix, r: int) -> None:
        """Copy row ``r`` of ``src`` (fewer or equal columns) into this matrix."""
        c = src.columns
        self.periods[r] = src.periods[r]
        self.stats[r] = src.stats[r]
        self.fields[r, :, :c] = src.fields[r]
        self.totals[r, :, :c] = src.totals[r]


class _Control:
    """The counters control segment: geometry, current data epoch, slot table."""

    def __init__(self, seg: Segment) -> None:
        hdr = check_header(
            seg, COUNTERS_CONTROL, MAGIC_COUNTERS_CONTROL, "a cslb counters control segment"
        )
        h = hdr[0]
        self.seg = seg
        self.cw = seg.words
        self.rows = int(h["rows"])
        self.buckets = int(h["buckets"])
        self.window_buckets = int(h["window_buckets"])
        self.bucket_ns = int(h["bucket_ns"])
        self.window_ns = int(h["window_ns"])
        self.base_ns = int(h["base_ns"])
        off = int(h["slots_offset"])
        if (
            not 1 <= self.rows <= _MAX_ROWS
            or self.buckets != self.window_buckets + 2
            or self.bucket_ns <= 0
            or self.window_ns <= 0
            or off < COUNTERS_CONTROL.itemsize
            or off % 64
            or off + self.rows * SLOT.itemsize > seg.size
        ):
            raise SegmentLayoutError(
                seg.name,
                f"geometry out of range: {self.rows} rows, {self.buckets} buckets "
                f"({self.window_buckets} in the window) of {self.bucket_ns} ns, slot table "
                f"at {off} in {seg.size} bytes",
            )
        self.slots = seg.array(SLOT, off, self.rows)
        self.matrix: _Matrix | None = None

    def current(self) -> _Matrix:
        """The current data segment's matrix, attaching it if the epoch moved.

        Raises
        ------
        SegmentSizeError
            The control or the current data segment was shrunk under its mapping.
        """
        self.seg.check_size()
        while True:
            epoch = _epoch_word(self.seg, self.cw[_C_CURRENT])
            m = self.matrix
            if m is not None and m.epoch == epoch:
                m.seg.check_size()
                return m
            name = f"{self.seg.name}.{epoch}"
            try:
                seg = Segment.attach(name, writable=self.seg.writable, min_size=_HEADER_BYTES)
            except SegmentMissingError:
                if self.cw[_C_CURRENT] != epoch:
                    continue  # grown again meanwhile
                raise
            self.matrix = _Matrix(seg, epoch, self.rows, self.buckets)
            return self.matrix


def _attach_control(namespace: str, *, writable: bool) -> _Control:
    name = segment_name(namespace, "counters")
    return _Control(attach_initialized(name, writable=writable, min_size=_HEADER_BYTES))


def _create_data(name: str, epoch: int, rows: int, columns: int, buckets: int) -> Segment:
    layout = row_layout(columns, buckets)
    size = align(_HEADER_BYTES + rows * layout["row_words"] * 8, _PAGE)
    seg = Segment.create_replacing(name, size)
    h = seg.header(COUNTERS_DATA)
    h["version"] = LAYOUT_VERSION
    h["size"] = size
    h["epoch"] = epoch
    h["rows"] = rows
    h["columns"] = columns
    h["buckets"] = buckets
    h["row_words"] = layout["row_words"]
    h["rows_offset"] = _HEADER_BYTES
    rows2d = seg.array(np.int64, _HEADER_BYTES, rows * layout["row_words"]).reshape(rows, -1)
    rows2d[:, :buckets] = -1  # no bucket holds a period yet
    fence()
    h["magic"] = MAGIC_COUNTERS_DATA
    return seg


# ------------------------------------------------------------------------------------
# Slot information.


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """State of one worker slot (row)."""

    row: int
    claimed: bool
    pid: int
    thread_id: int
    alive: bool
    claims: int
    used: bool
    reserved: bool = False


# ------------------------------------------------------------------------------------
# Store.


class CounterStore:
    """A namespace's counter matrix: create it (the owner) or attach to it.

    Use :meth:`create` in the process that owns the counters (the gunicorn master or
    the discovery process) and :meth:`attach` elsewhere; workers call :meth:`claim`
    to get their :class:`Recorder`.
    """

    def __init__(self, control: _Control, namespace: str, *, owner: bool) -> None:
        self.namespace = namespace
        self._ctl = control
        self._owner = owner
        self._closed = False
        self._pid = os.getpid()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        namespace: str,
        *,
        rows: int = DEFAULT_ROWS,
        columns: int = 64,
        window_ns: int = DEFAULT_WINDOW_NS,
        window_buckets: int = DEFAULT_WINDOW_BUCKETS,
        replace_invalid: bool = False,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> CounterStore:
        """Create the counters of ``namespace``, or take over existing ones.

        Existing counters of the same geometry are taken over: a restarted owner keeps
        the history and the slots.

        Parameters
        ----------
        rows
            Worker slots: processes (or threads) that may record at the same time.
        columns
            Initial endpoint slots (grows on demand).
        window_ns
            Occupancy window, in nanoseconds.
        window_buckets
            Time buckets spanning the window.
        replace_invalid
            Replace existing segments that are foreign, of another layout version or of
            another geometry instead of raising.

        Raises
        ------
        SegmentLayoutError
            The counters exist with another geometry (and not ``replace_invalid``).
        SegmentFullError
            ``/dev/shm`` is too small.
        """
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= _MAX_ROWS:
            raise CounterInputError(f"rows must be an integer from 1 to {_MAX_ROWS}, got {rows!r}")
        if not isinstance(window_buckets, int) or not 1 <= window_buckets <= 1000:
            raise CounterInputError(
                f"window_buckets must be an integer from 1 to 1000, got {window_buckets!r}"
            )
        if not isinstance(window_ns, int) or window_ns < window_buckets:
            raise CounterInputError(
                f"window_ns must be an integer number of nanoseconds >= window_buckets, "
                f"got {window_ns!r}"
            )
        if not isinstance(columns, int) or not 1 <= columns <= _MAX_COLUMNS:
            raise CounterInputError(f"columns must be from 1 to {_MAX_COLUMNS}, got {columns!r}")
        name = segment_name(namespace, "counters")
        buckets = window_buckets + 2
        bucket_ns = -(-window_ns // window_buckets)
        slots_off = _HEADER_BYTES
        ctl_size = align(slots_off + rows * SLOT.itemsize, _PAGE)
        for _ in range(3):
            try:
                seg: Segment | None = Segment.create(name, ctl_size)
            except SegmentExistsError:
                seg = None
            with contextlib.ExitStack() as held:
                try:
                    held.enter_context(segment_lock(name))
                except SegmentMissingError:
                    continue  # removed meanwhile: start over
                # Under the lock nobody else creates, takes over or grows these counters.
                if seg is None:
                    try:
                        seg = Segment.attach(name, writable=True, min_size=8)
                    except SegmentSizeError:  # its creator died before sizing it
                        seg = Segment.reinitialize(name, ctl_size)
                if seg.words[_C_MAGIC] == 0:
                    # New, or its creator died before writing the magic (written last).
                    if seg.size != ctl_size:
                        seg.close()
                        seg = Segment.reinitialize(name, ctl_size)
                    else:
                        seg.buf[:] = bytes(ctl_size)
                    h = seg.header(COUNTERS_CONTROL)
                    h["version"] = LAYOUT_VERSION
                    h["size"] = ctl_size
                    h["rows"] = rows
                    h["buckets"] = buckets
                    h["window_buckets"] = window_buckets
                    h["bucket_ns"] = bucket_ns
                    h["window_ns"] = window_ns
                    h["base_ns"] = clock()
                    h["slots_offset"] = slots_off
                    h["created_ns"] = clock()
                    # Data segments of an earlier incarnation are nobody's now.
                    unlink_stale_epochs(namespace, "counters", None)
                    try:
                        data = _create_data(f"{name}.1", 1, rows, _columns_for(columns), buckets)
                    except BaseException:
                        seg.unlink()  # e.g. /dev/shm too small: leave nothing behind
                        raise
                    data.close()
                    h["current"] = 1
                    seam("counters.control.init")
                    fence()
                    h["magic"] = MAGIC_COUNTERS_CONTROL
                    return cls(_Control(seg), namespace, owner=True)
                try:
                    ctl = _Control(seg)
                    geometry = (ctl.rows, ctl.window_ns, ctl.window_buckets)
                    if geometry != (rows, window_ns, window_buckets):
                        raise SegmentLayoutError(
                            name,
                            f"exists with {ctl.rows} rows and a {ctl.window_ns} ns window in "
                            f"{ctl.window_buckets} buckets; asked for {rows} rows and a "
                            f"{window_ns} ns window in {window_buckets} buckets",
                        )
                    m = ctl.current()
                    # Other epochs are left by a process killed while growing the matrix
                    # (before or after the switch).
                    unlink_stale_epochs(namespace, "counters", m.epoch)
                    return cls(ctl, namespace, owner=True)
                except (SegmentCorruptError, SegmentMissingError):
                    if not replace_invalid:
                        seg.close()
                        raise
                    for seg_name in _namespace_counters(namespace):
                        unlink_name(seg_name)
            if seg is not None:
                seg.close()
        raise SegmentLayoutError(name, "could not create or take over the counters")

    @classmethod
    def attach(cls, namespace: str, *, writable: bool = True) -> CounterStore:
        """Attach to existing counters (workers: ``writable``; readers may map read-only).

        Raises
        ------
        SegmentMissingError, SegmentCorruptError
        """
        ctl = _attach_control(namespace, writable=writable)
        ctl.current()
        return cls(ctl, namespace, owner=False)

    # -- geometry -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Name of the control segment."""
        return self._ctl.seg.name

    @property
    def rows(self) -> int:
        """Worker slots."""
        return self._ctl.rows

    @property
    def columns(self) -> int:
        """Endpoint slots of the current matrix."""
        return self._ctl.current().columns

    @property
    def window_ns(self) -> int:
        """Occupancy window in nanoseconds."""
        return self._ctl.window_ns

    @property
    def bucket_ns(self) -> int:
        """Width of one time bucket in nanoseconds."""
        return self._ctl.bucket_ns

    @property
    def buckets(self) -> int:
        """Time buckets kept per row (window buckets + 2)."""
        return self._ctl.buckets

    def memory_bytes(self) -> int:
        """Size of the current data segment, in bytes."""
        return self._ctl.current().seg.size

    # -- slots --------------------------------------------------------------------------

    def claim(
        self, *, thread_id: int = 0, now_ns: int | None = None, row: int | None = None
    ) -> Recorder:
        """Claim a free worker slot (or one whose owner died) for this process.

        Parameters
        ----------
        thread_id
            ``threading.get_ident()`` when the row is for one thread of the process.
        now_ns
            CLOCK_MONOTONIC time of the claim (ns).
        row
            Adopt this row, reserved for this process by its parent (a prefork master's
            :meth:`reserve` before the fork), instead of taking any free row.

        Raises
        ------
        NoFreeSlotError
            Every slot is held by a live process (or one whose liveness cannot be
            told right now: such a slot is never taken).
        SlotOwnershipError
            ``row`` is out of range or not reserved by this process's parent (or by this
            process); nothing was claimed.
        ProcessLivenessError
            This process's own start time cannot be read from ``/proc``.
        """
        self._check_writable()
        pid = os.getpid()
        ticks = own_start_ticks()
        now = time.monotonic_ns() if now_ns is None else int(now_ns)
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            m = ctl.current()
            if row is not None:
                self._check_reserved(row, (os.getppid(), pid))
                target = int(row)
            else:
                target = self._free_row(ctl)
                _release_in_flight(m, target)
            s = ctl.slots[target : target + 1]
            s["pid"] = pid
            s["start_ticks"] = ticks
            s["thread_id"] = thread_id
            s["claimed_ns"] = now
            s["claims"] = int(s["claims"][0]) + 1
            s["used"] = 1
            fence()
            s["state"] = SLOT_CLAIMED
        return Recorder(self, target)

    def _free_row(self, ctl: _Control) -> int:
        """A free row, else one whose owner (or reserver) died; call under the lock."""
        state = ctl.slots["state"]
        free = np.flatnonzero(state == SLOT_FREE)
        if free.size:
            return int(free[0])
        for r in range(ctl.rows):
            s = ctl.slots[r]
            pid = int(s["pid"])
            # A dead child of ours not yet waited for: its exit (child_exit -> release)
            # is still to come and must not free a row handed on to a newer child.
            if not process_alive(pid, int(s["start_ticks"])) and not unreaped_child(pid):
                return r
        pids = sorted({int(p) for p in ctl.slots["pid"]})
        raise NoFreeSlotError(
            self.name,
            f"all {ctl.rows} worker slots are held by live processes "
            f"(pids {pids[:10]}{'...' if len(pids) > 10 else ''}); "
            "create the counters with more rows",
        )

    def _check_reserved(self, row: Any, holders: tuple[int, ...]) -> None:
        ctl = self._ctl
        ctl.seg.check_size()
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
            raise SlotOwnershipError(f"row must be an integer, got {row!r}")
        if not 0 <= int(row) < ctl.rows:
            raise SlotOwnershipError(
                f"row {row} is out of range: {self.name} has rows 0..{ctl.rows - 1}"
            )
        s = ctl.slots[int(row)]
        state, holder = int(s["state"]), int(s["pid"])
        if state != SLOT_RESERVED or holder not in holders:
            what = {SLOT_FREE: "free", SLOT_CLAIMED: "claimed", SLOT_RESERVED: "reserved"}
            raise SlotOwnershipError(
                f"row {row} of {self.name} is not reserved for process {os.getpid()}: it is "
                f"{what.get(state, f'in state {state}')} by pid {holder}; claim without a row"
            )

    def reserve(self, now_ns: int | None = None) -> int:
        """Reserve a worker slot for a child this process is about to fork.

        A prefork master calls this before each fork (gunicorn's ``pre_fork``); the child
        adopts the row with ``claim(row=...)``. Until then the row is held by this
        process, so no other process takes it; :meth:`release` frees it if the child
        dies before or after adopting it.

        Returns
        -------
        int
            The reserved row.

        Raises
        ------
        NoFreeSlotError
            Every slot is held by a live process.
        """
        self._check_writable()
        now = time.monotonic_ns() if now_ns is None else int(now_ns)
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            m = ctl.current()
            row = self._free_row(ctl)
            _release_in_flight(m, row)
            s = ctl.slots[row : row + 1]
            s["pid"] = os.getpid()
            s["start_ticks"] = own_start_ticks()
            s["thread_id"] = 0
            s["claimed_ns"] = now
            fence()
            s["state"] = SLOT_RESERVED
        return row

    def release(self, row: int, pid: int, now_ns: int | None = None) -> bool:
        """Free ``row`` if process ``pid`` holds it or it is still reserved by this process.

        For a prefork master's ``child_exit``: the exited child's row is freed at once
        (its in-flight counts released, history and totals kept), whether the child
        adopted it or died before that. The caller passes the row it reserved for that
        child; :meth:`reserve` never hands on the row of a child the caller has not
        waited for yet, so the row cannot have been reserved again meanwhile.

        Returns
        -------
        bool
            Whether the row was freed (``False``: someone else holds it now).
        """
        self._check_writable()
        now = time.monotonic_ns() if now_ns is None else int(now_ns)
        ctl = self._ctl
        ctl.seg.check_size()
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
            raise SlotOwnershipError(f"row must be an integer, got {row!r}")
        if not 0 <= int(row) < ctl.rows:
            raise SlotOwnershipError(
                f"row {row} is out of range: {self.name} has rows 0..{ctl.rows - 1}"
            )
        with ctl.seg.lock():
            s = ctl.slots[int(row) : int(row) + 1]
            state, holder = int(s["state"][0]), int(s["pid"][0])
            if not (
                (state == SLOT_CLAIMED and holder == int(pid))
                or (state == SLOT_RESERVED and holder in (int(pid), os.getpid()))
            ):
                return False
            _release_in_flight(ctl.current(), int(row))
            s["state"] = SLOT_FREE
            s["released_ns"] = now
        return True

    def reap(self, now_ns: int | None = None) -> list[int]:
        """Free every slot whose owner (or reserver) died; release its in-flight counts.

        Returns
        -------
        list[int]
            The rows reclaimed.
        """
        self._check_writable()
        now = time.monotonic_ns() if now_ns is None else int(now_ns)
        out = []
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            m = ctl.current()
            held = (ctl.slots["state"] == SLOT_CLAIMED) | (ctl.slots["state"] == SLOT_RESERVED)
            for r in np.flatnonzero(held).tolist():
                s = ctl.slots[r : r + 1]
                if not process_alive(int(s["pid"][0]), int(s["start_ticks"][0])):
                    _release_in_flight(m, r)
                    s["state"] = SLOT_FREE
                    s["released_ns"] = now
                    out.append(r)
        return out

    def slots(self) -> list[SlotInfo]:
        """State of every worker slot (liveness checked now)."""
        out = []
        self._ctl.seg.check_size()
        for r, s in enumerate(self._ctl.slots.copy()):
            claimed = int(s["state"]) == SLOT_CLAIMED
            out.append(
                SlotInfo(
                    row=r,
                    claimed=claimed,
                    pid=int(s["pid"]),
                    thread_id=int(s["thread_id"]),
                    alive=claimed and process_alive(int(s["pid"]), int(s["start_ticks"])),
                    claims=int(s["claims"]),
                    used=bool(s["used"]),
                    reserved=int(s["state"]) == SLOT_RESERVED,
                )
            )
        return out

    def _release_row(self, rec: Recorder, now_ns: int | None) -> None:
        now = time.monotonic_ns() if now_ns is None else int(now_ns)
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            s = ctl.slots[rec.row : rec.row + 1]
            if int(s["state"][0]) == SLOT_CLAIMED and int(s["pid"][0]) == os.getpid():
                _release_in_flight(ctl.current(), rec.row)
                s["state"] = SLOT_FREE
                s["released_ns"] = now

    # -- growth -------------------------------------------------------------------------

    def ensure_columns(self, n: int) -> int:
        """Grow the matrix to at least ``n`` endpoint slots; returns the column count.

        Raises
        ------
        CapacityError
            ``n`` exceeds the layout's limit.
        SegmentFullError
            ``/dev/shm`` is too small for the larger matrix.
        """
        if n <= self._ctl.current().columns:
            return self._ctl.matrix.columns  # type: ignore[union-attr]
        self._check_writable()
        if n > _MAX_COLUMNS:
            raise CapacityError(self.name, f"{n} endpoint slots exceed the limit of {_MAX_COLUMNS}")
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            old = ctl.current()
            if n <= old.columns:
                return old.columns
            unlink_stale_epochs(self.namespace, "counters", old.epoch)  # a killed grower's
            # At least 25 % more (growth copies every row, so keep it geometric), but
            # no doubling: /dev/shm holds the old and the new matrix until the switch.
            cols = _columns_for(max(n, old.columns + old.columns // 4))
            epoch = old.epoch + 1
            seg = _create_data(f"{self.name}.{epoch}", epoch, ctl.rows, cols, ctl.buckets)
            new = _Matrix(seg, epoch, ctl.rows, ctl.buckets)
            for r in np.flatnonzero(ctl.slots["used"] != 0).tolist():
                new.copy_row(old, r)
            fence()
            seam("counters.grow.switch")
            ctl.cw[_C_CURRENT] = epoch
            seam("counters.grow.switched")
            ctl.matrix = new
            old.seg.unlink()
            old.seg.close()
            return cols

    def reset_totals(self, slots: Any) -> None:
        """Zero the lifetime request and failure totals of endpoint ``slots`` in every row.

        For a table writer handing a freed slot to a new endpoint: its Prometheus
        counters must start at zero, not at the previous endpoint's totals. Only freed
        slots (no worker routes to them any more, and the occupancy window has passed
        since) may be reset; a call still open on the old endpoint that ends after
        this is counted for the new one.

        Raises
        ------
        CounterInputError
            A slot out of range.
        """
        self._check_writable()
        idx = np.asarray(slots, dtype=np.intp).ravel()
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            m = ctl.current()
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= m.columns):
                raise CounterInputError(
                    f"endpoint slots must be in 0..{m.columns - 1}, got {idx.tolist()[:10]}"
                )
            m.totals[:, :, idx] = 0

    # -- lifecycle ----------------------------------------------------------------------

    def replaced(self) -> bool:
        """True if the control segment this store maps was removed or recreated.

        That happens when the owner closed the counters (which removes them) or
        replaced invalid ones. Recorders of this store then write into segments no
        new reader sees, and readers see only the old rows: attach again and claim a
        new slot (a worker should check this about once a second; one ``stat`` call).
        """
        return (
            current_inode(self.name) != self._ctl.seg.inode
            or self._ctl.seg.shrunk_to() is not None
        )

    def repair(self) -> bool:
        """Replace a current data segment that was shrunk, removed or damaged; True if done.

        For the owner (the gunicorn master): a new data epoch of the same width takes
        its place, its rows starting empty (the shrunk one cannot be read). Recorders
        follow the epoch on their next call, as after growth; readers on their next
        read. A shrunk control segment cannot be repaired in place: :meth:`replaced`
        is True then, and the owner creates the counters again.

        Raises
        ------
        SegmentSizeError
            The control segment itself was shrunk.
        """
        self._check_writable()
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            readable: _Matrix | None = None
            try:
                readable = ctl.current()
                if current_inode(readable.seg.name) == readable.seg.inode:
                    return False
                # Unlinked (a /dev/shm cleanup): whole still, but nobody new can map it.
            except (SegmentCorruptError, SegmentMissingError):
                # Shrunk, removed or overwritten: the owner makes a new one either way.
                if ctl.seg.shrunk_to() is not None:
                    raise
            old = ctl.matrix
            now = int(ctl.cw[_C_CURRENT])
            garbage = not 1 <= now < _MAX_EPOCH
            if garbage:
                # Garbage in the epoch word: this owner's own matrix, if still whole, is
                # the current one; else the newest data segment left names the epoch.
                if old is not None and old.seg.shrunk_to() is None:
                    readable, now = old, old.epoch
                else:
                    readable = None
                    left = [e for e in epoch_segments(self.namespace, "counters") if e < _MAX_EPOCH]
                    now = max(left, default=0)
            # Never mapped here (shrunk before this process first looked): its width is
            # lost with its header; the table writer grows the new one as it publishes.
            cols = old.columns if old is not None and old.epoch == now else _columns_for(64)
            epoch = now + 1
            unlink_stale_epochs(self.namespace, "counters", now)
            seg = _create_data(f"{self.name}.{epoch}", epoch, ctl.rows, cols, ctl.buckets)
            new = _Matrix(seg, epoch, ctl.rows, ctl.buckets)
            if readable is not None:
                for r in np.flatnonzero(ctl.slots["used"] != 0).tolist():
                    new.copy_row(readable, r)
            fence()
            ctl.cw[_C_CURRENT] = epoch
            ctl.matrix = new
            if readable is None or garbage:
                unlink_name(f"{self.name}.{now}")
            if old is not None:
                old.seg.close()
            return True

    def reader(self) -> CounterReader:
        """A host-wide reader over these counters."""
        return CounterReader(self.namespace, _control=self._ctl)

    def _check_writable(self) -> None:
        if self._closed:
            raise SlotOwnershipError(f"counter store {self.name} is closed")
        if not self._ctl.seg.writable:
            raise SlotOwnershipError(f"counter store {self.name} was attached read-only")

    def close(self, *, unlink: bool | None = None) -> None:
        """Detach; the owner (:meth:`create`) also unlinks the counters (``unlink=None``).

        Unlinking while workers still record leaves their recorders writing into the
        removed segments (they cannot tell without :meth:`replaced`); an owner that
        outlives its workers only for a restart should close with ``unlink=False`` so
        the next owner takes the counters over, history and slots included.
        """
        if self._closed:
            return
        self._closed = True
        if (self._owner if unlink is None else unlink) and os.getpid() == self._pid:
            for seg_name in _namespace_counters(self.namespace):
                unlink_name(seg_name)

    def __enter__(self) -> CounterStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _namespace_counters(namespace: str) -> list[str]:
    return [segment_name(namespace, "counters"), *epoch_segments(namespace, "counters").values()]


# What a fan-out's end adds to per call in its bucket column, in the order of the values
# ``Recorder._end`` passes; then ``requests_total``.
_END_FIELDS = ("open", "open_start_sum", "busy_ns", "completed", "latency_ns")
_NO_SLOTS = np.empty(0, dtype=np.int64)
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


def _release_in_flight(m: _Matrix, row: int) -> None:
    m.fields[row, : 1 + 2 * m.buckets] = 0  # open_old, open, open_start_sum


# ------------------------------------------------------------------------------------
# Recording.

_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for rec in list(_RECORDERS):
        rec._epoch = -1  # the next call fails: a forked child must claim its own slot
        rec._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class Recorder:
    """Records one worker's requests into its own row of the counter matrix.

    Not thread-safe: one thread per recorder (see :class:`ThreadRecorder` and
    :class:`LockedRecorder` for gthread workers). Obtained from
    :meth:`CounterStore.claim`.

    Every addition is one :func:`lbcore.scatter_add` over the row's ``int64`` words: a
    fan-out's start is one (open count and start offset of every call), its end one
    (plus one per failure kind present) whatever its size, unless its calls span
    buckets. Slots are checked first (one pass), unless the caller says they are in
    range (``bound``); the kernel checks every cell against the row either way.

    Attributes
    ----------
    row : int
        The worker slot (row) this recorder writes.
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
        self._matrix: _Matrix | None = None
        self._epoch = -1
        self._bind(ctl.current())
        _RECORDERS.add(self)

    def _bind(self, m: _Matrix) -> None:
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
        tot = m.totals[self.row]
        self._requests_total = tot[0]
        self._failures_total = tot[1]
        self._kinds_total = tot[2 : 2 + nk]
        self._stats = memoryview(m.stats[self.row])  # item updates, no NumPy call
        # The whole row as one flat view; per bucket column the word offsets (in it) of
        # what an end adds besides `open`, and per failure code (index 0 unused) the
        # words a failed call adds one to: failures, failures_total, its kind's bucket
        # field and total.
        self._row_words = m.rows2d[self.row]
        self._add = scatter_adder()  # the recording hot path's one call, resolved here
        self._add_routed = scatter_adder_routed()
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
        # Per bucket column, one-field views made once (a view made per call costs a
        # NumPy call, and the kernel's buffer request on a new array costs more).
        self._opens = [self._open[j] for j in range(k)]
        self._open_sums = [self._open_sum[j] for j in range(k)]
        self._busys = [self._busy[j] for j in range(k)]
        self._completeds = [self._completed[j] for j in range(k)]
        self._latencies = [self._latency[j] for j in range(k)]
        self._fail_offsets = [
            [()]
            + [
                (
                    lay["failures"] + j * cols,
                    lay["failures_total"],
                    lay[KIND_FIELDS[c]] + j * cols,
                    lay[f"{KIND_FIELDS[c]}_total"],
                )
                for c in range(nk)
            ]
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
        self._epoch = m.epoch

    def _moved(self) -> bool:
        """Whether the matrix moved to another epoch (then :meth:`_follow` it).

        Checks first that neither segment was shrunk under its mapping, so a recording
        is refused (:class:`SegmentSizeError`) instead of faulting.
        """
        self._ctl_seg.check_size()
        if self._cw[_C_CURRENT] != self._epoch:
            return True  # a shrunk old matrix is left behind, not copied
        self._data_seg.check_size()
        return False

    def _moved_paced(self) -> bool:
        """:meth:`_moved`, paced by :data:`shm.segment.SIZE_CHECK_NS` (for :meth:`count`).

        :meth:`count` runs once per routed batch: see :meth:`Segment.shrunk_to_paced`
        (:data:`shm.segment.SIZE_CHECK_NS`) for the window that leaves.
        """
        now = time.monotonic_ns()
        self._ctl_seg.check_size_paced(now)
        if self._cw[_C_CURRENT] != self._epoch:
            return True
        self._data_seg.check_size_paced(now)
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

    def record_start(self, slots: Any, now_ns: int, *, bound: int | None = None) -> None:
        """Record the start of one call per entry of ``slots`` (a whole fan-out).

        Parameters
        ----------
        slots
            Endpoint slot of each call (repeats allowed).
        now_ns
            CLOCK_MONOTONIC start time in nanoseconds, of every call (an ``int``) or of
            each call (an integer array, one per slot: calls that started apart and are
            recorded in one step); pass the same to :meth:`record_end` as ``started_ns``.
        bound
            The caller's promise that ``slots`` is a contiguous 1-D ``int64`` array of
            slots in ``0 .. bound - 1`` (say, a plan's counter slots and its
            ``n_slots``): then the slots are not checked here, only ``bound`` against
            the row's columns. Default: every slot is checked.

        Raises
        ------
        CounterInputError
            Slots that are not integers in range, or start times that are not one
            integer per call; nothing is recorded then.
        """
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
            if q > self._period - self._k:  # a bucket this row holds
                self._add(self._row_words, s, (1, now_ns - q * b), self._start_offsets[q % self._k])
            else:  # a thread that took long to get the row's lock: older than every bucket
                self._add(self._open_old, s, 1)
        else:
            t = np.asarray(now_ns)
            if t.dtype.kind not in "iu" or t.shape != s.shape:
                raise CounterInputError(
                    f"start times must be one integer per call ({s.size}), got a "
                    f"{t.dtype} array of shape {t.shape}"
                )
            if s.size:
                self._start_each(s, t.astype(np.int64))

    def record_start_routed(
        self, slot_map: np.ndarray, endpoints: np.ndarray, now_ns: int, bound: int
    ) -> int:
        """:meth:`record_start` of a routed fan-out at one time: one kernel call.

        Parameters
        ----------
        slot_map
            Counter slot per endpoint (``int64``, each in ``0 .. bound - 1``: a plan's
            :attr:`~lbcore.Plan.slots` and :attr:`~lbcore.Plan.n_slots`).
        endpoints
            Endpoint index per call (``int32`` or ``int64``; ``-1``: fallback, not
            recorded).
        now_ns
            CLOCK_MONOTONIC start time of every call (an ``int``), in nanoseconds.
        bound
            Every slot of ``slot_map`` is below it.

        Returns
        -------
        int
            The calls recorded (the routed ones): pass the fan-out to
            :meth:`record_end_routed` if not zero.

        Raises
        ------
        CounterInputError
            Endpoints outside the map or slots outside the row; nothing is recorded then.
        """
        if self._moved():
            self._follow()
        if bound > self._cols or now_ns.__class__ is not int:
            slots = self._routed_slots(slot_map, endpoints)
            self.record_start(slots, now_ns)
            return int(slots.size)
        b = self._bucket_ns
        q = now_ns // b
        if q > self._period:
            self._rotate(q)
        try:
            if q > self._period - self._k:  # a bucket this row holds
                return self._add_routed(
                    self._row_words,
                    slot_map,
                    endpoints,
                    (1, now_ns - q * b),
                    self._start_offsets[q % self._k],
                )
            return self._add_routed(self._open_old, slot_map, endpoints, 1)
        except (IndexError, TypeError) as exc:
            raise CounterInputError(str(exc)) from None

    def record_end_routed(
        self,
        slot_map: np.ndarray,
        endpoints: np.ndarray,
        started_ns: int,
        duration_ns: int,
        now_ns: int,
        bound: int,
    ) -> None:
        """:meth:`record_end` of a fan-out :meth:`record_start_routed` recorded: one call.

        Every call started at ``started_ns`` and was busy ``duration_ns >= 0`` (ints,
        nanoseconds); none failed (a fan-out with failures or its own end times goes
        through :meth:`record_end`).

        Raises
        ------
        CounterInputError
            As :meth:`record_start_routed`, or a negative duration.
        """
        if self._moved():
            self._follow()
        d = duration_ns
        if d.__class__ is not int or started_ns.__class__ is not int or d < 0:
            if d.__class__ is int and d < 0:
                raise CounterInputError(f"durations must be >= 0 ns, got {d}")
            self.record_end(self._routed_slots(slot_map, endpoints), started_ns, d, now_ns)
            return
        b = self._bucket_ns
        period = now_ns // b
        if period > self._period:
            self._rotate(period)
        if period > self._period - self._k and started_ns >= period * b and bound <= self._cols:
            # The fast path of _end: every call started in this bucket.
            j = period % self._k
            try:
                self._add_routed(
                    self._row_words,
                    slot_map,
                    endpoints,
                    (-1, period * b - started_ns, d, 1, d, 1),
                    self._end_offsets[j],
                )
            except (IndexError, TypeError) as exc:
                raise CounterInputError(str(exc)) from None
            return
        s = self._routed_slots(slot_map, endpoints)
        if s.size:
            self._end(s, started_ns, d, int(now_ns), None)

    def record_calls(
        self,
        ended: list[int],
        done: list[int],
        starts: dict[tuple[int, int], int],
        now_ns: int,
    ) -> None:
        """One step of a batching caller's calls: their ends, then their starts.

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
        b = self._bucket_ns
        if ended or done:
            period = int(now_ns) // b
        elif starts:
            period = max(t for _, t in starts) // b
        else:
            return
        if period > self._period:
            self._rotate(period)
        try:
            head, tail = self._geometry
            self._add_calls(self._row_words, ended, done, starts, (*head, self._period, *tail))
        except (ArgumentError, TypeError, OverflowError) as exc:
            if self._moved():  # grown meanwhile: check again
                self._follow()
                return self.record_calls(ended, done, starts, now_ns)
            raise CounterInputError(str(exc)) from None

    def _routed_slots(self, slot_map: np.ndarray, endpoints: np.ndarray) -> np.ndarray:
        """The checked slots of the routed calls (the general paths of the two above)."""
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

    def _start_each(self, s: np.ndarray, t: np.ndarray) -> None:
        """:meth:`record_start` with a start time per call (``int64``, ``s.size > 0``).

        Each call's open entry goes to its own start bucket, with its own offset, so
        :meth:`record_end` given the same start times takes them out exactly.
        """
        b, k, cols = self._bucket_ns, self._k, self._cols
        q = t // b
        lo, hi = int(_min(q)), int(_max(q))
        if hi > self._period:
            self._rotate(hi)
        oldest = self._period - k  # buckets after this one are held
        if lo == hi and lo > oldest:  # the usual case: every call in one bucket
            scatter_add(self._opens[lo % k], s, 1)
            scatter_add(self._open_sums[lo % k], s, t - lo * b)
            return
        held = q > oldest
        scatter_add(self._open_old, s[~held], 1)  # older than every bucket kept
        qh = q[held]
        cells = (qh % k) * cols + s[held]
        scatter_add(self._open.reshape(-1), cells, 1)
        scatter_add(self._open_sum.reshape(-1), cells, t[held] - qh * b)

    def record_end(
        self,
        slots: Any,
        started_ns: Any,
        durations_ns: Any,
        now_ns: int,
        failed: Any = None,
        *,
        bound: int | None = None,
        opened: bool = True,
        completed: bool = True,
    ) -> None:
        """Record the end of calls started by :meth:`record_start` (a whole fan-out).

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
        # Threads sharing a row (LockedRecorder) may record slightly out of time order:
        # a period the row has moved past is still fine while its bucket is retained.
        if period > self._period - self._k and (
            started >= period * b if scalar_start else int(_min(started)) >= period * b
        ):
            # Every call started in this bucket (and ended by now_ns): all of it is here,
            # and so are its open entries (record_start put them in this bucket).
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
            if failed is not None and completed:
                self._end_failures(s, failed, self._fail_offsets[j])
            return
        st = np.full(s.size, started, dtype=np.int64) if scalar_start else started
        dd = np.full(s.size, d, dtype=np.int64) if d.__class__ is int else d
        self._end_spread(s, st, dd, failed, opened, completed)

    def _end_failures(
        self, s: np.ndarray, failed: np.ndarray, offsets: list[tuple[int, ...]]
    ) -> None:
        """Each failed call adds one to its four failure words (``offsets`` by code)."""
        f = failed.nonzero()[0]
        if not f.size:
            return
        codes = failed[f]
        for c in np.unique(codes).tolist():
            scatter_add(self._row_words, s[f[codes == c]], 1, offsets[c])

    def _end_spread(
        self,
        s: np.ndarray,
        st: np.ndarray,
        d: np.ndarray,
        failed: np.ndarray | None,
        opened: bool = True,
        completed: bool = True,
    ) -> None:
        """General case: calls spanning buckets, or ending in older retained buckets."""
        b, kk, cols = self._bucket_ns, self._k, self._cols
        if completed:
            scatter_add(self._requests_total, s, 1)
        newest = self._period
        oldest = newest - kk + 1  # the buckets this row holds; older time is forgotten
        if opened:
            # A call's open entry is in its start bucket's column while the row holds
            # that bucket (record_start put it there, rotation has not moved it), else in
            # open_old.
            qs = st // b
            held = qs >= oldest
            h = held.nonzero()[0]
            cells = (qs[h] % kk) * cols + s[h]
            scatter_add(self._open.reshape(-1), cells, -1)
            scatter_add(self._open_sum.reshape(-1), cells, qs[h] * b - st[h])
            if h.size != s.size:
                scatter_add(self._open_old, s[~held], -1)
        end = st + d
        for q in range(max(oldest, int(st.min()) // b), newest + 1):
            part = np.minimum(end, (q + 1) * b) - np.maximum(st, q * b)
            np.maximum(part, 0, out=part)
            if part.any():
                scatter_add(self._busys[q % kk], s, part)
        if not completed:
            return
        qend = np.clip(end // b, oldest, newest)
        for q in np.unique(qend).tolist():
            sel = qend == q
            j = q % kk
            ss = s[sel]
            scatter_add(self._completeds[j], ss, 1)
            scatter_add(self._latencies[j], ss, np.ascontiguousarray(d[sel]))
            if failed is not None:
                self._end_failures(ss, failed[sel], self._fail_offsets[j])

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
        if self._moved_paced():  # (once per batch)
            self._follow()
        st = self._stats
        st[0] += decisions
        st[1] += fallbacks
        st[2] += moves

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

    def release(self, now_ns: int | None = None) -> None:
        """Give the slot back (its in-flight counts are zeroed, history stays)."""
        if self._released or self._forked:
            return
        self._store._release_row(self, now_ns)
        self._released = True
        self._epoch = -1


class _Forwarding:
    """The recording calls of :class:`Recorder`, forwarded through one method.

    ``_run`` picks the row's recorder and guards the call (a lock, or a row per thread).
    """

    def _run(self, method: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def record_start(self, slots: Any, now_ns: int, *, bound: int | None = None) -> None:
        """See :meth:`Recorder.record_start`."""
        self._run(Recorder.record_start, slots, now_ns, bound=bound)

    def record_end(
        self,
        slots: Any,
        started_ns: Any,
        durations_ns: Any,
        now_ns: int,
        failed: Any = None,
        *,
        bound: int | None = None,
        opened: bool = True,
        completed: bool = True,
    ) -> None:
        """See :meth:`Recorder.record_end`."""
        self._run(
            Recorder.record_end,
            slots,
            started_ns,
            durations_ns,
            now_ns,
            failed,
            bound=bound,
            opened=opened,
            completed=completed,
        )

    def count(self, decisions: int, fallbacks: int = 0, moves: int = 0) -> None:
        """See :meth:`Recorder.count`."""
        self._run(Recorder.count, decisions, fallbacks, moves)

    def tally(self, field: str, n: int) -> None:
        """See :meth:`Recorder.tally`."""
        self._run(Recorder.tally, field, n)


class LockedRecorder(_Forwarding):
    """One row shared by all threads of a process, calls serialized by a lock.

    Parameters
    ----------
    recorder
        The process's :class:`Recorder`.

    Attributes
    ----------
    recorder : Recorder
        The row's recorder.
    lock : threading.Lock
        Held around every call into it: a caller that records several steps at once
        (say a fan-out's start and a routed batch's counts) may hold it around them and
        call :attr:`recorder` directly.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.lock = threading.Lock()

    @property
    def row(self) -> int:
        """The worker slot (row) recorded into."""
        return self.recorder.row

    def _run(self, method: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        with self.lock:
            method(self.recorder, *args, **kwargs)

    def release(self, now_ns: int | None = None) -> None:
        """Give the slot back."""
        with self.lock:
            self.recorder.release(now_ns)


class ThreadRecorder(_Forwarding):
    """A row per thread, claimed on each thread's first call (no lock on the way).

    A thread's first call claims its row (a ``flock`` and a ``/proc`` read, ~0.1 ms,
    once); later calls take no lock. Each thread holds a row for the life of the
    recorder, so the counters need a row per thread of every worker (see README,
    "gthread workers"); :class:`LockedRecorder` needs one row per process.

    Parameters
    ----------
    store
        The counters to claim rows from.
    """

    def __init__(self, store: CounterStore) -> None:
        self._store = store
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Recorder] = []
        self._released = False

    def _mine(self) -> Recorder:
        rec = getattr(self._local, "rec", None)
        if rec is None:
            with self._lock:  # claims are rare; serialized so none follows release()
                if self._released:
                    raise SlotOwnershipError(
                        "this per-thread recorder was released; claim a new one"
                    )
                rec = self._store.claim(thread_id=threading.get_ident())
                self._all.append(rec)
            self._local.rec = rec
        return rec

    def _run(self, method: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        method(self._mine(), *args, **kwargs)

    @property
    def rows(self) -> list[int]:
        """Rows claimed so far (one per thread that recorded)."""
        with self._lock:
            return [r.row for r in self._all]

    def release(self, now_ns: int | None = None) -> None:
        """Give back every thread's slot; the recorder cannot be used afterwards.

        A thread still in a request then gets :class:`~shm.errors.SlotOwnershipError`
        from its ``record_end`` (its in-flight counts were released with its row), as
        from any later call; it never lands in a new row, which would drive that row's
        counts negative.
        """
        with self._lock:
            self._released = True
            recs, self._all = self._all, []
        for rec in recs:
            rec.release(now_ns)


# ------------------------------------------------------------------------------------
# Reading.


def bucket_weights(periods: np.ndarray, bucket_ns: int, now_ns: int, window_ns: int) -> np.ndarray:
    """Share of each bucket's counts inside the window, by :func:`lbcore.signals.window_weights`.

    Parameters
    ----------
    periods
        Bucket numbers (``time // bucket_ns``), any shape; ``-1``: empty (weighs 0).
    bucket_ns, now_ns, window_ns
        Bucket width, the present and the window length, in nanoseconds.

    Returns
    -------
    numpy.ndarray
        ``float64`` weights in ``[0, 1]``, shaped like ``periods``.
    """
    w = window_weights(periods.astype(np.int64).ravel() * bucket_ns, bucket_ns, now_ns, window_ns)
    w = w.reshape(periods.shape)
    w[periods < 0] = 0.0
    return w


@dataclass(frozen=True)
class HostLoads:
    """Host-wide load per endpoint slot, read at one instant.

    Attributes
    ----------
    now_ns : int
        When it was read (CLOCK_MONOTONIC, ns).
    window_ns : int
        The occupancy window (ns).
    in_flight : numpy.ndarray
        ``int64`` open requests per slot, all workers summed.
    occupancy : numpy.ndarray
        ``float64`` busy-seconds per second over the window (open requests included).
    completed : numpy.ndarray
        ``float64`` requests completed inside the window.
    mean_latency_s : numpy.ndarray
        ``float64`` mean latency of those requests in seconds (NaN: none completed).
    failure_rate : numpy.ndarray
        ``float64`` share of those requests that failed (NaN: none completed).
    global_latency_s : float
        Mean latency over all slots in seconds (NaN: nothing completed).
    requests_total, failures_total : numpy.ndarray
        ``int64`` requests ended (and those that failed) per slot since the slot was
        given to its endpoint, all workers ever summed: never age out (Prometheus
        counters). A writer handing a freed slot to a new endpoint zeroes them
        (:meth:`CounterStore.reset_totals`).
    failures : numpy.ndarray
        ``float64`` failed requests per slot inside the window (weighted like
        :attr:`completed`; ``failures / completed`` is :attr:`failure_rate`).
    failures_by_kind : numpy.ndarray
        ``float64`` ``(slots, 4)``: :attr:`failures` split by kind, column ``code - 1``
        for the codes of :mod:`lbcore.outlier` (connect, timeout, status, other, as
        :data:`lbcore.outlier.FAILURE_KINDS`); rows sum to :attr:`failures`. NaN when
        read with ``failure_kinds=False``.
    failures_total_by_kind : numpy.ndarray
        ``int64`` ``(slots, 4)``: :attr:`failures_total` split by kind, columns as in
        :attr:`failures_by_kind`; rows sum to :attr:`failures_total`.
    """

    now_ns: int
    window_ns: int
    in_flight: np.ndarray
    occupancy: np.ndarray
    completed: np.ndarray
    mean_latency_s: np.ndarray
    failure_rate: np.ndarray
    global_latency_s: float
    requests_total: np.ndarray
    failures_total: np.ndarray
    failures: np.ndarray
    failures_by_kind: np.ndarray
    failures_total_by_kind: np.ndarray

    @classmethod
    def idle(cls, n: int, now_ns: int, window_ns: int = 0) -> HostLoads:
        """Loads of ``n`` endpoint slots nobody has called (nothing recorded, NaN latency)."""
        z = np.zeros(n)
        nan = np.full(n, np.nan)
        zi = np.zeros(n, np.int64)
        nk = len(FAILURE_KINDS)
        return cls(
            now_ns=int(now_ns),
            window_ns=int(window_ns),
            in_flight=zi,
            occupancy=z,
            completed=z,
            mean_latency_s=nan,
            failure_rate=nan,
            global_latency_s=float("nan"),
            requests_total=zi,
            failures_total=zi,
            failures=z,
            failures_by_kind=np.zeros((n, nk)),
            failures_total_by_kind=np.zeros((n, nk), np.int64),
        )

    def take(self, slots: Any) -> HostLoads:
        """The loads of the given slots, in that order (e.g. ``Table.slots``: per endpoint).

        Slots this snapshot does not cover (given to endpoints published after it was
        read) count as idle: no in-flight, no occupancy, no completions (NaN latency).

        Raises
        ------
        CounterInputError
            A negative slot.
        """
        idx = np.asarray(slots, dtype=np.intp)
        n = self.in_flight.size
        if idx.size and int(idx.min()) < 0:
            raise CounterInputError(f"endpoint slots must be >= 0, got {int(idx.min())}")
        beyond = bool(idx.size) and int(idx.max()) >= n
        if beyond:
            # Every uncovered slot reads the one idle row appended at n: what this costs
            # depends on how many slots there are, never on how large one is.
            idx = np.minimum(idx, n)

        def pick(arr: np.ndarray, idle: float) -> np.ndarray:
            if beyond:
                pad = np.full((1, *arr.shape[1:]), idle, dtype=arr.dtype)
                arr = np.concatenate((arr, pad))
            return arr.take(idx, axis=0)

        return HostLoads(
            now_ns=self.now_ns,
            window_ns=self.window_ns,
            in_flight=pick(self.in_flight, 0),
            occupancy=pick(self.occupancy, 0.0),
            completed=pick(self.completed, 0.0),
            mean_latency_s=pick(self.mean_latency_s, np.nan),
            failure_rate=pick(self.failure_rate, np.nan),
            global_latency_s=self.global_latency_s,
            requests_total=pick(self.requests_total, 0),
            failures_total=pick(self.failures_total, 0),
            failures=pick(self.failures, 0.0),
            failures_by_kind=pick(self.failures_by_kind, 0.0),
            failures_total_by_kind=pick(self.failures_total_by_kind, 0),
        )

    def _with_failures(self) -> tuple[np.ndarray, np.ndarray]:
        return with_failures(
            self.occupancy,
            self.mean_latency_s,
            self.completed,
            self.failures,
            self.global_latency_s,
            self.window_ns / 1e9,
        )

    def effective(self, cap: float = DEFAULT_LATENCY_CAP) -> np.ndarray:
        """``max(in_flight, occupancy) × min(latency / global latency, cap)`` (lbcore).

        Failed calls count as calls of the host's mean latency
        (:func:`lbcore.signals.with_failures`), as in :meth:`signal`.
        """
        occ, lat = self._with_failures()
        return effective_load(self.in_flight, occ, lat, self.global_latency_s, cap=cap)

    def signal(self, name: str) -> np.ndarray:
        """The ``float64`` load vector a knob's load signal names, by lbcore's rule.

        ``occupancy``, ``in-flight`` or ``effective`` (see :data:`lbcore.signals.LOAD_SIGNALS`
        and :func:`lbcore.signals.load_for`). Occupancy and effective load count every
        failed call as a call of the host's mean latency
        (:func:`lbcore.signals.with_failures`), so a pod that fails fast does not look
        idle; :attr:`occupancy` and :attr:`mean_latency_s` stay as measured.
        """
        if name not in LOAD_SIGNALS:
            raise CounterInputError(f"unknown load signal {name!r}, expected one of {LOAD_SIGNALS}")
        occ, lat = self._with_failures()
        return load_for(name, self.in_flight, occ, lat, self.global_latency_s)

    def bar_increment(self, name: str) -> float:
        """What bounded load's bar counts for the call being routed, in ``name``'s unit.

        :func:`lbcore.bounded.routed_call_load` with the host's mean call latency over
        the occupancy window (:attr:`global_latency_s`: summed latency over summed
        completions of every slot read) and the window: 1.0 for ``in-flight`` and
        ``effective`` (Skipper's), ``global_latency_s / window`` seconds per second
        for ``occupancy`` (1.0 while nothing completed in the window). Routing on
        ``lbcore.bounded.in_call_units(signal(name), bar_increment(name))`` decides as
        the bar ``(increment + Σ load) / n × balance_factor`` on :meth:`signal`.
        """
        if name not in LOAD_SIGNALS:
            raise CounterInputError(f"unknown load signal {name!r}, expected one of {LOAD_SIGNALS}")
        return routed_call_load(name, self.global_latency_s, self.window_ns / 1e9)


# Bounds of sane counter cells. Any process of the user can write the matrix; a row
# holding values no recorder writes (a count beyond 2**31 calls in one bucket, busy time
# beyond 2**56 ns, a negative total, a period from the future) is left out of every sum,
# so its garbage reaches neither routing nor the lifetime totals.
_MAX_OPEN = 1 << 31
_MAX_CELL = 1 << 56
_MAX_TOTAL = 1 << 53


def _sane_rows(m: _Matrix, hi: int, n: int, now_ns: int | None, bucket_ns: int) -> np.ndarray:
    """Per row ``< hi``: whether every cell a reader sums is in a recorder's range.

    ``now_ns``: the reader's present, against which the rows' periods are checked
    (``None``: lifetime totals only, which do not depend on them).
    """
    k = m.buckets
    f = m.fields[:hi, :, :n]
    opens = f[:, : 1 + k, :]  # open_old, then open per bucket (transiently negative)
    sums = f[:, 1 + 2 * k :, :]  # busy, completed, latency, failures and kinds per bucket
    ok = (opens.min(axis=(1, 2), initial=0) >= -_MAX_OPEN) & (
        opens.max(axis=(1, 2), initial=0) <= _MAX_OPEN
    )
    ok &= (sums.min(axis=(1, 2), initial=0) >= 0) & (sums.max(axis=(1, 2), initial=0) <= _MAX_CELL)
    if now_ns is not None:
        periods = m.periods[:hi]
        # -1: never stamped; down to -(k+1): stamped by a first rotation at a clock near 0.
        latest = now_ns // bucket_ns + 2
        ok &= ((periods >= -(k + 1)) & (periods <= latest)).all(axis=1)
    totals = m.totals[:hi, :, :n]
    ok &= (totals.min(axis=(1, 2), initial=0) >= 0) & (
        totals.max(axis=(1, 2), initial=0) <= _MAX_TOTAL
    )
    stats = m.stats[:hi, : len(STATS_FIELDS)]
    ok &= ((stats >= 0) & (stats <= _MAX_TOTAL)).all(axis=1)
    return ok


class CounterReader:
    """Sums the counter rows of every worker of the host. Writes nothing.

    Rows holding values no recorder writes are left out of every sum (see
    :attr:`ignored_rows`), so one damaged row changes neither routing nor the totals.

    Parameters
    ----------
    namespace
        Namespace of the counters.

    Attributes
    ----------
    ignored_rows : tuple[int, ...]
        Rows the last read left out as damaged.
    ignored_total : int
        Rows left out, summed over every read so far.
    """

    def __init__(self, namespace: str, *, _control: _Control | None = None) -> None:
        self.namespace = namespace
        self._ctl = _control if _control is not None else _attach_control(namespace, writable=False)
        self._ctl.current()
        self.ignored_rows: tuple[int, ...] = ()
        self.ignored_total = 0

    def _rows(self, m: _Matrix, n: int, now_ns: int | None = None) -> np.ndarray | None:
        """Indices of the used rows whose cells are sane (``None``: no row is used)."""
        ctl = self._ctl
        used = np.flatnonzero(ctl.slots["used"] != 0)
        if used.size == 0:
            self.ignored_rows = ()
            return None
        hi = int(used[-1]) + 1
        # Rows never used below the last used one hold zeros: summed, they weigh
        # nothing (and keep the common case one strided view); damaged, they are out.
        ok = _sane_rows(m, hi, n, None if now_ns is None else int(now_ns), ctl.bucket_ns)
        bad = np.flatnonzero(~ok)
        self.ignored_rows = tuple(int(r) for r in bad)
        self.ignored_total += len(bad)
        rows = np.flatnonzero(ok)
        return rows if rows.size else None

    @property
    def columns(self) -> int:
        """Endpoint slots of the current matrix."""
        return self._ctl.current().columns

    def read(
        self, now_ns: int, columns: int | None = None, *, failure_kinds: bool = True
    ) -> HostLoads:
        """Host-wide loads per endpoint slot at ``now_ns``.

        Parameters
        ----------
        now_ns
            CLOCK_MONOTONIC time in nanoseconds.
        columns
            Number of endpoint slots to read (``Table.n_slots``); default all.
        failure_kinds
            Also sum the window's failures per kind (:attr:`HostLoads.failures_by_kind`;
            otherwise NaN). They double the cost of the window sums, and routing does
            not need them; the lifetime totals per kind are always read.
        """
        ctl = self._ctl
        ctl.seg.check_size()
        m = ctl.current()
        n = m.columns if columns is None else min(int(columns), m.columns)
        k = ctl.buckets
        w_ns = ctl.window_ns
        rows = self._rows(m, n, now_ns) if n else None
        if rows is None:
            return HostLoads.idle(n, now_ns, w_ns)
        # Rows are claimed lowest first, so the used rows are (nearly) a prefix: read them
        # as one strided view, no copy, unless a damaged row must be left out; rows never
        # used hold zeros and weigh nothing.
        hi = rows.size
        take: Any = slice(0, hi) if int(rows[-1]) + 1 == hi else rows
        cells = m.fields[take, :, :n]
        periods = m.periods[take]
        weights = bucket_weights(periods, ctl.bucket_ns, now_ns, w_ns)
        # Busy time of requests still open, each counted from its start but at most for
        # the window: per start bucket, count x (now - bucket start) - start offsets,
        # clipped to [0, count x window]. Exact for buckets wholly inside or outside the
        # window; in the one straddling its start, off by at most a bucket per request.
        old = np.maximum(cells[:, 0, :], 0)
        opens = cells[:, 1 : 1 + k, :]
        in_flight = np.maximum(old.sum(axis=0) + opens.sum(axis=(0, 1)), 0)
        open_ns = old.sum(axis=0) * w_ns
        ri, ji = np.nonzero(opens.any(axis=2))  # the few (row, bucket)s with open requests
        if ri.size:
            # Time since each bucket's start, capped at window + bucket: a bucket that
            # old holds only requests older than the window, and the cap keeps the
            # products far from overflowing.
            b_ns = ctl.bucket_ns
            since = np.minimum(now_ns - periods[ri, ji] * b_ns, w_ns + b_ns)[:, None]
            c = np.maximum(opens[ri, ji], 0)
            busy_open = c * since - cells[ri, 1 + k + ji, :]
            np.clip(busy_open, 0, c * w_ns, out=busy_open)
            open_ns += busy_open.sum(axis=0)
        # (rows, field, bucket, slot) weighted over rows and buckets, every field at once.
        nf = len(COUNTER_FIELDS) + (len(KIND_FIELDS) if failure_kinds else 0)
        fields = cells[:, 1 + 2 * k : 1 + (2 + nf) * k, :].reshape(hi, nf, k, n)
        summed = np.einsum("rk,rfkc->fc", weights, fields)
        busy, completed, latency_ns, failures = summed[: len(COUNTER_FIELDS)]
        if failure_kinds:
            by_kind = np.ascontiguousarray(summed[len(COUNTER_FIELDS) :].T)
        else:
            by_kind = np.full((n, len(KIND_FIELDS)), np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            failure_rate = np.where(
                completed > 0, failures / np.where(completed > 0, completed, 1), np.nan
            )
        total = float(completed.sum())
        glob = float(latency_ns.sum()) / total / 1e9 if total > 0 else float("nan")
        return HostLoads(
            now_ns=int(now_ns),
            window_ns=w_ns,
            in_flight=in_flight,
            occupancy=_occupancy(busy + open_ns, w_ns),
            completed=completed,
            mean_latency_s=_mean_latency(latency_ns / 1e9, completed),
            failure_rate=failure_rate,
            global_latency_s=glob,
            requests_total=m.totals[take, 0, :n].sum(axis=0),
            failures_total=m.totals[take, 1, :n].sum(axis=0),
            failures=failures,
            failures_by_kind=by_kind,
            failures_total_by_kind=np.ascontiguousarray(
                m.totals[take, 2 : 2 + len(KIND_FIELDS), :n].sum(axis=0).T
            ),
        )

    def totals(self, columns: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Lifetime totals per endpoint slot, all workers ever summed (no window math).

        Parameters
        ----------
        columns
            Number of endpoint slots to read; default all.

        Returns
        -------
        tuple of numpy.ndarray
            ``requests_total`` (``int64`` per slot) and failures per kind (``int64``
            ``(slots, 4)``, columns in :data:`lbcore.outlier.FAILURE_KINDS` order).
        """
        ctl = self._ctl
        ctl.seg.check_size()
        m = ctl.current()
        n = m.columns if columns is None else min(int(columns), m.columns)
        nk = len(KIND_FIELDS)
        rows = self._rows(m, n)
        if rows is None:
            return np.zeros(n, np.int64), np.zeros((n, nk), np.int64)
        requests = m.totals[rows, 0, :n].sum(axis=0)
        kinds = np.ascontiguousarray(m.totals[rows, 2 : 2 + nk, :n].sum(axis=0).T)
        return requests, kinds

    def stats(self) -> dict[str, int]:
        """Lifetime routing-decision totals of every worker of the host.

        Returns
        -------
        dict[str, int]
            ``decisions``, ``fallbacks`` and ``moves`` (keys bounded load moved), summed
            over every row ever used (see :meth:`Recorder.count`).
        """
        ctl = self._ctl
        ctl.seg.check_size()
        m = ctl.current()
        rows = self._rows(m, m.columns)
        if rows is None:
            return dict.fromkeys(STATS_FIELDS, 0)
        sums = m.stats[rows, : len(STATS_FIELDS)].sum(axis=0)
        return {name: int(v) for name, v in zip(STATS_FIELDS, sums, strict=True)}

    def replaced(self) -> bool:
        """True if the counters control segment was removed or recreated since attaching.

        Attach a new reader then (see :meth:`CounterStore.replaced`).
        """
        return (
            current_inode(self._ctl.seg.name) != self._ctl.seg.inode
            or self._ctl.seg.shrunk_to() is not None
        )

    def close(self) -> None:
        """Drop the reader's mappings."""
        self._ctl.matrix = None
