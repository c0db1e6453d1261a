"""One-off routing over a ring set: a :class:`lbcore.Plan` per call.

For callers that route one batch per snapshot (tests, the command line, a simulator
step). A caller routing many batches on one snapshot builds the plan once and asks
:attr:`lbcore.Plan.route`. (One ring alone needs no plan: :meth:`lbcore.Ring.lookup`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore.fade import RingSet
from lbcore.plan import Plan

__all__ = ["route_ring_set"]


def route_ring_set(
    ring_set: RingSet,
    keys: Any,
    now_ns: int,
    *,
    loads: Any = None,
    balance_factor: float | None = None,
    candidates: Any = None,
    max_hops: int | None = None,
    attempt: int = 0,
    hashes: np.ndarray | None = None,
) -> np.ndarray:
    """Route a batch through ``ring_set`` at time ``now_ns`` (N-ring fade-in).

    Each key is routed on the newest ring whose share is above its draw, with bounded
    load when ``balance_factor`` is set (the bar is computed over that ring's endpoints).

    Parameters
    ----------
    ring_set
        The established and fading rings.
    keys
        A batch of keys (see :func:`lbcore.hash_keys`); ignored when ``hashes`` is given.
    now_ns
        The present on the fade clock (CLOCK_MONOTONIC), in nanoseconds.
    loads
        Per-endpoint load indexed like ``ring_set.endpoints``; needed with
        ``balance_factor``.
    balance_factor, max_hops, candidates, attempt
        As in :meth:`lbcore.Ring.lookup_bounded` / :meth:`lbcore.Ring.lookup`.
    hashes
        Precomputed ``uint64`` key hashes.

    Returns
    -------
    numpy.ndarray
        ``int32`` indices into ``ring_set.endpoints``; ``-1`` (fallback) when the set is
        empty or nothing is eligible.
    """
    newest = ring_set.newest
    listed = None if newest is None else newest.listed_mask(candidates)
    plan = Plan(
        ring_set,
        now_ns,
        ejected=None if listed is None else ~listed,
        loads=loads,
        balance_factor=balance_factor,
        max_hops=max_hops,
        max_key_bytes=None,
    )
    if hashes is None:
        return plan.route(keys, attempt)[0]
    return plan.route_hashes(hashes, attempt)[0]
