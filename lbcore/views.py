"""What a plan hands its kernel about views: the codes, the draw thresholds, each view's counts.

A *view* is the set of endpoints a key may be routed to (one per ring in N-ring fade-in,
one per candidate level in Skipper's fade-in, one otherwise). Both kernels read the codes
below (how a key picks its view, how the gate applies) and the arrays :func:`view_arrays`
derives from a plan's masks; :class:`lbcore.Plan` and :meth:`lbcore.Ring.lookup` build
them through these functions, so the rule is written once, below both kernels.
"""

from __future__ import annotations

import numpy as np

from lbcore.bounded import target_load
from lbcore.draws import unit_threshold

__all__ = [
    "CHOICE_FIXED",
    "CHOICE_NRING",
    "CHOICE_SKIPPER",
    "GATE_ALL",
    "GATE_NONE",
    "GATE_PARTIAL",
    "draw_thresholds",
    "view_arrays",
    "view_counts",
    "view_good",
    "view_of_draws",
    "zone_good",
]

#: How a key picks its view: a fixed one, the newest N-ring ring whose share is above its
#: draw, or the number of Skipper fade-in levels at or below its draw.
CHOICE_FIXED, CHOICE_NRING, CHOICE_SKIPPER = 0, 1, 2
#: The rollout gate: every key passes, none does, or those whose draw is under a threshold.
GATE_ALL, GATE_NONE, GATE_PARTIAL = 0, 1, 2

_M64 = (1 << 64) - 1


def draw_thresholds(shares: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Integer forms of ``u < share`` (:func:`lbcore.draws.unit_threshold`) and "is 2**64".

    Returns
    -------
    (thresholds, saturated)
        ``uint64`` threshold per share and ``uint8`` 1 where it is ``2**64`` (every key).
    """
    ts = [unit_threshold(s) for s in shares]
    return (
        np.array([min(t, _M64) for t in ts], dtype=np.uint64),
        np.array([t > _M64 for t in ts], dtype=np.uint8),
    )


def view_of_draws(
    choice: int, thresholds: np.ndarray, saturated: np.ndarray, m: np.ndarray
) -> np.ndarray:
    """Each key's view (``intp``) from its draw ``m = mix64(h, salt)`` (a choice not fixed).

    N-ring: the newest ring whose share is above the draw (``u < s``, in integers);
    Skipper: the number of candidate levels at or below the draw. With 2-D
    ``thresholds``/``saturated`` (one row per instant) and ``m`` (as many rows), each
    row of draws is read against its own row of thresholds.
    """
    if thresholds.ndim == 1:
        v = np.zeros(m.size, dtype=np.intp)
        rows = zip(thresholds.tolist(), saturated.tolist(), strict=True)
    else:
        v = np.zeros(m.shape, dtype=np.intp)
        rows = zip(thresholds.T[:, :, None], saturated.T[:, :, None], strict=True)
    for j, (t, sat) in enumerate(rows):
        if choice == CHOICE_NRING:
            # The newest ring whose share is above the draw: newer rings overwrite older.
            np.copyto(v, j + 1, where=(m < np.uint64(t)) | (sat != 0))
        else:
            v += (m >= np.uint64(t)) & (sat == 0)
    return v


def view_counts(
    listed: np.ndarray, eligible: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per view, the counts the kernels read, from its ``(views, endpoints)`` masks.

    Parameters
    ----------
    listed
        ``bool`` candidates of each view (Skipper counts and averages over them).
    eligible
        ``bool`` endpoints the walk may stop at in each view (candidates widened to
        their hosts, on that view's ring).

    Returns
    -------
    (listed_count, eligible_count, single)
        ``int64`` counts per view, and ``int32`` the one candidate of a view that has one
        (else ``-1``).
    """
    # Row by row: a batch routed on a one-off plan pays for these calls, and 1-D counts
    # cost less than axis reductions on the few views a plan has.
    listed_count = [int(np.count_nonzero(row)) for row in listed]
    eligible_count = [int(np.count_nonzero(row)) for row in eligible]
    single = [
        int(row.argmax()) if c == 1 else -1 for row, c in zip(listed, listed_count, strict=True)
    ]
    return (
        np.array(listed_count, dtype=np.int64),
        np.array(eligible_count, dtype=np.int64),
        np.array(single, dtype=np.int32),
    )


def view_good(
    listed: np.ndarray,
    eligible: np.ndarray,
    listed_count: np.ndarray,
    loads: np.ndarray,
    balance_factor: float,
) -> np.ndarray:
    """Per (view, endpoint), eligible and under the view's bar (bounded load).

    ``listed_count`` is :func:`view_counts`' for the same masks and ``loads`` checked
    per-endpoint loads. All false in a view of fewer than two candidates, whose rule is
    not the walk.
    """
    good = np.zeros(eligible.shape, dtype=np.bool_)
    for v, count in enumerate(listed_count.tolist()):
        if count > 1:
            bar = target_load(loads, listed[v], balance_factor)
            np.logical_and(eligible[v], loads <= bar, out=good[v])
    return good


def zone_good(
    eligible: np.ndarray,
    listed_count: np.ndarray,
    loads: np.ndarray,
    bars: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """With a zone: per (view, endpoint), eligible and under the endpoint's own bar.

    ``bars`` are :func:`lbcore.bounded.share_bars`' (the same bar in every view, from
    the plan's expected shares). Returns ``(good, under)``: ``good`` as
    :func:`view_good`'s (all false in a view of fewer than two candidates) and
    ``under``, ``bool`` per endpoint, whether its load is at or under its bar (a local
    key whose zone answer is not spills to the global view).
    """
    under = loads <= bars
    good = np.zeros(eligible.shape, dtype=np.bool_)
    for v, count in enumerate(listed_count.tolist()):
        if count > 1:
            np.logical_and(eligible[v], under, out=good[v])
    return good, under


def view_arrays(
    listed: np.ndarray,
    eligible: np.ndarray,
    loads: np.ndarray | None,
    balance_factor: float | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`view_counts` and, with bounded load, :func:`view_good` of a plan's masks.

    Parameters
    ----------
    listed, eligible
        As for :func:`view_counts`.
    loads
        Per-endpoint loads (checked), needed with ``balance_factor``.
    balance_factor
        Bounded load's factor, or ``None`` for plain consistent hashing.

    Returns
    -------
    (listed_count, eligible_count, single, good)
        :func:`view_counts`' arrays, and ``good`` (``None`` without bounded load).
    """
    listed_count, eligible_count, single = view_counts(listed, eligible)
    good = None
    if balance_factor is not None:
        assert loads is not None
        good = view_good(listed, eligible, listed_count, loads, balance_factor)
    return listed_count, eligible_count, single, good
