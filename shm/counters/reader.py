"""Summing every worker's counter row: :class:`CounterReader`. Writes nothing."""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore.reported import ReportState
from lbcore.signals import failure_rate, global_latency, open_busy_ns
from lbcore.signals import mean_latency as _mean_latency
from lbcore.signals import occupancy as _occupancy
from shm.counters.loads import HostLoads, bucket_weights
from shm.counters.matrix import Control, Matrix, attach_control
from shm.counters.reports import merge_reports
from shm.layout import COUNTER_FIELDS, KIND_FIELDS, STATS_FIELDS
from shm.names import current_inode

# Bounds of sane counter cells. Any process of the user can write the matrix; a row
# holding values no recorder writes (a count beyond 2**31 calls in one bucket, busy time
# beyond 2**56 ns, a negative total, a period from the future) is left out of every sum,
# so its garbage reaches neither routing nor the lifetime totals.

_MAX_OPEN = 1 << 31
_MAX_CELL = 1 << 56
_MAX_TOTAL = 1 << 53


def _sane_rows(m: Matrix, hi: int, n: int, now_ns: int | None, bucket_ns: int) -> np.ndarray:
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

    def __init__(self, namespace: str, *, _control: Control | None = None) -> None:
        self.namespace = namespace
        self._ctl = _control if _control is not None else attach_control(namespace, writable=False)
        self._ctl.current()
        self.ignored_rows: tuple[int, ...] = ()
        self.ignored_total = 0

    def _rows(self, m: Matrix, n: int, now_ns: int | None = None) -> np.ndarray | None:
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
        # Busy time of requests still open (lbcore.signals.open_busy_ns); those older
        # than every bucket count one full window each.
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
            open_ns += open_busy_ns(opens[ri, ji], since, cells[ri, 1 + k + ji, :], w_ns).sum(
                axis=0
            )
        # (rows, field, bucket, slot) weighted over rows and buckets, every field at once.
        nf = len(COUNTER_FIELDS) + (len(KIND_FIELDS) if failure_kinds else 0)
        fields = cells[:, 1 + 2 * k : 1 + (2 + nf) * k, :].reshape(hi, nf, k, n)
        summed = np.einsum("rk,rfkc->fc", weights, fields)
        busy, completed, latency_ns, failures = summed[: len(COUNTER_FIELDS)]
        if failure_kinds:
            by_kind = np.ascontiguousarray(summed[len(COUNTER_FIELDS) :].T)
        else:
            by_kind = np.full((n, len(KIND_FIELDS)), np.nan)
        return HostLoads(
            now_ns=int(now_ns),
            window_ns=w_ns,
            in_flight=in_flight,
            occupancy=_occupancy(busy + open_ns, w_ns),
            completed=completed,
            mean_latency_s=_mean_latency(latency_ns / 1e9, completed),
            failure_rate=failure_rate(failures, completed),
            global_latency_s=global_latency(latency_ns, completed),
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

    def reports(
        self, now_ns: int, expiry_ns: int, columns: int | None = None
    ) -> tuple[ReportState, np.ndarray]:
        """The pods' latest load reports per endpoint slot, newest across every row.

        Parameters
        ----------
        now_ns
            CLOCK_MONOTONIC time now (ns): reports stamped later are garbage.
        expiry_ns
            The report expiry (see :func:`shm.counters.reports.merge_reports`).
        columns
            Number of endpoint slots to read; default all.

        Returns
        -------
        tuple of (lbcore.reported.ReportState, numpy.ndarray)
            Report state per slot, and each slot's ``application_utilization`` (NaN:
            none). Cells no recorder writes count as no report; nothing raises on them.
        """
        ctl = self._ctl
        ctl.seg.check_size()
        m = ctl.current()
        n = m.columns if columns is None else min(int(columns), m.columns)
        used = np.flatnonzero(ctl.slots["used"] != 0)
        if used.size == 0 or n == 0:
            return ReportState.empty(n), np.full(n, np.nan)
        hi = int(used[-1]) + 1  # (rows never used hold zeros: no report)
        return merge_reports(m.reports[:hi, :, :n], int(now_ns), int(expiry_ns))

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
