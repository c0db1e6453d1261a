"""The client side: every routing decision is made by :mod:`lbcore`.

Three fade-in modes, each a small class over the same interface (``publish``,
``remove``, ``route``):

* ``none``: one :class:`lbcore.Ring` of the published pods; new pods take their full
  share the moment they are published;
* ``skipper``: Skipper's probabilistic fade-in: one ring of the published pods, and per
  call one uniform threshold choosing the candidates through
  :func:`lbcore.fade.skipper_fadein_candidates` with scores from
  :func:`lbcore.fadein_score` (each pod's age counted from its own detection);
* ``nring``: cslb's N-ring fade-in, an :class:`lbcore.RingSet` with one ring per
  published scale-up event.

Bounded load, when a balance factor is set, is lbcore's too (``lookup_bounded`` /
``RingSet.route(loads=...)``). The simulator only translates between its global pod
numbers and each ring's endpoint indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import lbcore
from lbcore.fade import skipper_fadein_candidates

__all__ = ["FADE_MODES", "Router", "endpoint_name", "make_router"]

FADE_MODES = ("none", "skipper", "nring")


def endpoint_name(pod: int) -> str:
    """The address a simulated pod is hashed under (Skipper hashes ``scheme://ip:port``)."""
    return f"http://10.{pod // 65536 % 256}.{pod // 256 % 256}.{pod % 256}:8080"


def _ns(t_s: float) -> int:
    return round(t_s * 1e9)


class Router:
    """Routes calls to global pod numbers; subclasses hold the lbcore structures."""

    mode = ""

    def __init__(self, balance_factor: float | None, max_hops: int | None, vnodes: int) -> None:
        self.balance_factor = balance_factor
        self.max_hops = max_hops
        self.vnodes = vnodes
        self.pod_of = np.empty(0, dtype=np.int64)  # ring endpoint index -> global pod

    @property
    def members(self) -> np.ndarray:
        """Global numbers of the pods currently in the routing table."""
        return self.pod_of

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        raise NotImplementedError

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        raise NotImplementedError

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        """Global pod number for every call; ``loads`` is indexed by global pod."""
        raise NotImplementedError

    def _bounded(self, loads: np.ndarray | None) -> np.ndarray | None:
        if self.balance_factor is None:
            return None
        if loads is None:
            raise ValueError("bounded-load routing needs a load snapshot")
        return loads[self.pod_of]


class PlainRouter(Router):
    """No fade-in: one ring of all published pods."""

    mode = "none"

    def __init__(self, pods: Sequence[int], *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._rebuild(list(pods))

    def _rebuild(self, pods: list[int]) -> None:
        self.pod_of = np.array(pods, dtype=np.int64)
        self.ring = lbcore.Ring([endpoint_name(p) for p in pods], vnodes=self.vnodes)

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        self._rebuild([*self.pod_of.tolist(), *pods])

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        gone = set(pods)
        self._rebuild([p for p in self.pod_of.tolist() if p not in gone])

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        ring_loads = self._bounded(loads)
        if ring_loads is None:
            idx = self.ring.lookup(None, hashes=hashes)
        else:
            idx = self.ring.lookup_bounded(
                None, ring_loads, self.balance_factor, max_hops=self.max_hops, hashes=hashes
            )
        return self.pod_of[idx]


class SkipperRouter(PlainRouter):
    """Skipper's fade-in: a random threshold per call filters young pods."""

    mode = "skipper"

    def __init__(
        self,
        pods: Sequence[int],
        balance_factor: float | None,
        max_hops: int | None,
        vnodes: int,
        *,
        duration_s: float,
        exponent: float,
        rng: np.random.Generator,
    ) -> None:
        self.detected: dict[int, int | None] = {p: None for p in pods}  # None: long ago
        self.duration_ns = _ns(duration_s)
        self.exponent = exponent
        self.rng = rng
        super().__init__(pods, balance_factor, max_hops, vnodes)

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        for p in pods:
            self.detected[p] = _ns(now_s)
        super().publish(pods, now_s)

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        for p in pods:
            self.detected.pop(p, None)
        super().remove(pods, now_s)

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        now = _ns(now_s)
        scores = np.array(
            [
                1.0
                if self.detected[p] is None
                else lbcore.fadein_score(now - self.detected[p], self.duration_ns, self.exponent)
                for p in self.pod_of.tolist()
            ]
        )
        thresholds = self.rng.random(hashes.size)
        ring_loads = self._bounded(loads)
        out = np.empty(hashes.size, dtype=np.int64)
        for rows, mask in skipper_fadein_candidates(scores, thresholds):
            if ring_loads is None:
                idx = self.ring.lookup(None, candidates=mask, hashes=hashes[rows])
            else:
                idx = self.ring.lookup_bounded(
                    None,
                    ring_loads,
                    self.balance_factor,
                    candidates=mask,
                    max_hops=self.max_hops,
                    hashes=hashes[rows],
                )
            out[rows] = self.pod_of[idx]
        return out


class NRingRouter(Router):
    """cslb's N-ring fade-in: one :class:`lbcore.RingSet`, one ring per published event."""

    mode = "nring"

    def __init__(
        self,
        pods: Sequence[int],
        balance_factor: float | None,
        max_hops: int | None,
        vnodes: int,
        *,
        duration_s: float,
        exponent: float,
    ) -> None:
        super().__init__(balance_factor, max_hops, vnodes)
        self.rings = lbcore.RingSet(
            [endpoint_name(p) for p in pods],
            duration_ns=_ns(duration_s),
            exponent=exponent,
            vnodes=vnodes,
        )
        self._pod_by_name = {endpoint_name(p): p for p in pods}
        self._sync()

    def _sync(self) -> None:
        self.pod_of = np.array([self._pod_by_name[e] for e in self.rings.endpoints], dtype=np.int64)

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        self._pod_by_name.update({endpoint_name(p): p for p in pods})
        self.rings = self.rings.scale_up([endpoint_name(p) for p in pods], _ns(now_s))
        self._sync()

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        self.rings = self.rings.remove([endpoint_name(p) for p in pods])
        self._sync()

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        now = _ns(now_s)
        self.rings = self.rings.advance(now)  # same endpoints, fewer rings once a fade ends
        ring_loads = self._bounded(loads)
        idx = self.rings.route(
            None,
            now,
            loads=ring_loads,
            balance_factor=self.balance_factor,
            max_hops=self.max_hops,
            hashes=hashes,
        )
        return self.pod_of[idx]


def make_router(
    mode: str,
    pods: Sequence[int],
    *,
    balance_factor: float | None,
    max_hops: int | None,
    vnodes: int,
    fade_s: float,
    fade_exponent: float,
    rng: np.random.Generator,
) -> Router:
    """Build the router of a fade-in ``mode`` (one of :data:`FADE_MODES`)."""
    if mode == "none":
        return PlainRouter(pods, balance_factor, max_hops, vnodes)
    if mode == "skipper":
        return SkipperRouter(
            pods,
            balance_factor,
            max_hops,
            vnodes,
            duration_s=fade_s,
            exponent=fade_exponent,
            rng=rng,
        )
    if mode == "nring":
        return NRingRouter(
            pods, balance_factor, max_hops, vnodes, duration_s=fade_s, exponent=fade_exponent
        )
    raise ValueError(f"unknown fade-in mode {mode!r}; expected one of {', '.join(FADE_MODES)}")
