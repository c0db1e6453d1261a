"""The routing plan: everything one snapshot decides, built once, asked per batch.

A control path (the router, the simulator, the status page) builds one immutable
:class:`Plan` per (ring set, ejected mask, load snapshot, knobs, time); the hot path asks
it one question per batch, :attr:`Plan.route`, answered by one kernel call: hash the
keys, find their ring positions, choose each key's fade ring, apply the rollout gate
and bounded load, count fallbacks and bounded-load moves. Like Envoy's thread-aware
load balancers: the table is built when membership or load changes, the worker's pick
only reads it.

What a plan holds, per *view* (the set of endpoints a key may be routed to: one per
ring in N-ring fade-in, one per candidate level in Skipper's fade-in, one otherwise):
which endpoints are candidates (Skipper counts and averages over them), which the walk
may stop at (candidates widened to their hosts, on that ring), and which of those are
under the bounded-load bar. All rings are walked on the newest ring's nodes, stepping
over endpoints a view does not hold (ring ``k`` is the newest ring without the nodes
of later fading events), so the plan needs the newest ring's hashes, owners and bucket
table only — shared-memory views are used as they are, never copied. With bounded
load every key walks from its position until an endpoint is under the bar: most stop
at once, so no per-position answer table is needed (:meth:`Plan.answers` builds one
for inspection and tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lbcore import kernel as _kernel
from lbcore.bounded import check_balance_factor, check_loads, check_max_hops, share_bars
from lbcore.core import make_core
from lbcore.draws import unit_threshold
from lbcore.errors import ArgumentError
from lbcore.fade import FADE_SALT, SKIPPER_SALT, RingSet, fadein_scores
from lbcore.gate import Gate
from lbcore.keys import MAX_KEY_BYTES, check_max_key_bytes
from lbcore.knobs import FADE_MODES
from lbcore.ring import check_hashes
from lbcore.views import (
    CHOICE_FIXED,
    CHOICE_NRING,
    CHOICE_SKIPPER,
    GATE_ALL,
    GATE_NONE,
    GATE_PARTIAL,
    draw_thresholds,
    view_arrays,
    view_counts,
    zone_good,
)
from lbcore.zones import (
    ZoneSplit,
    expected_shares,
    view_arcs,
    window_shares,
)

__all__ = ["CHOICE_FIXED", "CHOICE_NRING", "CHOICE_SKIPPER", "Plan"]

_EMPTY_U64 = np.empty(0, dtype=np.uint64)
_EMPTY_U8 = np.empty(0, dtype=np.uint8)
# The arrays a plan keeps: its own (copied from a caller's where they came from one) and
# read-only once built, so nothing can make the kernels' build-time state disagree.
_FROZEN = (
    "loads",
    "ejected",
    "slots",
    "listed",
    "eligible",
    "good",
    "listed_count",
    "eligible_count",
    "single",
    "fade_thresholds",
    "fade_saturated",
    "under",
    "bars",
)

# The plan's attributes its kernel side is built from (lbcore.core.make_core).
_CORE_FIELDS = (
    "views",
    "eligible",
    "good",
    "listed_count",
    "eligible_count",
    "single",
    "loads",
    "max_hops",
    "choice",
    "fixed_view",
    "choice_salt",
    "fade_thresholds",
    "fade_saturated",
    "gate_mode",
    "gate_threshold",
    "slots",
    "n_slots",
    "guard",
    "closed",
    "max_key_bytes",
    "zone_views",
    "zone_threshold",
    "under",
)


def _owned(arr: np.ndarray, given: Any) -> np.ndarray:
    """``arr`` (checked from ``given``) as a C-contiguous array no caller can reach."""
    if arr is given or arr.base is not None or not arr.flags.c_contiguous:
        return np.array(arr, order="C")
    return arr


_ROUTE_DOC = """``route(keys, attempt=0)``: route a batch: ``(indices, fallbacks, moves, valid)``.

Parameters
----------
keys
    A batch of product IDs (see :func:`lbcore.hash_keys`): a list or tuple of
    ``str``, ``bytes``-like or ``int``, or a 1-D NumPy array of them.
attempt
    ``0`` for the first choice; ``a > 0`` for a retry: the ``a``-th next distinct
    endpoint (bounded load: never one chosen by an earlier attempt).

