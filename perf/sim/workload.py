"""The traffic: a product catalogue with Zipf popularity and batch requests of IDs.

Product IDs are the integers ``0 .. catalogue - 1`` and ID ``k`` is the ``k``-th most
popular (probability proportional to ``1 / (k + 1) ** exponent``). Popularity rank and
ring position are independent because the ring places a key by the XXH64 hash of its
decimal string, so numbering by rank loses nothing and makes "the head" easy to name.
"""

from __future__ import annotations

import functools

import numpy as np

import lbcore

__all__ = ["Batches", "Catalogue", "catalogue_hashes"]


@functools.lru_cache(maxsize=4)
def catalogue_hashes(size: int) -> np.ndarray:
    """XXH64 of every product ID ``0 .. size - 1`` (hashed once per process, read-only).

    The IDs are hashed by :func:`lbcore.hash_keys` exactly as a worker hashes an integer
    product ID (its decimal string), so every routing call can pass ``hashes=``.
    """
    h = lbcore.hash_keys(np.arange(size, dtype=np.int64))
    h.setflags(write=False)
    return h


class Catalogue:
    """Products with Zipf-distributed popularity.

    Parameters
    ----------
    size
        Number of product IDs.
    exponent
        Zipf exponent ``s`` (0 gives uniform popularity).
    """

    def __init__(self, size: int, exponent: float) -> None:
        if size < 1:
            raise ValueError(f"catalogue size must be >= 1 product, got {size}")
        if not np.isfinite(exponent) or exponent < 0:
            raise ValueError(f"Zipf exponent must be a finite number >= 0, got {exponent}")
        self.size = int(size)
        self.exponent = float(exponent)
        weights = np.arange(1, size + 1, dtype=np.float64) ** -self.exponent
        self.popularity = weights / weights.sum()
        cdf = np.cumsum(self.popularity)
        cdf[-1] = 1.0
        self._cdf = cdf
        self.hashes = catalogue_hashes(self.size)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` product IDs drawn by popularity, independently (``int64``)."""
        return np.searchsorted(self._cdf, rng.random(n), side="right").astype(np.int64)

    def sample_batches(self, rng: np.random.Generator, sizes: np.ndarray) -> np.ndarray:
        """Batches of *distinct* product IDs drawn by popularity, concatenated (``int64``).

        A batch API de-duplicates the IDs of one request, so a batch never asks for a
        product twice. Each batch takes IDs from an independent popularity-weighted
        stream and skips the ones it already has (successive sampling without
        replacement).

        Parameters
        ----------
        rng
            The workload's random generator.
        sizes
            IDs per batch; each at most :attr:`size`.
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        nb = sizes.size
        if nb and int(sizes.max()) > self.size:
            raise ValueError(
                f"a batch of {int(sizes.max())} distinct IDs needs a catalogue at least "
                f"that large, got {self.size}"
            )
        starts = np.zeros(nb, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        out = np.empty(int(sizes.sum()), dtype=np.int64)
        # One vectorized pass over a stream a quarter longer than needed (Zipf 1 over a
        # million IDs repeats ~12 % of a 100-ID batch) fills almost every batch ...
        stream_batch = np.repeat(np.arange(nb, dtype=np.int64), sizes + sizes // 4 + 4)
        stream = self.sample(rng, stream_batch.size)
        _, first = np.unique(stream_batch * self.size + stream, return_index=True)
        first.sort()  # first occurrences, in stream (so batch) order
        kb = stream_batch[first]
        rank = np.arange(kb.size) - np.searchsorted(kb, kb, side="left")
        take = rank < sizes[kb]
        out[starts[kb[take]] + rank[take]] = stream[first[take]]
        got = np.bincount(kb[take], minlength=nb)
        # ... and the few it does not continue their streams one at a time.
        for b in np.flatnonzero(got < sizes).tolist():
            lo, n, have = int(starts[b]), int(sizes[b]), int(got[b])
            seen = set(out[lo : lo + have].tolist())
            while have < n:
                for key in self.sample(rng, 2 * (n - have) + 4).tolist():
                    if key not in seen:
                        seen.add(key)
                        out[lo + have] = key
                        have += 1
                        if have == n:
                            break
        return out


class Batches:
    """Batch requests arriving in one tick, flattened into calls in arrival order.

    Attributes
    ----------
    keys : numpy.ndarray
        ``int64`` product ID of every call.
    arrival : numpy.ndarray
        ``float64`` arrival time of every call, in seconds (all calls of a batch leave
        the client together: the fan-out is parallel).
    starts : numpy.ndarray
        Index of the first call of every batch (for ``np.maximum.reduceat``).
    client : numpy.ndarray
        Client host (0-based) every call comes from.
    """

    __slots__ = ("arrival", "client", "keys", "starts")

    def __init__(
        self, keys: np.ndarray, arrival: np.ndarray, starts: np.ndarray, client: np.ndarray
    ) -> None:
        self.keys = keys
        self.arrival = arrival
        self.starts = starts
        self.client = client

    @classmethod
    def draw(
        cls,
        rng: np.random.Generator,
        catalogue: Catalogue,
        rate: float,
        max_batch: int,
        t0: float,
        dt: float,
        clients: int = 1,
    ) -> Batches:
        """Poisson batch arrivals over ``[t0, t0 + dt)`` carrying ``rate`` calls/s on average.

        Batch sizes are uniform in ``1 .. max_batch``; the number of batches is Poisson
        with mean ``rate * dt / mean_batch_size``; a batch's IDs are distinct
        (:meth:`Catalogue.sample_batches`); each batch comes from one of ``clients``
        client hosts, uniformly.

        Parameters
        ----------
        rng
            The workload's random generator.
        catalogue
            Products and their popularity.
        rate
            Calls (IDs) per second, on average.
        max_batch
            Largest batch, in IDs.
        t0, dt
            The interval, in seconds.
        clients
            Client hosts.
        """
        mean_size = (1 + max_batch) / 2.0
        nb = int(rng.poisson(rate * dt / mean_size))
        if nb == 0:
            empty = np.empty(0, dtype=np.int64)
            return cls(empty, np.empty(0, dtype=np.float64), empty, empty)
        sizes = rng.integers(1, max_batch + 1, nb)
        when = t0 + np.sort(rng.random(nb)) * dt
        starts = np.zeros(nb, dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        n = int(sizes.sum())
        keys = catalogue.sample_batches(rng, sizes)
        client = (
            np.zeros(n, dtype=np.int64)
            if clients == 1
            else np.repeat(rng.integers(0, clients, nb), sizes)
        )
        return cls(keys, np.repeat(when, sizes), starts, client)
