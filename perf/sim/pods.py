"""The pods' side: concurrency slots with one FIFO queue per pod.

A pod serves at most ``concurrency`` calls at once; a call that arrives when every slot
is busy waits in the pod's FIFO queue. This is an exact multi-server FIFO queue
(M/G/c with the given service times): in arrival order each call takes the slot that
frees up first and starts at ``max(arrival, slot free time)``. It is vectorized over
pods: the ``r``-th call of every pod in a tick is placed in one step, so a tick costs
as many steps as its busiest pod has arrivals.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PodQueues"]


class PodQueues:
    """Slot-free times of every pod.

    Parameters
    ----------
    pods
        Number of pods.
    concurrency
        Calls a pod serves at once (its concurrency limit).
    """

    def __init__(self, pods: int, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency limit must be >= 1 call, got {concurrency}")
        self.concurrency = concurrency
        self.free = np.zeros((pods, concurrency), dtype=np.float64)

    def serve(self, pods: np.ndarray, arrival: np.ndarray, service: np.ndarray) -> np.ndarray:
        """Completion time of every call (seconds).

        Parameters
        ----------
        pods
            Pod of every call.
        arrival
            Arrival time of every call in seconds, non-decreasing (arrival order).
        service
            Service time of every call in seconds.
        """
        n = pods.size
        done = np.empty(n, dtype=np.float64)
        if n == 0:
            return done
        by_pod = np.argsort(pods, kind="stable")  # stable: keeps arrival order per pod
        pod_sorted = pods[by_pod]
        counts = np.bincount(pod_sorted)
        first = np.cumsum(counts) - counts
        rank = np.arange(n) - first[pod_sorted]
        by_rank = np.argsort(rank, kind="stable")
        calls = by_pod[by_rank]
        bounds = np.searchsorted(rank[by_rank], np.arange(int(rank.max()) + 2))
        free = self.free
        for r in range(bounds.size - 1):
            c = calls[bounds[r] : bounds[r + 1]]
            p = pods[c]
            slots = free[p]
            j = slots.argmin(axis=1)
            start = np.maximum(arrival[c], slots[np.arange(c.size), j])
            end = start + service[c]
            free[p, j] = end
            done[c] = end
        return done
