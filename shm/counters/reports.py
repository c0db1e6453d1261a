"""The pods' load reports in the counter rows: one writer per row, readers take the newest.

Every counter row ends with one report cell per endpoint slot
(:data:`shm.layout.REPORT_FIELDS`): the latest load report the row's writer received
from that slot's pod. Counters are sharded, not locked across processes, and so are
reports: a worker writes only its own row (:func:`write_reports`, through
:meth:`shm.Recorder.record_reports`), and a reader takes, per slot, the newest report
across rows (:func:`merge_reports`). The folding rules (:mod:`lbcore.reported`) then
decide what that report is worth.

**Run start across rows.** Each writer keeps the run start of its own row
(:func:`lbcore.reported.run_start` on the row's previous report). A worker that got
its first report of a pod a second ago must not restart a blackout the host began long
ago, so the merged run start of a slot is the earliest run start among the rows whose
report is of the newest report's kind and identity and no more than the expiry older
than it: the runs the host saw without a gap. Every reader derives the same run start
from the same cells.

**Untrusted cells.** Any process of the user can write shared memory. A cell no writer
produces (an unknown kind, a value negative, not finite or above
:data:`MAX_REPORT_VALUE`, a time after the reader's present or a run that begins
after its report) counts as no report of that row; nothing read here raises.

**Tearing.** A writer stores a cell's words one by one (aligned 64-bit stores, the kind
last), and a reader does not lock: for microseconds a reader may mix the fields of two
consecutive reports of one row and pod. Both are the same pod's latest load; the
identity and kind checks keep a mix of two pods from counting as one run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore.fence import fence
from lbcore.reported import KIND_NONE, KIND_OCCUPANCY, KIND_UTILIZATION, ReportState, run_start
from shm.layout import REPORT_FIELDS

__all__ = ["MAX_REPORT_VALUE", "merge_reports", "write_reports"]

F_VALUE, F_UTIL, F_KIND, F_AT, F_SINCE, F_IDENTITY = (
    REPORT_FIELDS.index(f"report_{n}")
    for n in ("value", "util", "kind", "at_ns", "since_ns", "identity")
)

#: Largest reported value a cell may hold (the wire format's own limit): above it a cell
#: was not written by a recorder.
MAX_REPORT_VALUE = 1e12

_NO_TIME = np.iinfo(np.int64).max


def write_reports(
    cells: np.ndarray, slots: Any, columns: tuple[Any, Any, Any, Any], now_ns: int, expiry_ns: int
) -> None:
    """Store one report per slot in one row's report cells (the row's one writer).

    Parameters
    ----------
    cells
        The row's ``int64`` report cells, ``(len(REPORT_FIELDS), columns)``, writable.
    slots
        Endpoint slots (checked by the caller: in range, each once).
    columns
        ``values, utils, kinds, identities``, one entry per slot each, as
        :meth:`shm.Recorder.record_reports` takes them.
    now_ns
        When the reports arrived (CLOCK_MONOTONIC ns).
    expiry_ns
        The report expiry: a row's run goes on only over reports no older than it.
    """
    idx = np.asarray(slots, np.intp).reshape(-1)
    if idx.size == 0:
        return
    values, utils, kinds, identities = columns
    ids = np.asarray(identities, np.uint64).reshape(-1).view(np.int64)
    since = run_start(
        cells[F_KIND, idx],
        cells[F_AT, idx],
        cells[F_SINCE, idx],
        cells[F_IDENTITY, idx].view(np.uint64),
        np.asarray(kinds),
        ids.view(np.uint64),
        int(now_ns),
        int(expiry_ns),
    )
    cells[F_VALUE, idx] = np.asarray(values, np.float64).reshape(-1).view(np.int64)
    cells[F_UTIL, idx] = np.asarray(utils, np.float64).reshape(-1).view(np.int64)
    cells[F_IDENTITY, idx] = ids
    cells[F_SINCE, idx] = since
    cells[F_AT, idx] = int(now_ns)
    fence()
    cells[F_KIND, idx] = np.asarray(kinds, np.int64).reshape(-1)


def merge_reports(cells: np.ndarray, now_ns: int, expiry_ns: int) -> tuple[ReportState, np.ndarray]:
    """Per slot, the newest report across rows, and its ``application_utilization``.

    Parameters
    ----------
    cells
        ``int64`` ``(rows, len(REPORT_FIELDS), n)``: the report cells of the rows to read.
    now_ns
        The reader's present (CLOCK_MONOTONIC ns): reports stamped later are garbage.
    expiry_ns
        The report expiry (the merged run start spans rows no more than this apart).

    Returns
    -------
    tuple of (ReportState, numpy.ndarray)
        The report state of the ``n`` slots (:data:`lbcore.reported.KIND_NONE` where no
        row holds a sane report) and ``float64`` utilization per slot (NaN: none).
    """
    rows, _, n = cells.shape
    if rows == 0 or n == 0:
        return ReportState.empty(n), np.full(n, np.nan)
    value = cells[:, F_VALUE].view(np.float64)
    util = cells[:, F_UTIL].view(np.float64)
    kind = cells[:, F_KIND]
    at = cells[:, F_AT]
    since = cells[:, F_SINCE]
    ident = cells[:, F_IDENTITY]
    with np.errstate(invalid="ignore"):
        ok = (
            ((kind == KIND_OCCUPANCY) | (kind == KIND_UTILIZATION))
            & np.isfinite(value)
            & (value >= 0.0)
            & (value <= MAX_REPORT_VALUE)
            & (at >= 0)
            & (at <= now_ns)
            & (since >= 0)
            & (since <= at)
        )
    stamped = np.where(ok, at, -1)
    best = stamped.argmax(axis=0)
    col = np.arange(n)
    has = stamped[best, col] >= 0
    b_kind = np.where(has, kind[best, col], KIND_NONE)
    b_ident = ident[best, col]
    b_at = at[best, col]
    same = ok & (kind == b_kind) & (ident == b_ident) & (at >= b_at - int(expiry_ns))
    b_since = np.where(same, since, _NO_TIME).min(axis=0)
    u = util[best, col]
    with np.errstate(invalid="ignore"):
        u_ok = has & np.isfinite(u) & (u >= 0.0) & (u <= MAX_REPORT_VALUE)
    state = ReportState(
        np.where(has, value[best, col], np.nan),
        b_kind.astype(np.uint8),
        np.where(has, b_at, 0).astype(np.int64),
        np.where(has, b_since, 0).astype(np.int64),
        np.where(has, b_ident, 0).view(np.uint64).copy(),
    )
    return state, np.where(u_ok, u, np.nan)
