"""Bounded load over any ring: walk on from a key's position while endpoints are too busy.

This is consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2016) in
the form Skipper implements it (``boundedLoadSearch``): the bar is

    target = (1.0 + Σ load over candidates, summed in list order) / n_candidates × balance_factor

computed in float64 in exactly that order, because the true target is often an integer
that another evaluation order misses by one ulp; an endpoint is acceptable when
``float64(load) <= target`` (``<=``: a load equal to the bar is accepted). The ``1.0``
counts the request being routed.

That ``1.0`` is one open request: right for in-flight counts, wrong in size for a load
averaged over a window. A call adds only its latency's share of the window to a pod's
occupancy (busy-seconds per second), about 0.0005 for 5 ms in 10 s, so with Skipper's
1.0 a host whose summed occupancy is a few busy-seconds per second gets a bar of
``balance_factor × (1 + 1 / Σ load)`` times its mean instead of ``balance_factor``
times it. :func:`routed_call_load` gives the increment that fits a signal and
:func:`in_call_units` re-expresses loads so that the routing functions' 1.0 is that
increment (the bar is scale-free otherwise); in-flight loads pass through untouched.

Like Envoy's ``BoundedLoadHashingLoadBalancer`` this decorates a table: it needs only
ring positions and their owners, so the same code bounds the plain ring, every ring of
a fade-in ring set and a zone's ring.

Both kernels implement the walks (:mod:`lbcore.numpy_kernel` with the vectorized ones
here: each step advances only the keys still looking, and a key that has walked more
than a few steps is finished with one search over the positions of acceptable
endpoints); the rule's arithmetic — the bar, the increment, the checks — is here once.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from lbcore.errors import ArgumentError, BalanceFactorError, LoadError, TableDataError


class Ring(Protocol):
    """What the walks read of a ring (:class:`lbcore.Ring` is one)."""

    hashes: np.ndarray
    owners: np.ndarray
    present: np.ndarray
    all_present: bool

    def __len__(self) -> int: ...


__all__ = [
    "advance_distinct",
    "check_balance_factor",
    "check_loads",
    "check_max_hops",
    "in_call_units",
    "owners_at",
    "routed_call_load",
    "share_bars",
    "skip_to_eligible",
    "target_load",
    "walk_distinct",
    "walk_to_good",
]

# Masked single steps before a key is finished with a search over acceptable positions.
_STEPS_BEFORE_SEARCH = 8


def check_balance_factor(balance_factor: Any) -> float:
    """Validate a balance factor: a finite float ``>= 1`` (Skipper rejects smaller ones)."""
    if isinstance(balance_factor, bool) or not isinstance(
        balance_factor, (int, float, np.integer, np.floating)
    ):
        raise BalanceFactorError(
            f"balance factor must be a number >= 1, got {type(balance_factor).__name__}"
        )
    bf = float(balance_factor)
    if not math.isfinite(bf) or bf < 1.0:
        raise BalanceFactorError(
            f"balance factor must be a finite number >= 1 (Skipper rejects smaller), got {bf!r}"
        )
    return bf


def check_loads(loads: Any, n_endpoints: int) -> np.ndarray:
    """Validate a per-endpoint load vector: ``n_endpoints`` finite non-negative numbers."""
    if type(loads) is np.ndarray and loads.dtype == np.float64:
        arr = loads
    else:
        raw = np.asarray(loads)
        if raw.dtype.kind not in "iuf":
            raise LoadError(f"loads must be real numbers, one per endpoint; got {raw.dtype} values")
        arr = raw.astype(np.float64)
    if arr.shape != (n_endpoints,):
        raise LoadError(
            f"loads has shape {arr.shape}, expected ({n_endpoints},): one load per endpoint"
        )
    if arr.size and arr.min() >= 0.0 and arr.max() < np.inf:  # False for NaN too
        return arr
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise LoadError(
            f"load of endpoint {i} is {float(arr[i])!r}; loads must be finite and >= 0 "
            f"({bad.size} bad value(s))"
        )
    return arr


def check_max_hops(max_hops: Any) -> int | None:
    """Validate a hop cap: ``None`` (Skipper's full lap) or a positive integer."""
    if max_hops is None:
        return None
    if isinstance(max_hops, bool) or not isinstance(max_hops, (int, np.integer)) or max_hops < 1:
        raise ArgumentError(f"max_hops must be a positive integer or None, got {max_hops!r}")
    return int(max_hops)


def target_load(
    loads: np.ndarray, listed: np.ndarray, balance_factor: float, increment: float = 1.0
) -> float:
    """Skipper's bar: ``(1.0 + Σ loads of candidates in list order) / n × balance_factor``.

    The sum is a left-to-right float64 accumulation starting at 1.0 (``np.add.accumulate``,
    as ``np.cumsum``, adds in that order; ``np.sum`` would add pairwise and round
    differently). ``increment``
    replaces the 1.0 (the routed call's load, :func:`routed_call_load`); the default is
    Skipper's.
    """
    # count_nonzero and add.accumulate: what all() and cumsum() do, at a fraction of
    # their fixed cost per call (a one-off batch pays it).
    cand = loads if np.count_nonzero(listed) == listed.size else loads[listed]
    acc = np.empty(cand.size + 1)
    acc[0] = increment
    acc[1:] = cand
    return _bar(float(np.add.accumulate(acc)[-1]), cand.size, balance_factor)


def share_bars(
    loads: np.ndarray,
    listed: np.ndarray,
    shares: np.ndarray,
    balance_factor: float,
    increment: float = 1.0,
) -> np.ndarray:
    """Each endpoint's bar: ``balance_factor × max(share, 1 / n) × (1.0 + Σ candidates' loads)``.

    The bar of a plan whose endpoints are not meant to carry equal parts (zone affinity:
    local pods carry the zone's local keys on top of their global part). ``shares`` are
    the endpoints' expected shares of the routed keys (:func:`lbcore.zones.expected_shares`,
    summing to 1); with equal shares ``1 / n`` this is :func:`target_load`'s bar. The total
    is summed as :func:`target_load` sums it, ``increment`` replacing the 1.0 alike.

    An endpoint expected to carry less than the average ``1 / n`` of the ``n``
    candidates (a remote pod while most keys stay local, a pod early in its fade-in)
    keeps :func:`target_load`'s bar, as it would without a zone: held to its own small
    share, a handful of calls (a new pod's first ones are slow) would put it over, and
    keys would flap on and off it.

    Returns
    -------
    numpy.ndarray
        ``float64`` bar per endpoint, in the unit of ``loads``.
    """
    cand = loads if np.count_nonzero(listed) == listed.size else loads[listed]
    acc = np.empty(cand.size + 1)
    acc[0] = increment
    acc[1:] = cand
    total = float(np.add.accumulate(acc)[-1])
    own = np.asarray(shares, dtype=np.float64) * total * balance_factor
    return np.maximum(own, _bar(total, cand.size, balance_factor)) if cand.size else own


def routed_call_load(
    signal: str, mean_latency_s: float | None = None, window_s: float | None = None
) -> float:
    """What routing one more call adds to a pod's load, in the unit of ``signal``.

    Parameters
    ----------
    signal
        ``"in-flight"`` or ``"effective"`` (``max(in_flight, occupancy) × ratio``, whose
        in-flight part is a count): one open request, 1.0, Skipper's increment.
        ``"occupancy"`` (busy-seconds per second over a window): the call's expected
        latency as a share of the window, ``mean_latency_s / window_s``.
    mean_latency_s
        Expected latency of the call, in seconds (for example the host's mean over the
        window, :func:`lbcore.signals.mean_latency`); needed for occupancy. ``None`` or
        NaN (nothing completed in the window, so every occupancy is 0): 1.0.
    window_s
        The occupancy window, in seconds.

    Returns
    -------
    float
        The increment, ``> 0``; pass it to :func:`in_call_units` (or
        :func:`target_load` to show the bar).
    """
    if signal in ("in-flight", "effective"):
        return 1.0
    if signal != "occupancy":
        raise ArgumentError(
            f"unknown load signal {signal!r}; expected 'in-flight', 'occupancy' or 'effective'"
        )
    if mean_latency_s is None or not math.isfinite(mean_latency_s) or mean_latency_s <= 0:
        return 1.0
    if window_s is None or not math.isfinite(window_s) or window_s <= 0:
        raise ArgumentError(f"occupancy window must be > 0 seconds, got {window_s!r}")
    return float(mean_latency_s) / float(window_s)


def in_call_units(loads: np.ndarray, increment: float) -> np.ndarray:
    """``loads`` divided by ``increment``: the routing functions' 1.0 becomes ``increment``.

    Every bounded-load decision compares ``load <= (1.0 + Σ load) / n × balance_factor``
    or picks the least loaded endpoint, both unchanged by a common positive scale except
    for the 1.0; on ``loads / increment`` they decide as the bar
    ``(increment + Σ load) / n × balance_factor`` would on ``loads`` (up to float
    rounding). ``increment`` 1.0 returns ``loads`` itself (in-flight counts stay
    Skipper-exact).
    """
    inc = float(increment)
    if not math.isfinite(inc) or inc <= 0.0:
        raise ArgumentError(f"increment must be a finite number > 0, got {increment!r}")
    if inc == 1.0:
        return loads
    return np.asarray(loads, dtype=np.float64) / inc


def _bar(total: float, count: int, balance_factor: float) -> float:
    """The bar from the running total (1.0 + loads): average first, then the factor."""
    return total / float(count) * balance_factor


def owners_at(ring: Ring, at: np.ndarray | None, n: int) -> np.ndarray:
    """The owners of ring positions ``at`` (``None``: every node), each one of ``n`` endpoints.

    One private read (``take`` copies), checked, which is then what indexes: the ring
    may be a view of shared memory that another process writes, and a negative owner
    would index from an array's end without an error. The native kernel checks each
    owner it reads alike.

    Raises
    ------
    lbcore.TableDataError
        An owner outside ``0 .. n - 1``: the ring is damaged, or was rewritten while it
        was read (the caller's guard tells which).
    """
    own = np.array(ring.owners) if at is None else ring.owners.take(at)
    # As uint32 a negative owner is above any n: one reduction checks both ends.
    wide = own.view(np.uint32) if own.dtype == np.int32 else own.astype(np.uint64)
    if own.size and int(wide.max()) >= n:
        raise TableDataError(
            "ring table holds an entry out of range (damaged, or rewritten while it was read)"
        )
    return own


def _next_marked(marked_positions: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """First marked ring position at or after each of ``cur``, cyclically."""
    idx = np.searchsorted(marked_positions, cur, side="left")
    idx[idx == marked_positions.size] = 0
    return marked_positions[idx]


def skip_to_eligible(ring: Ring, pos: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """Skipper's skip rule: step each position on until its endpoint is a candidate.

    ``eligible`` must have at least one ``True``.
    """
    if eligible is ring.present and ring.all_present:
        return pos  # every endpoint on the ring is a candidate: nothing to skip
    n = eligible.size
    size = ring.owners.size
    bad = np.flatnonzero(~eligible[owners_at(ring, pos, n)])
    step = 0
    while bad.size:
        if step == _STEPS_BEFORE_SEARCH:
            marked = np.flatnonzero(eligible[owners_at(ring, None, n)])
            pos[bad] = _next_marked(marked, pos[bad])
            break
        cur = pos[bad] + 1
        cur[cur == size] = 0
        pos[bad] = cur
        bad = bad[~eligible[owners_at(ring, cur, n)]]
        step += 1
    return pos


def advance_distinct(ring: Ring, pos: np.ndarray, eligible: np.ndarray, attempt: int) -> np.ndarray:
    """From each primary position, the position of the ``attempt``-th next distinct endpoint.

    Walks on along the ring over eligible endpoints, counting each endpoint once; the
    caller guarantees at least ``attempt + 1`` eligible endpoints exist.
    """
    n_ep = eligible.size
    size = ring.owners.size
    n = pos.size
    seen = np.full((n, attempt + 1), -1, dtype=np.int64)
    seen[:, 0] = owners_at(ring, pos, n_ep)
    found = np.ones(n, dtype=np.intp)
    active = np.arange(n)
    cur = pos.copy()
    for _ in range(size):
        if not active.size:
            break
        c = cur[active] + 1
        c[c == size] = 0
        cur[active] = c
        own = owners_at(ring, c, n_ep)
        new = eligible[own] & ~(seen[active] == own[:, None]).any(axis=1)
        rows = active[new]
        seen[rows, found[rows]] = own[new]
        found[rows] += 1
        active = active[found[active] <= attempt]
    return cur


def walk_to_good(ring: Ring, pos: np.ndarray, good: np.ndarray) -> np.ndarray:
    """Skipper's walk: the first ``good`` endpoint at or after each position, one lap at most."""
    n = good.size
    size = ring.owners.size
    result = np.empty(pos.size, dtype=np.int32)
    active = np.arange(pos.size)
    cur = pos.copy()
    for step in range(_STEPS_BEFORE_SEARCH + 1):
        if step:
            cur += 1
            cur[cur == size] = 0
        own = owners_at(ring, cur, n)
        ok = good[own]
        result[active[ok]] = own[ok]
        active = active[~ok]
        cur = cur[~ok]
        if not active.size:
            return result
    marked = np.flatnonzero(good[owners_at(ring, None, n)])
    if marked.size:
        result[active] = owners_at(ring, _next_marked(marked, cur), n)
    else:  # nothing under the bar (only possible with float rounding): stay at the start
        result[active] = owners_at(ring, pos[active], n)
    return result


def walk_distinct(
    ring: Ring,
    pos: np.ndarray,
    eligible: np.ndarray,
    good: np.ndarray,
    loads: np.ndarray,
    max_hops: int | None,
    exclude: np.ndarray | None,
) -> np.ndarray:
    """The walk counting distinct endpoints: hop cap, least loaded fallback, exclusions."""
    n_ep = eligible.size
    size = ring.owners.size
    n = pos.size
    result = np.full(n, -1, dtype=np.int32)
    hops = size if max_hops is None else max_hops
    width = max(1, min(hops, int(eligible.sum())))
    seen = np.full((n, width), -1, dtype=np.int64)
    nseen = np.zeros(n, dtype=np.intp)
    best = np.full(n, -1, dtype=np.int64)
    best_load = np.full(n, np.inf)
    active = np.arange(n)
    cur = pos.copy()
    for step in range(size):
        if not active.size:
            break
        if step:
            c = cur[active] + 1
            c[c == size] = 0
            cur[active] = c
        else:
            c = cur
        own = owners_at(ring, c, n_ep)
        new = eligible[own] & ~(seen[active] == own[:, None]).any(axis=1)
        if exclude is not None:
            new &= ~(exclude[active] == own[:, None]).any(axis=1)
        rows = active[new]
        own_new = own[new]
        take = good[own_new]
        result[rows[take]] = own_new[take]
        lighter = loads[own_new] < best_load[rows]
        best[rows[lighter]] = own_new[lighter]
        best_load[rows[lighter]] = loads[own_new[lighter]]
        slot = nseen[rows]
        fits = slot < width
        seen[rows[fits], slot[fits]] = own_new[fits]
        nseen[rows] += 1
        done = np.zeros(n, dtype=np.bool_)
        done[rows[take]] = True
        done[rows[nseen[rows] >= width]] = True
        active = active[~done[active]]
    unresolved = result < 0
    result[unresolved] = best[unresolved]
    return result
