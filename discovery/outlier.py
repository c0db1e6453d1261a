"""The host's outlier monitor: counter deltas in, ejections and readmissions out.

Every interval (1 s by default) the discovery loop hands the monitor the lifetime
totals the host's workers recorded for each endpoint of the published table (requests
and failures per kind, :meth:`discovery.publisher.Publisher.counter_totals`). The
monitor turns them into per-interval deltas, keeps the last window of them (10 s by
default), and applies lbcore's rules (:func:`lbcore.outlier.interval_counts`,
:func:`lbcore.outlier.judge`, :func:`lbcore.ejection.step`). What it decides goes out
with the next publish, which the loop makes at once when the set of ejected endpoints
(or the panic state) changed.

Deltas, not windowed counter reads: lifetime totals never age out, so a delta is exact
however late the loop runs, and per-interval entries let the consecutive-failure rule
see each interval. A delta is taken as zero (and the baseline reset) when an endpoint's
counter slot changed, its totals went down (a freed slot reset for a new endpoint) or
the counter matrix was replaced (a restarted gunicorn master): one interval unseen
beats a burst of phantom calls.

While an endpoint is ejected nothing is accumulated for it (calls still ending there
are the tail of the failure); when it is readmitted it is judged on fresh counts only.
A deleted endpoint's state is dropped: if the pod comes back it is a new endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lbcore.ejection import Ejections, routing_mask, step
from lbcore.outlier import FAILURE_KINDS, OutlierParams, interval_counts, judge, streaks

__all__ = ["OutlierMonitor", "Published", "Totals", "Verdicts"]

_NK = len(FAILURE_KINDS)


@dataclass(frozen=True, slots=True)
class Totals:
    """Lifetime counter totals of the published endpoints, read at one instant.

    Attributes
    ----------
    source : int
        Identifies the counter matrix read (changes when it was replaced).
    slots : numpy.ndarray
        ``int32`` counter slot per endpoint (-1: none).
    requests : numpy.ndarray
        ``int64`` calls ended per endpoint.
    failures_by_kind : numpy.ndarray
        ``int64`` ``(endpoints, 4)`` failures per kind.
    """

    source: int
    slots: np.ndarray
    requests: np.ndarray
    failures_by_kind: np.ndarray


@dataclass(frozen=True, slots=True)
class Verdicts:
    """What one evaluation changed (addresses), for the loop to publish and log.

    Attributes
    ----------
    ejected, readmitted, held_back : tuple[str, ...]
        Endpoints ejected, readmitted, and outliers left in because the maximum share is
        ejected already.
    panic : bool
        Too few endpoints left: routing ignores the ejections.
    """

    ejected: tuple[str, ...]
    readmitted: tuple[str, ...]
    held_back: tuple[str, ...]
    panic: bool

    @property
    def publish(self) -> bool:
        """The ejected set changed (the panic flag is compared by the loop)."""
        return bool(self.ejected or self.readmitted)


class OutlierMonitor:
    """Per-endpoint failure history and ejection state of the published endpoints.

    Parameters
    ----------
    addresses, state
        Endpoints and their ejection state to continue from (the table a previous
        process published: its ejections and until-times go on); default none.
    """

    def __init__(self, addresses: Sequence[str] = (), state: Ejections | None = None) -> None:
        self.addresses: tuple[str, ...] = tuple(addresses)
        n = len(self.addresses)
        self.state = Ejections.none(n) if state is None else state
        self._history = np.zeros((n, 0, 2 + _NK), np.int64)  # per interval: succ, failed, kinds
        self._pos = 0
        self._streak = np.zeros(n, np.int64)
        self._base = _Baseline.empty(n)
        self._window = np.zeros((n, 2 + _NK), np.int64)
        self.panic = False
        #: Readmitted endpoints whose fade-in is not published yet.
        self.pending_readmit: set[str] = set()

    def align(self, addresses: Sequence[str], intervals: int) -> None:
        """Follow the published endpoint list (new endpoints start fresh, removed ones go).

        ``intervals``: how many per-interval entries the window keeps (a change starts
        the window over).
        """
        addresses = tuple(addresses)
        if addresses == self.addresses and self._history.shape[1] == intervals:
            return
        where = {a: i for i, a in enumerate(self.addresses)}
        rows = np.array([where.get(a, -1) for a in addresses], dtype=np.intp)
        new = rows < 0
        safe = np.where(new, 0, rows)
        self.state = self.state.take(rows)
        if self._history.shape[1] == intervals and len(self.addresses):
            hist = self._history.take(safe, axis=0)
            hist[new] = 0
        else:
            hist = np.zeros((rows.size, intervals, 2 + _NK), np.int64)
            self._pos = 0
        self._history = hist
        streak = self._streak.take(safe) if len(self.addresses) else np.zeros(rows.size, np.int64)
        streak[new] = 0
        self._streak = streak
        self._window = np.zeros((rows.size, 2 + _NK), np.int64)
        self._base = self._base.take(rows)
        self.addresses = addresses
        self.pending_readmit &= set(addresses)

    def evaluate(self, totals: Totals | None, now_ns: int, params: OutlierParams) -> Verdicts:
        """Judge the published endpoints at ``now_ns`` (after :meth:`align`).

        ``totals``: the counters' lifetime totals of :attr:`addresses` (``None``: no
        counters, or detection off; ejections still end on time).
        """
        n = len(self.addresses)
        succ = np.zeros(n, np.int64)
        fail = np.zeros(n, np.int64)
        kinds = np.zeros((n, _NK), np.int64)
        if totals is not None and params.enabled:
            calls, kinds = self._base.deltas(totals)
            # (ejected endpoints are no peers: their last calls are their failure's tail)
            counted = interval_counts(calls, kinds, peers=~self.state.ejected)
            succ, fail = counted.successes, counted.failures
        out = self.state.ejected
        succ[out] = fail[out] = 0
        kinds[out] = 0
        if self._history.shape[1]:
            self._history[:, self._pos, 0] = succ
            self._history[:, self._pos, 1] = fail
            self._history[:, self._pos, 2:] = kinds
            self._pos = (self._pos + 1) % self._history.shape[1]
        self._streak = streaks(self._streak, succ, fail)
        window = self._history.sum(axis=1)
        verdict = judge(window[:, 0], window[:, 1], self._streak, params)
        s = step(self.state, verdict.reasons, now_ns, params, verdict.failure_rate)
        fresh = np.concatenate((s.ejected, s.readmitted))
        self._history[fresh] = 0
        self._streak[fresh] = 0
        self._window = window
        self.state = s.state
        _, self.panic = routing_mask(s.state.ejected, params.panic_threshold)
        names = self.addresses
        readmitted = tuple(names[i] for i in s.readmitted)
        self.pending_readmit |= set(readmitted)
        return Verdicts(
            tuple(names[i] for i in s.ejected),
            readmitted,
            tuple(names[i] for i in s.held_back),
            self.panic,
        )

    @property
    def has_baseline(self) -> bool:
        """Whether every endpoint's counters were read once: calls count from that read on."""
        return bool(self._base.slots.size) and bool((self._base.slots >= 0).all())

    def window_counts(self, address: str) -> dict[str, int]:
        """The window counts the last evaluation judged ``address`` on (for log lines)."""
        row = self._window[self.addresses.index(address)].tolist()
        return {
            "successes": row[0],
            "failures": row[1],
            **{f"failures_{k}": v for k, v in zip(FAILURE_KINDS, row[2:], strict=True)},
        }

    def ejections_for(self, addresses: Sequence[str]) -> Ejections:
        """The ejection state of ``addresses`` in that order (unknown ones: never ejected)."""
        where = {a: i for i, a in enumerate(self.addresses)}
        return self.state.take([where.get(a, -1) for a in addresses])


