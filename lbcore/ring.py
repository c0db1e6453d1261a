"""Skipper's consistent-hash ring: the nodes, their owners and a bucket table.

The ring is Skipper's ``consistentHash`` (``loadbalancer/algorithm.go``): for endpoint
``i`` with address ``ep`` and ``j = 0 .. vnodes-1`` a node ``(XXH64(f"{ep}-{j}"), i)``;
nodes sorted ascending by hash; a key goes to the first node whose hash is ``>=`` the
key's hash, wrapping to node 0 past the end; nodes of endpoints that are not candidates
are stepped over.

Positions are not binary-searched. A *bucket table* indexed by the top bits of the hash
holds, for every bucket without a ring node, the ring position every hash of that
bucket maps to; only hashes that fall into one of the few buckets holding a node need a
comparison or a search. It is built once per ring, so a publisher builds it once per
generation and every worker shares it. Both kernels read these arrays:
:meth:`Ring.lookup` and :meth:`Ring.lookup_bounded` route one batch on them directly
(the rule of a :class:`lbcore.Plan` of this ring alone, built from the endpoints' masks
only and kept for the next call where nothing changed), for callers that route one
batch per ring. The endpoint addresses and their hosts are :mod:`lbcore.endpoints`'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lbcore.bounded import check_balance_factor, check_loads, check_max_hops
from lbcore.core import make_core
from lbcore.endpoints import endpoint_tuple, host_ids_of, host_key, renumbered
from lbcore.errors import ArgumentError, CandidatesError, EndpointError
from lbcore.hashing import hash_node_names
from lbcore.kernel import check_attempt, hash_keys, native
from lbcore.views import CHOICE_FIXED, GATE_ALL, view_counts, view_good

__all__ = [
    "DEFAULT_VNODES",
    "Ring",
    "bucket_bits_for",
    "build_bucket_table",
    "host_ids_of",
    "host_key",
    "renumbered",
]

#: Skipper's production constructor always uses 100 virtual nodes per endpoint.
DEFAULT_VNODES = 100

_I64 = np.dtype(np.int64)
# 2^21 int32 entries = 8 MiB per ring: two buffers of 2^22-entry tables would not fit a
# container's default 64 MiB /dev/shm, and more entries stop paying off (perf/RESULTS.md).
MAX_BUCKET_BITS = 21
MIN_BUCKET_BITS = 8
_NO_U64 = np.empty(0, dtype=np.uint64)
_NO_U8 = np.empty(0, dtype=np.uint8)


def bucket_bits_for(ring_size: int) -> int:
    """Number of top hash bits that index the bucket table of a ring of ``ring_size`` nodes.

    About 32 buckets per node: with hashes spread evenly, about 97 % of keys land in a
    bucket without a node and cost one table load, and the table (4 bytes per bucket)
    still fits the CPU caches; more bits make the table spill out of them.
    """
    if ring_size <= 1:
        return MIN_BUCKET_BITS
    bits = math.ceil(math.log2(ring_size)) + 5
    return max(MIN_BUCKET_BITS, min(MAX_BUCKET_BITS, bits))


def build_bucket_table(hashes: np.ndarray, bits: int) -> np.ndarray:
    """Bucket table of a sorted ring.

    Parameters
    ----------
    hashes
        Sorted ``uint64`` ring hashes.
    bits
        Number of top hash bits that select a bucket.

    Returns
    -------
    numpy.ndarray
        ``int32`` array of ``2**bits`` entries. ``e >= 0``: the bucket holds no node and
        every hash in it maps to ring position ``e`` (already wrapped to 0 past the last
        node). ``e <= -2``: the bucket holds exactly one node, at position ``p = -e - 2``;
        a hash maps to ``p`` if it is ``<= hashes[p]``, else to ``p + 1`` (wrapped).
        ``e == -1``: several nodes; the hash needs a search.
    """
    # Few and small temporaries: fresh pages fault on first write, and on a
    # 2-million-node ring the faults cost more than the arithmetic.
    n_buckets = 1 << bits
    first = np.zeros(n_buckets, dtype=np.int32)
    if not hashes.size:
        return first
    shift = np.uint64(64 - bits)
    counts = np.bincount((hashes >> shift).view(np.int64), minlength=n_buckets)
    np.cumsum(counts[:-1], out=first[1:])  # nodes before each bucket
    first[int(hashes[-1] >> shift) + 1 :] = 0  # above the last node: roll over to position 0
    one = np.flatnonzero(counts == 1)
    first[one] = -first[one] - 2
    first[counts > 1] = -1
    return first


def sorted_nodes(hashes: np.ndarray, vnodes: int, first: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort node hashes (endpoint-major, ``vnodes`` each) into ring order with their owners.

    Sorting the values alone is about twice as fast as ``argsort``, so the node index is
    packed into the low bits of each hash, the packed values are sorted, and the rare
    runs whose high bits tie are put back in full-hash order. Skipper's ``sort.Sort`` is
    not stable either: equal hashes only come from equal address strings, which are
    rejected before this.

    Returns
    -------
    (hashes, owners)
        Sorted ``uint64`` hashes and the ``int32`` endpoint index (``first`` + position in
        the given list) of each.
    """
    n = hashes.size
    bits = max(1, int(n - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    packed = (hashes & ~low) | np.arange(n, dtype=np.uint64)
    packed.sort()
    idx = (packed & low).astype(np.intp)
    high = packed >> np.uint64(bits)
    same = high[1:] == high[:-1]
    if same.any():  # runs whose high bits tie: order them by the full hash
        edges = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
        for a, b in zip(
            np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True
        ):
            run = idx[a : b + 1]
            idx[a : b + 1] = run[np.argsort(hashes[run], kind="stable")]
    out = hashes[idx]
    owners = (idx // vnodes + first).astype(np.int32)
    return out, owners


class Ring:
    """Skipper's consistent-hash ring over a list of endpoint addresses.

    Parameters
    ----------
    endpoints
        Endpoint address strings, verbatim (Skipper hashes ``scheme://host:port``; a
        different spelling gives different positions). Must be non-empty and unique.
    vnodes
        Virtual nodes per endpoint; Skipper's production value is 100.

    Attributes
    ----------
    endpoints : tuple[str, ...]
        The endpoints, in the order given; results are indices into this tuple.
    hashes : numpy.ndarray
        ``uint64`` node hashes sorted ascending (Skipper's ring).
    owners : numpy.ndarray
        ``int32`` endpoint index of each ring position.
    host_ids : numpy.ndarray
        Per endpoint, an id shared by endpoints with the same :func:`host_key`, numbered
        from 0 in order of first appearance (:func:`host_ids_of`); read-only. Computed
        when the ring is built (rings derived from it share it).
    has_aliases : bool
        Whether two endpoints share a host (Skipper's skip rule then widens candidates).
    """

    __slots__ = (
        "_memo",
        "_shift0",
        "all_present",
        "bucket_bits",
        "buckets",
        "endpoints",
        "has_aliases",
        "hashes",
        "host_ids",
        "owners",
        "present",
        "vnodes",
    )

    def __init__(self, endpoints: Sequence[str], vnodes: int = DEFAULT_VNODES) -> None:
        eps = endpoint_tuple(endpoints)
        if isinstance(vnodes, bool) or not isinstance(vnodes, int) or vnodes < 1:
            raise EndpointError(f"vnodes must be a positive integer, got {vnodes!r}")
        hashes, owners = sorted_nodes(hash_node_names(eps, vnodes), vnodes, 0)
        self._init(eps, vnodes, hashes, owners)

    def with_added(self, endpoints: Sequence[str]) -> Ring:
        """A ring with more endpoints: these plus ``endpoints`` appended (indices stay).

        The new endpoints' nodes are merged into the sorted ring in one pass instead of
        sorting every node again, which is most of a scale-up's cost on a large ring.
        """
        new = endpoint_tuple(endpoints, allow_empty=True)
        if not new:
            return self
        clash = sorted(set(new) & set(self.endpoints))
        if clash:
            raise EndpointError(f"endpoints already on the ring: {clash[:5]}")
        eps = self.endpoints + new  # both checked: unique, and no clash between them
        add_hashes, add_owners = sorted_nodes(
            hash_node_names(new, self.vnodes), self.vnodes, len(self.endpoints)
        )
        at = np.searchsorted(self.hashes, add_hashes)
        ring = Ring.__new__(Ring)
        ring._init(
            eps,
            self.vnodes,
            np.insert(self.hashes, at, add_hashes),
            np.insert(self.owners, at, add_owners),
        )
        return ring

    @classmethod
    def from_arrays(
        cls,
        endpoints: Sequence[str],
        hashes: np.ndarray,
        owners: np.ndarray,
        *,
        vnodes: int = DEFAULT_VNODES,
        buckets: np.ndarray | None = None,
        host_ids: np.ndarray | None = None,
    ) -> Ring:
        """Wrap ring arrays that were built elsewhere (a published table) without copying.

        ``hashes`` must be sorted and ``owners`` index ``endpoints``; ``buckets`` is the
        matching :func:`build_bucket_table` output, built here when not given;
        ``host_ids`` is another ring's :attr:`host_ids` (or :func:`host_ids_of`, ids
        numbered in order of first appearance) for the same endpoints, so rings of one
        set share one parse of their addresses; parsed here when not given. A reader of
        shared memory validates these before calling.
        """
        ring = cls.__new__(cls)
        ring._init(tuple(endpoints), vnodes, hashes, owners, buckets, host_ids)
        return ring

    def _init(
        self,
        eps: tuple[str, ...],
        vnodes: int,
        hashes: np.ndarray,
        owners: np.ndarray,
        buckets: np.ndarray | None = None,
        host_ids: np.ndarray | None = None,
    ) -> None:
        self.endpoints = eps
        self.vnodes = vnodes
        self.hashes = hashes
        self.owners = owners
        if buckets is None:
            self.bucket_bits = bucket_bits_for(hashes.size)
            self.buckets = build_bucket_table(hashes, self.bucket_bits)
        else:
            bits = buckets.size.bit_length() - 1
            if buckets.size != 1 << bits or not 0 < bits <= 32:
                raise EndpointError(f"bucket table has {buckets.size} entries, not a power of two")
            self.bucket_bits, self.buckets = bits, buckets
        # 0-d: an array operand costs a NumPy call no scalar conversion.
        self._shift0 = np.array(64 - self.bucket_bits, dtype=np.uint64)
        if host_ids is None:
            host_ids = host_ids_of(eps)
        elif host_ids.shape != (len(eps),):
            raise EndpointError(f"host_ids has {host_ids.size} entries for {len(eps)} endpoints")
        self.host_ids = host_ids
        # Ids are numbered in order of first appearance: fewer ids than endpoints = aliases.
        self.has_aliases = bool(host_ids.size) and int(host_ids.max()) + 1 != host_ids.size
        # Counted from one private read with every value outside 0..n-1 set to n: owners
        # may be a view of shared memory rewritten after its reader checked it, bincount
        # refuses negative values and allocates as many counts as the largest value it
        # finds (gigabytes for garbage).
        n = len(eps)
        counted = np.array(owners, dtype=np.int64)
        counted[(counted < 0) | (counted >= n)] = n
        self.present = np.bincount(counted, minlength=n + 1)[:n] > 0
        self.all_present = bool(self.present.all())
        # What one-off routing on every endpoint computes again and again, kept (a ring
        # never changes): the view's arrays, and on the native kernel the last routing
        # objects (see _core).
        self._memo: dict[str, Any] = {}

    def __len__(self) -> int:
        return int(self.hashes.size)

    def __getstate__(self) -> dict[str, Any]:
        # Without what one-off routing kept: kernel objects do not pickle.
        return {name: getattr(self, name) for name in self.__slots__ if name != "_memo"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._memo = {}

    def __repr__(self) -> str:
        return f"Ring({len(self.endpoints)} endpoints, {self.hashes.size} nodes)"

    def derived(self, name: str) -> dict[Any, Any]:
        """A dictionary kept with this ring for what is derived from it alone.

        A ring never changes, so neither does what its arrays determine (say each
        view's arc shares, :func:`lbcore.zones.view_arcs`): the deriving code keeps it
        here under ``name``, keyed as it likes and bounded by it. Not pickled.
        """
        kept = self._memo.get("derived " + name)
        if kept is None:
            kept = self._memo.setdefault("derived " + name, {})
        return kept

    def subset(self, members: Any) -> Ring:
        """The ring of only some endpoints, keeping the same endpoint indices.

        Each endpoint keeps its node positions, so this equals ``Ring`` built from the
        member endpoints alone (Skipper's skip rule is "equivalent to building the ring
        from only the candidate endpoints"), but no node is hashed or sorted again.
        """
        mask = self.candidate_mask(members)
        if mask is None:
            return self
        if not mask.any():
            raise CandidatesError("a ring subset needs at least one endpoint")
        keep = mask[self.owners]
        ring = Ring.__new__(Ring)
        ring._init(
            self.endpoints,
            self.vnodes,
            self.hashes[keep],
            self.owners[keep],
            host_ids=self.host_ids,
        )
        return ring

    def with_more_endpoints(
        self, endpoints: tuple[str, ...], host_ids: np.ndarray | None = None
    ) -> Ring:
        """The same nodes and bucket table over a longer endpoint list (indices stay).

        ``endpoints`` must start with this ring's endpoints (a ring set that grew by a
        scale-up); nothing is hashed, sorted or rebuilt. ``host_ids``: the longer list's
        (another ring's :attr:`host_ids`), parsed here when not given.
        """
        if endpoints[: len(self.endpoints)] != self.endpoints:
            raise EndpointError("a ring's endpoint list can only grow at its end")
        ring = Ring.__new__(Ring)
        ring._init(endpoints, self.vnodes, self.hashes, self.owners, self.buckets, host_ids)
        return ring

    def keep_nodes(
        self,
        keep: np.ndarray,
        *,
        endpoints: tuple[str, ...] | None = None,
        reindex: np.ndarray | None = None,
        host_ids: np.ndarray | None = None,
    ) -> Ring:
        """The ring of exactly the nodes where ``keep`` (one bool per ring position) is set.

        Unlike :meth:`subset` this never widens to host aliases: it is how a ring set
        builds its fading rings and drops deleted endpoints, where the ring must hold
        exactly the listed endpoints (as Skipper builds a route's ring from its endpoint
        list). ``endpoints`` and ``reindex`` (old endpoint index -> new one) give the kept
        nodes a compacted endpoint list; by default the indices stay. ``host_ids`` are
        that list's (parsed here when not given; this ring's when the list stays).
        """
        owners = self.owners[keep]
        if reindex is not None:
            owners = reindex.take(owners).astype(np.int32, copy=False)
        ring = Ring.__new__(Ring)
        ring._init(
            self.endpoints if endpoints is None else endpoints,
            self.vnodes,
            self.hashes[keep],
            owners,
            host_ids=self.host_ids if endpoints is None else host_ids,
        )
        return ring

    # ---------------------------------------------------------------------------------
    # Candidate sets.

    def listed_mask(self, candidates: Any) -> np.ndarray | None:
        """Boolean mask of the listed candidates (indices or a mask); ``None`` means all.

        Raises
        ------
        CandidatesError
            Wrong shape or dtype, an index out of range, or an index listed twice.
        """
        if candidates is None:
            return None
        n = len(self.endpoints)
        arr = np.asarray(candidates)
        if arr.dtype == np.bool_:
            if arr.shape != (n,):
                raise CandidatesError(
                    f"candidate mask has shape {arr.shape}, expected ({n},) for {n} endpoints"
                )
            return arr.copy()
        if arr.size == 0:
            return np.zeros(n, dtype=np.bool_)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise CandidatesError(
                f"candidates must be endpoint indices or a boolean mask, got {arr.dtype} "
                f"array of shape {arr.shape}"
            )
        if int(arr.min()) < 0 or int(arr.max()) >= n:
            raise CandidatesError(f"candidate index out of range: {arr.tolist()} for {n} endpoints")
        mask = np.zeros(n, dtype=np.bool_)
        mask[arr] = True
        if int(mask.sum()) != arr.size:
            raise CandidatesError(f"candidate indices repeat: {arr.tolist()}")
        return mask

    def candidate_mask(self, candidates: Any) -> np.ndarray | None:
        """Endpoints the skip rule keeps: the listed candidates, widened to their hosts.

        Skipper's skip rule compares hosts, not list positions, so an endpoint that shares
        a host (``host:port`` with the default port filled in) with a listed candidate is
        not skipped. Endpoints without nodes on this ring are never kept. ``None`` means
        all endpoints.
        """
        mask = self.listed_mask(candidates)
        if mask is None:
            return None
        return self._widen(mask)

    def _widen(self, listed: np.ndarray) -> np.ndarray:
        mask = listed
        if self.has_aliases:
            n = len(self.endpoints)
            mask = np.bincount(self.host_ids, weights=mask, minlength=n)[self.host_ids] > 0
        if not self.all_present:
            mask = mask & self.present
        return mask

    # ---------------------------------------------------------------------------------
    # Position lookup.

    def positions(self, hashes: np.ndarray) -> np.ndarray:
        """Ring position of each key hash: the first node with ``hash >= key``, wrapped.

        The NumPy kernel's lookup (the native kernel reads the same arrays).

        Parameters
        ----------
        hashes
            ``uint64`` key hashes.

        Returns
        -------
        numpy.ndarray
            ``intp`` ring positions.
        """
        pos = self.buckets.take((hashes >> self._shift0).view(_I64))
        miss = (pos < 0).nonzero()[0]
        if miss.size:
            # Buckets with one node: compare with that node; with several: search.
            hm = hashes[miss]
            node = -pos[miss] - 2
            one = np.flatnonzero(node >= 0)
            found = np.empty(miss.size, dtype=np.int64)
            p1 = node[one]
            found[one] = p1 + (hm[one] > self.hashes[p1])
            several = np.flatnonzero(node < 0)
            if several.size:
                found[several] = np.searchsorted(self.hashes, hm[several], side="left")
            found %= self.hashes.size  # past the last node: roll over to position 0
            pos[miss] = found
        return pos

    # ---------------------------------------------------------------------------------
    # Routing one batch on this ring (the kernel's routing object of one view per call).

    def _view(self, candidates: Any) -> tuple[np.ndarray, ...]:
        """The one view of one-off routing: ``(listed, eligible)`` masks, counts, slots.

        The view is the one :class:`lbcore.Plan` builds for a ring set of this ring alone
        with the unlisted endpoints ejected; nothing of it is per ring position or per
        load. Kept for ``candidates=None`` (every endpoint).
        """
        if candidates is None:
            view = self._memo.get("view")
            if view is not None:
                return view
        n = len(self.endpoints)
        chosen = self.listed_mask(candidates)
        if chosen is not None and chosen.all():
            chosen = None  # every endpoint listed: as a plan without ejections
        listed = self.present if chosen is None else chosen & self.present
        eligible = listed if chosen is None or not self.has_aliases else self._widen(listed)
        masks = (listed[None, :], eligible[None, :])
        view = (*masks, *view_counts(*masks), np.arange(n, dtype=np.int64))
        if candidates is None:
            for a in view:
                a.flags.writeable = False
            self._memo["view"] = view
        return view

    def _core(
        self,
        candidates: Any,
        loads: Any = None,
        balance_factor: float | None = None,
        max_hops: int | None = None,
    ) -> Any:
        """The routing object of this ring (:func:`lbcore.core.make_core`) of one view.

        A call costs the batch plus a few passes over the endpoints. On the native
        kernel, for every endpoint as candidates, the last plain object and the last
        bounded one are kept: a bounded one with the load snapshot it was built on (a
        copy), reused while the loads, factor and hop cap are the same again (a worker
        routes many batches on one snapshot). The NumPy kernel's object refers to the
        ring, so it is not kept.
        """
        n = len(self.endpoints)
        bf = None if balance_factor is None else check_balance_factor(balance_factor)
        hops = check_max_hops(max_hops)
        if bf is not None and loads is None:
            raise ArgumentError("bounded-load routing needs loads (one per endpoint)")
        memo = self._memo if candidates is None and native() is not None else None
        snapshot = None
        if memo is not None:
            if bf is None:
                core = memo.get("plain")
                if core is not None:
                    return core
            elif type(loads) is np.ndarray and loads.dtype == np.float64 and loads.shape == (n,):
                # The bytes of a snapshot that was checked when it was first seen.
                snapshot = loads.tobytes()
                last = memo.get("bounded")
                if last is not None and last[0] == (bf, hops, snapshot):
                    return last[1]
        listed, eligible, listed_count, eligible_count, single, slots = self._view(candidates)
        load = good = None
        if bf is not None:
            load = check_loads(loads, n)
            if memo is not None:
                snapshot = load.tobytes() if snapshot is None else snapshot
                load = np.frombuffer(snapshot, dtype=np.float64)  # the core's own copy
            good = view_good(listed, eligible, listed_count, load, bf)
        core = make_core(
            newest=self,
            n=n,
            views=1,
            eligible=eligible,
            good=good,
            listed_count=listed_count,
            eligible_count=eligible_count,
            single=single,
            loads=load,
            max_hops=hops,
            choice=CHOICE_FIXED,
            fixed_view=0,
            choice_salt=0,
            fade_thresholds=_NO_U64,
            fade_saturated=_NO_U8,
            gate_mode=GATE_ALL,
            gate_threshold=None,
            slots=slots,
            n_slots=n,
            guard=None,
            closed=False,
            max_key_bytes=None,
        )
        if memo is not None:
            if bf is None:
                memo["plain"] = core
            else:
                memo["bounded"] = ((bf, hops, snapshot), core)
        return core

    def lookup(
        self,
        keys: Any,
        *,
        candidates: Any = None,
        attempt: int = 0,
        hashes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Endpoint index for every key, exactly as Skipper's ``consistentHash`` picks it.

        Parameters
        ----------
        keys
            A batch of keys (see :func:`lbcore.hash_keys`); ignored when ``hashes`` is given.
        candidates
            Endpoint indices or a boolean mask of the endpoints still eligible; the others
            are stepped over as Skipper's skip rule does. ``None``: all endpoints. If
            exactly one endpoint is a candidate it is returned for every key (Skipper's
            ``Apply`` shortcut); if none is, every key gets ``-1``.
        attempt
            ``0`` for the primary choice; ``a > 0`` for the ``a``-th distinct eligible
            endpoint after it along the ring (a retry on a different pod), ``-1`` if
            fewer than ``a + 1`` endpoints are eligible.
        hashes
            Precomputed ``uint64`` key hashes, to skip hashing.

        Returns
        -------
        numpy.ndarray
            ``int32`` endpoint indices, ``-1`` for fallback.
        """
        return _route(self._core(candidates), keys, hashes, attempt)

    def lookup_bounded(
        self,
        keys: Any,
        loads: Any,
        balance_factor: float | None,
        *,
        candidates: Any = None,
        max_hops: int | None = None,
        sequential: bool = False,
        attempt: int = 0,
        hashes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Consistent hashing with bounded load (Skipper's ``boundedLoadSearch``).

        Parameters
        ----------
        keys
            A batch of keys; ignored when ``hashes`` is given.
        loads
            Per-endpoint load, non-negative and finite (in-flight counts, occupancy or
            effective load), indexed like :attr:`endpoints`.
        balance_factor
            An endpoint is acceptable while ``load <= (1 + Σ candidate loads) / n_candidates
            × balance_factor`` (float64, in Skipper's order). Must be ``>= 1``. ``None``
            means plain :meth:`lookup` (Skipper without ``consistentHashBalanceFactor``).
        candidates
            As in :meth:`lookup`.
        max_hops
            ``None``: Skipper's walk, at most one lap of the ring. An integer: stop after
            that many distinct endpoints and, if none was acceptable, take the least loaded
            one visited (the first visited among equals).
        sequential
            ``True``: keys arrive one by one and each choice adds 1 to its endpoint's load
            before the next key (Skipper under request-by-request traffic: a plan per
            key). ``False``: the whole batch is routed on one load snapshot.
        attempt
            ``a > 0`` excludes the endpoints chosen by attempts ``0 .. a-1`` and routes
            on the rest (a retry on a different pod); ``-1`` where none is left.
        hashes
            Precomputed ``uint64`` key hashes.

        Returns
        -------
        numpy.ndarray
            ``int32`` endpoint indices, ``-1`` for fallback.
        """
        if balance_factor is None:
            return self.lookup(keys, candidates=candidates, attempt=attempt, hashes=hashes)
        if not sequential:
            return _route(
                self._core(candidates, loads, balance_factor, max_hops), keys, hashes, attempt
            )
        h = hash_keys(keys) if hashes is None else check_hashes(hashes)
        load = check_loads(loads, len(self.endpoints)).copy()
        out = np.empty(h.size, dtype=np.int32)
        for i in range(h.size):
            core = self._core(candidates, load, balance_factor, max_hops)
            chosen = int(_route(core, None, h[i : i + 1], attempt)[0])
            out[i] = chosen
            if chosen >= 0:
                load[chosen] += 1.0
        return out


def _route(core: Any, keys: Any, hashes: np.ndarray | None, attempt: int) -> np.ndarray:
    """``core``'s answer for ``keys``, or for precomputed ``hashes`` when given."""
    if hashes is None:
        return core.route(keys, attempt)[0]
    return core.route_hashes(np.ascontiguousarray(check_hashes(hashes)), check_attempt(attempt))[0]


def check_hashes(hashes: Any) -> np.ndarray:
    """Validate precomputed key hashes: a 1-D ``uint64`` NumPy array."""
    if type(hashes) is not np.ndarray or hashes.dtype != np.uint64 or hashes.ndim != 1:
        shape = getattr(hashes, "shape", None)
        dtype = getattr(hashes, "dtype", type(hashes).__name__)
        raise ArgumentError(
            f"hashes must be a 1-D uint64 array from lbcore.hash_keys, got {dtype} {shape or ''}"
        )
    return hashes
