"""Per-pod LRU caches, vectorized by resolving recency to the simulation tick.

Exact LRU needs the order of every access; here recency is the *tick* of a key's last
access (its stamp). A pod's cache holds the keys whose stamp is at least the pod's
``cutoff``; when a tick leaves a cache with more than ``size`` keys, whole cohorts of
least-recent stamps are dropped (``cutoff`` advances) until it fits. So:

* a cache never holds more than ``size`` keys (checked after every tick);
* it holds at least ``size`` minus the keys of one tick cohort, i.e. the only departure
  from exact LRU is the order of eviction among keys last used in the same tick;
* within a tick the first access to an uncached key misses and inserts it; later
  accesses to it in the same tick hit (they are served by that fetch).

Stamps live in one dense ``pods x catalogue`` array (``uint16`` when the run has fewer
than 65,535 ticks, else ``uint32``): 2 bytes per pod and product, e.g. 200 MB for 100
pods and 1,000,000 products; page-touching is lazy, so a pod that never sees a product
costs nothing for it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TickLRU"]


class TickLRU:
    """Per-pod LRU caches over a shared catalogue.

    Parameters
    ----------
    pods
        Number of pods (rows).
    catalogue
        Number of products (columns).
    size
        Capacity of every pod's cache, in products.
    stamps
        Largest stamp value that will ever be used (ticks plus prefill cohorts).
    """

    def __init__(self, pods: int, catalogue: int, size: int, stamps: int) -> None:
        if size < 1:
            raise ValueError(f"cache size must be >= 1 product, got {size}")
        self.pods = pods
        self.catalogue = catalogue
        self.capacity = int(size)
        dtype = np.uint16 if stamps < np.iinfo(np.uint16).max else np.uint32
        self.stamps = np.zeros(pods * catalogue, dtype=dtype)
        # cohort[p, s]: keys of pod p whose last access has stamp s (only s >= cutoff[p]).
        self.cohort = np.zeros((pods, stamps + 1), dtype=np.int64)
        self.size = np.zeros(pods, dtype=np.int64)
        self.cutoff = np.ones(pods, dtype=np.int64)  # stamp 0 means "never cached"
        self.max_stamp = stamps

    def prefill(self, pod: int, keys_oldest_first: np.ndarray, stamps: np.ndarray) -> None:
        """Put keys into an empty pod's cache with given stamps (warm start)."""
        if self.size[pod]:
            raise ValueError(f"pod {pod} already has a cache; prefill only an empty one")
        keys = np.asarray(keys_oldest_first, dtype=np.int64)[-self.capacity :]
        st = np.asarray(stamps, dtype=np.int64)[-self.capacity :]
        self.stamps[pod * self.catalogue + keys] = st
        np.add.at(self.cohort[pod], st, 1)
        self.size[pod] = keys.size

    def access(self, pods: np.ndarray, keys: np.ndarray, stamp: int) -> np.ndarray:
        """Serve one tick's accesses (in arrival order) and return which ones hit.

        Parameters
        ----------
        pods, keys
            Pod and product of every access, in arrival order.
        stamp
            This tick's stamp; larger than every stamp used before.

        Returns
        -------
        numpy.ndarray
            ``bool`` per access: ``True`` for a cache hit, ``False`` for a miss (a
            database read that inserts the key).
        """
        n = keys.size
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        code = pods.astype(np.int64) * self.catalogue + keys
        uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
        old = self.stamps[uniq].astype(np.int64)
        upod = uniq // self.catalogue
        cached = old >= self.cutoff[upod]
        hit = cached[inv]
        hit |= np.arange(n) != first[inv]  # repeats within the tick ride on the first fetch
        if cached.any():
            np.subtract.at(self.cohort, (upod[cached], old[cached]), 1)
        self.cohort[:, stamp] += np.bincount(upod, minlength=self.pods)
        self.size += np.bincount(upod[~cached], minlength=self.pods)
        self.stamps[uniq] = stamp
        self._evict()
        return hit

    def _evict(self) -> None:
        over = np.flatnonzero(self.size > self.capacity)
        while over.size:
            c = self.cutoff[over]
            self.size[over] -= self.cohort[over, c]
            self.cohort[over, c] = 0
            self.cutoff[over] = c + 1
            over = over[self.size[over] > self.capacity]

    def contents(self, pod: int) -> np.ndarray:
        """Product IDs in a pod's cache now (sorted)."""
        row = self.stamps[pod * self.catalogue : (pod + 1) * self.catalogue]
        return np.flatnonzero(row >= self.cutoff[pod])

    def drop(self, pod: int) -> None:
        """Empty a pod's cache (the pod was deleted)."""
        self.cutoff[pod] = self.max_stamp + 1
        self.size[pod] = 0
        self.cohort[pod] = 0
