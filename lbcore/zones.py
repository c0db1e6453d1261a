"""Zone-aware consistent hashing: which keys stay in the caller's zone, and on which pods.

The rules, written once here and applied by both kernels through
:class:`lbcore.Plan` (``zone=ZoneSplit(...)``):

* **Z1, a zone's ring is the global ring restricted to its pods.** The same
  ``"<endpoint>-<j>"`` positions, walked stepping over remote endpoints (a restricted
  view, as fading rings are): a key whose global owner is local keeps it, and a key's
  local pod changes only when local membership changes.
* **Z2, split by key, not by request.** For a caller in zone ``z``, a key is local iff
  ``mix64(h, zone_salt(z))`` is below the integer threshold of ``share``
  (:func:`lbcore.draws.unit_threshold`), a draw independent of the fade-in ring choice
  and of the rollout gate. Raising the share only adds keys to the local set, so each
  key moves at most once per change. The draw is salted per caller zone
  (:func:`zone_salt`): the keys one zone keeps remote are not those another zone keeps
  remote (two zones' local sets at ``x`` overlap about ``x²``). A key remote from zone
  ``z`` is mostly local in the other zones, where by Z1 its local pod in its global
  owner's zone is that owner: the owner's cache holds it as warm as any pod holds its
  local keys, so remote calls read no faster for being few. One draw for every zone
  would send the keys every zone keeps remote to their owner from all zones, cache-hot
  there, and make remote calls look fast.
* **Z3, capacity cap and the zone's size.** The share a controller may give a zone is
  capped by :func:`zone_cap`. A view of the ring set whose zone part holds fewer than
  ``min_pods`` non-ejected local pods is global for every key (the share is not
  floored there, it is 0). A retry (``attempt`` ``a >= 1``) of a local key stays in the
  zone while the zone part holds more than ``a`` such pods (two for the fan-out's one
  retry).
* **B1, bounded load from the plan.** With a zone, each endpoint's bar is
  ``balance_factor × max(its expected share, 1 / n) × (1.0 + Σ load)`` over the ``n``
  candidates (:func:`lbcore.bounded.share_bars`, kept as ``Plan.bars``) where the
  expected share is the part of this host's keys the plan sends it without bounded load
  (arc lengths × zone split × fade-in share, :func:`expected_shares`). For a local pod
  of an even fleet that is ``(load per local pod + load per global pod) ×
  balance_factor``; a plain average would call every local pod overloaded as soon as
  the share is noticeably above 0. No bar is below the average's: an endpoint expected
  to carry little (a remote pod while most keys stay local) keeps the bar it has
  without a zone, so a handful of calls does not put it over and keys do not flap on
  and off it. A local key whose zone walk ends on a pod over its bar is routed
  on the global ring instead (a *spill*, counted in ``route``'s ``moves``). Without a
  zone, or when no view's zone is open, the bar and every answer are Skipper's. The
  expected shares are those the loads saw: loads averaged over a window reflect the
  expected shares averaged over it, local share and N-ring fade-in weights together
  (``ZoneSplit.bar_window_ns``, ``bar_shares``; :func:`window_instants`). Bars at the
  instant's shares would call remote pods overloaded while the share rises (local pods
  while it falls) and a fading ring's older pods overloaded as it grows.

The controller that moves ``share`` over time (ramp, probe floor, latency hysteresis)
belongs to the host's table writer; its settings are :mod:`lbcore.zone_settings`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lbcore.draws import below, mix64
from lbcore.errors import ArgumentError, TableDataError
from lbcore.kernel import hash_keys, native
from lbcore.views import CHOICE_FIXED, CHOICE_NRING, draw_thresholds, view_of_draws

__all__ = [
    "ZONE_SALT",
    "ZoneSplit",
    "arc_shares",
    "arc_sums",
    "expected_shares",
    "local_keys",
    "local_mask",
    "view_arcs",
    "view_weights",
    "window_instants",
    "window_shares",
    "zone_cap",
    "zone_salt",
]

#: Salt of the per-key draws that decide whether a key is local (Z2), mixed with the
#: caller zone's name (:func:`zone_salt`): independent of the fade-in draw
#: (``FADE_SALT``), Skipper's (``SKIPPER_SALT``) and the gate's.
ZONE_SALT = 0x7A6F6E652D616666

#: Most local pods a zone may be required to hold (``CSLB_ZONE_MIN_PODS``'s range).
MAX_MIN_PODS = 1000

#: Longest load window the bars look back over (an hour, in ns).
MAX_BAR_WINDOW_NS = 3600 * 1_000_000_000

#: Instants at which the bars take the expected shares over a load window
#: (:func:`window_instants`): the share and fade curves are smooth, so a few suffice.
WINDOW_SAMPLES = 16


def zone_salt(zone: str) -> int:
    """The salt of Z2's draw for callers in ``zone``: ``mix64(xxh64(zone), ZONE_SALT)``.

    The zone's name is hashed as a key is (:func:`lbcore.hash_keys`: XXH64 of its
    UTF-8 bytes), so every process on every machine draws the same local keys for a
    zone. Changing this rule moves local keys on upgrade.

    Parameters
    ----------
    zone
        The caller's zone name (``""``: unknown; it has a salt like any other name).

    Returns
    -------
    int
        The salt, an unsigned 64-bit integer.

    Raises
    ------
    lbcore.ArgumentError
        ``zone`` is not a ``str``.
    """
    if not isinstance(zone, str):
        raise ArgumentError(f"zone must be a zone name (str), got {zone!r:.80}")
    return _zone_salt(zone)


@functools.lru_cache(maxsize=64)
def _zone_salt(zone: str) -> int:
    # Cached: a worker rebuilds its zone split on every load refresh, for the same zone.
    return int(mix64(hash_keys([zone]), ZONE_SALT)[0])


@dataclass(frozen=True, slots=True, eq=False)
class ZoneSplit:
    """The zone part of a plan: which endpoints are local and which keys stay local.

    Parameters
    ----------
    local
        One ``bool`` per endpoint of the ring set (its index order): the endpoints in
        the caller's zone.
    share
        ``x`` of Z2, in ``[0, 1]``: the fraction of keys routed on the zone's ring.
    min_pods
        A view's zone part routes keys only while it holds at least this many
        non-ejected local endpoints (``CSLB_ZONE_MIN_PODS``).
    bar_window_ns
        How far back the loads compared with the bars reach, in nanoseconds (0: loads
        of the instant). B1's bars then expect the shares averaged over that window,
        not the instant's: loads averaged over a window saw the local share and the
        fade-in weights of the whole window.
    bar_shares
        With a window: the local share at each of its :func:`window_instants` (the
        caller's curve evaluated there), :data:`WINDOW_SAMPLES` numbers in ``[0, 1]``;
        ``None`` without one. Routing uses ``share`` only.
    name
        The caller's zone: its local keys are those of Z2's draw salted with
        :func:`zone_salt` of this name (``""``: the zone unknown).

    Attributes
    ----------
    salt : int
        :func:`zone_salt` of ``name``: the salt the kernels draw local keys with.

    Raises
    ------
    lbcore.ArgumentError
        ``local`` is not a 1-D sequence of bools, ``share`` is not a number in
        ``[0, 1]``, ``min_pods`` is not an integer from 1 to 1,000, ``bar_window_ns``
        not one from 0 to an hour, ``bar_shares`` not its samples (none without a
        window), or ``name`` not a ``str``.
    """

    local: np.ndarray
    share: float
    min_pods: int = field(default=3, kw_only=True)
    bar_window_ns: int = field(default=0, kw_only=True)
    bar_shares: tuple[float, ...] | None = field(default=None, kw_only=True)
    name: str = field(default="", kw_only=True)
    salt: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.local)
        if arr.ndim != 1 or (arr.size and arr.dtype != np.bool_):
            raise ArgumentError(
                f"ZoneSplit.local must be one bool per endpoint, got {arr.dtype} {arr.shape}"
            )
        arr = np.array(arr, dtype=np.bool_)
        arr.setflags(write=False)
        s = _unit_share(self.share, "ZoneSplit.share")
        m = self.min_pods
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
            raise ArgumentError(f"ZoneSplit.min_pods must be an integer, got {m!r}")
        if not 1 <= int(m) <= MAX_MIN_PODS:
            raise ArgumentError(f"ZoneSplit.min_pods must be from 1 to {MAX_MIN_PODS}, got {m}")
        object.__setattr__(self, "local", arr)
        object.__setattr__(self, "share", s)
        object.__setattr__(self, "min_pods", int(m))
        w = self.bar_window_ns
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
            raise ArgumentError(f"ZoneSplit.bar_window_ns must be an integer, got {w!r}")
        if not 0 <= int(w) <= MAX_BAR_WINDOW_NS:
            raise ArgumentError(
                f"ZoneSplit.bar_window_ns must be from 0 to {MAX_BAR_WINDOW_NS}, got {w}"
            )
        b = self.bar_shares
        if (b is None) != (int(w) == 0):
            raise ArgumentError("ZoneSplit.bar_shares go with a bar window, and only with one")
        if b is not None:
            if isinstance(b, (str, bytes)) or len(b) != WINDOW_SAMPLES:
                raise ArgumentError(
                    f"ZoneSplit.bar_shares must be {WINDOW_SAMPLES} shares, got {b!r:.80}"
                )
            b = tuple(_unit_share(x, "ZoneSplit.bar_shares[]") for x in b)
        object.__setattr__(self, "bar_window_ns", int(w))
        object.__setattr__(self, "bar_shares", b)
        if not isinstance(self.name, str):
            raise ArgumentError(f"ZoneSplit.name must be a zone name (str), got {self.name!r:.80}")
        object.__setattr__(self, "salt", zone_salt(self.name))

    @classmethod
    def for_zone(
        cls,
        zones: Sequence[str | None],
        zone: str,
        share: float,
        *,
        min_pods: int = 3,
        bar_window_ns: int = 0,
        bar_shares: Sequence[float] | None = None,
    ) -> ZoneSplit:
        """The split of a caller in ``zone``, from each endpoint's zone (``None``: unknown).

        An empty ``zone`` (the caller's zone unknown) makes no endpoint local. The
        split's ``name`` is ``zone``.
        """
        if not isinstance(zone, str):
            raise ArgumentError(f"zone must be a zone name (str), got {zone!r:.80}")
        return cls(
            np.array([bool(zone) and z == zone for z in zones], dtype=np.bool_),
            share,
            min_pods=min_pods,
            bar_window_ns=bar_window_ns,
            bar_shares=None if bar_shares is None else tuple(bar_shares),
            name=zone,
        )

    def __repr__(self) -> str:
        bar = f", bar_window_ns={self.bar_window_ns}" if self.bar_window_ns else ""
        return (
            f"ZoneSplit({self.name!r}: {int(self.local.sum())}/{self.local.size} local, "
            f"share={self.share:g}{bar}, min_pods={self.min_pods})"
        )


def _unit_share(s: Any, what: str) -> float:
    if isinstance(s, bool) or not isinstance(s, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"{what} must be a number in [0, 1], got {s!r}")
    if not (math.isfinite(float(s)) and 0.0 <= float(s) <= 1.0):
        raise ArgumentError(f"{what} must be in [0, 1], got {s!r}")
    return float(s)


def _per_zone(values: Mapping[str, float] | None, what: str) -> dict[str, float]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ArgumentError(f"{what} must be a mapping of zone to a number, got {values!r}")
    out: dict[str, float] = {}
    for z, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ArgumentError(f"{what}[{z!r}] must be a number >= 0, got {v!r}")
        if not (math.isfinite(float(v)) and float(v) >= 0.0):
            raise ArgumentError(f"{what}[{z!r}] must be a finite number >= 0, got {v!r}")
        out[str(z)] = float(v)
    return out


def zone_cap(pods: Mapping[str, float], callers: Mapping[str, float] | None, zone: str) -> float:
    """Z3's cap on a zone's share: ``min(1, pod share of zone / caller share of zone)``.

    The zone's callers may keep at most the part of their keys that the zone's pods
    can serve if every zone's callers did the same (Envoy's residual-capacity
    arithmetic, applied per key rather than per request).

    Parameters
    ----------
    pods
        Pods (or their capacity) per zone; a zone not listed has none.
    callers
        Callers (or their traffic) per zone; ``None``: callers in proportion to pods
        (the cap is 1 wherever there are pods).
    zone
        The callers' zone.

    Returns
    -------
    float
        The cap in ``[0, 1]``: 0 when the zone has no pods, 1 when it has no callers.
    """
    p = _per_zone(pods, "pods")
    c = _per_zone(callers, "callers")
    pod_total = sum(p.values())
    if pod_total <= 0.0 or p.get(zone, 0.0) <= 0.0:
        return 0.0
    if callers is None:
        return 1.0
    caller_total = sum(c.values())
    if caller_total <= 0.0 or c.get(zone, 0.0) <= 0.0:
        return 1.0
    return min(1.0, (p[zone] / pod_total) / (c[zone] / caller_total))


def local_mask(hashes: np.ndarray, share: float, zone: str) -> np.ndarray:
    """Per key hash (``uint64``, :func:`lbcore.hash_keys`), whether it is local at ``share``.

    ``zone`` is the caller's zone: each zone draws its own local keys (:func:`zone_salt`).
    """
    return below(np.asarray(hashes, dtype=np.uint64), zone_salt(zone), float(share))


def local_keys(keys: Any, share: float, zone: str) -> np.ndarray:
    """Which keys a caller in ``zone`` keeps local (Z2) at ``x = share``: ``bool`` per key.

    ``keys`` is a batch as :func:`lbcore.hash_keys` takes it. Nested in ``share``: a key
    local at one share is local at every larger one. Whether a local key is routed in
    its zone also depends on the zone's size (see :class:`ZoneSplit`).
    """
    if isinstance(share, bool) or not isinstance(share, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"share must be a number in [0, 1], got {share!r}")
    if not (math.isfinite(float(share)) and 0.0 <= float(share) <= 1.0):
        raise ArgumentError(f"share must be in [0, 1], got {share!r}")
    return local_mask(hash_keys(keys), share, zone)


# ---------------------------------------------------------------------------------------
# Expected shares (B1).


class ViewedRing(Protocol):
    """What :func:`arc_shares` reads of the newest ring (:class:`lbcore.Ring` is one)."""

    hashes: np.ndarray
    owners: np.ndarray


class PlanLike(Protocol):
    """What :func:`expected_shares` reads of a plan (:class:`lbcore.Plan` is one)."""

    ring_set: Any
    now_ns: int
    newest: Any
    views: int
    zone_views: int
    zone_share: float
    eligible: np.ndarray
    listed_count: np.ndarray
    single: np.ndarray
    choice: int
    fixed_view: int
    fade_thresholds: np.ndarray
    fade_saturated: np.ndarray


def arc_shares(ring: ViewedRing, eligible: np.ndarray) -> np.ndarray:
    """Each endpoint's share of the hash space when keys walk to ``eligible`` endpoints.

    A key belongs to the first ring node at or after its hash (wrapping), and the skip
    rule carries it on to the first node whose endpoint is eligible: each eligible
    node answers the arc from the previous eligible node to itself.

    Returns
    -------
    numpy.ndarray
        ``float64`` per endpoint (``eligible``'s length), summing to 1 (all 0 when no
        node is eligible).

    Raises
    ------
    lbcore.TableDataError
        A ring node's owner is not an endpoint (damaged arrays).
    """
    return _normalized(arc_sums(ring, np.asarray(eligible, dtype=np.bool_)[None, :])[0])


def arc_sums(ring: ViewedRing, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows`` (``bool`` ``(views, endpoints)``), each endpoint's arcs in 2**-64 units.

    What :func:`arc_shares` normalizes, for several views in one pass over the ring on
    the native kernel (the NumPy reference, :func:`_arc_sums`, passes once per view; the
    sums are the same to the bit). ``float64`` ``(views, endpoints)``.

    Raises
    ------
    lbcore.TableDataError
        On both kernels: a ring node's owner is not an endpoint (damaged arrays).
    """
    k = native()
    if k is not None and rows.size:
        # Endpoint-major: a node's cells of every view are next to each other.
        member = np.ascontiguousarray(rows.T, dtype=np.bool_)
        sums = np.zeros(member.shape)
        k.arc_sums(np.asarray(ring.hashes), np.asarray(ring.owners), member, sums)
        return np.ascontiguousarray(sums.T)
    out = np.zeros(rows.shape)
    for v, row in enumerate(rows):
        out[v] = _arc_sums(ring, row)
    return out


def _arc_sums(ring: ViewedRing, eligible: np.ndarray) -> np.ndarray:
    n = eligible.size
    # One private read: a ring over shared memory may be rewritten under a lapped
    # reader, and a garbage owner must neither index out of range nor size a count.
    owners = np.array(ring.owners, dtype=np.int64)
    bad = np.flatnonzero((owners < 0) | (owners >= n))
    if bad.size:
        i = int(bad[0])
        raise TableDataError(
            f"ring node {i} has owner {int(owners[i])}: not one of the {n} endpoints (the "
            "ring arrays are damaged or were rewritten)"
        )
    marked = np.flatnonzero(eligible[owners])
    if not marked.size:
        return np.zeros(n)
    ends = np.asarray(ring.hashes)[marked]
    # Arc of eligible node i: from the previous eligible node (exclusive) to it, in
    # uint64 arithmetic that wraps exactly once around the ring (the first node's
    # previous one is the last).
    arcs = np.empty(ends.size)
    arcs[1:] = np.diff(ends)
    arcs[0] = float((int(ends[0]) - int(ends[-1])) % (1 << 64)) if ends.size > 1 else 2.0**64
    return np.bincount(owners[marked], weights=arcs, minlength=n)


def _normalized(sums: np.ndarray) -> np.ndarray:
    total = sums.sum()
    return sums / total if total > 0 else sums


def view_weights(plan: PlanLike) -> np.ndarray:
    """The fraction of keys each global view gets from its draw (fade-in or Skipper level).

    The draw is uniform over 64-bit integers and the choice is a step function of it
    with steps at the plan's thresholds, so each step's width is its weight exactly.
    """
    g = plan.views - plan.zone_views if plan.zone_views else plan.views
    if plan.choice == CHOICE_FIXED:
        w = np.zeros(g)
        w[plan.fixed_view] = 1.0
        return w
    return _step_weights(g, plan.choice, plan.fade_thresholds, plan.fade_saturated)[0]


def _step_weights(
    views: int, choice: int, thresholds: np.ndarray, saturated: np.ndarray
) -> np.ndarray:
    """Per row of ``thresholds`` (one row: 1-D), each of ``views`` views' weight.

    The draws between two consecutive thresholds pick one view
    (:func:`lbcore.views.view_of_draws` at the lower one): its weight is the width.
    ``float64`` ``(rows, views)``.
    """
    ts, sat = np.atleast_2d(thresholds), np.atleast_2d(saturated)
    rows, k = ts.shape
    # A saturated threshold is no step: put it at 0, where it adds a step of width 0.
    edges = np.zeros((rows, k + 1), np.uint64)
    edges[:, 1:] = np.where(sat, 0, ts)
    edges.sort(axis=1)
    picked = view_of_draws(choice, ts, sat, edges)
    ends = np.empty((rows, k + 2))
    ends[:, :-1] = edges
    ends[:, -1] = 2.0**64
    widths = ends[:, 1:] - ends[:, :-1]
    # Each row's steps into its own views: one bincount over (row, view) cells.
    cells = (picked + np.arange(rows)[:, None] * views).ravel()
    w = np.bincount(cells, weights=widths.ravel(), minlength=rows * views).reshape(rows, views)
    return w / w.sum(axis=1, keepdims=True)


def window_instants(now_ns: int, window_ns: int) -> list[int]:
    """The instants (ns) at which B1's bars take the shares over ``(now - window, now]``.

    The midpoints of :data:`WINDOW_SAMPLES` equal steps: the mean over them of a smooth
    curve is its mean over the window (exact for a straight line).
    """
    step = window_ns / WINDOW_SAMPLES
    return [int(now_ns) - int(window_ns) + round((k + 0.5) * step) for k in range(WINDOW_SAMPLES)]


def window_shares(plan: PlanLike, split: ZoneSplit, arcs: np.ndarray | None = None) -> np.ndarray:
    """:func:`expected_shares` averaged over ``split``'s bar window: what its loads saw.

    At each of :func:`window_instants`, the local share ``split.bar_shares`` gives and
    the N-ring fade-in weights of the ring set's curves then (a ring not started then
    carries none); Skipper's levels are other views at each instant and a fixed view
    has no curve, so theirs are the plan's. Without a window, :func:`expected_shares`.
    """
    if not split.bar_window_ns or split.bar_shares is None:
        return expected_shares(plan, arcs)
    if arcs is None:
        arcs = view_arcs(plan)
    if plan.newest is None or not arcs.shape[1]:
        return np.zeros(arcs.shape[1])
    if plan.choice == CHOICE_NRING:
        rs = plan.ring_set
        at = window_instants(plan.now_ns, split.bar_window_ns)
        thresholds, saturated = draw_thresholds([s for t in at for s in rs.share_list(t)])
        rows = (len(at), -1)
        g = plan.views - plan.zone_views if plan.zone_views else plan.views
        weights = _step_weights(g, CHOICE_NRING, thresholds.reshape(rows), saturated.reshape(rows))
    else:
        weights = view_weights(plan)[None, :]
    # The mean of the instants' shares is one mix of the views' arcs: its coefficients'
    # mean over the instants.
    mix = _view_mix(plan, weights, np.array(split.bar_shares), arcs)
    return _mixed(mix.mean(axis=0), arcs)


def _view_mix(
    plan: PlanLike, weights: np.ndarray, shares: np.ndarray, arcs: np.ndarray
) -> np.ndarray:
    """Per instant, the coefficient of each view's arcs in the expected shares then.

    ``weights``: the global views' weights per instant ``(instants, global views)``
    (one row: every instant); ``shares``: the local share per instant. A view's zone
    part takes the local keys where it is open; the mix is normalized to sum to 1
    (keys a view sends to fallback carry none). ``float64`` ``(instants, views)``.
    """
    g = plan.views - plan.zone_views if plan.zone_views else plan.views
    rows = max(weights.shape[0], shares.size)
    mix = np.zeros((rows, plan.views))
    mix[:, :g] = weights
    if plan.zone_views:
        x = shares.reshape(-1, 1)
        is_open = plan.listed_count[plan.zone_views :] > 0
        local = np.where(is_open, weights * x, 0.0)
        mix[:, :g] -= local
        mix[:, g:] = local
    # A view's arcs sum to 1 (arc_shares), or to 0 without a candidate.
    total = np.einsum("iv,v->i", mix, (plan.listed_count > 0).astype(np.float64))
    return np.divide(mix, total[:, None], out=np.zeros_like(mix), where=total[:, None] > 0)


#: Views whose arcs a ring keeps (a plan has up to twice its rings' count; the oldest go).
_KEPT_ARCS = 16


def view_arcs(plan: PlanLike) -> np.ndarray:
    """Each view's share of the hash space per endpoint: ``float64`` ``(views, endpoints)``.

    What :func:`expected_shares` weighs; it depends on the ring and the views' endpoints
    only, not on time or loads (:class:`lbcore.Plan`'s ``reuse`` keeps it across plans,
    and the ring keeps each view's). A view of one candidate sends it every key, one
    of none no key.
    """
    n = plan.eligible.shape[1]
    out = np.zeros((plan.views, n))
    if plan.newest is None or not n:
        return out
    # A ring never changes: the arcs of a set of its endpoints are kept with it (each
    # new load snapshot's plan, the status page, ``cslb route --live`` ask again).
    kept = plan.newest.derived("zone arcs")
    todo: dict[bytes, list[int]] = {}
    for v in range(plan.views):
        count = int(plan.listed_count[v])
        if count == 1:
            out[v, int(plan.single[v])] = 1.0
        elif count > 1:
            key = plan.eligible[v].tobytes()
            got = kept.get(key)
            if got is None:
                todo.setdefault(key, []).append(v)
            else:
                out[v] = got
    if todo:
        first = [vs[0] for vs in todo.values()]
        for key, sums in zip(todo, arc_sums(plan.newest, plan.eligible[first]), strict=True):
            got = _normalized(sums)
            got.setflags(write=False)
            while len(kept) >= _KEPT_ARCS:
                kept.pop(next(iter(kept)))
            kept[key] = got
            out[todo[key]] = got
    return out


def expected_shares(
    plan: PlanLike,
    arcs: np.ndarray | None = None,
    share: float | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Each endpoint's expected share of this host's routed keys under ``plan``.

    The sum over views of the view's weight (:func:`view_weights`) × its arcs
    (:func:`arc_shares`), local keys (``share``, default ``plan.zone_share``) on the
    view's zone part where it is open, without bounded load. Keys a view sends to
    fallback carry no share; the result sums to 1 over endpoints (0 everywhere when
    every key is fallback). ``arcs``: :func:`view_arcs` of the plan, when known.
    ``share`` and ``weights``: another local share and other view weights on the same
    views (B1's bars use what the loads saw: :func:`window_shares`). ``float64`` per
    endpoint.
    """
    n = plan.eligible.shape[1]
    if plan.newest is None or not n:
        return np.zeros(n)
    if arcs is None:
        arcs = view_arcs(plan)
    x = (plan.zone_share if share is None else float(share)) if plan.zone_views else 0.0
    if weights is None:
        weights = view_weights(plan)
    return _mixed(_view_mix(plan, np.asarray(weights)[None, :], np.array([x]), arcs)[0], arcs)


def _mixed(coefficients: np.ndarray, arcs: np.ndarray) -> np.ndarray:
    # einsum's own loops, not BLAS: a worker's plan builds start no BLAS thread pool.
    return np.einsum("v,vn->n", coefficients, arcs)
