"""Routing tables in shared memory: one writer, any number of readers, no torn reads.

The discovery process publishes with a :class:`TableWriter`; every worker maps the
tables with a :class:`TableReader` and routes on zero-copy NumPy views of them. A table
(:class:`Table`) holds everything a worker needs to route: the endpoints with zone, node
and stable counter slot; the lbcore :class:`~lbcore.RingSet` (each ring's sorted hashes,
owners and bucket table, wrapped by :meth:`lbcore.Ring.from_arrays` so no worker ever
hashes or sorts a ring); per-endpoint ejected flags and outlier-ejection state (why, until
when, how often); the runtime knobs; the publisher's PID and the publish time.

Protocol
--------
Segments: a small *control* segment ``/cslb.<ns>.tables`` and a *data* segment
``/cslb.<ns>.tables.<epoch>`` with two buffers. The control word ``current`` packs
``epoch << 1 | buffer``: the one buffer readers should use. Each buffer starts with a
header whose ``seq`` is odd while the writer rewrites the buffer (a seqlock), then the
``generation``, the payload length and an XXH3-64 ``checksum`` of the payload.

Publish (writer; ``fence`` = store->store ordering, see :func:`shm.segment.fence`)::

    idle buffer B (the one ``current`` does not name); s = B.seq made odd
    B.seq = s ; fence ; write payload ; B.generation, length, checksum ; fence
    B.seq = s + 1 ; fence ; control.current = (epoch, B) ; control.generation = g
    (killed between the last two stores, the table is published and the word one
    behind: readers that mapped it say its generation, the next writer repairs it)

Read (reader; ``fence`` = load->load ordering)::

    c = control.current ; fence ; s1 = buffer(c).seq ; fence
    retry if control.current != c now, or if s1 is odd
    map the payload; first time for this (epoch, buffer, s1): verify the checksum and
    every offset, count and index, build the Table of zero-copy views
    fence ; retry unless buffer(c).seq == s1 still
    ... route on the views ...
    fence ; s2 = buffer(c).seq ; the routing result counts only if s1 == s2

Why it is correct:

* A reader only takes a generation that ``current`` named at some moment after the
  generation was complete. The writer's stores go: the idle buffer's ``seq`` even
  (payload complete), then ``current`` names that buffer. The reader's loads go:
  ``current`` (``c``), the buffer's ``seq`` (``s1``), ``current`` again. If ``s1`` is
  the even ``seq`` of a publish, the second load of ``current`` happens after that
  publish's buffer was complete, so it returns either that publish's switch (or a
  later one), or the *other* buffer — never ``c`` from before. Only comparing the two
  loads of ``current`` makes this hold: a reader that stalled after loading ``c``
  while the writer published once into the other buffer and then completed the next
  generation in ``c``'s buffer, but had not switched yet, would otherwise take a
  generation that is not current, go back to the older current one on its next call,
  and, had the writer died before switching, see a new writer publish a *different*
  table under the same generation number (review finding B1; the regression test
  forces exactly that interleaving with real processes). A stale ``current`` equal to
  ``c`` after a later switch back to the same buffer is harmless: that switch came
  after another rewrite of the buffer, whose odd ``seq`` the final ``seq`` check sees.
* The writer never writes the buffer ``current`` names, so a reader holding the
  current buffer is undisturbed until the writer has published *twice* more. When it
  does rewrite that buffer, it makes ``seq`` odd *before* its first payload store and
  even (and larger) only *after* its last; a reader whose route overlapped any payload
  store therefore reads ``s2 != s1`` and retries. ``Table.valid()`` is that second
  read, and :meth:`TableReader.consistent` the retry loop; a routing function that
  faults on garbage (say an out-of-range owner) while the table is invalid is retried
  the same way, and NumPy's bounds checks mean a garbage index can raise but never
  read outside the mapping.
* A writer killed mid-publish leaves an odd ``seq`` in a buffer ``current`` does not
  name, or a complete buffer it never switched to: readers never take either (first
  point) and keep the previous generation; a new writer takes the writer lock
  (released by the kernel when the old writer died), continues the generation count
  from the control segment, writes the idle buffer again and publishes.
* Generations only increase, per reader: each table a reader returns was current at
  its second load of ``current``, later loads of one location never return older
  values (coherence), and ``current`` only ever moves to newer generations. (A
  :class:`TableReader` that follows a *new* control segment, after the writer removed
  the old one, follows that writer's count, which starts again at 1.)
* Readers write nothing to the tables segments (they are mapped read-only) and take no
  cross-process lock, so they cannot block the writer; a reader can only be delayed by
  a writer that republishes faster than it can map a table.
* On x86-64 (TSO) the CPU keeps loads in order with loads and stores with stores,
  which is all this needs, and the fences are no-ops. On arm64 or POWER they are real
  barriers (:func:`shm.segment.fence`): the reader's order ``current`` -> ``seq`` ->
  ``current`` -> payload -> ``seq`` and the writer's ``seq`` -> payload -> ``seq`` ->
  ``current`` are each fenced.
* What the checksum buys there: it does not depend on any barrier at all. A reader
  verifies it the first time it maps a generation, over every payload byte it will use,
  so whatever the CPU did with the order in which the writer's stores became visible,
  a generation is only ever used after the reader has seen all of it exactly as the
  writer wrote it (a mismatch with a stable ``seq`` is retried briefly, then reported
  as :class:`~shm.errors.TableChecksumError`). Cache coherence, which every CPU keeps
  per memory location, then guarantees that the reader's later loads of those bytes
  return these values or newer ones (a rewrite), never older ones. The same check
  catches a corrupted or foreign segment. The barriers are then needed for the
  ordering of ``current`` and ``seq`` (first point) and for a reader still routing on
  a buffer the writer reuses two publishes later, where ``seq`` must be ordered
  around the payload loads.

Capacity: a table larger than the buffers goes to a new data segment
``/cslb.<ns>.tables.<epoch+1>`` whose buffers hold 1.25x its size; ``current`` then
names the new epoch and readers attach it on their next :meth:`TableReader.table`
call. The writer unlinks the old segment at once (readers still mapping it keep their
mapping until they drop their last view of it), so ``/dev/shm`` holds both segments
only briefly. A writer killed between creating the new segment and switching, or
between switching and unlinking the old one, leaves one behind: the next writer
removes every data segment ``current`` does not name when it takes over.

Mapping off the caller's path: verifying and validating a new generation costs tens of
milliseconds for tens of thousands of endpoints (an XXH3-64 over ~80 MiB at 20,000
endpoints, ~5 ms, then every offset, count and index). ``TableReader(background=True)`` does it
in a thread while :meth:`TableReader.table` keeps returning the previous table, which
stays valid until the writer has published twice more (it never writes the current
buffer); should that buffer be rewritten first, :meth:`TableReader.table` waits for the
new generation. Every guarantee above holds unchanged: the thread runs the same read.
While nobody calls :meth:`TableReader.table`, the thread looks for a new generation
every ``prefetch_s`` and maps it ahead (an idle worker's next call neither maps nor
waits). With ``foreground_bytes``, generations up to that size are still mapped by the caller
(cheaper than handing them to a thread; the workers' Router uses 2 MiB). A due check
for a replaced control segment (``recheck_s``) is a ``stat`` made before the thread
starts, never a reason to map in the foreground.

Restart: a writer that stops cleanly removes the segments; readers keep their last
table, and :class:`TableReader` switches to the next writer's new control segment by
itself once that writer has published (checked every ``recheck_s``).
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

import lbcore
from lbcore import knobs as lbcore_knobs
from lbcore.ejection import Ejections
from lbcore.errors import OutlierError
from lbcore.hashing import digest
from lbcore.outlier import EJECT_REASONS
from lbcore.ring import host_key
from lbcore.signals import DEFAULT_WINDOW_NS
from shm.background import BackgroundWorker, Job
from shm.errors import (
    SegmentCorruptError,
    SegmentError,
    SegmentExistsError,
    SegmentLayoutError,
    SegmentMissingError,
    SegmentSizeError,
    TableChecksumError,
    TableInputError,
    TableUnavailableError,
    WriterBusyError,
    WriterUnusableError,
)
from shm.layout import (
    BUFFER_HEADER,
    BUFFER_HEADER_BYTES,
    CONTROL_BYTES,
    DATA_HEADER_BYTES,
    LAYOUT_VERSION,
    MAGIC_PAYLOAD,
    MAGIC_TABLES_CONTROL,
    MAGIC_TABLES_DATA,
    PAYLOAD_HEADER,
    SECTION,
    TABLE_SECTIONS,
    TABLES_CONTROL,
    TABLES_DATA,
    align,
    ring_sections,
    table_sections,
    word,
)
from shm.segment import (
    _TSO,
    Segment,
    WriterLock,
    attach_initialized,
    check_header,
    current_inode,
    epoch_segments,
    fence,
    own_start_ticks,
    process_alive,
    seam,
    segment_name,
    unlink_name,
    unlink_stale_epochs,
)
from shm.status import PublisherStatus, read_status, write_status

if TYPE_CHECKING:
    from shm.counters import CounterStore

__all__ = [
    "DEFAULT_SLOT_REUSE_NS",
    "Knobs",
    "SlotAllocator",
    "Table",
    "TableReader",
    "TableWriter",
]

T = TypeVar("T")

#: A freed counter slot is reused only this long after its endpoint left: the occupancy
#: window plus margin, so the new endpoint never inherits the old one's load.
DEFAULT_SLOT_REUSE_NS = DEFAULT_WINDOW_NS + 2_000_000_000

_WEAK = not _TSO
_MAX_ENDPOINTS = 1 << 20
# How long a verdict "this buffer is corrupt" stands before the buffer is checked again.
# Any process of the user can write the segment: bytes damaged for a moment (and
# repaired, or rewritten with the same sequence number) must not be refused forever,
# and re-checking costs a checksum of the payload, so not on every read either.
_BAD_RECHECK_NS = 1_000_000_000
_MAX_RINGS = 64
_MAX_VNODES = 1 << 16
_MIN_BUCKET_BITS = 1
_MAX_BUCKET_BITS = 32  # lbcore builds at most MAX_BUCKET_BITS; accept any sane table
_PAGE = 4096

# Word indices used on hot paths.
_C_MAGIC = word(TABLES_CONTROL, "magic")
_C_CURRENT = word(TABLES_CONTROL, "current")
_C_GENERATION = word(TABLES_CONTROL, "generation")
_C_WRITER_PID = word(TABLES_CONTROL, "writer_pid")
_C_WRITER_START = word(TABLES_CONTROL, "writer_start")
_C_HEARTBEAT = word(TABLES_CONTROL, "heartbeat_ns")
_B_SEQ = word(BUFFER_HEADER, "seq")
_B_GENERATION = word(BUFFER_HEADER, "generation")
_B_PAYLOAD = word(BUFFER_HEADER, "payload_bytes")
_B_CHECKSUM = word(BUFFER_HEADER, "checksum")
_DIR_OFFSET = align(PAYLOAD_HEADER.itemsize, 8)
_now_ns = time.monotonic_ns
_NO_SEQ = memoryview(np.zeros(1, dtype=np.uint64)).cast("B").cast("Q")  # never equals 1


def _checksum(data: memoryview) -> int:
    # XXH3-64 through lbcore (shm may not import xxhash itself): ~20 GB/s here against
    # CRC-32's ~3 GB/s, which was half of mapping a 20,000-endpoint table; it releases
    # the GIL on large buffers, so a background map does not hold up routing threads.
    return digest(data)


# ------------------------------------------------------------------------------------
# Knobs.


_KNOB_DEFAULTS = lbcore_knobs.defaults()


@dataclass(frozen=True, slots=True)
class Knobs:
    """Runtime knobs, published with every table.

    One change reaches every worker of the host at the same generation. Defaults and
    validation are those of :data:`lbcore.knobs.ROUTING_KNOBS` (declared once there);
    the fade-in duration and exponent and the virtual nodes travel in the ring set.

    Parameters
    ----------
    enabled
        Kill switch: ``False`` routes every key to fallback.
    percentage
        Share of keys (0-100) routed client-side.
    balance_factor
        Bounded-load factor (``>= 1``); ``None`` disables bounded load.
    max_hops
        Cap on the bounded-load walk (``>= 1``); ``None``: Skipper's unlimited walk.
    load_signal
        One of :data:`lbcore.signals.LOAD_SIGNALS`.
    fade_mode
        One of :data:`lbcore.knobs.FADE_MODES`.
    """

    enabled: bool = _KNOB_DEFAULTS["enabled"]
    percentage: float = _KNOB_DEFAULTS["percentage"]
    balance_factor: float | None = _KNOB_DEFAULTS["balance_factor"]
    max_hops: int | None = _KNOB_DEFAULTS["max_hops"]
    load_signal: str = _KNOB_DEFAULTS["load_signal"]
    fade_mode: str = _KNOB_DEFAULTS["fade_mode"]

    def __post_init__(self) -> None:
        for field in self.__slots__:
            value = getattr(self, field)
            if isinstance(value, (float, np.floating)) and math.isnan(value):
                raise TableInputError(f"knob {field} is NaN")
            try:
                typed = lbcore_knobs.knob(field).convert(value, "table knobs")
            except lbcore_knobs.KnobError as exc:
                raise TableInputError(str(exc)) from None
            object.__setattr__(self, field, typed)

    def gate(self) -> lbcore.Gate:
        """The rollout gate these knobs describe."""
        return lbcore.Gate(bool(self.enabled), self.percentage)


# ------------------------------------------------------------------------------------
# Counter slots of endpoints.


class SlotAllocator:
    """Stable counter columns ("slots") for endpoints, across table generations.

    An endpoint keeps its slot for as long as it is in the table. When it leaves, its
    slot is freed and handed to a new endpoint only ``reuse_after_ns`` later, after its
    counters have aged out of the occupancy window. An address that comes back before
    its old slot was reused gets that slot back (a flapping pod keeps its history).

    Parameters
    ----------
    reuse_after_ns
        Minimum time between freeing a slot and reusing it, in nanoseconds.
    """

    def __init__(self, reuse_after_ns: int = DEFAULT_SLOT_REUSE_NS) -> None:
        self.reuse_after_ns = int(reuse_after_ns)
        self.slot_of: dict[str, int] = {}
        self.freed_ns: dict[int, int] = {}
        self.freed_by: dict[str, int] = {}  # address -> its freed, not yet reused slot
        self.n_slots = 0
        #: Slots the last :meth:`assign` handed to a *different* endpoint than before.
        self.reused: list[int] = []

    def copy(self) -> SlotAllocator:
        """An independent copy (publish works on a copy and commits it on success)."""
        out = SlotAllocator(self.reuse_after_ns)
        out.slot_of = dict(self.slot_of)
        out.freed_ns = dict(self.freed_ns)
        out.freed_by = dict(self.freed_by)
        out.n_slots = self.n_slots
        return out

    @classmethod
    def recover(
        cls, endpoints: Sequence[str], slots: np.ndarray, freed_ns: np.ndarray, reuse_after_ns: int
    ) -> SlotAllocator:
        """Rebuild the allocator from a published table (a new writer taking over)."""
        out = cls(reuse_after_ns)
        out.slot_of = {ep: int(s) for ep, s in zip(endpoints, slots.tolist(), strict=True)}
        out.n_slots = int(freed_ns.size)
        used = set(out.slot_of.values())
        for s, t in enumerate(freed_ns.tolist()):
            if s not in used:
                out.freed_ns[s] = max(int(t), 0)
        return out

    def assign(self, endpoints: Sequence[str], now_ns: int) -> np.ndarray:
        """Slots of ``endpoints`` at ``now_ns`` (mutates this allocator).

        Returns
        -------
        numpy.ndarray
            ``int32`` slot per endpoint, unique.
        """
        slot_of = self.slot_of
        wanted = set(endpoints)
        for ep in [ep for ep in slot_of if ep not in wanted]:
            s = slot_of.pop(ep)
            self.freed_ns[s] = now_ns
            self.freed_by[ep] = s
        got: list[int | None] = list(map(slot_of.get, endpoints))
        self.reused = []
        if None in got:  # new endpoints (a lookup per endpoint above covers the rest)
            reusable = sorted(
                s for s, t in self.freed_ns.items() if now_ns - t >= self.reuse_after_ns
            )
            reusable.reverse()  # pop() takes the lowest
            for i, s in enumerate(got):
                if s is not None:
                    continue
                ep = endpoints[i]
                s = self.freed_by.pop(ep, None)
                if s is None or s not in self.freed_ns:
                    s = None
                    while reusable:
                        cand = reusable.pop()
                        if cand in self.freed_ns:
                            s = cand
                            self.reused.append(s)
                            break
                    if s is None:
                        s = self.n_slots
                        self.n_slots += 1
                self.freed_ns.pop(s, None)
                slot_of[ep] = s
                got[i] = s
            # Forget "came back" hints for slots that now belong to someone else.
            taken = set(slot_of.values())
            self.freed_by = {ep: s for ep, s in self.freed_by.items() if s not in taken}
        return np.array(got, dtype=np.int32)

    def freed_array(self) -> np.ndarray:
        """Per slot: ``-1`` in use, else the CLOCK_MONOTONIC time it was freed (ns)."""
        out = np.full(self.n_slots, -1, dtype=np.int64)
        for s, t in self.freed_ns.items():
            out[s] = t
        return out


# ------------------------------------------------------------------------------------
# The reader's view of one generation.


class Table:
    """One published generation, as a reader sees it. Immutable.

    Arrays are read-only zero-copy views of shared memory; they stay correct for as
    long as :meth:`valid` is true (the writer reuses a buffer only two publishes later).

    Attributes
    ----------
    generation : int
        Publish count (0: nothing published yet; an empty table).
    published_ns : int
        CLOCK_MONOTONIC time of the publish, in nanoseconds.
    publisher_pid : int
        PID of the process that published it.
    endpoints, zones, nodes : tuple[str, ...]
        Per endpoint: address, zone and node name (``""`` if unknown).
    slots : numpy.ndarray
        ``int32`` counter slot (column of the counter matrix) per endpoint.
    ejected : numpy.ndarray
        ``bool`` per endpoint: routing skips it (ejected by outlier detection; none
        while :attr:`outlier_panic`).
    ejections : lbcore.ejection.Ejections
        Outlier-ejection state per endpoint (views): reason code (0: not ejected),
        until when (CLOCK_MONOTONIC ns), multiplier, next decay and ejections so far
        per reason (:data:`lbcore.outlier.EJECT_REASONS`).
    outlier_panic : bool
        Too few endpoints are left un-ejected: routing ignores every ejection.
    ring_set : lbcore.RingSet
        The established and fading rings (fade duration and exponent included).
    knobs : Knobs
        Runtime knobs of this generation.
    n_slots : int
        Counter columns in use (every slot is below it).
    slot_freed_ns : numpy.ndarray
        ``int64`` per counter slot: ``-1`` in use, else when it was freed (ns).
    segment : str
        Name of the data segment holding it.
    buffer_offset : int
        Byte offset in that segment of the buffer holding it (its header, then the
        payload); ``-1`` for no table.
    """

    __slots__ = (
        "_mapped",
        "_seq",
        "_seq_index",
        "_seq_words",
        "buffer",
        "buffer_offset",
        "ejected",
        "ejections",
        "endpoints",
        "generation",
        "knobs",
        "n_slots",
        "nodes",
        "outlier_panic",
        "published_ns",
        "publisher_pid",
        "ring_set",
        "segment",
        "slot_freed_ns",
        "slots",
        "zones",
    )

    @classmethod
    def empty(cls) -> Table:
        """A generation-0 table without endpoints: what readers see before any publish.

        Always valid; routing on it gives fallback (``-1``) for every key.
        """
        return _empty_table()

    def __repr__(self) -> str:
        return (
            f"Table(generation {self.generation}, {len(self.endpoints)} endpoints, "
            f"{len(self.ring_set.rings)} ring(s), {self.segment} buffer {self.buffer})"
        )

    def valid(self) -> bool:
        """True while the writer has not started rewriting this table's buffer.

        Check it *after* using the table: a result computed from it counts only if the
        table is still valid then. Costs one shared-memory load and an ``lseek`` to the end of
        the data segment: a table whose segment was shrunk under it (by another
        process) is invalid, and reading its sequence word would fault.
        """
        seg = self._mapped
        if seg is not None and seg.shrunk_to() is not None:
            return False
        if _WEAK:
            fence()
        return self._seq_words[self._seq_index] == self._seq

    @property
    def guard(self) -> tuple[Any, int, int]:
        """The sequence check of this table as :class:`lbcore.Plan` takes it: ``(words, i, value)``.

        A plan built with it says after each batch whether the table was still valid
        (what :meth:`valid` says then), read by the kernel with acquire ordering.
        """
        return self._seq_words, self._seq_index, self._seq

    @property
    def fade_duration_ns(self) -> int:
        """Fade-in window of the ring set, in nanoseconds."""
        return self.ring_set.duration_ns

    @property
    def fade_exponent(self) -> float:
        """Fade-in curve exponent of the ring set."""
        return self.ring_set.exponent


def _empty_table() -> Table:
    t = Table.__new__(Table)
    t.generation = 0
    t.published_ns = 0
    t.publisher_pid = 0
    t.endpoints = t.zones = t.nodes = ()
    t.slots = np.empty(0, dtype=np.int32)
    t.ejected = np.empty(0, dtype=np.bool_)
    t.ejections = Ejections.none(0)
    t.outlier_panic = False
    t.ring_set = lbcore.RingSet(())
    t.knobs = Knobs()
    t.n_slots = 0
    t.slot_freed_ns = np.empty(0, dtype=np.int64)
    t.segment = ""
    t.buffer = -1
    t.buffer_offset = -1
    t._seq_words = memoryview(np.zeros(1, dtype=np.uint64)).cast("B").cast("Q")
    t._seq_index = 0
    t._seq = 0
    t._mapped = None
    return t


# ------------------------------------------------------------------------------------
# Encoding (writer side).


def _blob(strings: Sequence[str], what: str) -> bytes:
    try:
        joined = "\0".join(strings)
    except TypeError:
        joined = None
    if joined is None or joined.count("\0") != max(len(strings) - 1, 0):
        for s in strings:  # find the culprit
            if not isinstance(s, str):
                raise TableInputError(f"{what} must be strings, got {type(s).__name__}: {s!r}")
            if "\0" in s:
                raise TableInputError(f"{what} must not contain NUL characters: {s!r}")
    assert joined is not None
    try:
        return joined.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TableInputError(f"{what} are not valid Unicode (lone surrogate?): {exc}") from exc


def _per_endpoint(values: Any, n: int, dtype: Any, what: str, default: Any) -> np.ndarray:
    if values is None:
        return np.full(n, default, dtype=dtype)
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise TableInputError(f"{what} has shape {arr.shape}, expected ({n},) for {n} endpoints")
    return np.ascontiguousarray(arr, dtype=dtype)


def _strings(values: Sequence[str] | None, n: int, what: str) -> list[str]:
    if values is None:
        return [""] * n
    out = list(values)
    if len(out) != n:
        raise TableInputError(f"{what} has {len(out)} entries, expected {n} (one per endpoint)")
    return out


class _Encoded:
    """A table laid out as a payload: header, section directory, sections."""

    def __init__(self, header: np.ndarray, sections: list[tuple[str, memoryview]]) -> None:
        self.header = header
        self.sections = sections
        self.directory = np.zeros(len(sections), dtype=SECTION)
        off = align(_DIR_OFFSET + SECTION.itemsize * len(sections), 64)
        for i, (_, data) in enumerate(sections):
            self.directory[i] = (off, data.nbytes)
            off = align(off + data.nbytes, 64)
        self.payload_bytes = off

    def write(self, buf: memoryview, start: int) -> None:
        hb = memoryview(self.header).cast("B")
        buf[start : start + hb.nbytes] = hb
        db = memoryview(self.directory).cast("B")
        buf[start + _DIR_OFFSET : start + _DIR_OFFSET + db.nbytes] = db
        pos = start + _DIR_OFFSET + db.nbytes
        for (_, data), (off, nbytes) in zip(self.sections, self.directory.tolist(), strict=True):
            # Zero the alignment gaps too: the checksum covers every payload byte.
            buf[pos : start + off] = bytes(start + off - pos)
            buf[start + off : start + off + nbytes] = data
            pos = start + off + nbytes
        buf[pos : start + self.payload_bytes] = bytes(start + self.payload_bytes - pos)


def _bytes_of(arr: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(arr).reshape(-1)).cast("B")


def _encode(
    ring_set: lbcore.RingSet,
    *,
    generation: int,
    now_ns: int,
    slots: np.ndarray,
    freed_ns: np.ndarray,
    zones: list[str],
    nodes: list[str],
    ejected: np.ndarray,
    ejections: Ejections,
    outlier_panic: bool,
    knobs: Knobs,
) -> _Encoded:
    eps = ring_set.endpoints
    n = len(eps)
    rings = ring_set.rings
    if n and len(rings) != len(ring_set.starts_ns) + 1:
        raise TableInputError(
            f"ring set has {len(rings)} rings for {len(ring_set.starts_ns)} fading events"
        )
    if len(rings) > _MAX_RINGS or n > _MAX_ENDPOINTS:
        raise TableInputError(
            f"table too large: {n} endpoints, {len(rings)} rings "
            f"(limits {_MAX_ENDPOINTS} endpoints, {_MAX_RINGS} rings)"
        )
    hdr = np.zeros(1, dtype=PAYLOAD_HEADER)
    h = hdr[0]
    h["magic"] = MAGIC_PAYLOAD
    h["generation"] = generation
    h["published_ns"] = now_ns
    h["publisher_pid"] = os.getpid()
    h["endpoints"] = n
    h["rings"] = len(rings)
    h["vnodes"] = ring_set.vnodes
    h["slots"] = freed_ns.size
    h["fade_duration_ns"] = ring_set.duration_ns
    h["fade_exponent"] = ring_set.exponent
    h["enabled"] = int(bool(knobs.enabled))
    h["percentage"] = knobs.percentage
    h["balance_factor"] = math.nan if knobs.balance_factor is None else knobs.balance_factor
    h["max_hops"] = -1 if knobs.max_hops is None else int(knobs.max_hops)
    h["load_signal"] = knobs.load_signal.encode("ascii")
    h["fade_mode"] = knobs.fade_mode.encode("ascii")
    h["outlier_panic"] = int(bool(outlier_panic))
    ej = ejections
    sections: list[tuple[str, memoryview]] = [
        ("addresses", memoryview(_blob(eps, "endpoint addresses"))),
        ("zones", memoryview(_blob(zones, "zones"))),
        ("nodes", memoryview(_blob(nodes, "node names"))),
        ("slot", _bytes_of(slots.astype(np.int32))),
        ("ejected", _bytes_of(ejected.astype(np.uint8))),
        ("eject_reason", _bytes_of(ej.reason.astype(np.uint8))),
        ("eject_until_ns", _bytes_of(ej.until_ns.astype(np.int64))),
        ("eject_multiplier", _bytes_of(ej.multiplier.astype(np.int32))),
        ("eject_decay_ns", _bytes_of(ej.decay_ns.astype(np.int64))),
        ("ejections", _bytes_of(ej.counts.astype(np.int64))),
        ("tier", _bytes_of(np.asarray(ring_set.tiers, dtype=np.int32))),
        ("starts_ns", _bytes_of(np.array(ring_set.starts_ns, dtype=np.int64))),
        ("slot_freed_ns", _bytes_of(freed_ns)),
        ("ring_nodes", _bytes_of(np.array([len(r) for r in rings], dtype=np.int64))),
        ("ring_pos", _bytes_of(np.asarray(ring_set.ring_pos, dtype=np.int32))),
        ("owner_table", _bytes_of(np.asarray(ring_set.owner_table, dtype=np.int32))),
    ]
    if rings and not np.array_equal(ring_set.owner_table[-1], rings[-1].owners):
        # Readers take the newest ring's owners from this row (it is not stored twice).
        raise TableInputError("ring set's owner table does not end with its newest ring's owners")
    for k, ring in enumerate(rings):
        arrays = {"hashes": (ring.hashes, np.uint64), "owners": (ring.owners, np.int32)}
        arrays["buckets"] = (ring.buckets, np.int32)
        for name, _ in ring_sections(k, len(rings)):
            arr, dt = arrays[name.split(".")[1]]
            sections.append((name, _bytes_of(np.asarray(arr, dtype=dt))))
    h["sections"] = len(sections)
    return _Encoded(hdr, sections)


# ------------------------------------------------------------------------------------
# Decoding and validation (reader side; the writer uses it to recover).


class _Decoder:
    """Checks one buffer's payload and builds the :class:`Table` of views over it."""

    def __init__(
        self,
        data: Segment,
        buffer: int,
        start: int,
        payload_bytes: int,
        host_keys: dict[str, str] | None = None,
    ) -> None:
        self.data = data
        self.buffer = buffer
        self.start = start
        self.nbytes = payload_bytes
        self.where = f"buffer {buffer}"
        # endpoint -> lbcore.host_key of the previous generation a reader decoded: a new
        # generation mostly repeats its endpoints, and parsing 20,000 URLs costs ~0.1 s.
        self.host_keys = {} if host_keys is None else host_keys
        self.on_host_keys: Callable[[dict[str, str]], None] | None = None

    def host_ids(self, eps: tuple[str, ...]) -> np.ndarray:
        """Per endpoint, the id of its host identity (what ``lbcore.ring.host_ids_of`` gives).

        Computed once for all rings of the table, from the previous generation's
        :attr:`host_keys` where an endpoint repeats; :attr:`host_keys` then becomes the
        keys of exactly these endpoints (the next generation's decoder starts from them).
        """
        known = self.host_keys
        keys: dict[str, str] = {}
        ids: dict[str, int] = {}
        out = np.empty(len(eps), dtype=np.intp)
        for i, ep in enumerate(eps):
            key = known.get(ep)
            if key is None:
                key = host_key(ep)
            keys[ep] = key
            out[i] = ids.setdefault(key, len(ids))
        out.flags.writeable = False
        self.host_keys = keys
        if self.on_host_keys is not None:
            self.on_host_keys(keys)
        return out

    def fail(self, message: str) -> SegmentLayoutError:
        return SegmentLayoutError(self.data.name, f"{self.where}: {message}")

    def decode(self, generation: int) -> Table:
        data, start = self.data, self.start
        if self.nbytes < _DIR_OFFSET:
            raise self.fail(f"payload of {self.nbytes} bytes is shorter than a table header")
        h = data.array(PAYLOAD_HEADER, start, 1).copy()[0]
        if int(h["magic"]) != MAGIC_PAYLOAD:
            raise self.fail("payload does not start with the table magic")
        if int(h["generation"]) != generation:
            raise self.fail(
                f"payload is generation {int(h['generation'])}, buffer header says {generation}"
            )
        self.where = f"buffer {self.buffer} generation {generation}"
        n = int(h["endpoints"])
        n_rings = int(h["rings"])
        vnodes = int(h["vnodes"])
        n_slots = int(h["slots"])
        if n > _MAX_ENDPOINTS or n_rings > _MAX_RINGS or not 1 <= vnodes <= _MAX_VNODES:
            raise self.fail(f"counts out of range: {n} endpoints, {n_rings} rings, {vnodes} vnodes")
        if (n == 0) != (n_rings == 0):
            raise self.fail(f"{n} endpoints but {n_rings} rings")
        if n_slots > _MAX_ENDPOINTS * 4 or n_slots < n:
            raise self.fail(f"{n_slots} counter slots for {n} endpoints")
        n_sections = int(h["sections"])
        expect = table_sections(n_rings)
        if n_sections != expect:
            raise self.fail(f"{n_sections} sections, expected {expect} for {n_rings} rings")
        directory = data.array(SECTION, start + _DIR_OFFSET, n_sections).copy()
        first = align(_DIR_OFFSET + SECTION.itemsize * n_sections, 64)
        names = [name for name, _ in TABLE_SECTIONS]
        dtypes = [dt for _, dt in TABLE_SECTIONS]
        for k in range(n_rings):
            for name, dt in ring_sections(k, n_rings):
                names.append(name)
                dtypes.append(dt)
        views: dict[str, Any] = {}
        for (off, nbytes), name, dt in zip(directory.tolist(), names, dtypes, strict=True):
            if off % 8 or off < first or off + nbytes > self.nbytes:
                raise self.fail(
                    f"section {name!r} at offset {off} with {nbytes} bytes lies outside the "
                    f"{self.nbytes}-byte payload"
                )
            if dt is None:
                views[name] = data.buf[start + off : start + off + nbytes]
            else:
                item = np.dtype(dt).itemsize
                if nbytes % item:
                    raise self.fail(f"section {name!r} is {nbytes} bytes, not a multiple of {item}")
                views[name] = data.array(dt, start + off, nbytes // item)

        def count(name: str, expected: int) -> np.ndarray:
            arr = views[name]
            if arr.size != expected:
                raise self.fail(f"section {name!r} has {arr.size} entries, expected {expected}")
            return arr

        def owned(name: str, expected: int) -> np.ndarray:
            # Per-endpoint values are copied before they are checked: any process of the
            # user can write the segment after the check, and these size and index
            # arrays (a slot of 0x7FFFFFF0 must not become a 16 GiB padding). The ring
            # arrays stay views (too large to copy per generation); the kernel bounds
            # every index it reads from them.
            arr = count(name, expected).copy()
            arr.flags.writeable = False  # immutable like the views it stands for
            return arr

        eps = self._strings(views["addresses"], n, "addresses")
        zones = self._strings(views["zones"], n, "zones")
        nodes = self._strings(views["nodes"], n, "nodes")
        if "" in eps:  # (one C-level scan; a generator holds the GIL far longer)
            raise self.fail("an endpoint address is empty")
        slots = owned("slot", n)
        if n and (int(slots.min()) < 0 or int(slots.max()) >= n_slots):
            raise self.fail(f"endpoint slots must be in 0..{n_slots - 1}")
        if n and int(np.bincount(slots, minlength=n_slots).max()) > 1:
            raise self.fail("two endpoints share a counter slot")
        ejected_u8 = owned("ejected", n)
        if n and int(ejected_u8.max()) > 1:
            raise self.fail("ejected flags must be 0 or 1")
        ejections = self._ejections(owned, n)
        panic = int(h["outlier_panic"])
        if panic not in (0, 1):
            raise self.fail(f"outlier panic flag must be 0 or 1, got {panic}")
        tiers = owned("tier", n)
        if n and (int(tiers.min()) < 0 or int(tiers.max()) >= n_rings):
            raise self.fail(f"endpoint tiers must be in 0..{n_rings - 1}")
        starts = owned("starts_ns", max(n_rings - 1, 0))
        if starts.size > 1 and bool((np.diff(starts) < 0).any()):
            raise self.fail("fading events are not ordered oldest first")
        freed = owned("slot_freed_ns", n_slots)
        ring_nodes = owned("ring_nodes", n_rings)
        duration = int(h["fade_duration_ns"])
        exponent = float(h["fade_exponent"])
        if duration < 0 or not math.isfinite(exponent) or exponent <= 0:
            raise self.fail(f"fade duration {duration} ns / exponent {exponent} out of range")
        rings = []
        # Host identities are per endpoint, not per ring: one parse serves every ring.
        host_ids = self.host_ids(eps) if n else None
        master = int(ring_nodes[-1]) if n_rings else 0
        if n_rings and not 1 <= master <= n * vnodes:
            raise self.fail(f"newest ring has {master} nodes for {n} endpoints x {vnodes} vnodes")
        ring_pos = count("ring_pos", n_rings * master).reshape(n_rings, master)
        owner_table = count("owner_table", n_rings * master).reshape(n_rings, master)
        if master and (int(owner_table.min()) < 0 or int(owner_table.max()) >= n):
            raise self.fail(f"owner table must hold endpoint indices 0..{n - 1}")
        for k in range(n_rings):
            m = int(ring_nodes[k])
            names = dict(ring_sections(k, n_rings))
            hn, bn = f"ring{k}.hashes", f"ring{k}.buckets"
            if not 1 <= m <= master:
                raise self.fail(f"ring {k} has {m} nodes, its newest ring {master}")
            hashes = count(hn, m)
            buckets = views[bn]
            bits = buckets.size.bit_length() - 1
            if buckets.size != 1 << bits or not _MIN_BUCKET_BITS <= bits <= _MAX_BUCKET_BITS:
                raise self.fail(
                    f"ring {k} bucket table has {buckets.size} entries, expected a power of two "
                    f"from 2**{_MIN_BUCKET_BITS} to 2**{_MAX_BUCKET_BITS}"
                )
            if m > 1 and bool((hashes[1:] < hashes[:-1]).any()):
                raise self.fail(f"ring {k} hashes are not sorted")
            if f"ring{k}.owners" in names:
                owners = count(f"ring{k}.owners", m)
                if int(owners.min()) < 0 or int(owners.max()) >= n:
                    raise self.fail(f"ring {k} owners must be endpoint indices 0..{n - 1}")
                if int(tiers.take(owners).max()) > k:
                    raise self.fail(f"ring {k} holds endpoints of a newer fading event")
            else:  # the newest ring: its owners are the owner table's last row (checked)
                owners = owner_table[k]
            # Entries: e >= 0 a ring position; -1 "search"; e <= -2 the one node -e - 2.
            if int(buckets.min()) < -(m + 1) or int(buckets.max()) >= m:
                raise self.fail(f"ring {k} bucket table points outside the ring")
            if int(ring_pos[k].min()) < 0 or int(ring_pos[k].max()) >= m:
                raise self.fail(f"routing map of ring {k} points outside the ring")
            rings.append(
                lbcore.Ring.from_arrays(
                    eps, hashes, owners, vnodes=vnodes, buckets=buckets, host_ids=host_ids
                )
            )
        knobs = self._knobs(h)
        t = Table.__new__(Table)
        t._mapped = None  # set by the reader once its sequence word checks out
        t.generation = generation
        t.published_ns = int(h["published_ns"])
        t.publisher_pid = int(h["publisher_pid"])
        t.endpoints = eps
        t.zones = zones
        t.nodes = nodes
        t.slots = slots
        t.ejected = ejected_u8.view(np.bool_)
        t.ejections = ejections
        t.outlier_panic = bool(panic)
        t.knobs = knobs
        t.n_slots = n_slots
        t.slot_freed_ns = freed
        t.segment = data.name
        t.buffer = self.buffer
        t.buffer_offset = self.start - BUFFER_HEADER_BYTES
        if n_rings:
            t.ring_set = lbcore.RingSet.from_parts(
                eps,
                tiers,
                tuple(starts.tolist()),
                tuple(rings),
                ring_pos,
                owner_table,
                duration_ns=duration,
                exponent=exponent,
                vnodes=vnodes,
            )
        else:
            t.ring_set = lbcore.RingSet((), duration_ns=duration, exponent=exponent)
        return t

    def _strings(self, blob: memoryview, n: int, what: str) -> tuple[str, ...]:
        if n == 0:
            if blob.nbytes:
                raise self.fail(f"section {what!r} holds text for an empty table")
            return ()
        try:
            out = bytes(blob).decode("utf-8").split("\0")
        except UnicodeDecodeError as exc:
            raise self.fail(f"section {what!r} is not valid UTF-8: {exc}") from exc
        if len(out) != n:
            raise self.fail(f"section {what!r} holds {len(out)} strings, expected {n}")
        return tuple(out)

    def _ejections(self, count: Callable[[str, int], np.ndarray], n: int) -> Ejections:
        reason = count("eject_reason", n)
        names = ("eject_until_ns", "eject_multiplier", "eject_decay_ns")
        parts = [count(name, n) for name in names]
        counts = count("ejections", n * len(EJECT_REASONS)).reshape(n, len(EJECT_REASONS))
        if n and int(reason.max()) > len(EJECT_REASONS):
            raise self.fail(f"ejection reasons must be 0..{len(EJECT_REASONS)}")
        if n and min(int(p.min()) for p in (*parts, counts)) < 0:
            raise self.fail("ejection times, multipliers and counts must be >= 0")
        return Ejections(reason, *parts, counts)

    def _knobs(self, h: np.void) -> Knobs:
        enabled = int(h["enabled"])
        bf = float(h["balance_factor"])
        hops = int(h["max_hops"])
        try:
            signal = bytes(h["load_signal"]).rstrip(b"\0").decode("ascii")
            fade_mode = bytes(h["fade_mode"]).rstrip(b"\0").decode("ascii")
        except UnicodeDecodeError as exc:
            raise self.fail("load signal or fade mode name is not ASCII") from exc
        if enabled not in (0, 1) or (hops != -1 and hops < 1):
            raise self.fail(f"knobs out of range: enabled={enabled}, max_hops={hops}")
        try:
            return Knobs(
                enabled=bool(enabled),
                percentage=float(h["percentage"]),
                balance_factor=None if math.isnan(bf) else bf,
                max_hops=None if hops == -1 else hops,
                load_signal=signal,
                fade_mode=fade_mode,
            )
        except TableInputError as exc:
            raise self.fail(str(exc)) from exc


class _TablesView:
    """Read access to a namespace's tables: control segment plus current data segment."""

    def __init__(self, control: Segment) -> None:
        self.control = control
        self.cw = control.words
        self.data: Segment | None = None
        self.data_epoch = 0
        self.offsets = (0, 0)
        self.buffer_bytes = 0
        self.writable = control.writable
        # (mapping, buffer, seq, error) of a current buffer found unusable: while none of
        # these changes, later reads raise the same error at once instead of checking
        # the whole table again (or waiting out the timeout) on every call.
        self.bad: tuple[memoryview, int, int, SegmentError, int] | None = None
        self.host_keys: dict[str, str] = {}  # of the last decoded generation (see _Decoder)

    def data_segment(self, epoch: int) -> Segment:
        if self.data is not None and self.data_epoch == epoch:
            if self.data.shrunk_to() is None:
                return self.data
            # Shrunk under the mapping: map it again, which checks its size anew.
            self.data.close()
            self.data, self.data_epoch, self.bad = None, 0, None
        name = f"{self.control.name}.{epoch}"
        seg = Segment.attach(name, writable=self.writable, min_size=DATA_HEADER_BYTES)
        hdr = check_header(seg, TABLES_DATA, MAGIC_TABLES_DATA, "a cslb tables data segment")
        off0, off1, bb = (
            int(hdr["buffer_offset0"][0]),
            int(hdr["buffer_offset1"][0]),
            int(hdr["buffer_bytes"][0]),
        )
        if int(hdr["epoch"][0]) != epoch:
            raise SegmentLayoutError(name, f"header says epoch {int(hdr['epoch'][0])}")
        lo, hi = sorted((off0, off1))
        if (
            off0 % 64
            or off1 % 64
            or bb < BUFFER_HEADER_BYTES + PAYLOAD_HEADER.itemsize
            or lo < DATA_HEADER_BYTES
            or lo + bb > hi
            or hi + bb > seg.size
        ):
            raise SegmentLayoutError(
                name,
                f"buffer offsets {off0}, {off1} with {bb} bytes each do not fit "
                f"a {seg.size}-byte segment",
            )
        if self.data is not None:
            self.data.close()
        self.data, self.data_epoch = seg, epoch
        self.offsets, self.buffer_bytes = (off0, off1), bb
        return seg

    def payload_hint(self, cur: int) -> int:
        """Payload bytes the buffer ``cur`` names says it holds, without reading it.

        Only a size hint for deciding where to map it (not checked, may be racing a
        rewrite); a buffer of a data segment not mapped yet counts as unbounded.
        """
        data = self.data
        if not cur or data is None or (cur >> 1) != self.data_epoch:
            return 1 << 62
        return int(data.words[self.offsets[cur & 1] // 8 + _B_PAYLOAD])

    def close(self) -> None:
        """Drop the mappings (views handed out keep theirs alive)."""
        if self.data is not None:
            self.data.close()
            self.data = None
        self.control.close()

    def read(self, cached: Table | None, timeout_s: float) -> tuple[int, Table]:
        """The current table, retried until consistent; returns ``(current word, table)``."""
        deadline = time.monotonic() + timeout_s
        spins = 0
        bad: SegmentCorruptError | None = None
        bad_tries = 0
        last: str = "no table could be read"
        while True:
            self.control.check_size()
            cur = self.cw[_C_CURRENT]
            if cur == 0:
                return 0, _empty_table()
            if _WEAK:
                fence()  # load `current` before the buffer's seq
            epoch, b = cur >> 1, cur & 1
            try:
                data = self.data_segment(epoch)
            except SegmentMissingError:
                if self.cw[_C_CURRENT] == cur:
                    raise  # named by control, yet gone: someone removed it
                continue  # the writer grew the tables again meanwhile
            seam("tables.read.mapped")
            data.check_size()
            off = self.offsets[b]
            w = data.words
            si = off // 8 + _B_SEQ
            seq1 = w[si]
            if _WEAK:
                fence()  # load seq1 before `current` again and before the payload
            if self.cw[_C_CURRENT] != cur:
                # The buffer may hold a newer generation that `current` does not name
                # yet (the writer completed it and has not switched): not ours to use.
                last = "the writer switched buffers while this one was being mapped"
            elif (
                (v := self.bad) is not None
                and v[0] is w
                and v[1] == b
                and v[2] == seq1
                and time.monotonic_ns() < v[4]
            ):
                raise v[3]  # judged lately, not rewritten since
            elif seq1 & 1:
                last = f"buffer {b} was being rewritten"
            else:
                if (
                    cached is not None
                    and cached._seq_words is w  # this very mapping, not a namesake
                    and cached.buffer == b
                    and cached._seq == seq1
                ):
                    table: Table | None = cached
                else:
                    table = None
                    try:
                        table = self._decode(data, b, off, w)
                    except SegmentCorruptError as exc:
                        bad, last = exc, str(exc)
                    except Exception as exc:
                        # Content rewritten under our feet can fail any check in any
                        # way; if seq stayed put, it is simply bad content.
                        bad = SegmentLayoutError(
                            data.name, f"buffer {b}: content cannot be decoded: {exc!r}"
                        )
                        last = str(bad)
                if _WEAK:
                    fence()
                if w[si] == seq1:
                    if table is not None:
                        if table is not cached:
                            table._seq_words, table._seq_index, table._seq = w, si, seq1
                            table._mapped = data
                        return cur, table
                    # Stable seq, still corrupt: on a weakly ordered CPU the writer's
                    # stores may not all be visible yet; retry briefly, then report.
                    bad_tries += 1
                    if bad_tries >= 3:
                        assert bad is not None
                        self.bad = (w, b, seq1, bad, time.monotonic_ns() + _BAD_RECHECK_NS)
                        raise bad
                    time.sleep(0.001)
                    continue
                last = f"buffer {b} was rewritten while it was read"
            spins += 1
            if time.monotonic() > deadline:
                err = TableUnavailableError(
                    self.control.name,
                    f"no consistent table within {timeout_s:g} s ({spins} retries; last: {last})",
                )
                if seq1 & 1 and self.cw[_C_CURRENT] == cur:
                    # The writer never rewrites the current buffer: an odd seq that stayed
                    # there all along is damage, not a publish in progress.
                    self.bad = (w, b, seq1, err, time.monotonic_ns() + _BAD_RECHECK_NS)
                raise err
            time.sleep(0 if spins < 100 else 0.0005)

    def _decode(self, data: Segment, b: int, off: int, w: memoryview) -> Table:
        base = off // 8
        gen = w[base + _B_GENERATION]
        nbytes = w[base + _B_PAYLOAD]
        checksum = w[base + _B_CHECKSUM]
        start = off + BUFFER_HEADER_BYTES
        if nbytes > self.buffer_bytes - BUFFER_HEADER_BYTES:
            raise SegmentLayoutError(
                data.name,
                f"buffer {b}: payload of {nbytes} bytes exceeds the buffer capacity of "
                f"{self.buffer_bytes - BUFFER_HEADER_BYTES} bytes",
            )
        found = _checksum(data.buf[start : start + nbytes])
        if found != checksum:
            raise TableChecksumError(
                data.name,
                f"buffer {b} generation {gen}: payload checksum 0x{found:016x} does not "
                f"match the stored 0x{checksum:016x} (corrupted, or written by something else)",
            )
        decoder = _Decoder(data, b, start, nbytes, self.host_keys)
        decoder.on_host_keys = self._keep_host_keys
        return decoder.decode(gen)

    def _keep_host_keys(self, keys: dict[str, str]) -> None:
        self.host_keys = keys  # parsed by the last decode: the next one reuses them


def _read_ahead(view: _TablesView, timeout_s: float) -> tuple[int, Table]:
    """A background map: the current table, decoded off the routing thread.

    Decoding includes what routing on the table needs first, such as the endpoints'
    host identities (:attr:`lbcore.Ring.host_ids`, compared by routing with ejected
    endpoints or Skipper's fade-in): the first batch on the table does not pay for them.
    """
    cur, t = view.read(None, timeout_s)
    return cur, t


def _attach_control(namespace: str, *, writable: bool) -> Segment:
    """Attach and validate a tables control segment (waiting briefly for its creator)."""
    name = segment_name(namespace, "tables")
    seg = attach_initialized(name, writable=writable, min_size=CONTROL_BYTES)
    check_header(seg, TABLES_CONTROL, MAGIC_TABLES_CONTROL, "a cslb tables control segment")
    return seg


# ------------------------------------------------------------------------------------
# Reader.


_BACKGROUND_READERS: weakref.WeakSet[TableReader] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A background reader's thread takes the reader's lock (its idle look-ahead, every
    # ``prefetch_s``); forked while it held it, the child's lock would never be released.
    for r in list(_BACKGROUND_READERS):
        r._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class TableReader:
    """A worker's handle on a namespace's routing tables.

    Thread-safe: the threads of a gthread worker may share one reader. The per-batch
    path (nothing changed) takes no lock; remapping after a publish is serialized by a
    per-reader lock, so one thread maps a new generation and the others wait for it
    and reuse it.

    Follows a restarted writer: if the control segment was removed and created anew
    (a writer stopped cleanly, which removes the segments, and a new one started), the
    reader notices within ``recheck_s`` and switches to the new segments once the new
    writer has published, keeping the last table until then. The new writer's
    generations count from 1 again.

    Parameters
    ----------
    namespace
        The namespace the writer publishes under.
    timeout_s
        How long :meth:`table` keeps retrying before it gives up (seconds).
    recheck_s
        How often :meth:`table` checks that the control segment it maps is still the
        namespace's (seconds; one ``stat`` call each time).
    background
        Map new generations off the caller's path: when a new generation is current
        and the previous table is still valid (the writer reuses its buffer only two
        publishes later), :meth:`table` starts mapping the new one (checksum,
        validation) in a background thread and keeps returning the previous table
        until it is ready (a worker keeps routing instead of stalling on a large
        table); once the previous table's buffer is being rewritten, :meth:`table`
        waits for the new one. Off by default: then :meth:`table` returns the current
        generation as soon as it was published.
    foreground_bytes
        With ``background``: a new generation whose payload is at most this many
        bytes is mapped by :meth:`table` itself, as without ``background`` (mapping
        costs about 0.35 ms per MiB on a 2-vCPU Zen3 VM, so small tables are followed
        at once for less than a thread hand-over costs). Default 0: every new
        generation but the first is mapped in the background.
    prefetch_s
        With ``background``: while nobody calls :meth:`table`, the background thread
        looks for a new generation every this many seconds and maps it ahead, so an
        idle worker's next call finds it mapped (it would otherwise map it then, or
        wait for it if the writer had published twice meanwhile).

    Raises
    ------
    SegmentMissingError
        No writer has created the tables yet.
    SegmentCorruptError
        The control segment is foreign, truncated or of another layout version.

    Attributes
    ----------
    reattached : int
        How many times the reader switched to a new control segment.
    """

    def __init__(
        self,
        namespace: str,
        *,
        timeout_s: float = 1.0,
        recheck_s: float = 1.0,
        background: bool = False,
        foreground_bytes: int = 0,
        prefetch_s: float = 0.05,
    ) -> None:
        if isinstance(foreground_bytes, bool) or not isinstance(foreground_bytes, int):
            raise TypeError(f"foreground_bytes must be an int >= 0, got {foreground_bytes!r}")
        if foreground_bytes < 0:
            raise ValueError(f"foreground_bytes must be an int >= 0, got {foreground_bytes}")
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.recheck_s = recheck_s
        self.background = bool(background)
        self.foreground_bytes = foreground_bytes
        self.reattached = 0
        #: Generations mapped by the background thread (``background=True``).
        self.mapped_in_background = 0
        self._lock = threading.Lock()
        # The background map in progress: (its job, the process that submitted it); the
        # job's result is (current word, table).
        self._bg: tuple[Job, int] | None = None
        self._worker: BackgroundWorker | None = None
        self._view = _TablesView(_attach_control(namespace, writable=False))
        self._ctl = self._view.cw
        if self.background:  # (after attaching: a reader that failed starts no thread)
            _BACKGROUND_READERS.add(self)  # its thread takes the lock: reset at a fork
            me = weakref.ref(self)  # the thread must not keep an unused reader alive

            def look_ahead() -> None:
                reader = me()
                if reader is not None:
                    reader._prefetch()

            self._worker = BackgroundWorker("cslb-table-map", idle=look_ahead, idle_s=prefetch_s)
            self._worker.start()  # now: starting a thread makes its caller wait for it
            weakref.finalize(self, self._worker.close)  # a reader dropped unclosed
        # (control words, current word, table, its seq word, index and value): one
        # attribute, so a thread on the fast path never pairs one remap's table with
        # another's control or current word.
        self._state: tuple[memoryview, int, Table | None, memoryview, int, int]
        self._set_state(-1, None)
        self._inode = self._view.control.inode
        self._recheck_ns = _now_ns() + int(recheck_s * 1e9)

    @property
    def name(self) -> str:
        """Name of the control segment."""
        return self._view.control.name

    def table(self) -> Table:
        """The current table: cached while nothing changed, remapped after a publish.

        When nothing changed this costs two shared-memory loads and a clock read
        (~0.15 µs; the clock paces the check for a replaced control segment). After a
        publish it maps the new generation once: verifies its checksum, validates its
        layout and wraps its rings (milliseconds for thousands of endpoints).

        Raises
        ------
        TableChecksumError, SegmentLayoutError
            The current generation is corrupt (tables already returned stay usable
            while :meth:`Table.valid` says so).
        TableUnavailableError
            No consistent read within ``timeout_s``.
        """
        self._check_mapped()
        ctl, cur, t, seq_words, seq_index, seq = self._state
        if ctl[_C_CURRENT] == cur:
            if _WEAK:
                fence()
            if seq_words[seq_index] == seq and _now_ns() < self._recheck_ns:
                return t  # never None here: cur is -1 while there is no table
        return self._refresh()

    def _check_mapped(self, now_ns: int | None = None) -> None:
        """Refuse to touch segments shrunk under their mappings (a touch would be SIGBUS).

        A shrunk control segment is dropped for the namespace's new one if its writer
        made one (see :meth:`_follow_replacement`); a shrunk data segment is unmapped, so
        the next read maps whatever the control segment names then (the writer
        publishes into a new data segment when it notices).

        ``now_ns`` (CLOCK_MONOTONIC): on the routing path, check each segment at most
        once per :data:`shm.segment.SIZE_CHECK_NS` (see :meth:`Segment.shrunk_to_paced`);
        ``None``: check now.

        Raises
        ------
        SegmentSizeError
            The control segment shrank and has no replacement yet.
        """
        view = self._view
        if now_ns is None:
            if view.control.shrunk_to() is None and (
                view.data is None or view.data.shrunk_to() is None
            ):
                return
        elif view.control.shrunk_to_paced(now_ns) is None and (
            view.data is None or view.data.shrunk_to_paced(now_ns) is None
        ):
            return
        with self._lock:
            view = self._view
            if view.control.shrunk_to() is not None:
                self._recheck_ns = 0
                self._follow_replacement()
                view = self._view
                view.control.check_size()
            data = view.data
            if data is not None and data.shrunk_to() is not None:
                view.data, view.data_epoch, view.bad = None, 0, None
                data.close()
                self._set_state(-1, None)

    def is_current(self, table: Table) -> bool:
        """Whether :meth:`table` returns ``table`` now (nothing published since).

        Two shared-memory loads and no remapping: ``False`` once a new
        generation was published (the word ``current`` changed, or names the same
        buffer rewritten since), or when ``table`` is not this reader's current one. A
        replaced control segment is noticed by :meth:`table` (its clock paces the
        check), which callers still call now and then. Each segment's size is checked
        at most every :data:`shm.segment.SIZE_CHECK_NS` here (a clock read instead of two
        ``lseek`` calls per batch; see :meth:`Segment.shrunk_to_paced` for the window
        that leaves).
        """
        self._check_mapped(_now_ns())
        ctl, cur, t, seq_words, seq_index, seq = self._state
        if t is not table or ctl[_C_CURRENT] != cur:
            return False
        if _WEAK:
            fence()
        return seq_words[seq_index] == seq

    def _set_state(self, cur: int, t: Table | None) -> None:
        if t is None:
            self._state = (self._ctl, -1, None, _NO_SEQ, 0, 1)
        else:
            self._state = (self._ctl, cur, t, t._seq_words, t._seq_index, t._seq)

    def _refresh(self) -> Table:
        with self._lock:
            if self.background:
                kept = self._refresh_in_background()
                if kept is not None:
                    return kept
            if _now_ns() >= self._recheck_ns:
                self._follow_replacement()
            ctl, cur, t = self._state[:3]
            if t is not None and ctl[_C_CURRENT] == cur and t.valid():
                return t  # another thread remapped while we waited for the lock
            cur, t = self._view.read(t, self.timeout_s)
            self._set_state(cur, t)
            return t

    def _refresh_in_background(self) -> Table | None:
        """:meth:`_refresh` with ``background``; ``None``: read in the foreground.

        Called with the lock held. Returns the table to use now: a new generation the
        background thread finished mapping, or the previous table while it is still
        valid and the thread maps the new one. The view is only ever used by one
        thread at a time: the foreground reads only when no background map runs.
        """
        bg = self._bg
        ctl, cur, t = self._state[:3]
        if bg is not None:
            job, pid = bg
            if pid != os.getpid():
                self._bg = None  # inherited through fork: the thread is not ours
            else:
                if not job.done():
                    if t is not None and t.valid():
                        return t
                    job.wait()  # the previous table's buffer is being rewritten: wait
                self._bg = None
                if job.error is None:
                    new_cur, new = job.result
                    if new.valid():
                        self.mapped_in_background += 1
                        self._set_state(new_cur, new)
                        if ctl[_C_CURRENT] == new_cur:
                            return new
                        cur, t = new_cur, new  # already superseded: map the next one
                else:
                    return None  # failed: the foreground read reports it (remembered)
        if _now_ns() >= self._recheck_ns:
            # Before mapping in the background (the thread uses the view this may
            # replace); a replaced control segment resets the state: foreground.
            self._follow_replacement()
            ctl, cur, t = self._state[:3]
        if t is None or ctl[_C_CURRENT] == cur or not t.valid():
            return None
        if self.foreground_bytes and self._view.payload_hint(ctl[_C_CURRENT]) <= (
            self.foreground_bytes
        ):
            return None  # small: mapped at once by the caller
        view, timeout_s = self._view, self.timeout_s
        assert self._worker is not None
        self._bg = (self._worker.submit(lambda: _read_ahead(view, timeout_s)), os.getpid())
        return t

    def _prefetch(self) -> None:
        """On the background thread when idle: map a new generation nobody asked for yet.

        Only after the first :meth:`table` call, and never while a map is pending or a
        caller holds the lock (it will look itself). The next :meth:`table` call takes
        the mapped generation as it takes any background result.
        """
        if not self._lock.acquire(blocking=False):
            return
        try:
            bg = self._bg
            if bg is not None and (bg[1] != os.getpid() or not bg[0].done()):
                return
            ctl, cur, t = self._state[:3]
            now = ctl[_C_CURRENT]
            # (The same current word names a newer generation once its buffer was reused.)
            if t is None or now == 0 or (now == cur and t.valid()):
                return
            if bg is not None:
                if bg[0].error is not None:
                    return  # a failed map: the next table() call reads (and reports) it
                done_cur, done = bg[0].result
                if done_cur == now and done.valid():
                    return  # mapped already, not picked up yet
            if _now_ns() >= self._recheck_ns:
                self._follow_replacement()  # a stat; a replaced segment resets the state
                if self._state[2] is None:
                    return  # the next table() call maps the new writer's first table
            view, timeout_s = self._view, self.timeout_s
            assert self._worker is not None
            self._bg = (self._worker.submit(lambda: _read_ahead(view, timeout_s)), os.getpid())
        finally:
            self._lock.release()

    def mapped_ahead(self) -> int:
        """Generation the background thread mapped and :meth:`table` did not take yet (0: none)."""
        bg = self._bg
        if bg is None or bg[1] != os.getpid() or not bg[0].done() or bg[0].error is not None:
            return 0
        return int(bg[0].result[1].generation)

    def _background_busy(self) -> bool:
        bg = self._bg
        return bg is not None and bg[1] == os.getpid() and not bg[0].done()

    def _follow_replacement(self) -> None:
        """Switch to a new control segment if the namespace has one that was published."""
        if self._background_busy():
            return  # it reads the view this would replace: check again after it
        self._recheck_ns = _now_ns() + int(self.recheck_s * 1e9)
        if current_inode(self.name) == self._inode:
            return
        try:
            control = _attach_control(self.namespace, writable=False)
        except SegmentError:
            return  # gone, or being created: keep routing on the last table
        if control.words[_C_CURRENT] == 0:
            control.close()  # its writer has published nothing yet: keep the last table
            return
        old = self._view
        self._bg = None  # a finished background map of the old segments: not ours now
        self._view = _TablesView(control)
        self._ctl = self._view.cw
        self._set_state(-1, None)  # same segment names, other content: no reuse
        self._inode = control.inode
        self.reattached += 1
        old.close()  # tables handed out keep their own mappings alive

    def _maybe_follow(self) -> None:
        if _now_ns() >= self._recheck_ns:
            with self._lock:
                self._follow_replacement()
        self._check_mapped()

    def consistent(self, fn: Callable[[Table], T]) -> T:
        """``fn(table)`` on the current table, repeated until it ran on a valid table.

        A failure of ``fn`` while the table was being rewritten is retried too; a
        failure on a valid table propagates. To use the table after ``fn`` (say its
        ``slots`` for the routed endpoints), return it from ``fn``:
        ``t, idx = reader.consistent(lambda t: (t, t.ring_set.route(keys, now)))``.
        """
        deadline = time.monotonic() + self.timeout_s
        while True:
            t = self.table()
            try:
                result = fn(t)
            except Exception:
                if t.valid():
                    raise
            else:
                if t.valid():
                    return result
            if time.monotonic() > deadline:
                raise TableUnavailableError(
                    self.name, f"no routing pass finished on a stable table in {self.timeout_s} s"
                )

    def generation(self) -> int:
        """Latest published generation as the control segment says (no remapping).

        A writer killed between switching ``current`` and storing the generation word
        leaves the word one behind the table ``current`` names (published all the same);
        when this reader has mapped that table, its generation is the answer.
        """
        self._maybe_follow()
        ctl, cur, t = self._state[:3]
        gen = int(self._ctl[_C_GENERATION])
        if t is not None and ctl is self._ctl and ctl[_C_CURRENT] == cur and t.generation > gen:
            return t.generation
        return gen

    def heartbeat_ns(self) -> int:
        """CLOCK_MONOTONIC time of the writer's last heartbeat or publish (ns)."""
        self._maybe_follow()
        return int(np.int64(np.uint64(self._ctl[_C_HEARTBEAT])))

    def status(self) -> PublisherStatus | None:
        """The writer's report on its sources (:meth:`TableWriter.set_status`).

        ``None`` when it cannot be read (a writer killed while rewriting it).
        """
        self._maybe_follow()
        return read_status(self._view.control)

    def writer_pid(self) -> int:
        """PID of the last process that took over as writer (0 if none)."""
        self._maybe_follow()
        return int(self._ctl[_C_WRITER_PID])

    def writer_alive(self) -> bool:
        """True if that writer process is still running (PID and start time match)."""
        self._maybe_follow()
        return process_alive(self._ctl[_C_WRITER_PID], self._ctl[_C_WRITER_START])

    def replaced(self) -> bool:
        """True if the control segment this reader maps was removed or recreated.

        :meth:`table` follows a new control segment by itself once its writer has
        published (then this is False again). Costs one ``stat`` call.
        """
        return current_inode(self.name) != self._inode

    def close(self) -> None:
        """Drop this reader's mappings (tables already returned keep theirs alive)."""
        with self._lock:
            bg = self._bg
            if bg is not None and bg[1] == os.getpid():
                bg[0].wait()
            self._bg = None
            if self._worker is not None:
                self._worker.close()
            self._set_state(-1, None)
            self._view.close()

    def __enter__(self) -> TableReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------
# Writer.


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
        self._view = _TablesView(ctl)
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
        cur = self._cw[_C_CURRENT]
        self.removed_stale = unlink_stale_epochs(namespace, "tables", cur >> 1 if cur else None)
        self._cw[_C_WRITER_START] = ticks
        self._cw[_C_WRITER_PID] = self._pid
        self._cw[_C_HEARTBEAT] = int(np.uint64(np.int64(self._clock())))
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
                if seg.words[_C_MAGIC] == 0:
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
        if seg.words[_C_MAGIC] == 0 and seg.size != CONTROL_BYTES:
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
            return int(seg.words[_C_WRITER_PID])
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
        cur = self._cw[_C_CURRENT]
        self.generation = int(self._cw[_C_GENERATION])
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
            self._cw[_C_GENERATION] = table.generation
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
        zone_list = _strings(zones, n, "zones")
        node_list = _strings(nodes, n, "nodes")
        if ejections is None:
            ej = _per_endpoint(ejected, n, np.bool_, "ejected", False)
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
        enc = _encode(
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
        )
        self._ctl_seg.check_size()
        self._drop_lost_data()
        if skip_unchanged and self._unchanged(enc):
            self._cw[_C_HEARTBEAT] = int(np.uint64(np.int64(now)))
            return self.generation
        self._follow_replaced_counters()
        if self._counters is not None:
            self._counters.ensure_columns(alloc.n_slots)
            if alloc.reused:  # a new endpoint's lifetime totals start at zero
                self._counters.reset_totals(alloc.reused)
        cur_before = self._cw[_C_CURRENT]
        data, b, old = self._target(enc.payload_bytes)
        off = self._view.offsets[b]
        words = data.words
        base = off // 8
        seq = words[base + _B_SEQ]
        seq = seq + 1 if seq % 2 == 0 else seq + 2  # odd: "being rewritten"
        words[base + _B_SEQ] = seq
        fence()
        start = off + BUFFER_HEADER_BYTES
        enc.write(data.buf, start)
        words[base + _B_GENERATION] = gen
        words[base + _B_PAYLOAD] = enc.payload_bytes
        words[base + _B_CHECKSUM] = _checksum(data.buf[start : start + enc.payload_bytes])
        fence()
        words[base + _B_SEQ] = seq + 1
        fence()
        seam("tables.publish.switch")
        self._cw[_C_CURRENT] = (self._view.data_epoch << 1) | b
        seam("tables.publish.current")  # published; the generation word not yet stored
        self._cw[_C_GENERATION] = gen
        self._cw[_C_HEARTBEAT] = int(np.uint64(np.int64(now)))
        seam("tables.publish.switched")
        self.generation = gen
        self._slots = alloc
        if cur_before and (cur_before >> 1) != self._view.data_epoch:
            # Grown (or replaced a lost or damaged segment): the old one is nobody's now.
            unlink_name(f"{self.name}.{cur_before >> 1}")
        if old is not None:
            old.close()
        return gen

    def _unchanged(self, enc: _Encoded) -> bool:
        """True if ``enc`` holds what the current buffer holds, publish details aside."""
        cur = self._cw[_C_CURRENT]
        data = self._view.data
        if not cur or data is None or (cur >> 1) != self._view.data_epoch:
            return False
        off = self._view.offsets[cur & 1]
        words = data.words
        if words[off // 8 + _B_PAYLOAD] != enc.payload_bytes:
            return False
        start = off + BUFFER_HEADER_BYTES
        current = data.array(PAYLOAD_HEADER, start, 1)[0]
        mine = enc.header.copy()
        for field in ("generation", "published_ns", "publisher_pid"):
            mine[0][field] = current[field]
        if bytes(memoryview(mine).cast("B")) != bytes(data.buf[start : start + mine.nbytes]):
            return False
        pos = start + _DIR_OFFSET
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
        cur = self._cw[_C_CURRENT]
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
        self._cw[_C_HEARTBEAT] = int(np.uint64(np.int64(now)))

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
        if data is None or not self._cw[_C_CURRENT]:
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
        self._cw[_C_GENERATION] = self.generation
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
