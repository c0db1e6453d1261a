"""The pod's own clock: each worker process records its requests, any of them reads the pod's.

:class:`PodLoad` is the per-process handle the middlewares use. :meth:`~PodLoad.begin`
and :meth:`~PodLoad.end` write this process's row of the pod's pool
(:mod:`workers.serving.pool`) with a few aligned stores under a lock private to the
process (gthread workers share a row between threads); :meth:`~PodLoad.snapshot` sums
every row into the pod's occupancy, rates and open requests; :meth:`~PodLoad.header`
caches the report text for :attr:`PodSettings.refresh_s`.

Occupancy is busy-seconds per second over the window (``CSLB_POD_WINDOW``, 10 s in ten
1-s buckets, like the host's counters): the busy time of requests that ended, spread over
the buckets they spanned, each bucket weighed by its share of the window
(:func:`lbcore.signals.window_weights`), plus open requests counted from their start (at
most one window each). Open requests of a row whose owner died (SIGKILL) stop counting
at the next liveness check (:data:`LIVENESS_NS`); its finished work ages out of the
window; its row is reclaimed by the next process that needs one.

The row is claimed on first use, so a middleware built in a gunicorn master
(``--preload``) claims nothing there; a forked child drops its parent's row and claims
its own; the row is released at exit, and the last process to leave removes the pool.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from lbcore.signals import window_weights
from lbwire.orca import MAX_VALUE, format_report
from shm.owners import process_alive
from workers.serving.capacity import gunicorn_capacity
from workers.serving.pool import (
    BUCKET,
    FIRST_BUCKET,
    OPEN,
    OPEN_SUM,
    PID,
    TICKS,
    auto_namespace,
    open_pool,
    release,
)
from workers.serving.settings import PodSettings

__all__ = ["LIVENESS_NS", "WINDOW_BUCKETS", "PodLoad", "PodSnapshot"]

#: Buckets spanning the window.
WINDOW_BUCKETS = 10
#: A reader checks whether each row's owner lives at most this often (nanoseconds).
LIVENESS_NS = 1_000_000_000

_monotonic_ns = time.monotonic_ns


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    """The pod's load at one instant.

    Attributes
    ----------
    occupancy : float
        Busy-seconds per second over the window, all worker processes together.
    rps, eps : float
        Requests and errors (5xx or exceptions) that ended, per second over the window.
    capacity : int
        Requests the pod serves at once; ``utilization = occupancy / capacity``.
    capacity_source : str
        How the capacity was found.
    open_requests : int
        Requests in progress in live processes.
    processes : int
        Live processes recording into the pool.
    """

    occupancy: float
    rps: float
    eps: float
    capacity: int
    capacity_source: str
    open_requests: int
    processes: int

    @property
    def utilization(self) -> float:
        """Occupancy divided by capacity."""
        return self.occupancy / self.capacity


class PodLoad:
    """Recorder of the pod's load for this process, and its reader.

    Parameters
    ----------
    settings
        The middleware settings (default: from the environment).
    namespace
        The pool's namespace (default: from ``settings.pool``, :func:`pool.auto_namespace`).
    """

    def __init__(self, settings: PodSettings | None = None, *, namespace: str | None = None):
        self.settings = settings if settings is not None else PodSettings.from_env()
        self._namespace = namespace
        self._lock = threading.Lock()
        self._w: memoryview | None = None
        self._text = ""
        self._due = 0
        self._refresh_ns = int(self.settings.refresh_s * 1e9)
        self._capacity: tuple[int, str] | None = None
        self._alive: dict[int, tuple[int, int, bool, int]] = {}
        _INSTANCES.add(self)

    # ---- lifecycle ------------------------------------------------------------------

    def _attach(self) -> None:
        window_ns = int(self.settings.window_s * 1e9)
        ns = self._namespace or auto_namespace(self.settings.pool)
        self.pool, self.row = open_pool(ns, window_ns, WINDOW_BUCKETS)
        p = self.pool
        self._o = p.offset(self.row)
        self._base = p.base_ns
        self._bucket_ns = p.bucket_ns
        self._buckets = p.buckets
        self._window_ns = p.bucket_ns * (p.buckets - 2)
        self._w = p.words
        self._alive.clear()

    def _forget(self) -> None:
        """In a forked child: the row is the parent's; claim another on first use."""
        self._lock = threading.Lock()
        self._w = None
        self._due = 0

    def close(self) -> None:
        """Release this process's row (the pool goes with its last process). Idempotent."""
        with self._lock:
            if self._w is not None:
                release(self.pool, self.row)
                self._w = None

    # ---- the request path -----------------------------------------------------------

    def begin(self) -> int:
        """Count a request as open from now; returns its start (CLOCK_MONOTONIC ns)."""
        now = _monotonic_ns()
        with self._lock:
            if self._w is None:
                self._attach()
            w, o = self._w, self._o
            w[o + OPEN] += 1
            w[o + OPEN_SUM] += now - self._base
        return now

    def end(self, start_ns: int, error: bool = False) -> int:
        """End a request begun at ``start_ns``; returns the end (CLOCK_MONOTONIC ns)."""
        now = _monotonic_ns()
        with self._lock:
            w = self._w
            if w is None:  # begun before a fork, or closed: nothing of it is in this row
                return now
            o, bn = self._o, self._bucket_ns
            period = now // bn
            j = o + FIRST_BUCKET + (period % self._buckets) * BUCKET
            if w[j] != period:
                self._recycle(j, period)
            dur = now - start_ns
            head = now - period * bn
            # Busy time first, open count after: a reader in between counts the request
            # twice for a moment rather than not at all.
            if dur <= head:
                w[j + 1] += dur
            else:
                w[j + 1] += head
                self._spread(period, dur - head)
            w[j + 2] += 1
            if error:
                w[j + 3] += 1
            w[o + OPEN] -= 1
            w[o + OPEN_SUM] -= start_ns - self._base
        return now

    def _recycle(self, j: int, period: int) -> None:
        w = self._w
        w[j] = -1  # readers weigh a bucket with no period as outside the window
        w[j + 1] = w[j + 2] = w[j + 3] = 0
        w[j] = period

    def _spread(self, period: int, rest: int) -> None:
        """Busy time of a request that began before the current bucket, into earlier ones."""
        w, o, bn, k = self._w, self._o, self._bucket_ns, self._buckets
        for q in range(period - 1, period - k, -1):
            if rest <= 0:
                return
            j = o + FIRST_BUCKET + (q % k) * BUCKET
            if w[j] != q:
                self._recycle(j, q)
            part = min(rest, bn)
            w[j + 1] += part
            rest -= part

    # ---- reading --------------------------------------------------------------------

    def _live(self, row: int, pid: int, ticks: int, now: int) -> bool:
        if row == self.row:
            return True
        seen = self._alive.get(row)
        if seen is None or seen[0] != pid or seen[1] != ticks or now - seen[3] > LIVENESS_NS:
            seen = (pid, ticks, process_alive(pid, ticks), now)
            self._alive[row] = seen
        return seen[2]

    def _resolve_capacity(self, processes: int) -> tuple[int, str]:
        if self.settings.capacity:
            return self.settings.capacity, "CSLB_POD_CAPACITY"
        if self._capacity is None:
            found = gunicorn_capacity()
            self._capacity = found if found is not None else (0, "")
        if self._capacity[0]:
            return self._capacity
        return max(1, processes), f"{max(1, processes)} processes in the pool"

    def snapshot(self, now_ns: int | None = None) -> PodSnapshot:
        """The pod's load now: every live process's row summed."""
        if self._w is None:
            with self._lock:
                if self._w is None:
                    self._attach()
        now = _monotonic_ns() if now_ns is None else int(now_ns)
        t = self.pool.table
        rows = np.flatnonzero(t[:, PID] != 0)
        sub = t[rows]  # one copy: the sums below see one instant per row
        k, bn, win = self._buckets, self._bucket_ns, self._window_ns
        cols = FIRST_BUCKET + BUCKET * np.arange(k)
        weights = window_weights(sub[:, cols] * bn, bn, now, win)
        busy = float((np.clip(sub[:, cols + 1], 0, None) * weights).sum())
        done = float((np.clip(sub[:, cols + 2], 0, None) * weights).sum())
        errors = float((np.clip(sub[:, cols + 3], 0, None) * weights).sum())
        live = np.array(
            [
                self._live(int(r), int(s[PID]), int(s[TICKS]), now)
                for r, s in zip(rows, sub, strict=True)
            ],
            dtype=bool,
        )
        n_open = np.where(live, np.clip(sub[:, OPEN], 0, None), 0)
        open_busy = n_open * (now - self._base) - np.where(live, sub[:, OPEN_SUM], 0)
        busy += float(np.clip(open_busy, 0, n_open * win).sum())
        processes = int(live.sum())
        cap, source = self._resolve_capacity(processes)
        window_s = win / 1e9
        return PodSnapshot(
            busy / win,
            done / window_s,
            errors / window_s,
            cap,
            source,
            int(n_open.sum()),
            processes,
        )

    def header(self) -> str:
        """The ``endpoint-load-metrics`` value, recomputed at most every ``refresh_s``."""
        now = _monotonic_ns()
        if now < self._due and self._text:
            return self._text
        s = self.snapshot(now)
        self._text = format_report(
            _bounded(s.utilization), _bounded(s.rps), _bounded(s.eps), _bounded(s.occupancy)
        )
        self._due = now + self._refresh_ns
        return self._text


def _bounded(v: float) -> float:
    # A row another process of the user scribbled on must not stop responses.
    return min(v, MAX_VALUE) if math.isfinite(v) and v > 0 else 0.0


_INSTANCES: weakref.WeakSet[PodLoad] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for inst in list(_INSTANCES):
        inst._forget()


def _at_exit() -> None:
    for inst in list(_INSTANCES):
        if inst._w is not None and inst.pool.words[inst._o + PID] == os.getpid():
            inst.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
