"""The host's counter matrix and its worker slots: :class:`CounterStore`.

Worker slots are claimed and released under a lock (``flock``, released by the kernel
if the holder dies): rare operations, never on the recording path. An owner is a PID
plus that process's start time, so a reused PID is not mistaken for the owner. A slot
whose owner died (SIGKILL, OOM) is reclaimed by :meth:`CounterStore.reap` or by the
next :meth:`CounterStore.claim` that needs it: its in-flight counts are released
(zeroed), its busy history stays until it ages out of the window.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lbcore.fence import fence
from lbcore.signals import DEFAULT_WINDOW_NS
from shm.counters.matrix import (
    C_CURRENT,
    C_MAGIC,
    DEFAULT_ROWS,
    DEFAULT_WINDOW_BUCKETS,
    HEADER_BYTES,
    MAX_COLUMNS,
    MAX_EPOCH,
    MAX_ROWS,
    PAGE,
    Control,
    Matrix,
    MatrixView,
    attach_control,
    columns_for,
    create_data,
    release_in_flight,
)
from shm.counters.reader import CounterReader
from shm.counters.recorder import Recorder
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
    COUNTERS_CONTROL,
    LAYOUT_VERSION,
    MAGIC_COUNTERS_CONTROL,
    SLOT,
    SLOT_CLAIMED,
    SLOT_FREE,
    SLOT_RESERVED,
    align,
)
from shm.locks import segment_lock
from shm.names import current_inode, epoch_segments, segment_name, unlink_name, unlink_stale_epochs
from shm.owners import own_start_ticks, process_alive, unreaped_child
from shm.seams import seam
from shm.segment import Segment


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


class CounterStore:
    """A namespace's counter matrix: create it (the owner) or attach to it.

    Use :meth:`create` in the process that owns the counters (the gunicorn master or
    the discovery process) and :meth:`attach` elsewhere; workers call :meth:`claim`
    to get their :class:`Recorder`.
    """

    def __init__(self, control: Control, namespace: str, *, owner: bool) -> None:
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
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
            raise CounterInputError(f"rows must be an integer from 1 to {MAX_ROWS}, got {rows!r}")
        if not isinstance(window_buckets, int) or not 1 <= window_buckets <= 1000:
            raise CounterInputError(
                f"window_buckets must be an integer from 1 to 1000, got {window_buckets!r}"
            )
        if not isinstance(window_ns, int) or window_ns < window_buckets:
            raise CounterInputError(
                f"window_ns must be an integer number of nanoseconds >= window_buckets, "
                f"got {window_ns!r}"
            )
        if not isinstance(columns, int) or not 1 <= columns <= MAX_COLUMNS:
            raise CounterInputError(f"columns must be from 1 to {MAX_COLUMNS}, got {columns!r}")
        name = segment_name(namespace, "counters")
        buckets = window_buckets + 2
        bucket_ns = -(-window_ns // window_buckets)
        slots_off = HEADER_BYTES
        ctl_size = align(slots_off + rows * SLOT.itemsize, PAGE)
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
                if seg.words[C_MAGIC] == 0:
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
                        data = create_data(f"{name}.1", 1, rows, columns_for(columns), buckets)
                    except BaseException:
                        seg.unlink()  # e.g. /dev/shm too small: leave nothing behind
                        raise
                    data.close()
                    h["current"] = 1
                    seam("counters.control.init")
                    fence()
                    h["magic"] = MAGIC_COUNTERS_CONTROL
                    return cls(Control(seg), namespace, owner=True)
                try:
                    ctl = Control(seg)
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
        ctl = attach_control(namespace, writable=writable)
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

    def matrix_view(self) -> MatrixView:
        """Read-only views of the current counter matrix (for tools and tests)."""
        return self._ctl.current().view()

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
                release_in_flight(m, target)
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

    def _free_row(self, ctl: Control) -> int:
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

    def _check_row(self, row: Any) -> None:
        """Refuse a row that is not an integer of this store's range (after a size check)."""
        ctl = self._ctl
        ctl.seg.check_size()
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
            raise SlotOwnershipError(f"row must be an integer, got {row!r}")
        if not 0 <= int(row) < ctl.rows:
            raise SlotOwnershipError(
                f"row {row} is out of range: {self.name} has rows 0..{ctl.rows - 1}"
            )

    def _check_reserved(self, row: Any, holders: tuple[int, ...]) -> None:
        ctl = self._ctl
        self._check_row(row)
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
            release_in_flight(m, row)
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
        self._check_row(row)
        with ctl.seg.lock():
            s = ctl.slots[int(row) : int(row) + 1]
            state, holder = int(s["state"][0]), int(s["pid"][0])
            if not (
                (state == SLOT_CLAIMED and holder == int(pid))
                or (state == SLOT_RESERVED and holder in (int(pid), os.getpid()))
            ):
                return False
            release_in_flight(ctl.current(), int(row))
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
                    release_in_flight(m, r)
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
                release_in_flight(ctl.current(), rec.row)
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
        if n > MAX_COLUMNS:
            raise CapacityError(self.name, f"{n} endpoint slots exceed the limit of {MAX_COLUMNS}")
        ctl = self._ctl
        ctl.seg.check_size()
        with ctl.seg.lock():
            old = ctl.current()
            if n <= old.columns:
                return old.columns
            unlink_stale_epochs(self.namespace, "counters", old.epoch)  # a killed grower's
            # At least 25 % more (growth copies every row, so keep it geometric), but
            # no doubling: /dev/shm holds the old and the new matrix until the switch.
            cols = columns_for(max(n, old.columns + old.columns // 4))
            epoch = old.epoch + 1
            seg = create_data(f"{self.name}.{epoch}", epoch, ctl.rows, cols, ctl.buckets)
            new = Matrix(seg, epoch, ctl.rows, ctl.buckets)
            for r in np.flatnonzero(ctl.slots["used"] != 0).tolist():
                new.copy_row(old, r)
            fence()
            seam("counters.grow.switch")
            ctl.cw[C_CURRENT] = epoch
            seam("counters.grow.switched")
            ctl.matrix = new
            old.seg.unlink()
            old.seg.close()
            return cols

    def reset_totals(self, slots: Any) -> None:
        """Zero the lifetime totals and load reports of endpoint ``slots`` in every row.

        For a table writer handing a freed slot to a new endpoint: its Prometheus
        counters must start at zero, not at the previous endpoint's totals. Only freed
        slots (no worker routes to them any more, and the occupancy window has passed
        since) may be reset; a call still open on the old endpoint that ends after
        this is counted for the new one. The old pod's load reports are forgotten with
        them (a report of the old pod stored after this is refused by its identity).

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
            m.reports[:, :, idx] = 0

    # -- lifecycle ----------------------------------------------------------------------

    def replaced(self) -> bool:
        """True if the control segment this store maps was removed or recreated.

        That happens when the owner closed the counters (which removes them) or
        replaced invalid ones. Recorders of this store then write into segments no
        new reader sees, and readers see only the old rows: attach again and claim a
        new slot (a worker should check this about once a second; one ``stat`` call).
        """
        return (
            current_inode(self.name) != self._ctl.seg.inode or self._ctl.seg.shrunk_to() is not None
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
            readable: Matrix | None = None
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
            now = int(ctl.cw[C_CURRENT])
            garbage = not 1 <= now < MAX_EPOCH
            if garbage:
                # Garbage in the epoch word: this owner's own matrix, if still whole, is
                # the current one; else the newest data segment left names the epoch.
                if old is not None and old.seg.shrunk_to() is None:
                    readable, now = old, old.epoch
                else:
                    readable = None
                    left = [e for e in epoch_segments(self.namespace, "counters") if e < MAX_EPOCH]
                    now = max(left, default=0)
            # Never mapped here (shrunk before this process first looked): its width is
            # lost with its header; the table writer grows the new one as it publishes.
            cols = old.columns if old is not None and old.epoch == now else columns_for(64)
            epoch = now + 1
            unlink_stale_epochs(self.namespace, "counters", now)
            seg = create_data(f"{self.name}.{epoch}", epoch, ctl.rows, cols, ctl.buckets)
            new = Matrix(seg, epoch, ctl.rows, ctl.buckets)
            if readable is not None:
                for r in np.flatnonzero(ctl.slots["used"] != 0).tolist():
                    new.copy_row(readable, r)
            fence()
            ctl.cw[C_CURRENT] = epoch
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
