"""Four ways a caller in one availability zone picks a pod, each over lbcore's routing.

* :class:`NoZones`: Skipper's ring over every pod, zones ignored;
* :class:`HardFilter`: Skipper's zone routing (``-kubernetes-topology-zone``): only the
  caller's zone's endpoints when it has at least ``min_pods`` of them, else all;
* :class:`RequestSplit`: Envoy's way: each *request* goes local with probability
  ``x_z = min(x, cap_z)`` whatever its key (a ring over the local pods), else to the
  ring of every pod, so a key is on a local pod for some requests and a remote one for
  others. Each ring is a child balancer with its own bounded load, as Envoy's
  per-locality balancers are: it counts only the calls it routed and sets its bar over
  its own pods (:attr:`Strategy.views` is 2);
* :class:`KeySplit`: cslb's zone rules (:mod:`lbcore.zones`): a *key* is local when its
  independent draw, salted with the caller's zone, is below ``x_z``; the zone's ring is
  the global ring restricted to its pods, and the bounded-load bars come from the plan.

Every strategy routes a caller zone's calls of one tick on one plan per ring, with the
zone's own load views (bounded load on, unless the balance factor is ``None``): one
view per child balancer (:attr:`Strategy.views`), each counting the calls it routed. The
split strategies share ``x_z`` (:func:`zone_shares`): the cap is lbcore's
(:func:`lbcore.zones.zone_cap`, Envoy's residual-capacity arithmetic). Rings over a
subset of pods hash the same endpoint names, so a local ring is the global ring
restricted to the local pods, as Skipper builds it from a filtered endpoint list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lbcore.plan import Plan
from lbcore.zones import ZoneSplit, zone_cap
from perf.sim.routing import PlainRouter, RingOptions

__all__ = [
    "STRATEGIES",
    "HardFilter",
    "KeySplit",
    "Layout",
    "NoZones",
    "RequestSplit",
    "Strategy",
    "make_strategy",
    "zone_names",
    "zone_shares",
]


#: Strategy names, in table order.
STRATEGIES = ("no zones", "hard filter", "request split", "cslb")


def zone_names(count: int) -> tuple[str, ...]:
    """``z-a``, ``z-b``, ... for ``count`` zones."""
    return tuple(f"z-{chr(ord('a') + i)}" for i in range(count))


class Layout:
    """Pods and callers per zone.

    Parameters
    ----------
    pods
        Pods per zone; pods are numbered zone by zone.
    callers
        Caller hosts per zone (traffic from a zone is in proportion to them).

    Attributes
    ----------
    zone_of : numpy.ndarray
        Zone of every pod.
    names : tuple[str, ...]
        Zone names (:func:`zone_names`).
    """

    def __init__(self, pods: Sequence[int], callers: Sequence[float]) -> None:
        if len(pods) != len(callers) or not pods:
            raise ValueError(f"pods {pods} and callers {callers} must name the same zones")
        self.pods = tuple(int(p) for p in pods)
        self.callers = tuple(float(c) for c in callers)
        self.zone_of = np.repeat(np.arange(len(pods)), self.pods)
        self.names = zone_names(len(pods))

    @property
    def zones(self) -> int:
        """Number of zones."""
        return len(self.pods)

    def local(self, zone: int) -> np.ndarray:
        """Global numbers of ``zone``'s pods."""
        return np.flatnonzero(self.zone_of == zone)


def zone_shares(layout: Layout, x: float) -> np.ndarray:
    """``x_z = min(x, cap_z)`` per zone, the cap from :func:`lbcore.zones.zone_cap`."""
    pods = dict(zip(layout.names, layout.pods, strict=True))
    callers = dict(zip(layout.names, layout.callers, strict=True))
    return np.array([min(x, zone_cap(pods, callers, z)) for z in layout.names])