@dataclass(slots=True)
class _Baseline:
    """The totals last seen per endpoint, to take deltas from."""

    source: int
    slots: np.ndarray
    requests: np.ndarray
    kinds: np.ndarray

    @classmethod
    def empty(cls, n: int) -> _Baseline:
        return cls(
            -1, np.full(n, -1, np.int32), np.zeros(n, np.int64), np.zeros((n, _NK), np.int64)
        )

    def take(self, rows: np.ndarray) -> _Baseline:
        new = rows < 0
        safe = np.where(new, 0, rows)
        if not self.slots.size:
            return _Baseline.empty(rows.size)
        slots = self.slots.take(safe)
        slots[new] = -1  # no baseline yet: the first read sets it
        return _Baseline(
            self.source, slots, self.requests.take(safe), self.kinds.take(safe, axis=0)
        )

    def deltas(self, t: Totals) -> tuple[np.ndarray, np.ndarray]:
        """Calls and failures by kind since the last read; the baseline moves to ``t``."""
        req = t.requests.astype(np.int64)
        kinds = t.failures_by_kind.astype(np.int64)
        d_req = req - self.requests
        d_kinds = kinds - self.kinds
        ok = (
            (t.source == self.source)
            & (t.slots == self.slots)
            & (t.slots >= 0)
            & (d_req >= 0)
            & (d_kinds >= 0).all(axis=1)
        )
        d_kinds = np.where(ok[:, None], d_kinds, 0)
        # A reader may see a call's failure before its request total (no cross-cell
        # snapshot): count the call now (its request then shows up once more later).
        d_req = np.where(ok, np.maximum(d_req, d_kinds.sum(axis=1)), 0)
        self.source, self.slots, self.requests, self.kinds = t.source, t.slots.copy(), req, kinds
        return d_req, d_kinds


@dataclass(frozen=True, slots=True)
class Published:
    """The outlier part of a published table: endpoints, their ejection state, panic."""

    addresses: tuple[str, ...]
    state: Ejections
    panic: bool

    def differs(self, addresses: tuple[str, ...], state: Ejections, panic: bool) -> bool:
        """Whether routing or the ejection record changed.

        A multiplier decay alone does not count: it rides along with the next publish.
        """
        if panic != self.panic or addresses != self.addresses:
            return True
        return not (
            np.array_equal(state.reason, self.state.reason)
            and np.array_equal(state.until_ns, self.state.until_ns)
        )

    def changes(self, new: Published) -> tuple[list[int], list[str]]:
        """Rows of ``new`` ejected since ``self``, and addresses readmitted since.

        Readmitted: ejected in ``self``, in ``new`` and no longer ejected there.
        """
        before = {
            a: int(u)
            for a, r, u in zip(self.addresses, self.state.reason, self.state.until_ns, strict=True)
            if r
        }
        ejected = [
            i
            for i, (a, r, u) in enumerate(
                zip(new.addresses, new.state.reason, new.state.until_ns, strict=True)
            )
            if r and before.get(a) != int(u)
        ]
        still = {a for a, r in zip(new.addresses, new.state.reason, strict=True) if r}
        present = set(new.addresses)
        readmitted = [a for a in before if a not in still and a in present]
        return ejected, readmitted
