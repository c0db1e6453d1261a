"""Host-wide loads per endpoint slot as read at one instant: :class:`HostLoads`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lbcore.bounded import routed_call_load
from lbcore.outlier import FAILURE_KINDS
from lbcore.signals import DEFAULT_LATENCY_CAP, LOAD_SIGNALS, routing_load, window_weights
from shm.errors import CounterInputError


def bucket_weights(periods: np.ndarray, bucket_ns: int, now_ns: int, window_ns: int) -> np.ndarray:
    """Share of each bucket's counts inside the window, by :func:`lbcore.signals.window_weights`.

    Parameters
    ----------
    periods
        Bucket numbers (``time // bucket_ns``), any shape; ``-1``: empty (weighs 0).
    bucket_ns, now_ns, window_ns
        Bucket width, the present and the window length, in nanoseconds.

    Returns
    -------
    numpy.ndarray
        ``float64`` weights in ``[0, 1]``, shaped like ``periods``.
    """
    w = window_weights(periods.astype(np.int64).ravel() * bucket_ns, bucket_ns, now_ns, window_ns)
    w = w.reshape(periods.shape)
    w[periods < 0] = 0.0
    return w


@dataclass(frozen=True)
class HostLoads:
    """Host-wide load per endpoint slot, read at one instant.

    Attributes
    ----------
    now_ns : int
        When it was read (CLOCK_MONOTONIC, ns).
    window_ns : int
        The occupancy window (ns).
    in_flight : numpy.ndarray
        ``int64`` open requests per slot, all workers summed.
    occupancy : numpy.ndarray
        ``float64`` busy-seconds per second over the window (open requests included).
    completed : numpy.ndarray
        ``float64`` requests completed inside the window.
    mean_latency_s : numpy.ndarray
        ``float64`` mean latency of those requests in seconds (NaN: none completed).
    failure_rate : numpy.ndarray
        ``float64`` share of those requests that failed (NaN: none completed).
    global_latency_s : float
        Mean latency over all slots in seconds (NaN: nothing completed).
    requests_total, failures_total : numpy.ndarray
        ``int64`` requests ended (and those that failed) per slot since the slot was
        given to its endpoint, all workers ever summed: never age out (Prometheus
        counters). A writer handing a freed slot to a new endpoint zeroes them
        (:meth:`CounterStore.reset_totals`).
    failures : numpy.ndarray
        ``float64`` failed requests per slot inside the window (weighted like
        :attr:`completed`; ``failures / completed`` is :attr:`failure_rate`).
    failures_by_kind : numpy.ndarray
        ``float64`` ``(slots, 4)``: :attr:`failures` split by kind, column ``code - 1``
        for the codes of :mod:`lbcore.outlier` (connect, timeout, status, other, as
        :data:`lbcore.outlier.FAILURE_KINDS`); rows sum to :attr:`failures`. NaN when
        read with ``failure_kinds=False``.
    failures_total_by_kind : numpy.ndarray
        ``int64`` ``(slots, 4)``: :attr:`failures_total` split by kind, columns as in
        :attr:`failures_by_kind`; rows sum to :attr:`failures_total`.
    """

    now_ns: int
    window_ns: int
    in_flight: np.ndarray
    occupancy: np.ndarray
    completed: np.ndarray
    mean_latency_s: np.ndarray
    failure_rate: np.ndarray
    global_latency_s: float
    requests_total: np.ndarray
    failures_total: np.ndarray
    failures: np.ndarray
    failures_by_kind: np.ndarray
    failures_total_by_kind: np.ndarray

    @classmethod
    def idle(cls, n: int, now_ns: int, window_ns: int = 0) -> HostLoads:
        """Loads of ``n`` endpoint slots nobody has called (nothing recorded, NaN latency)."""
        z = np.zeros(n)
        nan = np.full(n, np.nan)
        zi = np.zeros(n, np.int64)
        nk = len(FAILURE_KINDS)
        return cls(
            now_ns=int(now_ns),
            window_ns=int(window_ns),
            in_flight=zi,
            occupancy=z,
            completed=z,
            mean_latency_s=nan,
            failure_rate=nan,
            global_latency_s=float("nan"),
            requests_total=zi,
            failures_total=zi,
            failures=z,
            failures_by_kind=np.zeros((n, nk)),
            failures_total_by_kind=np.zeros((n, nk), np.int64),
        )

    def take(self, slots: Any) -> HostLoads:
        """The loads of the given slots, in that order (e.g. ``Table.slots``: per endpoint).

        Slots this snapshot does not cover (given to endpoints published after it was
        read) count as idle: no in-flight, no occupancy, no completions (NaN latency).

        Raises
        ------
        CounterInputError
            A negative slot.
        """
        idx = np.asarray(slots, dtype=np.intp)
        n = self.in_flight.size
        if idx.size and int(idx.min()) < 0:
            raise CounterInputError(f"endpoint slots must be >= 0, got {int(idx.min())}")
        beyond = bool(idx.size) and int(idx.max()) >= n
        if beyond:
            # Every uncovered slot reads the one idle row appended at n: what this costs
            # depends on how many slots there are, never on how large one is.
            idx = np.minimum(idx, n)

        def pick(arr: np.ndarray, idle: float) -> np.ndarray:
            if beyond:
                pad = np.full((1, *arr.shape[1:]), idle, dtype=arr.dtype)
                arr = np.concatenate((arr, pad))
            return arr.take(idx, axis=0)

        return HostLoads(
            now_ns=self.now_ns,
            window_ns=self.window_ns,
            in_flight=pick(self.in_flight, 0),
            occupancy=pick(self.occupancy, 0.0),
            completed=pick(self.completed, 0.0),
            mean_latency_s=pick(self.mean_latency_s, np.nan),
            failure_rate=pick(self.failure_rate, np.nan),
            global_latency_s=self.global_latency_s,
            requests_total=pick(self.requests_total, 0),
            failures_total=pick(self.failures_total, 0),
            failures=pick(self.failures, 0.0),
            failures_by_kind=pick(self.failures_by_kind, 0.0),
            failures_total_by_kind=pick(self.failures_total_by_kind, 0),
        )

    def _load(self, name: str, cap: float = DEFAULT_LATENCY_CAP) -> np.ndarray:
        return routing_load(
            name,
            self.in_flight,
            self.occupancy,
            self.mean_latency_s,
            self.completed,
            self.failures,
            self.global_latency_s,
            self.window_ns / 1e9,
            cap=cap,
        )

    def effective(self, cap: float = DEFAULT_LATENCY_CAP) -> np.ndarray:
        """``max(in_flight, occupancy) × min(latency / global latency, cap)`` (lbcore).

        Failed calls count as calls of the host's mean latency
        (:func:`lbcore.signals.with_failures`), as in :meth:`signal`.
        """
        return self._load("effective", cap)

    def signal(self, name: str) -> np.ndarray:
        """The ``float64`` load vector a knob's load signal names, by lbcore's rule.

        ``occupancy``, ``in-flight`` or ``effective`` (see :data:`lbcore.signals.LOAD_SIGNALS`
        and :func:`lbcore.signals.load_for`). Occupancy and effective load count every
        failed call as a call of the host's mean latency
        (:func:`lbcore.signals.with_failures`), so a pod that fails fast does not look
        idle; :attr:`occupancy` and :attr:`mean_latency_s` stay as measured.
        """
        if name not in LOAD_SIGNALS:
            raise CounterInputError(f"unknown load signal {name!r}, expected one of {LOAD_SIGNALS}")
        return self._load(name)

    def bar_increment(self, name: str) -> float:
        """What bounded load's bar counts for the call being routed, in ``name``'s unit.

        :func:`lbcore.bounded.routed_call_load` with the host's mean call latency over
        the occupancy window (:attr:`global_latency_s`: summed latency over summed
        completions of every slot read) and the window: 1.0 for ``in-flight`` and
        ``effective`` (Skipper's), ``global_latency_s / window`` seconds per second
        for ``occupancy`` (1.0 while nothing completed in the window). Routing on
        ``lbcore.bounded.in_call_units(signal(name), bar_increment(name))`` decides as
        the bar ``(increment + Σ load) / n × balance_factor`` on :meth:`signal`.
        """
        if name not in LOAD_SIGNALS:
            raise CounterInputError(f"unknown load signal {name!r}, expected one of {LOAD_SIGNALS}")
        return routed_call_load(name, self.global_latency_s, self.window_ns / 1e9)
