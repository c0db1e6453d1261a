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

Worker slots (rows) are claimed, released and reclaimed from dead owners by
:class:`CounterStore` (:mod:`shm.counters.store`), never on the recording path.

The matrix grows when the tables need more endpoint slots
(:meth:`CounterStore.ensure_columns`): a new data segment ``/cslb.<ns>.counters.<n>``
receives a copy of every row and the control segment then names it. Each recorder
notices the new epoch on its next call (one shared-memory load per call) and copies
its own row over again, since it may have recorded into the old segment after the
grower copied it; rows of idle or dead workers keep the grower's copy.

Modules: :mod:`~shm.counters.matrix` (views of the segments), :mod:`~shm.counters.store`
(the matrix and its slots), :mod:`~shm.counters.recorder` (a worker's row),
:mod:`~shm.counters.threaded` (recorders for threaded workers),
:mod:`~shm.counters.loads` (:class:`HostLoads`) and :mod:`~shm.counters.reader`.
"""

from shm.counters.loads import HostLoads, bucket_weights
from shm.counters.matrix import DEFAULT_ROWS, DEFAULT_WINDOW_BUCKETS, MatrixView
from shm.counters.reader import CounterReader
from shm.counters.recorder import Recorder
from shm.counters.store import CounterStore, SlotInfo
from shm.counters.threaded import LockedRecorder, ThreadRecorder

__all__ = [
    "DEFAULT_ROWS",
    "DEFAULT_WINDOW_BUCKETS",
    "CounterReader",
    "CounterStore",
    "HostLoads",
    "LockedRecorder",
    "MatrixView",
    "Recorder",
    "SlotInfo",
    "ThreadRecorder",
    "bucket_weights",
]
