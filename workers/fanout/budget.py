"""The retry budget: how many failed calls a worker may retry, windowed like Finagle's.

Every first call deposits; every retry withdraws. A retry is allowed while

    retries in the window  <  percent × calls in the window  +  floor × window

so a worker retries at most ``percent`` of its calls (Finagle's default: 20 %) plus a
small floor per second for workers that make few calls (Finagle: 10/s), and deposits
and withdrawals count for ``window`` seconds (Finagle's ``ttl``: 10 s) in ten slices.
A sudden outage of one pod in five costs retries for a fifth of the calls: covered
until the pod is ejected. A host-wide outage cannot triple the load: at most
``percent`` more calls go out, however many fail.

Pure apart from its lock: time comes in as an argument.
"""

from __future__ import annotations

import threading

__all__ = ["RetryBudget"]

_SLICES = 10


class RetryBudget:
    """A windowed retry budget (one per worker process; thread-safe).

    Parameters
    ----------
    percent
        Retries allowed per call deposited, ``0 ..``: ``0.2`` = one retry per five calls.
    floor_per_s
        Retries allowed per second on top, whatever the call rate.
    window_s
        Seconds a deposit or a withdrawal counts (at least 1).
    """

    __slots__ = (
        "_calls",
        "_head",
        "_lock",
        "_retries",
        "_slice_ns",
        "floor",
        "percent",
        "window_s",
    )

    def __init__(self, percent: float = 0.2, floor_per_s: float = 10.0, window_s: float = 10.0):
        if not (percent >= 0.0 and floor_per_s >= 0.0 and window_s >= 1.0):
            raise ValueError(
                f"retry budget: percent and floor_per_s must be >= 0 and window_s >= 1, got "
                f"{percent!r}, {floor_per_s!r}, {window_s!r}"
            )
        self.percent = float(percent)
        self.window_s = float(window_s)
        self.floor = float(floor_per_s) * self.window_s
        self._slice_ns = int(self.window_s * 1e9 / _SLICES)
        self._calls = [0] * _SLICES
        self._retries = [0] * _SLICES
        self._head = 0  # index of the newest slice (time // slice_ns)
        self._lock = threading.Lock()

    def _advance(self, now_ns: int) -> int:
        """Index of the slice of ``now_ns``, zeroing the slices that aged out (locked)."""
        q = now_ns // self._slice_ns
        head = self._head
        if q > head:
            for k in range(max(head + 1, q - _SLICES + 1), q + 1):
                self._calls[k % _SLICES] = 0
                self._retries[k % _SLICES] = 0
            self._head = q
        return self._head % _SLICES

    def deposit(self, now_ns: int, calls: int = 1) -> None:
        """Count ``calls`` first calls made at ``now_ns``."""
        with self._lock:
            self._calls[self._advance(now_ns)] += calls

    def withdraw(self, now_ns: int) -> bool:
        """Take one retry if the budget allows it now; ``False``: no retry."""
        with self._lock:
            j = self._advance(now_ns)
            if sum(self._retries) + 1 > self.percent * sum(self._calls) + self.floor:
                return False
            self._retries[j] += 1
            return True

    def balance(self, now_ns: int) -> float:
        """Retries the budget would allow now (may be fractional)."""
        with self._lock:
            self._advance(now_ns)
            return self.percent * sum(self._calls) + self.floor - sum(self._retries)