class Strategy:
    """Routes one caller zone's calls to global pod numbers.

    Parameters
    ----------
    layout
        Pods and callers per zone.
    balance_factor
        Bounded load's factor, or ``None`` for plain consistent hashing.
    max_hops, vnodes
        As for :class:`perf.sim.routing.PlainRouter`.
    """

    name = ""
    #: Each zone's ``x_z`` (split strategies), else ``None``.
    shares: np.ndarray | None = None
    #: Load views per caller zone: child balancers that each count only their own calls.
    views = 1

    def __init__(
        self, layout: Layout, balance_factor: float | None, max_hops: int | None, vnodes: int
    ) -> None:
        self.layout = layout
        self.balance_factor = balance_factor
        self.max_hops = max_hops
        self.vnodes = vnodes
        self.everyone = self._ring(range(len(layout.zone_of)))

    @property
    def label(self) -> str:
        """The table's row name."""
        return self.name

    def _ring(self, pods: Sequence[int]) -> PlainRouter:
        return PlainRouter(list(pods), RingOptions(self.balance_factor, self.max_hops, self.vnodes))

    def route(
        self,
        zone: int,
        hashes: np.ndarray,
        now_s: float,
        loads: np.ndarray | None,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """Global pod of every call from ``zone``, and the load view that routed it.

        Parameters
        ----------
        loads
            Per view (:attr:`views` rows), load per global pod in call units; ``None``
            without bounded load.

        Returns
        -------
        pods : numpy.ndarray
            Global pod number per call.
        view : numpy.ndarray or None
            The view (child balancer) of every call; ``None``: view 0 for all.
        """
        raise NotImplementedError


class NoZones(Strategy):
    """Skipper's ring over every pod."""

    name = "no zones"

    def route(
        self,
        zone: int,
        hashes: np.ndarray,
        now_s: float,
        loads: np.ndarray | None,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        return self.everyone.route(hashes, now_s, _view(loads, 0)), None


class HardFilter(Strategy):
    """Skipper's filter: the zone's pods when it has ``min_pods`` of them, else every pod."""

    name = "hard filter"

    def __init__(
        self,
        layout: Layout,
        balance_factor: float | None,
        max_hops: int | None,
        vnodes: int,
        *,
        min_pods: int,
    ) -> None:
        super().__init__(layout, balance_factor, max_hops, vnodes)
        self.rings = [
            self._ring(layout.local(z).tolist()) if layout.pods[z] >= min_pods else self.everyone
            for z in range(layout.zones)
        ]

    def route(
        self,
        zone: int,
        hashes: np.ndarray,
        now_s: float,
        loads: np.ndarray | None,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        return self.rings[zone].route(hashes, now_s, _view(loads, 0)), None


class RequestSplit(Strategy):
    """Each request local with probability ``x_z`` (Envoy's zone-aware split), any key.

    View 0 is the local ring's, view 1 the global ring's: each ring's bar is over its own
    pods and the calls it routed, so local requests do not make local pods look
    overloaded to the global ring.
    """

    name = "request split"
    views = 2

    def __init__(
        self,
        layout: Layout,
        balance_factor: float | None,
        max_hops: int | None,
        vnodes: int,
        *,
        share: float,
    ) -> None:
        super().__init__(layout, balance_factor, max_hops, vnodes)
        self.share = share
        self.shares = zone_shares(layout, share)
        self.local = [
            self._ring(layout.local(z).tolist()) if layout.pods[z] else None
            for z in range(layout.zones)
        ]

    @property
    def label(self) -> str:
        return f"{self.name} x={self.share:g}"

    def route(
        self,
        zone: int,
        hashes: np.ndarray,
        now_s: float,
        loads: np.ndarray | None,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        out = np.empty(hashes.size, dtype=np.int64)
        ring = self.local[zone]
        here = rng.random(hashes.size) < self.shares[zone]
        if ring is None:
            here[:] = False
        if here.any():
            out[here] = ring.route(hashes[here], now_s, _view(loads, 0))
        if not here.all():
            out[~here] = self.everyone.route(hashes[~here], now_s, _view(loads, 1))
        return out, np.where(here, 0, 1).astype(np.int8)


class KeySplit(Strategy):
    """cslb: lbcore's zone plan (key split, zone ring, bars from the plan)."""

    name = "cslb"

    def __init__(
        self,
        layout: Layout,
        balance_factor: float | None,
        max_hops: int | None,
        vnodes: int,
        *,
        share: float,
        min_pods: int,
    ) -> None:
        super().__init__(layout, balance_factor, max_hops, vnodes)
        self.min_pods = min_pods
        self.rings = self.everyone.rings
        self.set_share(share)

    @property
    def label(self) -> str:
        return f"{self.name} x={self.share:g}"

    def set_share(self, share: float) -> None:
        """Move every zone's ``x`` to ``min(share, cap)`` (the ramp's step)."""
        self.share = share
        self.shares = zone_shares(self.layout, share)
        self.splits = [self._split(z, float(s)) for z, s in enumerate(self.shares)]

    def set_zone_share(self, zone: int, x: float) -> None:
        """Set one zone's ``x`` as given (a controller's, already within the cap)."""
        assert self.shares is not None
        if float(self.shares[zone]) == x:
            return
        self.shares = self.shares.copy()
        self.shares[zone] = x
        self.splits[zone] = self._split(zone, float(x))

    def _split(self, zone: int, x: float) -> ZoneSplit:
        """Zone ``zone``'s split at ``x``, named: each zone draws its own local keys."""
        return ZoneSplit(
            self.layout.zone_of == zone, x, min_pods=self.min_pods, name=self.layout.names[zone]
        )

    def route(
        self,
        zone: int,
        hashes: np.ndarray,
        now_s: float,
        loads: np.ndarray | None,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        plan = Plan(
            self.rings,
            round(now_s * 1e9),
            loads=None if self.balance_factor is None else _view(loads, 0),
            balance_factor=self.balance_factor,
            max_hops=self.max_hops,
            fade_mode="off",
            max_key_bytes=None,
            zone=self.splits[zone],
        )
        idx = plan.route_hashes(hashes)[0]
        if idx.size and int(idx.min()) < 0:
            raise RuntimeError(f"lbcore's zone plan fell back for {int((idx < 0).sum())} calls")
        return idx.astype(np.int64), None


def _view(loads: np.ndarray | None, view: int) -> np.ndarray | None:
    """One view's row of ``loads`` (``None`` stays ``None``)."""
    return None if loads is None else loads[view]


def make_strategy(
    name: str,
    layout: Layout,
    *,
    share: float = math.nan,
    balance_factor: float | None,
    max_hops: int | None,
    vnodes: int,
    min_pods: int,
) -> Strategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`), at ``share`` = x if split."""
    common = (layout, balance_factor, max_hops, vnodes)
    if name == "no zones":
        return NoZones(*common)
    if name == "hard filter":
        return HardFilter(*common, min_pods=min_pods)
    if name == "request split":
        return RequestSplit(*common, share=share)
    if name == "cslb":
        return KeySplit(*common, share=share, min_pods=min_pods)
    raise ValueError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}")
