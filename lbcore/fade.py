"""Fade-in: bringing new pods in without a cache-miss storm.

Two mechanisms live here, both pure functions of the time passed in:

* **Skipper's fade-in** (``proxy/fadein.go``), the compatibility mode: per request one
  uniform random threshold; an endpoint stays a candidate iff
  ``threshold < (age / duration) ** exponent``; if none stays, all do.
* **N-ring fade-in**, cslb's default: every scale-up event (one debounced batch of new
  pods) opens a ring that is the newest ring plus the new pods; ring ``k`` started at
  ``t_k`` carries share ``s_k(t) = clamp((t - t_k) / D, 0, 1) ** E``. A key draws
  ``u`` in ``[0, 1)`` from an independent re-mix of its hash and uses the newest ring
  with ``u < s_k(t)``, else the established ring. Shares of older rings are never below
  those of newer ones, so a key only ever moves forward (established → ring 1 → ring
  2 ...), moves only when its new ring puts it on a new pod, and never returns: each key
  moves at most once per scale event, and only to a pod it keeps in steady state.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lbcore.endpoints import endpoint_tuple, renumbered
from lbcore.errors import EndpointError, FadeError
from lbcore.kernel import hash_keys
from lbcore.numpy_kernel import view_choice
from lbcore.ring import DEFAULT_VNODES, Ring, check_hashes
from lbcore.views import CHOICE_NRING, draw_thresholds

__all__ = [
    "DEFAULT_FADE_DURATION_NS",
    "DEFAULT_FADE_EXPONENT",
    "FADE_SALT",
    "SKIPPER_SALT",
    "RingSet",
    "fade_share",
    "fadein_filter",
    "fadein_score",
    "fadein_scores",
    "skipper_fadein_candidates",
    "skipper_fadein_route",
]

#: Default fade window D: 30 s, in nanoseconds.
DEFAULT_FADE_DURATION_NS = 30_000_000_000
#: Default fade exponent E: 0.3 % of keys at 10 % of the window, 17.7 % at 50 %, 76.8 % at 90 %.
DEFAULT_FADE_EXPONENT = 2.5
#: Salt of the per-key draw ``u`` that chooses a ring (see :func:`lbcore.draws.unit_interval`).
FADE_SALT = 0x6661646520696E21
#: Salt of the per-key draw that stands in for Skipper's per-request random threshold in
#: Skipper fade-in mode (independent of the N-ring and gate draws).
SKIPPER_SALT = 0x736B697070657221

# Go's time.Duration saturates at the maximum int64; an endpoint with a zero detected time
# has that age, so it is fully faded in.
_MAX_DURATION_NS = (1 << 63) - 1


# --------------------------------------------------------------------------------------
# Skipper's fade-in (compatibility mode).


def fadein_score(lifetime_ns: int, duration_ns: int, exponent: float) -> float:
    """Skipper's ``fadeInScore``: ``(lifetime / duration) ** exponent`` while fading, else 1.

    Parameters
    ----------
    lifetime_ns
        Time since the endpoint was detected, in nanoseconds.
    duration_ns
        Fade-in duration, in nanoseconds.
    exponent
        Curve exponent.
    """
    if not (0 < lifetime_ns < duration_ns):
        return 1.0
    return math.pow(float(lifetime_ns) / float(duration_ns), exponent)


def fadein_filter(
    ages_ns: Sequence[int | None], duration_ns: int, exponent: float, threshold: float
) -> np.ndarray:
    """Skipper's ``filterFadeIn`` for one request.

    Parameters
    ----------
    ages_ns
        Per endpoint, ``now - detected time`` in nanoseconds; ``None`` for a zero detected
        time (fully in).
    duration_ns
        Fade-in duration in nanoseconds; ``<= 0`` disables fade-in (nothing filtered).
    exponent
        Curve exponent.
    threshold
        The request's uniform random draw in ``[0, 1)``.

    Returns
    -------
    numpy.ndarray
        Indices of the endpoints that stay candidates (all of them if none would).
    """
    scores = fadein_scores(ages_ns, duration_ns, exponent)
    keep = np.flatnonzero(threshold < scores)
    return keep if keep.size else np.arange(len(scores))


def fadein_scores(ages_ns: Sequence[int | None], duration_ns: int, exponent: float) -> np.ndarray:
    """:func:`fadein_score` of every endpoint (``None``: a zero detected time, fully in).

    With ``duration_ns <= 0`` (no ``fadeIn`` on the route) every score is 1.
    """
    if duration_ns <= 0:
        return np.ones(len(ages_ns))
    return np.array(
        [
            fadein_score(_MAX_DURATION_NS if a is None else a, duration_ns, exponent)
            for a in ages_ns
        ],
        dtype=np.float64,
    )


def skipper_fadein_candidates(
    scores: np.ndarray, thresholds: np.ndarray
) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """Group a batch by the candidate set Skipper's fade-in gives each key.

    Every key is a request with its own threshold; its candidates are the endpoints with
    ``threshold < score`` (all if none). The sets are nested, so there are at most as many
    groups as distinct scores.

    Yields
    ------
    (rows, mask)
        Positions of the keys in the batch and the boolean candidate mask they share.
    """
    levels = np.unique(scores)
    group = np.searchsorted(levels, thresholds, side="right")
    for g in np.unique(group).tolist():
        rows = np.flatnonzero(group == g)
        mask = scores >= levels[g] if g < levels.size else np.ones(scores.size, dtype=np.bool_)
        yield rows, mask


def skipper_fadein_route(
    ring: Ring,
    keys: Any,
    ages_ns: Sequence[int | None],
    duration_ns: int,
    exponent: float,
    thresholds: Any,
    *,
    loads: Any = None,
    balance_factor: float | None = None,
    max_hops: int | None = None,
    candidates: Any = None,
    attempt: int = 0,
    hashes: np.ndarray | None = None,
    scores: np.ndarray | None = None,
) -> np.ndarray:
    """Route a batch with Skipper's fade-in (compatibility mode): each key is one request.

    Parameters
    ----------
    ring
        The ring of all endpoints (Skipper builds it from every route endpoint).
    keys
        The batch; ignored when ``hashes`` is given.
    ages_ns
        Per endpoint, ``now - detected time`` in nanoseconds (``None``: fully in).
    duration_ns, exponent
        Skipper's ``fadeIn(duration, exponent)``; ``duration_ns <= 0`` disables it.
    thresholds
        One uniform draw in ``[0, 1)`` per key (the caller's seeded generator).
    loads, balance_factor, max_hops
        Optional bounded load, as in :meth:`lbcore.Ring.lookup_bounded` (Skipper itself
        has no hop cap: ``None``).
    candidates
        Boolean mask (or indices) of the endpoints on Skipper's endpoint list, say all
        but the ejected ones; ``None``: all. Skipper's fade-in filters that list: a
        key's candidates are the listed endpoints scoring above its threshold, or every
        listed endpoint if none does.
    attempt
        As in :meth:`lbcore.Ring.lookup`: ``1`` for the retry (the next distinct
        candidate).
    hashes
        Precomputed ``uint64`` key hashes.
    scores
        Precomputed :func:`fadein_scores` of ``ages_ns`` (then ``ages_ns`` is not read):
        a caller routing many batches at one instant computes them once per fading event.

    Returns
    -------
    numpy.ndarray
        ``int32`` endpoint indices (``-1`` when nothing is listed).
    """
    h = hash_keys(keys) if hashes is None else hashes
    thr = np.asarray(thresholds, dtype=np.float64)
    if thr.shape != h.shape:
        raise FadeError(f"need one threshold per key: {thr.shape} for {h.size} keys")
    if scores is None:
        scores = fadein_scores(ages_ns, duration_ns, exponent)
    if scores.size != len(ring.endpoints):
        raise FadeError(f"need one age per endpoint: {scores.size} for {len(ring.endpoints)}")
    listed = ring.listed_mask(candidates)
    if listed is not None:
        # Unlisted endpoints score below every threshold (thresholds are >= 0), so the
        # groups are Skipper's filter over the listed ones; the masks then drop them.
        scores = np.where(listed, scores, -1.0)
    out = np.empty(h.size, dtype=np.int32)
    for rows, mask in skipper_fadein_candidates(scores, thr):
        if listed is not None:
            mask &= listed
        out[rows] = ring.lookup_bounded(
            None,
            loads,
            balance_factor,
            candidates=mask,
            max_hops=max_hops,
            attempt=attempt,
            hashes=np.ascontiguousarray(h[rows]),
        )
    return out


# --------------------------------------------------------------------------------------
# N-ring fade-in.


def _share(elapsed_ns: float, duration_ns: int, exponent: float) -> float:
    if duration_ns <= 0:
        return 1.0
    return min(max(elapsed_ns / duration_ns, 0.0), 1.0) ** exponent


def fade_share(elapsed_ns: Any, duration_ns: int, exponent: float) -> np.ndarray | float:
    """Share of keys a fading ring carries: ``clamp(elapsed / duration, 0, 1) ** exponent``.

    Parameters
    ----------
    elapsed_ns
        Time since the ring's scale event, in nanoseconds (scalar or array).
    duration_ns
        Fade window ``D`` in nanoseconds (``<= 0``: no fade, share 1 at once).
    exponent
        Curve exponent ``E``.
    """
    if np.ndim(elapsed_ns):
        flat = np.asarray(elapsed_ns, dtype=np.float64).ravel().tolist()
        shares = [_share(x, duration_ns, exponent) for x in flat]
        return np.array(shares, dtype=np.float64).reshape(np.shape(elapsed_ns))
    return _share(float(elapsed_ns), duration_ns, exponent)


def _check_fade_params(duration_ns: Any, exponent: Any) -> tuple[int, float]:
    if isinstance(duration_ns, bool) or not isinstance(duration_ns, (int, np.integer)):
        raise FadeError(
            f"fade duration must be an integer number of nanoseconds, got {duration_ns!r}"
        )
    if duration_ns < 0:
        raise FadeError(f"fade duration must be >= 0 ns, got {duration_ns}")
    try:
        e = float(exponent)
    except (TypeError, ValueError):
        raise FadeError(f"fade exponent must be a finite number > 0, got {exponent!r}") from None
    if not math.isfinite(e) or e <= 0:
        raise FadeError(f"fade exponent must be a finite number > 0, got {exponent!r}")
    return int(duration_ns), e


class RingSet:
    """An established ring plus fading rings, one per scale-up event. Immutable.

    Endpoints share one index space (:attr:`endpoints`); ring ``k`` holds the endpoints
    whose :attr:`tiers` value is ``<= k`` (tier 0: established; tier ``k``: added by the
    ``k``-th fading event still in progress). Operations return new sets.

    Parameters
    ----------
    endpoints
        Endpoint addresses, unique.
    tiers
        Per endpoint, 0 (established) or the 1-based fading event that added it.
    starts_ns
        Start time of each fading event, oldest first (CLOCK_MONOTONIC nanoseconds).
    duration_ns, exponent
        The fade curve.
    vnodes
        Virtual nodes per endpoint.
    newest
        Optionally, the ring of all ``endpoints`` (reused instead of rebuilt).
    """

    __slots__ = (
        "duration_ns",
        "endpoints",
        "exponent",
        "rings",
        "starts_ns",
        "tiers",
        "vnodes",
    )

    def __init__(
        self,
        endpoints: Sequence[str],
        tiers: Sequence[int] | np.ndarray | None = None,
        starts_ns: Sequence[int] = (),
        *,
        duration_ns: int = DEFAULT_FADE_DURATION_NS,
        exponent: float = DEFAULT_FADE_EXPONENT,
        vnodes: int = DEFAULT_VNODES,
        newest: Ring | None = None,
        _older: Sequence[Ring] | None = None,
    ) -> None:
        self.duration_ns, self.exponent = _check_fade_params(duration_ns, exponent)
        eps = endpoint_tuple(endpoints, allow_empty=True)
        tier = np.zeros(len(eps), dtype=np.int32) if tiers is None else np.array(tiers, np.int32)
        starts = tuple(int(s) for s in starts_ns)
        if tier.shape != (len(eps),):
            raise FadeError(f"tiers has {tier.size} entries for {len(eps)} endpoints")
        if tier.size and (int(tier.min()) < 0 or int(tier.max()) > len(starts)):
            raise FadeError(f"tiers must be in 0..{len(starts)} (one per fading event)")
        if any(b < a for a, b in itertools.pairwise(starts)):
            raise FadeError(f"fading events must be ordered oldest first, got {starts}")
        # Normalize: drop events that added no live endpoint; if nothing is established,
        # the oldest fading ring is the only place for keys, so it becomes established.
        live = [k for k in range(1, len(starts) + 1) if (tier == k).any()]
        if len(live) != len(starts) or (starts and not (tier == 0).any()):
            _older = None  # tiers change: the older rings are not those given
            remap = np.zeros(len(starts) + 1, dtype=np.int32)
            for new, old in enumerate(live, start=1):
                remap[old] = new
            tier = remap[tier]
            starts = tuple(starts[k - 1] for k in live)
        while starts and not (tier == 0).any():
            tier = np.maximum(tier - 1, 0).astype(np.int32)
            starts = starts[1:]
        self.endpoints = eps
        self.tiers = tier
        self.starts_ns = starts
        self.vnodes = vnodes
        rings: list[Ring] = []
        node_tier = None
        if eps:
            full = newest if newest is not None else Ring(eps, vnodes)
            if full.endpoints != eps:
                raise FadeError("newest ring endpoints differ from the ring set's endpoints")
            if starts:
                node_tier = tier.take(full.owners)
            if _older is not None and len(_older) == len(starts):
                # A scale-up: the older rings keep their nodes and bucket tables; only
                # their endpoint list grows.
                rings.extend(r.with_more_endpoints(eps, full.host_ids) for r in _older)
            else:
                for k in range(len(starts)):
                    # Exactly the endpoints of tiers <= k: never widened to host aliases.
                    rings.append(full.keep_nodes(node_tier <= k))
            rings.append(full)
        self.rings: tuple[Ring, ...] = tuple(rings)

    @classmethod
    def from_parts(
        cls,
        endpoints: tuple[str, ...],
        tiers: np.ndarray,
        starts_ns: tuple[int, ...],
        rings: tuple[Ring, ...],
        *,
        duration_ns: int,
        exponent: float,
        vnodes: int = DEFAULT_VNODES,
    ) -> RingSet:
        """Wrap a ring set that was built elsewhere (a published table) without rebuilding.

        The parts are what a built set holds (:attr:`endpoints`, :attr:`tiers`,
        :attr:`rings`, ...); a reader of shared memory validates them first. Only shapes
        are checked here.
        """
        duration, exp = _check_fade_params(duration_ns, exponent)
        n_rings = len(rings)
        if n_rings != len(starts_ns) + 1 or tiers.shape != (len(endpoints),):
            raise FadeError(
                f"ring set parts disagree: {n_rings} rings for {len(starts_ns)} fading events, "
                f"{tiers.size} tiers for {len(endpoints)} endpoints"
            )
        rs = cls.__new__(cls)
        rs.endpoints, rs.tiers, rs.starts_ns = endpoints, tiers, starts_ns
        rs.duration_ns, rs.exponent, rs.vnodes = duration, exp, vnodes
        rs.rings = rings
        return rs

    # ---------------------------------------------------------------------------------
    # Derived values.

    def __repr__(self) -> str:
        return (
            f"RingSet({len(self.endpoints)} endpoints, {len(self.starts_ns)} fading ring(s), "
            f"D={self.duration_ns / 1e9:g}s, E={self.exponent:g})"
        )

    @property
    def newest(self) -> Ring | None:
        """The ring of all endpoints (the newest ring), or ``None`` when empty."""
        return self.rings[-1] if self.rings else None

    def share_list(self, now_ns: int) -> list[float]:
        """Current share of each fading ring, oldest first, as Python floats."""
        return [_share(now_ns - s, self.duration_ns, self.exponent) for s in self.starts_ns]

    def shares(self, now_ns: int) -> np.ndarray:
        """Current share of each fading ring, oldest first."""
        return np.array(self.share_list(now_ns), dtype=np.float64)

    def ring_choice(self, hashes: np.ndarray, now_ns: int) -> np.ndarray:
        """The ring each key uses at ``now_ns`` (N-ring fade-in), as the plans choose it.

        ``intp`` per key: the newest ring whose share is above the key's draw, else 0
        (the NumPy kernel's choice, which both kernels are tested to make alike).
        """
        h = check_hashes(hashes)
        if len(self.rings) < 2:
            return np.zeros(h.size, dtype=np.intp)
        thresholds, saturated = draw_thresholds(self.share_list(now_ns))
        return view_choice(CHOICE_NRING, FADE_SALT, thresholds, saturated, h)

    # ---------------------------------------------------------------------------------
    # Events.

    def scale_up(self, new_endpoints: Sequence[str], now_ns: int) -> RingSet:
        """A new ring: the newest ring plus ``new_endpoints``, fading in from ``now_ns``."""
        new = endpoint_tuple(new_endpoints, allow_empty=True)
        if not new:
            return self
        if not self.endpoints:
            return RingSet(
                new, duration_ns=self.duration_ns, exponent=self.exponent, vnodes=self.vnodes
            )
        dup = sorted(set(new) & set(self.endpoints))  # duplicates within `new`: endpoint_tuple
        if dup:
            raise EndpointError(f"scale-up adds endpoints that already exist: {dup[:5]}")
        if self.starts_ns and now_ns < self.starts_ns[-1]:
            raise FadeError(
                f"scale-up at {now_ns} ns is earlier than the newest fading event "
                f"({self.starts_ns[-1]} ns); time must not run backwards"
            )
        tiers = np.concatenate((self.tiers, np.full(len(new), len(self.starts_ns) + 1, np.int32)))
        newest = self.newest
        return RingSet(
            self.endpoints + new,
            tiers,
            (*self.starts_ns, int(now_ns)),
            duration_ns=self.duration_ns,
            exponent=self.exponent,
            vnodes=self.vnodes,
            newest=None if newest is None else newest.with_added(new),
            _older=self.rings,
        )

    def remove(self, endpoints: Iterable[str]) -> RingSet:
        """Drop endpoints from every ring at once (deleted pods get nothing from now on)."""
        gone = set(endpoint_tuple(endpoints, allow_empty=True, allow_duplicates=True))
        if not gone & set(self.endpoints):
            return self
        keep = np.array([ep not in gone for ep in self.endpoints], dtype=np.bool_)
        eps = tuple(ep for ep in self.endpoints if ep not in gone)
        newest = None
        if self.newest is not None and keep.any():
            # Exactly the kept endpoints' nodes (an alias of a removed endpoint on the
            # same host must not keep them), re-indexed into the compacted list; the
            # bucket table is built once, here.
            new_index = (np.cumsum(keep, dtype=np.int32) - 1).astype(np.int32)
            newest = self.newest.keep_nodes(
                keep.take(self.newest.owners),
                endpoints=eps,
                reindex=new_index,
                host_ids=renumbered(self.newest.host_ids[keep]),
            )
        return RingSet(
            eps,
            self.tiers[keep],
            self.starts_ns,
            duration_ns=self.duration_ns,
            exponent=self.exponent,
            vnodes=self.vnodes,
            newest=newest,
        )

    def advance(self, now_ns: int) -> RingSet:
        """Collapse completed fades: the newest ring at share 1 becomes the established ring."""
        if not self.starts_ns:
            return self
        done = [k for k, s in enumerate(self.starts_ns, start=1) if now_ns - s >= self.duration_ns]
        if not done:
            return self
        k = done[-1]
        tiers = np.where(self.tiers <= k, 0, self.tiers - k).astype(np.int32)
        return RingSet(
            self.endpoints,
            tiers,
            self.starts_ns[k:],
            duration_ns=self.duration_ns,
            exponent=self.exponent,
            vnodes=self.vnodes,
            newest=self.newest,
        )

    def with_endpoints(self, endpoints: Sequence[str], now_ns: int) -> RingSet:
        """Apply a new endpoint list: deletions at once, additions as one scale-up event."""
        wanted = list(endpoint_tuple(endpoints, allow_empty=True))
        current = set(self.endpoints)
        gone = current - set(wanted)
        added = [ep for ep in wanted if ep not in current]
        out = self.remove(gone) if gone else self
        return out.scale_up(added, now_ns) if added else out
