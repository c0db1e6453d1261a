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

Walks run over the whole batch at once: each step advances only the keys that are still
looking, and a key that has walked further than a few steps is finished with one search
over the positions of acceptable endpoints.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from lbcore.errors import ArgumentError, BalanceFactorError, LoadError

if TYPE_CHECKING:
    from lbcore.ring import Ring

__all__ = [
    "advance_distinct",
    "check_balance_factor",
    "check_loads",
    "check_max_hops",
    "in_call_units",
    "redirect_table",
    "routed_call_load",
    "skip_to_eligible",
    "target_load",
    "walk_sequential",
    "walk_snapshot",
]

# Masked single steps before a key is finished with a search over acceptable positions.
_STEPS_BEFORE_SEARCH = 8
# Keys over the bar in a batch up to which each is walked in Python instead.
_FEW = 16


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

    The sum is a left-to-right float64 accumulation starting at 1.0 (``np.cumsum`` adds in
    that order; ``np.sum`` would add pairwise and round differently). ``increment``
    replaces the 1.0 (the routed call's load, :func:`routed_call_load`); the default is
    Skipper's.
    """
    cand = loads if listed.all() else loads[listed]
    acc = np.empty(cand.size + 1)
    acc[0] = increment
    acc[1:] = cand
    return _bar(float(np.cumsum(acc, out=acc)[-1]), cand.size, balance_factor)


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
    owners = ring.owners
    size = owners.size
    bad = np.flatnonzero(~eligible[owners.take(pos)])
    step = 0
    while bad.size:
        if step == _STEPS_BEFORE_SEARCH:
            marked = np.flatnonzero(eligible[owners])
            pos[bad] = _next_marked(marked, pos[bad])
            break
        cur = pos[bad] + 1
        cur[cur == size] = 0
        pos[bad] = cur
        bad = bad[~eligible[owners.take(cur)]]
        step += 1
    return pos


def advance_distinct(ring: Ring, pos: np.ndarray, eligible: np.ndarray, attempt: int) -> np.ndarray:
    """From each primary position, the position of the ``attempt``-th next distinct endpoint.

    Walks on along the ring over eligible endpoints, counting each endpoint once; the
    caller guarantees at least ``attempt + 1`` eligible endpoints exist.
    """
    owners = ring.owners
    size = owners.size
    n = pos.size
    seen = np.full((n, attempt + 1), -1, dtype=np.int64)
    seen[:, 0] = owners.take(pos)
    found = np.ones(n, dtype=np.intp)
    active = np.arange(n)
    cur = pos.copy()
    for _ in range(size):
        if not active.size:
            break
        c = cur[active] + 1
        c[c == size] = 0
        cur[active] = c
        own = owners.take(c)
        new = eligible[own] & ~(seen[active] == own[:, None]).any(axis=1)
        rows = active[new]
        seen[rows, found[rows]] = own[new]
        found[rows] += 1
        active = active[found[active] <= attempt]
    return cur


def _walk(
    ring: Ring,
    pos: np.ndarray,
    eligible: np.ndarray,
    good: np.ndarray,
    loads: np.ndarray,
    max_hops: int | None,
    exclude: np.ndarray | None,
) -> np.ndarray:
    """Vectorized bounded walk on one load snapshot.

    Each key steps from ``pos`` over the ring; non-eligible endpoints and the endpoints in
    the key's ``exclude`` row are stepped over; the first ``good`` endpoint wins. With
    ``max_hops`` the walk gives up after that many distinct endpoints and takes the least
    loaded one it saw. Returns ``int32`` endpoint indices.
    """
    if exclude is not None:
        return _walk_distinct(ring, pos, eligible, good, loads, max_hops, exclude)
    # Most keys' own endpoint is under the bar: answer those from one gather.
    first = ring.owners.take(pos)
    ok = good.take(first)
    if ok.all():
        return first
    rest = np.flatnonzero(~ok)
    if rest.size <= _FEW:
        # A handful of keys over the bar: walking each in Python beats ~10 array calls
        # per step of the vectorized walk.
        owner, elig, load, is_good = ring.owners.item, eligible.item, loads.item, good.item
        size = ring.owners.size
        hops = size if max_hops is None else max_hops
        first[rest] = [
            _walk_one(owner, size, elig, load, is_good, start, hops, [])
            for start in pos[rest].tolist()
        ]
    elif max_hops is None:
        first[rest] = _walk_to_good(ring, pos[rest], good)
    else:
        first[rest] = _walk_distinct(ring, pos[rest], eligible, good, loads, max_hops, None)
    return first


def _walk_to_good(ring: Ring, pos: np.ndarray, good: np.ndarray) -> np.ndarray:
    """Skipper's walk: the first ``good`` endpoint at or after each position, one lap at most."""
    owners = ring.owners
    size = owners.size
    result = np.empty(pos.size, dtype=np.int32)
    active = np.arange(pos.size)
    cur = pos.copy()
    for step in range(_STEPS_BEFORE_SEARCH + 1):
        if step:
            cur += 1
            cur[cur == size] = 0
        own = owners.take(cur)
        ok = good[own]
        result[active[ok]] = own[ok]
        active = active[~ok]
        cur = cur[~ok]
        if not active.size:
            return result
    marked = np.flatnonzero(good[owners])
    if marked.size:
        result[active] = owners.take(_next_marked(marked, cur))
    else:  # nothing under the bar (only possible with float rounding): stay at the start
        result[active] = owners.take(pos[active])
    return result


def _walk_distinct(
    ring: Ring,
    pos: np.ndarray,
    eligible: np.ndarray,
    good: np.ndarray,
    loads: np.ndarray,
    max_hops: int | None,
    exclude: np.ndarray | None,
) -> np.ndarray:
    """The walk counting distinct endpoints: hop cap, least loaded fallback, exclusions."""
    owners = ring.owners
    size = owners.size
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
        own = owners.take(c)
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


def walk_snapshot(
    ring: Ring,
    pos: np.ndarray,
    listed: np.ndarray,
    eligible: np.ndarray,
    loads: np.ndarray,
    balance_factor: float,
    max_hops: int | None,
    attempt: int = 0,
) -> np.ndarray:
    """Bounded-load choice for every key on one load snapshot (see module docs).

    ``listed`` are the candidates Skipper counts and averages over; ``eligible`` those the
    walk may stop at (the listed ones widened to their hosts, on this ring).
    """
    target = target_load(loads, listed, balance_factor)
    good = eligible & (loads <= target)
    result = _walk(ring, pos, eligible, good, loads, max_hops, None)
    if attempt:
        chosen = result[:, None].astype(np.int64)
        for _ in range(attempt):
            nxt = _walk(ring, pos, eligible, good, loads, max_hops, chosen)
            chosen = np.concatenate((chosen, nxt[:, None].astype(np.int64)), axis=1)
        result = chosen[:, -1].astype(np.int32)
    return result


def walk_sequential(
    ring: Ring,
    pos: np.ndarray,
    listed: np.ndarray,
    eligible: np.ndarray,
    loads: np.ndarray,
    balance_factor: float,
    max_hops: int | None,
    attempt: int = 0,
) -> np.ndarray:
    """Bounded-load choice key by key, each choice adding 1 to its endpoint's load first.

    This is Skipper under request-by-request traffic: every request recomputes the
    average from the current in-flight counts, so the bar rises by ``balance_factor / n``
    per routed key. Inherently sequential; meant for parity checks and simulation, not
    for the hot path (which routes a batch on one snapshot).
    """
    owners = ring.owner_list()
    size = len(owners)
    load = loads.tolist()
    elig = eligible.tolist()
    cand = np.flatnonzero(listed).tolist()
    integral = all(load[i].is_integer() for i in cand)
    total = 1.0
    for i in cand:
        total += load[i]
    hops = size if max_hops is None else max_hops
    out = np.empty(pos.size, dtype=np.int32)
    for k, start in enumerate(pos.tolist()):
        if not integral:  # a float sum depends on the order: redo it as Skipper does
            total = 1.0
            for i in cand:
                total += load[i]
        target = _bar(total, len(cand), balance_factor)
        excluded: list[int] = []
        for _ in range(attempt + 1):
            chosen = _walk_one(
                owners.__getitem__,
                size,
                elig.__getitem__,
                load.__getitem__,
                lambda e, target=target: load[e] <= target,
                start,
                hops,
                excluded,
            )
            excluded.append(chosen)
        chosen = excluded[-1]
        out[k] = chosen
        if chosen >= 0:
            load[chosen] += 1.0
            if listed[chosen]:
                total += 1.0
    return out


def _walk_one(
    owner: Any,
    size: int,
    eligible: Any,
    load: Any,
    is_good: Any,
    start: int,
    hops: int,
    excluded: list[int],
) -> int:
    """One key's walk; ``owner``, ``eligible``, ``load`` and ``is_good`` are index accessors."""
    p = start
    seen: set[int] = set()
    best, best_load = -1, math.inf
    for _ in range(size):
        e = owner(p)
        if eligible(e) and e not in seen and e not in excluded:
            if is_good(e):
                return e
            le = load(e)
            seen.add(e)
            if le < best_load:
                best, best_load = e, le
            if len(seen) >= hops:
                return best
        p += 1
        if p == size:
            p = 0
    return best if hops < size or best < 0 else owner(start)


def walk_few(
    ring: Ring,
    hashes: list[int],
    listed: np.ndarray,
    eligible: np.ndarray,
    loads: np.ndarray,
    balance_factor: float,
    max_hops: int | None,
    attempt: int = 0,
) -> np.ndarray:
    """:func:`walk_snapshot` for a few keys given as Python ints, key by key in Python."""
    target = target_load(loads, listed, balance_factor)
    owner, elig, load = ring.owners.item, eligible.item, loads.item
    size = len(ring)
    hops = size if max_hops is None else max_hops

    def is_good(e: int) -> bool:
        return load(e) <= target

    out = []
    for p in ring.positions_of(hashes):
        while not elig(owner(p)):  # Skipper's skip rule: the walk starts on a candidate
            p = p + 1 if p + 1 < size else 0
        chosen: list[int] = []
        for _ in range(attempt + 1):
            chosen.append(_walk_one(owner, size, elig, load, is_good, p, hops, chosen))
        out.append(chosen[-1])
    return np.array(out, dtype=np.int32)


def redirect_table(
    ring: Ring,
    loads: Any,
    balance_factor: float,
    *,
    candidates: Any = None,
    max_hops: int | None = None,
) -> np.ndarray:
    """Bounded-load answer for every ring position on one load snapshot.

    A worker that refreshes its load snapshot on a cadence builds this once per refresh;
    routing a key is then ``table[ring.positions(hash)]``, with no walk per key.

    Returns
    -------
    numpy.ndarray
        ``int32`` endpoint index per ring position (``-1`` if no endpoint is eligible).
    """
    bf = check_balance_factor(balance_factor)
    load = check_loads(loads, len(ring.endpoints))
    hops = check_max_hops(max_hops)
    listed, eligible = ring._selection(candidates)
    return redirect_from(ring, listed, eligible, load, bf, hops)


def redirect_from(
    ring: Ring,
    listed: np.ndarray,
    eligible: np.ndarray,
    loads: np.ndarray,
    balance_factor: float,
    max_hops: int | None,
) -> np.ndarray:
    """:func:`redirect_table` on validated inputs."""
    count = int(listed.sum())
    if count == 0 or not eligible.any():
        return np.full(len(ring), -1, dtype=np.int32)
    if count == 1:  # Skipper's Apply: one candidate left takes every key
        return np.full(len(ring), int(np.flatnonzero(listed)[0]), dtype=np.int32)
    pos = skip_to_eligible(ring, np.arange(len(ring), dtype=np.intp), eligible)
    return walk_snapshot(ring, pos, listed, eligible, loads, balance_factor, max_hops)
