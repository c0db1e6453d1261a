"""The discovery process's handle on the routing tables: :class:`TableWriter`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import lbcore
from lbcore.ejection import Ejections
from lbcore.errors import OutlierError
from lbcore.fence import fence
from shm.errors import (
    SegmentCorruptError,
    SegmentError,
    SegmentExistsError,
    SegmentMissingError,
    SegmentSizeError,
    TableInputError,
    WriterBusyError,
    WriterUnusableError,
)
from shm.layout import (
    BUFFER_HEADER_BYTES,
    CONTROL_BYTES,
    DATA_HEADER_BYTES,
    DIRECTORY_OFFSET,
    LAYOUT_VERSION,
    MAGIC_TABLES_CONTROL,
    MAGIC_TABLES_DATA,
    PAYLOAD_HEADER,
    TABLES_CONTROL,
    TABLES_DATA,
    align,
)
from shm.locks import WriterLock
from shm.names import current_inode, epoch_segments, segment_name, unlink_name, unlink_stale_epochs
from shm.owners import own_start_ticks
from shm.seams import seam
from shm.segment import Segment, check_header
from shm.status import write_status
from shm.tables.codec import Encoded, encode, per_endpoint, strings
from shm.tables.model import Knobs, Table
from shm.tables.protocol import TablesView
from shm.tables.slots import DEFAULT_SLOT_REUSE_NS, SlotAllocator
from shm.tables.words import (
    B_CHECKSUM,
    B_GENERATION,
    B_PAYLOAD,
    B_SEQ,
    C_CURRENT,
    C_GENERATION,
    C_HEARTBEAT,
    C_MAGIC,
    C_WRITER_PID,
    C_WRITER_START,
    payload_checksum,
)
from shm.tables.zone import ZoneCurve

if TYPE_CHECKING:
    from shm.counters import CounterStore

_PAGE = 4096


class TableWriter:
    """The single publisher of a namespace's routing tables.

    Creates the control segment if needed, or takes over the segments of a previous
    writer (generation count and counter slots continue where it stopped, even if it
    was killed mid-publish). Holds the namespace's writer lock for its lifetime: a
    second live writer gets :class:`~shm.errors.WriterBusyError`.

    Parameters
    ----------
    namespace
        Namespace of the segments (``/cslb.<namespace>.tables``).
    slot_reuse_ns
        Minimum age of a freed counter slot before another endpoint gets it (ns);
        default: the counters' occupancy window plus two buckets (12 s for the default
        window, also without counters).
    counters
        The host's :class:`shm.counters.CounterStore`, if any: before each publish its
        matrix is grown to hold every slot of the new table.
    replace_invalid
        Replace an existing control segment that is foreign or of another layout
        version instead of raising.
    min_capacity_bytes
        Smallest payload capacity of each buffer, in bytes.
    clock
        CLOCK_MONOTONIC source for publish and heartbeat times (nanoseconds).

    Attributes
    ----------
    generation : int
        The last generation published in this namespace (continues a previous
        writer's count).
    recovered : Table or None
        The table a previous writer left current, if it could be read.
    removed_stale : list[str]
        Data segments a previous writer left behind (killed while growing the tables)
        that this writer removed when it took over.
    """

    def __init__(
        self,
        namespace: str,
        *,
        slot_reuse_ns: int | None = None,
        counters: CounterStore | None = None,
        replace_invalid: bool = False,
        min_capacity_bytes: int = 1 << 20,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.namespace = namespace
        self.name = segment_name(namespace, "tables")
        ticks = own_start_ticks()  # before taking anything over
        self._clock = clock
        self._counters = counters
        self._follow_counters = counters is not None
        self._min_capacity = int(min_capacity_bytes)
        self._pid = os.getpid()
        self._closed = False
        ctl, self._lock = self._open_control(replace_invalid)
        self._ctl_seg = ctl
        self._cw = ctl.words
        self._view = TablesView(ctl)
        if slot_reuse_ns is None:
            slot_reuse_ns = DEFAULT_SLOT_REUSE_NS
            if counters is not None:  # the counters' own window, plus two buckets
                slot_reuse_ns = counters.window_ns + 2 * counters.bucket_ns
        self._slots = SlotAllocator(slot_reuse_ns)
        self.generation = 0
        self.recovered: Table | None = None
        self._recover()
        # A writer killed while growing leaves the new data segment (before the switch)
        # or the old one (after it): we hold the writer lock, so they are nobody's.
        cur = self._cw[C_CURRENT]
        self.removed_stale = unlink_stale_epochs(namespace, "tables", cur >> 1 if cur else None)
        self._cw[C_WRITER_START] = ticks
        self._cw[C_WRITER_PID] = self._pid
        self._cw[C_HEARTBEAT] = int(np.uint64(np.int64(self._clock())))
        write_status(ctl, "", 0)  # the previous writer's problems are not ours

    def _follow_replaced_counters(self) -> None:
        """Attach the namespace's counters again if they were removed or recreated.

        A gunicorn master that restarts (or an external server that recreated them)
        makes new counters; growing or resetting the old, unlinked ones would reach no
        worker. One ``stat`` per publish.
        """
        if not self._follow_counters:
            return
        c = self._counters
        if c is not None and not c.replaced():
            return
        from shm.counters import CounterStore

        if c is not None:
            c.close(unlink=False)
        try:
            self._counters = CounterStore.attach(self.namespace, writable=True)
        except (SegmentMissingError, SegmentCorruptError):
            self._counters = None  # none now; looked for again at the next publish

    # -- setup --------------------------------------------------------------------------

    def _open_control(self, replace_invalid: bool) -> tuple[Segment, WriterLock]:
        for _ in range(3):
            try:
                seg: Segment | None = Segment.create(self.name, CONTROL_BYTES)
            except SegmentExistsError:
                seg = None
            try:
                lock = WriterLock(self.name)
            except SegmentMissingError:
                continue  # removed meanwhile (a writer closing): start over
            except WriterBusyError as exc:
                if seg is not None:
                    seg.close()
                raise WriterBusyError(
                    self.name, f"process {self._busy_pid()} is the table writer (writer lock held)"
                ) from exc
            # We hold the writer lock: no other writer is live, none is creating.
            try:
                if seg is None:
                    seg = self._attach_locked()
                if seg.words[C_MAGIC] == 0:
                    # New, or its creator died before writing the magic (written last).
                    self._init_control(seg)
                    return seg, lock
                check_header(
                    seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "a cslb tables control segment"
                )
                return seg, lock
            except SegmentCorruptError:
                if not replace_invalid:
                    lock.release()
                    if seg is not None:
                        seg.close()
                    raise
                unlink_name(self.name)
                lock.release()
                if seg is not None:
                    seg.close()
            except BaseException:
                lock.release()
                raise
        raise WriterBusyError(self.name, "could not create or take over the control segment")

    def _attach_locked(self) -> Segment:
        """Map the existing control segment, holding the writer lock."""
        try:
            seg = Segment.attach(self.name, writable=True, min_size=8)
        except SegmentSizeError:
            # Its creator died before sizing it (nothing can be in it).
            return Segment.reinitialize(self.name, CONTROL_BYTES)
        if seg.words[C_MAGIC] == 0 and seg.size != CONTROL_BYTES:
            seg.close()
            return Segment.reinitialize(self.name, CONTROL_BYTES)
        return seg

    def _busy_pid(self) -> int:
        """PID of the writer holding the lock, as its control segment says (0: unknown)."""
        try:
            seg = Segment.attach(self.name, min_size=CONTROL_BYTES)
        except SegmentError:
            return 0
        try:
            return int(seg.words[C_WRITER_PID])
        finally:
            seg.close()

    def _init_control(self, seg: Segment) -> None:
        seg.buf[:] = bytes(seg.size)  # whatever a creator killed mid-way left
        hdr = seg.header(TABLES_CONTROL)
        hdr["version"] = LAYOUT_VERSION
        hdr["size"] = seg.size
        hdr["epoch"] = 0
        hdr["current"] = 0
        hdr["generation"] = 0
        hdr["created_ns"] = self._clock()
        seam("tables.control.init")
        fence()
        hdr["magic"] = MAGIC_TABLES_CONTROL  # last: readers wait for it

    def _recover(self) -> None:
        cur = self._cw[C_CURRENT]
        self.generation = int(self._cw[C_GENERATION])
        if cur == 0:
            return
        try:
            _, table = self._view.read(None, 1.0)
        except SegmentError:
            return  # unreadable: keep the generation count, start slots afresh
        if table.generation > self.generation:
            # The last writer died between switching ``current`` and storing the
            # generation word: store it now, so every reader reads it again.
            self.generation = table.generation
            self._cw[C_GENERATION] = table.generation
        self.recovered = table
        self._slots = SlotAllocator.recover(
            table.endpoints, table.slots, table.slot_freed_ns, self._slots.reuse_after_ns
        )

    # -- publishing ---------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise WriterUnusableError(f"table writer of {self.name} is closed")
        if os.getpid() != self._pid:
            raise WriterUnusableError(
                f"table writer of {self.name} was created in process {self._pid}; "
                "a forked child must create its own writer"
            )

    def publish(
        self,
        ring_set: lbcore.RingSet,
        *,
        zones: Sequence[str] | None = None,
        nodes: Sequence[str] | None = None,
        ejected: Any = None,
        ejections: Ejections | None = None,
        outlier_panic: bool = False,
        knobs: Knobs | None = None,
        now_ns: int | None = None,
        skip_unchanged: bool = False,
        zone: ZoneCurve | None = None,
    ) -> int:
        """Publish a new generation; returns its number (previous + 1).

        Parameters
        ----------
        ring_set
            The ring set to route on (endpoints, established and fading rings).
        zones, nodes
            Per endpoint of ``ring_set.endpoints``: zone and node name (default ``""``).
        ejected
            Per endpoint: routing skips it (default ``False``); only without
            ``ejections``.
        ejections
            Outlier-ejection state per endpoint (:class:`lbcore.ejection.Ejections`,
            e.g. from :func:`lbcore.ejection.step`); routing then skips the endpoints
            it ejects, unless ``outlier_panic``.
        outlier_panic
            Too few endpoints are left: routing ignores the ejections
            (:func:`lbcore.ejection.routing_mask`).
        knobs
            Runtime knobs (default :class:`Knobs()`).
        now_ns
            CLOCK_MONOTONIC publish time (default: the writer's clock), in nanoseconds.
        skip_unchanged
            If the table equals the current one in everything but its publish time,
            publish nothing and return the current generation (only the heartbeat is
            written): a knob read back unchanged does not count as a change.
        zone
            The caller's zone and the zone controller's curve (default: no zone,
            affinity off).

        Raises
        ------
        TableInputError
            Malformed input; nothing is published and the previous generation stays.
        SegmentFullError
            Growing the buffers needs more room than ``/dev/shm`` has.
        WriterUnusableError
            The writer was closed, or this is a forked child of its process.
        """
        self._check_usable()
        if not isinstance(ring_set, lbcore.RingSet):
            raise TableInputError(f"publish needs an lbcore.RingSet, got {type(ring_set).__name__}")
        knobs = Knobs() if knobs is None else knobs
        if not isinstance(knobs, Knobs):
            raise TableInputError(f"knobs must be a shm.Knobs, got {type(knobs).__name__}")
        now = self._clock() if now_ns is None else int(now_ns)
        n = len(ring_set.endpoints)
        zone_list = strings(zones, n, "zones")
        node_list = strings(nodes, n, "nodes")
        if ejections is None:
            ej = per_endpoint(ejected, n, np.bool_, "ejected", False)
            state = Ejections.none(n)
        elif ejected is not None:
            raise TableInputError("give ejected flags or ejections, not both")
        elif not isinstance(ejections, Ejections):
            raise TableInputError(
                f"ejections must be an lbcore.ejection.Ejections, got {type(ejections).__name__}"
            )
        else:
            if len(ejections) != n:
                raise TableInputError(f"ejections has {len(ejections)} rows for {n} endpoints")
            e = ejections
            try:
                state = Ejections.of(e.reason, e.until_ns, e.multiplier, e.decay_ns, e.counts)
            except OutlierError as exc:
                raise TableInputError(f"ejections: {exc}") from None
            ej = np.zeros(n, np.bool_) if outlier_panic else state.ejected
        alloc = self._slots.copy()
        slots = alloc.assign(ring_set.endpoints, now)
        gen = self.generation + 1
        enc = encode(
            ring_set,
            generation=gen,
            now_ns=now,
            slots=slots,
            freed_ns=alloc.freed_array(),
            zones=zone_list,
            nodes=node_list,
            ejected=ej,
            ejections=state,
            outlier_panic=outlier_panic,
            knobs=knobs,
            zone=zone,
        )
        self._ctl_seg.check_size()
        self._drop_lost_data()
        if skip_unchanged and self._unchanged(enc):
            self._cw[C_HEARTBEAT] = int(np.uint64(np.int64(now)))
            return self.generation
        self._follow_replaced_counters()
        if self._counters is not None:
            self._counters.ensure_columns(alloc.n_slots)
            if alloc.reused:  # a new endpoint's lifetime totals start at zero
                self._counters.reset_totals(alloc.reused)
        cur_before = self._cw[C_CURRENT]
        data, b, old = self._target(enc.payload_bytes)
        off = self._view.offsets[b]
        words = data.words
        base = off // 8
        seq = words[base + B_SEQ]
        seq = seq + 1 if seq % 2 == 0 else seq + 2  # odd: "being rewritten"
        words[base + B_SEQ] = seq
        fence()
        start = off + BUFFER_HEADER_BYTES
        enc.write(data.buf, start)
        seam("tables.publish.writing")  # the new payload in, its header and seq still odd
        words[base + B_GENERATION] = gen
        words[base + B_PAYLOAD] = enc.payload_bytes
        words[base + B_CHECKSUM] = payload_checksum(data.buf[start : start + enc.payload_bytes])
        fence()
        words[base + B_SEQ] = seq + 1
        fence()
        seam("tables.publish.switch")
        self._cw[C_CURRENT] = (self._view.data_epoch << 1) | b
        seam("tables.publish.current")  # published; the generation word not yet stored
        self._cw[C_GENERATION] = gen
        self._cw[C_HEARTBEAT] = int(np.uint64(np.int64(now)))
        seam("tables.publish.switched")
        self.generation = gen
        self._slots = alloc
        if cur_before and (cur_before >> 1) != self._view.data_epoch:
            # Grown (or replaced a lost or damaged segment): the old one is nobody's now.
            unlink_name(f"{self.name}.{cur_before >> 1}")
        if old is not None:
            old.close()
        return gen

    def _unchanged(self, enc: Encoded) -> bool:
        """True if ``enc`` holds what the current buffer holds, publish details aside."""
        cur = self._cw[C_CURRENT]
        data = self._view.data
        if not cur or data is None or (cur >> 1) != self._view.data_epoch:
            return False
        off = self._view.offsets[cur & 1]
        words = data.words
        if words[off // 8 + B_PAYLOAD] != enc.payload_bytes:
            return False
        start = off + BUFFER_HEADER_BYTES
        current = data.array(PAYLOAD_HEADER, start, 1)[0]
        mine = enc.header.copy()
        for field in ("generation", "published_ns", "publisher_pid"):
            mine[0][field] = current[field]
        if bytes(memoryview(mine).cast("B")) != bytes(data.buf[start : start + mine.nbytes]):
            return False
        pos = start + DIRECTORY_OFFSET
        dir_bytes = memoryview(enc.directory).cast("B")
        if data.buf[pos : pos + dir_bytes.nbytes] != dir_bytes:
            return False
        for (_, section), (off_s, nbytes) in zip(enc.sections, enc.directory.tolist(), strict=True):
            if data.buf[start + off_s : start + off_s + nbytes] != section:
                return False
        return True

    def _target(self, payload_bytes: int) -> tuple[Segment, int, Segment | None]:
        """Data segment and buffer to write (and the old segment if it had to grow).

        A table larger than the buffers goes to a new, larger data segment; the old one
        is returned so it can be unlinked after the switch is published.
        """
        cur = self._cw[C_CURRENT]
        data = self._view.data
        if cur and data is None:
            try:
                data = self._view.data_segment(cur >> 1)
            except SegmentError:
                data = None  # missing or corrupt: publish into a fresh segment instead
        capacity = self._view.buffer_bytes - BUFFER_HEADER_BYTES if data is not None else 0
        if cur and data is not None and payload_bytes <= capacity:
            return data, 1 - (cur & 1), None
        epoch = (cur >> 1) + 1 if cur else 1
        # 25 % headroom; growth stays geometric (each new capacity is > 1.25x the old
        # one, since the payload outgrew it), without doubling what /dev/shm must hold.
        want = max(self._min_capacity, payload_bytes + payload_bytes // 4)
        bb = align(BUFFER_HEADER_BYTES + want, _PAGE)
        size = DATA_HEADER_BYTES + 2 * bb
        name = f"{self.name}.{epoch}"
        seg = Segment.create_replacing(name, size)  # we hold the writer lock
        hdr = seg.header(TABLES_DATA)
        hdr["version"] = LAYOUT_VERSION
        hdr["size"] = size
        hdr["epoch"] = epoch
        hdr["buffer_offset0"] = DATA_HEADER_BYTES
        hdr["buffer_offset1"] = DATA_HEADER_BYTES + bb
        hdr["buffer_bytes"] = bb
        hdr["magic"] = MAGIC_TABLES_DATA
        seg.close()
        old = self._view.data
        self._view.data = None  # keep `old` mapped until the switch is published
        try:
            new = self._view.data_segment(epoch)
        except BaseException:
            self._view.data = old
            unlink_name(name)
            raise
        return new, 0, old

    def slots_of(self, endpoints: Sequence[str]) -> np.ndarray:
        """``int32`` counter slot of each endpoint in the last published table (-1: none)."""
        slot_of = self._slots.slot_of
        return np.array([slot_of.get(ep, -1) for ep in endpoints], dtype=np.int32)

    def heartbeat(self, now_ns: int | None = None) -> None:
        """Record that the writer is alive (does not change the generation).

        Raises
        ------
        SegmentSizeError
            The control segment was shrunk under the mapping (see :meth:`lost`).
        """
        self._check_usable()
        self._ctl_seg.check_size()
        now = self._clock() if now_ns is None else int(now_ns)
        self._cw[C_HEARTBEAT] = int(np.uint64(np.int64(now)))

    def lost(self) -> tuple[str, str] | None:
        """Which segment readers can no longer see, and why (``None``: nothing lost).

        ``("control", why)``: the control segment was removed, replaced or shrunk (by
        a ``/dev/shm`` cleanup, systemd's ``RemoveIPC``, another process of the user); a
        new writer must take over (:meth:`adopt`). ``("data", why)``: the current data
        segment was removed or shrunk; the next :meth:`publish` writes a new one by
        itself. Two ``stat`` calls and a size check of each mapping.
        """
        ctl = self._ctl_seg
        if current_inode(self.name) != ctl.inode:
            return "control", f"control segment {self.name} was removed or replaced"
        size = ctl.shrunk_to()
        if size is not None:
            return "control", f"control segment {self.name} shrank to {size} bytes"
        data = self._view.data
        if data is None or not self._cw[C_CURRENT]:
            return None
        if current_inode(data.name) != data.inode:
            return "data", f"data segment {data.name} was removed or replaced"
        size = data.shrunk_to()
        if size is not None:
            return "data", f"data segment {data.name} shrank to {size} bytes"
        return None

    def adopt(self, previous: TableWriter) -> None:
        """Continue ``previous``, a writer whose segments were lost.

        Its generation count and counter slots carry over, so generations keep counting
        publishes and endpoints keep their counter columns. Call before the first publish.
        """
        self.generation = max(self.generation, previous.generation)
        self._cw[C_GENERATION] = self.generation
        self._slots = previous._slots.copy()

    def _drop_lost_data(self) -> None:
        """Unmap a current data segment that was removed or shrunk: publish anew instead."""
        data = self._view.data
        if data is None:
            return
        if data.shrunk_to() is not None or current_inode(data.name) != data.inode:
            self._view.data, self._view.data_epoch, self._view.bad = None, 0, None
            data.close()

    def set_status(self, problem: str, since_ns: int = 0) -> None:
        """Report what is wrong with the sources (``""``: nothing) to every reader.

        Does not change the generation; :meth:`TableReader.status` reads it.
        """
        self._check_usable()
        self._ctl_seg.check_size()
        write_status(self._ctl_seg, problem, since_ns)

    @property
    def n_slots(self) -> int:
        """Counter columns the published tables use."""
        return self._slots.n_slots

    def capacity_bytes(self) -> int:
        """Payload capacity in bytes of each buffer (0 before the first publish)."""
        return max(self._view.buffer_bytes - BUFFER_HEADER_BYTES, 0)

    def close(self, *, unlink: bool = True) -> None:
        """Stop writing; with ``unlink`` remove the namespace's tables segments.

        Workers that mapped a table keep routing on it; new readers find nothing.
        """
        if self._closed:
            return
        self._closed = True
        if unlink and os.getpid() == self._pid:
            unlink_name(self.name)
            for seg_name in epoch_segments(self.namespace, "tables").values():
                unlink_name(seg_name)
        if self._view.data is not None:
            self._view.data.close()
        self._ctl_seg.close()
        self._lock.release()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
