"""The NumPy reference kernel: routing a batch on a :class:`lbcore.plan.Plan` with arrays.

The definition the native kernel (``lbcore/csrc/route.c``) is tested against, key for
key. Per batch: the XXH64 hashes (:func:`lbcore.keys.hash_each`), each key's
position on the newest ring (:meth:`lbcore.Ring.positions`), its view (the ring or
Skipper level its second draw picks; with a zone, a local key takes that view's zone
part while it holds more candidates than the attempt), then per view the answer:

* fewer candidates than ``attempt + 1`` eligible endpoints: fallback (``-1``); one
  candidate at attempt 0: that one (Skipper's ``Apply`` shortcut);
* Skipper's skip rule: from the position to the first endpoint the view holds;
* plain: that endpoint, or for a retry the ``attempt``-th next distinct one;
* bounded load: that endpoint if it is under the bar; else Skipper's walk (the first
  endpoint under the bar within one lap, else the start) without a hop cap, or with
  one the walk over distinct endpoints (the first under the bar among the first
  ``max_hops``, else the least loaded of them, the first seen among equals); a retry
  walks again from the start with the earlier attempts' endpoints left out.

A local key whose attempt-0 zone answer is over that endpoint's bar is answered in its
global view instead (the spill of :mod:`lbcore.zones`' B1). The gate then sends the
keys it excludes to fallback. The walks are
:mod:`lbcore.bounded`'s vectorized ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lbcore import bounded
from lbcore.draws import below_threshold, mix64
from lbcore.errors import ArgumentError, TableDataError
from lbcore.fence import fence
from lbcore.gate import GATE_SALT
from lbcore.kernel import check_attempt
from lbcore.keys import hash_each
from lbcore.views import CHOICE_FIXED, GATE_PARTIAL, view_of_draws

__all__ = ["Core", "answers", "counter_slots", "route", "route_hashes", "view_choice"]


def _valid(plan: Core) -> bool:
    if plan.guard is None:
        return True
    words, index, expected = plan.guard
    fence()  # the guard is read after the ring arrays
    return int(words[index]) == expected


class Core:
    """The NumPy side of a :class:`lbcore.plan.Plan`, as ``lbcore._kernel.Plan`` is the native one.

    It keeps the plan's arrays (the attributes these functions read, same names), not
    the plan: the plan's bound ``route`` would otherwise hold the plan in a reference
    cycle, and its shared-memory views with it, until the cycle collector ran.
    """

    _FIELDS = (
        "under",
        "zone_salt",
        "zone_threshold",
        "zone_views",
        "choice",
        "choice_salt",
        "closed",
        "eligible",
        "eligible_count",
        "fade_saturated",
        "fade_thresholds",
        "fixed_view",
        "gate_mode",
        "gate_threshold",
        "good",
        "guard",
        "listed_count",
        "loads",
        "max_hops",
        "max_key_bytes",
        "newest",
        "single",
        "slots",
        "views",
    )
    __slots__ = _FIELDS

    def __init__(self, **fields: Any) -> None:
        for name in self._FIELDS:
            setattr(self, name, fields[name])

    def route(self, keys: Any, attempt: int = 0) -> tuple[np.ndarray, int, int, bool]:
        """:attr:`lbcore.plan.Plan.route`."""
        return route(self, keys, check_attempt(attempt))

    def route_counted(
        self, keys: Any, attempt: int, sink: Any, totals: Any
    ) -> tuple[np.ndarray, int, int, bool, bool]:
        """:attr:`lbcore.plan.Plan.route_counted`: the reference counts nothing itself."""
        return (*route(self, keys, check_attempt(attempt)), False)

    def route_hashes(self, h: np.ndarray, attempt: int = 0) -> tuple[np.ndarray, int, int, bool]:
        """:meth:`lbcore.plan.Plan.route_hashes` (``h`` checked, ``attempt`` too)."""
        return route_hashes(self, h, attempt)

    def answers(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lbcore.plan.Plan.answers`, flat."""
        return answers(self)

    def counter_slots(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`lbcore.plan.Plan.counter_slots` (``idx`` contiguous ``int32``)."""
        return counter_slots(self, idx)


def route(plan: Core, keys: Any, attempt: int) -> tuple[np.ndarray, int, int, bool]:
    """:attr:`lbcore.plan.Plan.route` on arrays (``attempt`` checked)."""
    return route_hashes(plan, hash_each(keys, plan.max_key_bytes), attempt)


def view_choice(
    choice: int, salt: int, thresholds: np.ndarray, saturated: np.ndarray, h: np.ndarray
) -> np.ndarray:
    """Each key's view (``intp``) by its draw ``mix64(h, salt)``, for a choice other than fixed.

    N-ring: the newest ring whose share is above the draw (``u < s``, in integers);
    Skipper: the number of candidate levels at or below the draw
    (:func:`lbcore.views.view_of_draws`).
    """
    return view_of_draws(choice, thresholds, saturated, mix64(h, salt))


def _views(plan: Core, h: np.ndarray, attempt: int) -> np.ndarray | None:
    """Each key's view; ``None`` when every key uses ``plan.fixed_view``.

    With a zone, a local key uses its global view's zone part (``zone_views`` on) when
    that holds more candidates than ``attempt`` (a closed zone part holds none).
    """
    views = None
    if plan.choice != CHOICE_FIXED:
        views = view_choice(
            plan.choice, plan.choice_salt, plan.fade_thresholds, plan.fade_saturated, h
        )
    if not plan.zone_views:
        return views
    base = np.full(h.size, plan.fixed_view, dtype=np.intp) if views is None else views
    local = below_threshold(h, plan.zone_salt, plan.zone_threshold)
    zone = base + plan.zone_views
    use = local & (plan.listed_count.take(zone) > attempt)
    return np.where(use, zone, base)


def route_hashes(plan: Core, h: np.ndarray, attempt: int) -> tuple[np.ndarray, int, int, bool]:
    """:meth:`lbcore.plan.Plan.route_hashes` on arrays."""
    n = h.size
    if plan.closed:
        return np.full(n, -1, dtype=np.int32), n, 0, _valid(plan)
    try:
        return _route(plan, h, attempt)
    except TableDataError:
        # An owner out of range where a key read it (bounded.owners_at, per key as
        # the native kernel): damage if the table is still valid, else a rewrite
        # meanwhile that voids the answer.
        if _valid(plan):
            raise
        return np.full(n, -1, dtype=np.int32), n, 0, False


def _route(plan: Core, h: np.ndarray, attempt: int) -> tuple[np.ndarray, int, int, bool]:
    n = h.size
    pos = plan.newest.positions(h).astype(np.intp)
    out = np.empty(n, dtype=np.int32)
    moved = np.zeros(n, dtype=np.bool_)
    views = _views(plan, h, attempt)
    groups = (
        [(plan.fixed_view, None)]
        if views is None
        else [(v, np.flatnonzero(views == v)) for v in np.unique(views).tolist()]
    )
    for v, rows in groups:
        p = pos if rows is None else pos[rows]
        res, plain = _answer(plan, v, p, attempt)
        if plan.zone_views and v >= plan.zone_views and attempt == 0 and plan.good is not None:
            # B1: a local key whose zone walk ended over its pod's bar spills to the
            # global ring (its global view); its plain answer stays the zone's.
            spill = np.flatnonzero((res >= 0) & ~plan.under.take(np.maximum(res, 0)))
            if spill.size:
                res[spill] = _answer(plan, v - plan.zone_views, p[spill], 0)[0]
        if rows is None:
            out[:] = res
            moved[:] = (res != plain) & (res >= 0)
        else:
            out[rows] = res
            moved[rows] = (res != plain) & (res >= 0)
    if plan.gate_mode == GATE_PARTIAL:
        keep = below_threshold(h, GATE_SALT, plan.gate_threshold)
        out[~keep] = -1
        moved &= keep
    return out, int(np.count_nonzero(out < 0)), int(np.count_nonzero(moved)), _valid(plan)


def _answer(plan: Core, v: int, pos: np.ndarray, attempt: int) -> tuple[np.ndarray, np.ndarray]:
    """``(answer, plain answer)`` of keys at ring positions ``pos`` in view ``v``."""
    m = pos.size
    listed, eligible_n = int(plan.listed_count[v]), int(plan.eligible_count[v])
    if listed == 0 or attempt >= eligible_n:
        none = np.full(m, -1, dtype=np.int32)
        return none, none
    if listed == 1 and attempt == 0:
        one = np.full(m, int(plan.single[v]), dtype=np.int32)
        return one, one
    ring = plan.newest
    eligible = plan.eligible[v]
    n = eligible.size
    start = bounded.skip_to_eligible(ring, pos.copy(), eligible)
    if attempt == 0:
        plain = bounded.owners_at(ring, start, n).astype(np.int32, copy=False)
    else:
        at = bounded.advance_distinct(ring, start, eligible, attempt)
        plain = bounded.owners_at(ring, at, n).astype(np.int32, copy=False)
    if plan.good is None:
        return plain, plain
    good = plan.good[v]
    loads = plan.loads
    # At attempt 0 the start's owners are the plain answer's: one read for both.
    res = (plain if attempt == 0 else bounded.owners_at(ring, start, n)).astype(np.int32)
    rest = np.flatnonzero(~good.take(res))
    if rest.size:
        if plan.max_hops is None:
            res[rest] = bounded.walk_to_good(ring, start[rest], good)
        else:
            res[rest] = bounded.walk_distinct(
                ring, start[rest], eligible, good, loads, plan.max_hops, None
            )
    if attempt:
        chosen = res[:, None].astype(np.int64)
        for _ in range(attempt):
            nxt = bounded.walk_distinct(ring, start, eligible, good, loads, plan.max_hops, chosen)
            chosen = np.concatenate((chosen, nxt[:, None].astype(np.int64)), axis=1)
        res = chosen[:, -1].astype(np.int32)
    return res, plain


def answers(plan: Core) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`lbcore.plan.Plan.answers` on arrays: flat ``(answer, plain)``."""
    if plan.closed:
        empty = np.empty(0, dtype=np.int32)
        return empty, empty
    size = len(plan.newest)
    pos = np.arange(size, dtype=np.intp)
    try:
        parts = [_answer(plan, v, pos, 0) for v in range(plan.views)]
    except TableDataError:
        if _valid(plan):
            raise
        void = np.full(size * plan.views, -1, dtype=np.int32)
        return void, void
    return (
        np.concatenate([a for a, _ in parts]).astype(np.int32),
        np.concatenate([p for _, p in parts]).astype(np.int32),
    )


def counter_slots(plan: Core, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """:meth:`lbcore.plan.Plan.counter_slots` on arrays (``idx``: contiguous ``int32``)."""
    n = len(plan.slots)
    bad = np.flatnonzero((idx < -1) | (idx >= n))
    if bad.size:
        i = int(bad[0])
        raise ArgumentError(f"endpoint index {int(idx[i])} at position {i} is not in -1..{n - 1}")
    routed = idx >= 0
    if bool(routed.all()):
        return plan.slots.take(idx), None
    where = np.flatnonzero(routed).astype(np.int64)
    return plan.slots.take(idx[routed]), where
