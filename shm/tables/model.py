"""What a worker routes on: one published generation (:class:`Table`) and its knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import lbcore
from lbcore import knobs as lbcore_knobs
from lbcore.ejection import Ejections
from lbcore.fence import fence
from shm.errors import TableInputError
from shm.layout import BUFFER_HEADER_BYTES
from shm.tables.words import WEAK
from shm.tables.zone import ZoneCurve

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
    zone : shm.tables.zone.ZoneCurve
        The caller's zone, zone affinity and the zone controller's curve
        (:meth:`zone_share` evaluates it).
    n_slots : int
        Counter columns in use (every slot is below it).
    slot_freed_ns : numpy.ndarray
        ``int64`` per counter slot: ``-1`` in use, else when it was freed (ns).
    segment : str
        Name of the data segment holding it.
    buffer_offset : int
        Byte offset in that segment of the buffer holding it (its header, then the
        payload); ``-1`` for no table.
    payload_bytes : int
        Length of its payload in bytes (0 for no table).
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
        "payload_bytes",
        "published_ns",
        "publisher_pid",
        "ring_set",
        "segment",
        "slot_freed_ns",
        "slots",
        "zone",
        "zones",
    )

    @classmethod
    def empty(cls) -> Table:
        """A generation-0 table without endpoints: what readers see before any publish.

        Always valid; routing on it gives fallback (``-1``) for every key.
        """
        return empty_table()

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
        if WEAK:
            fence()
        return self._seq_words[self._seq_index] == self._seq

    @property
    def guard(self) -> tuple[Any, int, int]:
        """The sequence check of this table as :class:`lbcore.Plan` takes it: ``(words, i, value)``.

        A plan built with it says after each batch whether the table was still valid
        (what :meth:`valid` says then), read by the kernel with acquire ordering.
        """
        return self._seq_words, self._seq_index, self._seq

    def payload(self) -> np.ndarray:
        """The payload as the reader mapped it: a read-only ``uint8`` view (empty: no table).

        Every array of the table is a view into it (for tools and tests that check the
        zero-copy mapping, or locate a section in the segment).
        """
        seg = self._mapped
        if seg is None or self.payload_bytes == 0:
            return np.empty(0, np.uint8)
        start = self.buffer_offset + BUFFER_HEADER_BYTES
        view = np.frombuffer(seg.buf, np.uint8, self.payload_bytes, start)
        view.flags.writeable = False
        return view

    def zone_share(self, now_ns: int) -> float:
        """The local share ``x`` of the caller's zone at ``now_ns`` (CLOCK_MONOTONIC ns), 0-1.

        The published curve evaluated at that instant (0 without affinity or a known
        zone); see :class:`shm.tables.zone.ZoneCurve`.
        """
        return self.zone.share_at(now_ns)

    @property
    def fade_duration_ns(self) -> int:
        """Fade-in window of the ring set, in nanoseconds."""
        return self.ring_set.duration_ns

    @property
    def fade_exponent(self) -> float:
        """Fade-in curve exponent of the ring set."""
        return self.ring_set.exponent


def empty_table() -> Table:
    """The table of generation 0: no endpoints, default knobs (before any publish)."""
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
    t.zone = ZoneCurve()
    t.n_slots = 0
    t.slot_freed_ns = np.empty(0, dtype=np.int64)
    t.segment = ""
    t.buffer = -1
    t.buffer_offset = -1
    t.payload_bytes = 0
    t._seq_words = memoryview(np.zeros(1, dtype=np.uint64)).cast("B").cast("Q")
    t._seq_index = 0
    t._seq = 0
    t._mapped = None
    return t