Returns
-------
indices : numpy.ndarray
    ``int32`` endpoint index per key; ``-1``: fallback (through the ingress). The
    caller's own array: the native kernel may reuse one an earlier call returned, but
    only once nothing refers to it any more (the plan keeps a reference meanwhile, so
    an in-place ``resize`` needs ``refcheck=False``).
fallbacks : int
    Keys answered ``-1``.
moves : int
    Keys bounded load sent elsewhere than the plain ring (with ejected endpoints
    left out) would have; with a zone, the plain ring of a local key is its zone's,
    so a spill to the global ring counts.
valid : bool
    Whether the guard still held after routing (always ``True`` without one):
    if not, the ring arrays were rewritten meanwhile and the answer is void.

Raises
------
lbcore.KeyTypeError, lbcore.KeyEncodingError, lbcore.KeyTooLongError
    Bad keys (nothing is routed or counted).
lbcore.ArgumentError
    ``attempt`` is not a non-negative integer.
lbcore.TableDataError
    A ring array holds an entry out of range while the guard still holds (damage).
"""

_ROUTE_COUNTED_DOC = """``route_counted(keys, attempt, sink, totals)``: :attr:`route`, counted.

The same answer as :attr:`route`, as ``(indices, fallbacks, moves, valid, counted)``;
on the native kernel the batch's decision counts (keys, fallbacks, moves) are added in
the same call to a counter row and to ``totals`` (3 writable ``int64`` words, the
caller's own), unless the answer is not valid, the batch is empty or the row's matrix
is no longer the current one. ``counted`` says whether they were: if not, the caller
counts (on the NumPy kernel it always does). ``sink`` is ``(row, cell, control,
index, epoch)``: the row's ``int64`` words, the word of its decisions count (fallbacks
and moves follow it), and the 8-byte control words whose word ``index`` holds
``epoch`` while the row's matrix is the current one; ``None``: no row, nothing counted.
"""


class Plan:
    """One snapshot's routing, ready for :attr:`route`. Immutable.

    Parameters
    ----------
    ring_set
        The established and fading rings (an empty set routes every key to fallback).
    now_ns
        The present on the fade clock (CLOCK_MONOTONIC), in nanoseconds: fade shares and
        Skipper's fade-in scores are those of this instant.
    ejected
        Optional ``bool`` per endpoint: never chosen (left out as candidates).
    loads
        Per-endpoint load (finite, ``>= 0``), in the units bounded load compares
        (:func:`lbcore.bounded.in_call_units`); needed with ``balance_factor``.
    balance_factor
        Bounded load's factor (``>= 1``), or ``None`` for plain consistent hashing.
    max_hops
        The walk's cap in distinct endpoints (then the least loaded one seen is taken),
        or ``None`` for Skipper's full lap.
    gate
        The rollout gate (default: every key routed).
    fade_mode
        ``"n-ring"``, ``"skipper"`` (Skipper's fade-in, a key's draw standing in for the
        request's random threshold) or ``"off"`` (the newest ring for every key).
    slots
        Counter slot per endpoint (default: the endpoint index), for
        :meth:`counter_slots`.
    n_slots
        Counter columns in use (every slot is below it; default ``max(slots) + 1``).
    guard
        Optional sequence check ``(words, index, expected)``: a ``uint64`` array (say
        a shared-memory table's sequence words) whose entry ``index`` equals
        ``expected`` while the ring arrays are valid; :attr:`route` reads it after
        routing (with acquire ordering) and reports whether it still held.
    max_key_bytes
        Longest key accepted, in bytes (default 4,096, every cslb surface's limit);
        ``None``: no limit.
    zone
        Optional zone affinity (:class:`lbcore.ZoneSplit`: which endpoints are local,
        the local share of keys, the zone's minimum size; rules in
        :mod:`lbcore.zones`). ``None``, a share of 0 or a zone whose views all hold
        fewer than ``min_pods`` local candidates: exactly the plan without a zone.
    reuse
        An earlier plan (say the previous load snapshot's): where its views are this
        plan's (the same newest ring object, the same endpoints per view), its
        :attr:`view_arcs` are reused, so a zone plan with bounded load does not pass
        over the ring again for its bars. Only that array is kept, not the plan.
    loads_on_shares
        Instead of ``loads``: the function that gives them from the plan's
        :attr:`bar_shares` (``None`` when no view's zone is open), called once while
        the plan is built. For loads measured against what the plan expects of each
        endpoint: the pods' reports folded onto those shares
        (:func:`lbcore.reported.effective_loads`' ``expected``).

    Attributes
    ----------
    kernel : str
        ``"native"`` or ``"numpy"``: the kernel active when the plan was built.
    views : int
        Number of views; ``listed``, ``eligible`` and ``good`` are ``(views, endpoints)``
        ``bool`` arrays (``good`` is ``None`` without bounded load), ``listed_count``,
        ``eligible_count`` and ``single`` one entry per view.
    choice : int
        How a key picks its view: :data:`CHOICE_FIXED` (``fixed_view``),
        :data:`CHOICE_NRING` (the newest fading ring whose share is above the key's draw;
        ``fade_thresholds``) or :data:`CHOICE_SKIPPER` (the number of Skipper levels at
        or below the key's draw).
    fade_thresholds, fade_saturated : numpy.ndarray
        Per fading ring (or level), ``u < share`` as ``mix64(h, salt) < threshold``
        (``saturated``: the threshold is ``2**64``, every key).
    gate_threshold : int or None
        A key passes the gate iff ``mix64(h, GATE_SALT) < gate_threshold`` (``None``:
        every key passes, or none when :attr:`closed`).
    closed : bool
        Every key is fallback (no endpoints, or the gate is shut).
    zone_views : int
        ``0`` without zone mode; else the number of global views, views
        ``zone_views + v`` being view ``v`` restricted to local endpoints (empty where
        fewer than ``min_pods``).
    zone_share : float
        The share of keys that are local (``0.0`` without zone mode); a key is local iff
        ``mix64(h, zone.salt) < zone_threshold``, the draw salted with the caller's zone
        (:attr:`lbcore.ZoneSplit.salt`, :func:`lbcore.zone_salt` of its ``name``).
    bars : numpy.ndarray or None
        With zone mode and bounded load, each endpoint's own bar, ``float64`` in the
        units of ``loads`` (:func:`lbcore.bounded.share_bars`:
        ``balance_factor × max(bar share, 1 / n) × (1.0 + Σ load)`` over the newest
        ring's ``n`` candidates, never below the bar without a zone); ``None`` otherwise.
        The one bar the plan compares, for surfaces that show it.
    under : numpy.ndarray or None
        With zone mode and bounded load, ``bool`` per endpoint: its load is at or under
        its own bar (``bars``); a local key whose zone pod is not spills to the global
        view.
    expected_shares : numpy.ndarray
        Each endpoint's expected share of the routed keys (see the property).
    bar_shares : numpy.ndarray
        The expected shares the bars use (see the property).
    """

    __slots__ = {  # noqa: RUF023 (route first: it is the one documented)
        "route": _ROUTE_DOC,
        "route_counted": _ROUTE_COUNTED_DOC,
        "_core": None,
        "balance_factor": None,
        "choice": None,
        "choice_salt": None,
        "closed": None,
        "ejected": None,
        "eligible": None,
        "eligible_count": None,
        "fade_mode": None,
        "fade_saturated": None,
        "fade_thresholds": None,
        "fixed_view": None,
        "gate": None,
        "gate_mode": None,
        "gate_threshold": None,
        "good": None,
        "guard": None,
        "kernel": None,
        "listed": None,
        "listed_count": None,
        "loads": None,
        "max_hops": None,
        "max_key_bytes": None,
        "newest": None,
        "n_slots": None,
        "now_ns": None,
        "ring_set": None,
        "single": None,
        "slots": None,
        "views": None,
        "_arcs": None,
        "_expected": None,
        "_bar_shares": None,
        "bars": None,
        "under": None,
        "zone": None,
        "zone_share": None,
        "zone_threshold": None,
        "zone_views": None,
    }

    def __init__(
        self,
        ring_set: RingSet,
        now_ns: int,
        *,
        ejected: Any = None,
        loads: Any = None,
        balance_factor: float | None = None,
        max_hops: int | None = None,
        gate: Gate | None = None,
        fade_mode: str = "n-ring",
        slots: Any = None,
        n_slots: int | None = None,
        guard: tuple[Any, int, int] | None = None,
        max_key_bytes: int | None = MAX_KEY_BYTES,
        zone: ZoneSplit | None = None,
        reuse: Plan | None = None,
        loads_on_shares: Callable[[np.ndarray | None], Any] | None = None,
    ) -> None:
        if not isinstance(ring_set, RingSet):
            raise ArgumentError(f"a plan routes on a RingSet, got {type(ring_set).__name__}")
        if fade_mode not in FADE_MODES:
            raise ArgumentError(
                f"fade_mode must be one of {', '.join(FADE_MODES)}, got {fade_mode!r}"
            )
        if isinstance(now_ns, bool) or not isinstance(now_ns, (int, np.integer)):
            raise ArgumentError(f"now_ns must be an integer number of nanoseconds, got {now_ns!r}")
        if zone is not None and not isinstance(zone, ZoneSplit):
            raise ArgumentError(f"zone must be an lbcore.ZoneSplit, got {type(zone).__name__}")
        if zone is not None and zone.local.size != len(ring_set.endpoints):
            raise ArgumentError(
                f"zone.local has {zone.local.size} entries for {len(ring_set.endpoints)} endpoints"
            )
        if reuse is not None and not isinstance(reuse, Plan):
            raise ArgumentError(f"reuse must be an lbcore.Plan, got {type(reuse).__name__}")
        self.zone, self._expected, self._arcs, self._bar_shares = zone, None, None, None
        gate = Gate() if gate is None else gate
        if not isinstance(gate, Gate):
            raise ArgumentError(f"gate must be an lbcore.Gate, got {type(gate).__name__}")
        n = len(ring_set.endpoints)
        self.ring_set, self.now_ns, self.fade_mode, self.gate = (
            ring_set,
            int(now_ns),
            fade_mode,
            gate,
        )
        self.max_key_bytes = check_max_key_bytes(max_key_bytes)
        self.balance_factor = (
            None if balance_factor is None else check_balance_factor(balance_factor)
        )
        self.max_hops = check_max_hops(max_hops)
        if loads is not None and loads_on_shares is not None:
            raise ArgumentError("a plan takes loads or loads_on_shares, not both")
        if self.balance_factor is not None and loads is None and loads_on_shares is None:
            raise ArgumentError("bounded-load routing needs loads (one per endpoint)")
        # The plan's own copy: the kernels' state is computed from it once, here.
        self.loads = None if loads is None else _owned(check_loads(loads, n), loads)
        self.ejected = self._ejected(ejected, n)
        self.slots, self.n_slots = self._slots(slots, n_slots, n)
        self.guard = None if guard is None else self._guard(guard)
        self.newest = ring_set.newest
        enabled = bool(gate.enabled) and gate.percentage > 0.0
        self.closed = self.newest is None or not enabled
        self.gate_mode = GATE_NONE if not enabled else GATE_ALL if gate.passes_all else GATE_PARTIAL
        self.gate_threshold = (
            unit_threshold(gate.percentage / 100.0) if self.gate_mode == GATE_PARTIAL else None
        )
        self._build_views(n, reuse, loads_on_shares)
        for name in _FROZEN:
            a = getattr(self, name)
            if a is not None:
                a.setflags(write=False)
        self.kernel = _kernel.kernel_name()
        self._core = make_core(
            newest=self.newest,
            n=n,
            zone_salt=0 if zone is None else zone.salt,
            **{name: getattr(self, name) for name in _CORE_FIELDS},
        )
        # The kernel's method itself is the attribute: no Python frame per batch.
        self.route = self._core.route
        self.route_counted = self._core.route_counted

    # ---------------------------------------------------------------------------------
    # Building.

    @staticmethod
    def _ejected(ejected: Any, n: int) -> np.ndarray | None:
        if ejected is None:
            return None
        arr = np.asarray(ejected)
        if arr.dtype != np.bool_ or arr.shape != (n,):
            raise ArgumentError(
                f"ejected must be one bool per endpoint ({n}), got {arr.dtype} {arr.shape}"
            )
        return arr.copy() if arr.any() else None

    @staticmethod
    def _slots(slots: Any, n_slots: Any, n: int) -> tuple[np.ndarray, int]:
        s = np.arange(n, dtype=np.int64) if slots is None else np.asarray(slots)
        if s.shape != (n,) or (s.size and s.dtype.kind not in "iu"):
            raise ArgumentError(
                f"slots must be one integer per endpoint ({n}), got {s.dtype} {s.shape}"
            )
        s = _owned(s.astype(np.int64, copy=False), slots)
        top = int(s.max()) + 1 if s.size else 0
        cols = top if n_slots is None else int(n_slots)
        if s.size and (int(s.min()) < 0 or top > cols):
            raise ArgumentError(f"counter slots must be in 0..{cols - 1}, got {s.min()}..{top - 1}")
        return s, cols

    @staticmethod
    def _guard(guard: Any) -> tuple[np.ndarray, int, int]:
        words, index, expected = guard
        w = np.frombuffer(words, dtype=np.uint64) if not isinstance(words, np.ndarray) else words
        if w.dtype != np.uint64 or w.ndim != 1 or not 0 <= int(index) < w.size:
            raise ArgumentError(
                "guard must be (uint64 words, an index into them, the expected value)"
            )
        # Not copied (the guard is live: a writer's sequence words), but read-only here.
        w = w.view()
        w.setflags(write=False)
        return w, int(index), int(expected)

    def _build_views(
        self,
        n: int,
        reuse: Plan | None,
        loads_on_shares: Callable[[np.ndarray | None], Any] | None,
    ) -> None:
        rs, ej = self.ring_set, self.ejected
        self.zone_views, self.zone_share, self.zone_threshold = 0, 0.0, 0
        self.under = self.bars = None
        self.choice, self.fixed_view, self.choice_salt = CHOICE_FIXED, 0, 0
        self.fade_thresholds, self.fade_saturated = _EMPTY_U64, _EMPTY_U8
        if self.newest is None:
            self.views = 1
            self.listed = self.eligible = np.zeros((1, 0), dtype=np.bool_)
            self.good = None
            self.listed_count = self.eligible_count = np.zeros(1, dtype=np.int64)
            self.single = np.full(1, -1, dtype=np.int32)
            if loads_on_shares is not None:
                self.loads = self._given_loads(loads_on_shares(None), n)
            return
        present = self.newest.present
        cand = None if ej is None else ~ej
        if self.fade_mode == "skipper":
            listed_rows = self._skipper_levels(present, cand)
        else:
            rings = len(rs.rings)
            tiers = rs.tiers
            first = rings - 1 if self.fade_mode == "off" else 0
            listed_rows = [(tiers <= k) & present for k in range(first, rings)]
            members = listed_rows
            if cand is not None:
                listed_rows = [m & cand for m in members]
            if self.fade_mode == "n-ring" and rings > 1:
                self.choice, self.choice_salt = CHOICE_NRING, FADE_SALT
                self.fade_thresholds, self.fade_saturated = draw_thresholds(
                    rs.share_list(self.now_ns)
                )
        listed = np.array(listed_rows, dtype=np.bool_).reshape(len(listed_rows), n)
        eligible = self._widened(listed, cand is not None or self.fade_mode == "skipper")
        zone_listed = self._zone_rows(listed)
        if zone_listed is not None:
            # Z1: each view's zone part is the view restricted to local endpoints (the
            # same ring positions, remote ones stepped over); views 0..V-1 stay global.
            self.zone_views = listed.shape[0]
            self.zone_share = self.zone.share if self.zone is not None else 0.0
            self.zone_threshold = unit_threshold(self.zone_share)
            zone_eligible = self._widened(zone_listed, True)
            listed = np.concatenate((listed, zone_listed))
            eligible = np.concatenate((eligible, zone_eligible))
        self.views = listed.shape[0]
        self.listed, self.eligible = listed, eligible
        if not self.zone_views:
            if loads_on_shares is not None:
                self.loads = self._given_loads(loads_on_shares(None), n)
            self.listed_count, self.eligible_count, self.single, self.good = view_arrays(
                listed, eligible, self.loads, self.balance_factor
            )
            return
        self.listed_count, self.eligible_count, self.single = view_counts(listed, eligible)
        self.good = None
        if self.balance_factor is not None or loads_on_shares is not None:
            if (
                reuse is not None
                and reuse.newest is self.newest
                and reuse.views == self.views
                and reuse.zone_views == self.zone_views
                and np.array_equal(reuse.eligible, eligible)
                and np.array_equal(reuse.listed_count, self.listed_count)
            ):
                self._arcs = reuse.view_arcs  # the same views of the same ring
        if loads_on_shares is not None:
            self.loads = self._given_loads(loads_on_shares(self.bar_shares), n)
        if self.balance_factor is not None:
            assert self.loads is not None
            # B1: each endpoint's bar from its expected share under this plan.
            self.bars = share_bars(
                self.loads,
                listed[self.zone_views - 1],
                self.bar_shares,
                self.balance_factor,
            )
            self.good, self.under = zone_good(eligible, self.listed_count, self.loads, self.bars)

    @staticmethod
    def _given_loads(loads: Any, n: int) -> np.ndarray:
        """``loads_on_shares``' answer, checked as ``loads`` are, as the plan's own."""
        return _owned(check_loads(loads, n), loads)

    def _widened(self, listed: np.ndarray, filtered: bool) -> np.ndarray:
        """Views' endpoints the walk may stop at: ``listed`` widened to hosts on its ring.

        Skipper's skip rule compares hosts: an endpoint sharing a host with a candidate
        is not stepped over (lbcore.Ring.candidate_mask), on its ring. ``filtered``:
        the rows leave out some of their ring's endpoints (else they are the rings).
        """
        eligible = listed.copy()
        assert self.newest is not None
        if filtered and self.newest.has_aliases:
            rs, n = self.ring_set, listed.shape[1]
            host, present = self.newest.host_ids, self.newest.present
            for v in range(listed.shape[0]):
                ring_members = (rs.tiers <= self._ring_of(v)) & present
                widened = np.bincount(host, weights=listed[v], minlength=n)[host] > 0
                eligible[v] = widened & ring_members
        return eligible

    def _zone_rows(self, listed: np.ndarray) -> np.ndarray | None:
        """Each view's zone part (closed ones empty), or ``None`` when no key is local.

        A view's zone part is open while it holds ``min_pods`` candidates; with no open
        part or a share of 0 the plan is exactly the plan without a zone (Skipper's
        answers and bar).
        """
        z = self.zone
        if z is None or z.share <= 0.0:
            return None
        rows = listed & z.local
        rows[rows.sum(axis=1) < z.min_pods] = False
        return rows if rows.any() else None

    @property
    def view_arcs(self) -> np.ndarray:
        """Each view's share of the hash space per endpoint, ``(views, endpoints)``.

        :func:`lbcore.zones.view_arcs`: computed once per plan (one pass over the ring
        for all views on the native kernel), or taken from ``reuse`` when its views are
        this plan's.
        """
        if self._arcs is None:
            arcs = view_arcs(self)
            arcs.setflags(write=False)
            self._arcs = arcs
        return self._arcs

    @property
    def expected_shares(self) -> np.ndarray:
        """Each endpoint's expected share of this host's routed keys under this plan.

        Arc lengths × zone split × fade-in share, without bounded load
        (:func:`lbcore.zones.expected_shares`): ``float64`` per endpoint, summing to 1
        (0 everywhere when every key is fallback). With a zone and bounded load, the
        bars (:attr:`bars`) come from :attr:`bar_shares`, these averaged over the bar
        window, each never below the average ``1 / n``'s.
        """
        if self._expected is None:
            if self.newest is None:
                shares = np.zeros(len(self.ring_set.endpoints))
            else:
                shares = expected_shares(self, self.view_arcs)
            shares.setflags(write=False)
            self._expected = shares
        return self._expected

    @property
    def bar_shares(self) -> np.ndarray:
        """The expected shares B1's bars use: what the loads compared with them saw.

        :attr:`expected_shares` averaged over the zone split's ``bar_window_ns``
        (:func:`lbcore.zones.window_shares`: the local shares it gives and the fade-in
        weights there); :attr:`expected_shares` itself without a window. ``float64``
        per endpoint, summing to 1.
        """
        if self._bar_shares is None:
            z = self.zone
            if z is None or not self.zone_views or not z.bar_window_ns:
                shares = self.expected_shares
            else:
                shares = window_shares(self, z, self.view_arcs)
                shares.setflags(write=False)
            self._bar_shares = shares
        return self._bar_shares

    def _ring_of(self, view: int) -> int:
        """The ring a view walks on (its tier bound); Skipper's levels all use the newest."""
        rings = len(self.ring_set.rings)
        if self.zone_views:
            view %= self.zone_views
        if self.fade_mode == "skipper":
            return rings - 1
        return rings - 1 if self.fade_mode == "off" else view

    def _skipper_levels(self, present: np.ndarray, cand: np.ndarray | None) -> list[np.ndarray]:
        """Skipper's fade-in: per candidate level, the endpoints a key at that level keeps.

        Per request Skipper keeps the endpoints whose fade-in score is above one random
        threshold (all of them if none is): with the key's draw in its place, the keys of
        a batch fall into nested candidate sets, one per distinct score
        (:func:`lbcore.fade.skipper_fadein_candidates`).
        """
        rs = self.ring_set
        ages: list[int | None] = [None, *(self.now_ns - s for s in rs.starts_ns)]
        scores = fadein_scores(ages, rs.duration_ns, rs.exponent).take(rs.tiers)
        listed = present if cand is None else present & cand
        if cand is not None:
            scores = np.where(cand, scores, -1.0)  # below every draw: never kept by a level
        levels = np.unique(scores)
        rows = [listed & (scores >= lv) for lv in levels.tolist()]
        rows.append(listed.copy())  # a draw above every score: all of them
        self.choice, self.choice_salt = CHOICE_SKIPPER, SKIPPER_SALT
        # A key's level is the number of scores at or below its draw u: levels[j] <= u
        # iff not u < levels[j], i.e. mix64(h) >= unit_threshold(levels[j]).
        self.fade_thresholds, self.fade_saturated = draw_thresholds(levels.tolist())
        return rows

    # ---------------------------------------------------------------------------------
    # Asking.

    def route_hashes(
        self, hashes: np.ndarray, attempt: int = 0
    ) -> tuple[np.ndarray, int, int, bool]:
        """:attr:`route` for precomputed ``uint64`` key hashes (:func:`lbcore.hash_keys`)."""
        attempt = _kernel.check_attempt(attempt)
        return self._core.route_hashes(np.ascontiguousarray(check_hashes(hashes)), attempt)

    def answers(self) -> tuple[np.ndarray, np.ndarray]:
        """The attempt-0 answer for every (view, position of the newest ring).

        Returns
        -------
        answer : numpy.ndarray
            ``int32`` of shape ``(views, ring positions)``: the endpoint a key at that
            position of the newest ring gets in that view (``-1``: fallback). The gate
            is not applied. With N-ring fade-in and no bounded load or ejections this is
            each ring's owner at that position; in general
            :meth:`lbcore.RingSet.answer_table` with the plan's arguments. With a zone,
            rows ``zone_views`` on are the zone parts' answers, before any spill.
        moved : numpy.ndarray
            ``bool`` of the same shape: bounded load moved the answer off the plain one.
        """
        answer, plain = self._core.answers()
        size = 0 if self.closed or self.newest is None else len(self.newest)
        shape = (self.views if size else 0, size)
        answer, plain = answer.reshape(shape), plain.reshape(shape)
        return answer, (answer != plain) & (answer >= 0)

    def counter_slots(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Counter slots of the routed calls of ``indices`` (``route``'s ``int32`` array).

        Returns
        -------
        slots : numpy.ndarray
            ``int64`` slot of each entry ``>= 0``, in order.
        positions : numpy.ndarray or None
            Their positions in ``indices``; ``None`` when no entry is fallback.

        Raises
        ------
        lbcore.ArgumentError
            An entry outside ``-1 .. endpoints - 1``, or not a 1-D integer array.
        """
        idx = indices
        if type(idx) is not np.ndarray or idx.dtype != np.int32 or not idx.flags.c_contiguous:
            arr = np.asarray(indices)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ArgumentError(
                    f"endpoint indices must be a 1-D integer array, got {arr.dtype} {arr.shape}"
                )
            wide = arr.astype(np.int64)
            n = len(self.slots)
            if wide.size and (int(wide.min()) < -1 or int(wide.max()) >= n):
                i = int(np.flatnonzero((wide < -1) | (wide >= n))[0])
                raise ArgumentError(
                    f"endpoint index {int(wide[i])} at position {i} is not in -1..{n - 1}"
                )
            idx = np.ascontiguousarray(wide, dtype=np.int32)
        return self._core.counter_slots(idx)

    def __repr__(self) -> str:
        return (
            f"Plan({len(self.slots)} endpoints, {self.views} view(s), {self.fade_mode}, "
            f"balance_factor={self.balance_factor}, max_hops={self.max_hops}, "
            f"zone_share={self.zone_share:g}, kernel={self.kernel})"
        )
