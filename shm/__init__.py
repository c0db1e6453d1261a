"""Shared-memory routing tables and load counters (the "shared memory" box of DESIGN.md).

* :mod:`shm.tables`: the double-buffered table store. One :class:`TableWriter` per
  namespace publishes generations; every worker's :class:`TableReader` maps them as
  zero-copy NumPy views and never sees a torn table (the protocol is described in
  ``docs/shared-memory.md``). Modules: ``model``, ``slots``, ``codec``, ``protocol``,
  ``reader``, ``writer``.
* :mod:`shm.counters`: the host's counter matrix. Each worker claims a row
  (:meth:`CounterStore.claim`) and records whole fan-outs with a few kernel calls;
  :class:`CounterReader` sums the rows into :class:`HostLoads` (what the sums mean for
  routing is :mod:`lbcore.signals`). Modules: ``matrix``, ``store``, ``recorder``,
  ``threaded``, ``loads``, ``reader``.
* :mod:`shm.segment`, :mod:`shm.layout`, :mod:`shm.errors`: segment lifecycle, byte
  layout and the exceptions, each naming the segment and what was wrong;
  :mod:`shm.names` (namespaces, segment names), :mod:`shm.owners` (process identity),
  :mod:`shm.locks` (cross-process locks), :mod:`shm.seams` (test seams);
  :mod:`shm.background` the thread that maps tables off the routing path.

Imports only NumPy, ``posix_ipc`` and :mod:`lbcore`.
"""

from shm.background import BackgroundWorker
from shm.counters import (
    CounterReader,
    CounterStore,
    HostLoads,
    LockedRecorder,
    MatrixView,
    Recorder,
    SlotInfo,
    ThreadRecorder,
)
from shm.errors import *  # noqa: F403
from shm.errors import __all__ as _errors
from shm.layout import LAYOUT_VERSION
from shm.names import check_namespace, list_segments, segment_name
from shm.settings import SHM_NAMESPACE, shm_namespace
from shm.tables import Knobs, SlotAllocator, Table, TableReader, TableWriter

__all__ = [
    "LAYOUT_VERSION",
    "SHM_NAMESPACE",
    "BackgroundWorker",
    "CounterReader",
    "CounterStore",
    "HostLoads",
    "Knobs",
    "LockedRecorder",
    "MatrixView",
    "Recorder",
    "SlotAllocator",
    "SlotInfo",
    "Table",
    "TableReader",
    "TableWriter",
    "ThreadRecorder",
    "check_namespace",
    "list_segments",
    "segment_name",
    "shm_namespace",
    *_errors,
]
