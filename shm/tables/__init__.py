"""Routing tables in shared memory: one writer, any number of readers, no torn reads.

The discovery process publishes with a :class:`TableWriter`; every worker maps the
tables with a :class:`TableReader` and routes on zero-copy NumPy views of them. A
:class:`Table` holds everything a worker needs to route: the endpoints with zone, node
and stable counter slot (:class:`SlotAllocator`); the lbcore :class:`~lbcore.RingSet`
(each ring's sorted hashes, owners and bucket table, so no worker ever hashes or sorts a
ring); per-endpoint ejection state; the runtime :class:`Knobs`; the publisher's PID and
the publish time.

Modules: :mod:`~shm.tables.model` (the table and its knobs), :mod:`~shm.tables.slots`
(counter slots of endpoints), :mod:`~shm.tables.zone` (the zone record and its curve),
:mod:`~shm.tables.codec` (encoding and validated decoding), :mod:`~shm.tables.protocol`
(the seqlock read), :mod:`~shm.tables.reader` and :mod:`~shm.tables.writer`. The
protocol, and why it is correct, is described in ``docs/shared-memory.md``.
"""

from shm.tables.model import Knobs, Table
from shm.tables.reader import TableReader
from shm.tables.slots import DEFAULT_SLOT_REUSE_NS, SlotAllocator
from shm.tables.writer import TableWriter
from shm.tables.zone import ZoneCurve

__all__ = [
    "DEFAULT_SLOT_REUSE_NS",
    "Knobs",
    "SlotAllocator",
    "Table",
    "TableReader",
    "TableWriter",
    "ZoneCurve",
]
