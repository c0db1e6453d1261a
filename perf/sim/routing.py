"""The client side: every routing decision is made by :mod:`lbcore`, on its plans.

One small class per fade-in mode of :data:`lbcore.knobs.FADE_MODES`, each over the same
interface (``publish``, ``remove``, ``route``). Each tick routes on one
:class:`lbcore.Plan` per client load snapshot, as a worker does:

* ``off``: a ring set of the published pods, no fading ring; new pods take their full
  share the moment they are published;
* ``n-ring``: cslb's N-ring fade-in, an :class:`lbcore.RingSet` with one ring per
  published scale-up event;
* ``skipper``: Skipper's probabilistic fade-in with one uniform random threshold per
  call, as Skipper draws it per request (each pod's age counted from its own
  detection). The worker's plan draws the threshold from the key's hash instead, so
  a key keeps its pod between requests; to simulate Skipper itself this mode uses
  :func:`lbcore.fade.skipper_fadein_route`, which groups the calls by the candidate
  set their threshold gives them and routes each group on a plan of its own.

Bounded load, when a balance factor is set, is the plans' too. The simulator only
translates between its global pod numbers and each ring's endpoint indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import lbcore
from lbcore.fade import skipper_fadein_route
from lbcore.knobs import FADE_MODES
from lbcore.plan import Plan

__all__ = [
    "FADE_MODES",
    "FadeIn",
    "NRingRouter",
    "PlainRouter",
    "RingOptions",
    "Router",
    "SimRoutingError",
    "SkipperRouter",
    "endpoint_name",
    "make_router",
]


class SimRoutingError(RuntimeError):
    """lbcore answered something the simulator cannot route (a fallback, ``-1``)."""


def endpoint_name(pod: int) -> str:
    """The address a simulated pod is hashed under (Skipper hashes ``scheme://ip:port``)."""
    return f"http://10.{pod // 65536 % 256}.{pod // 256 % 256}.{pod % 256}:8080"


def _ns(t_s: float) -> int:
    return round(t_s * 1e9)


@dataclass(frozen=True, slots=True)
class RingOptions:
    """How every router's rings are built and walked.

    Attributes
    ----------
    balance_factor
        Bounded load's factor, or ``None`` for plain consistent hashing.
    max_hops
        Hop cap of the bounded-load walk (``None``: a full lap).
    vnodes
        Virtual nodes per pod.
    """

    balance_factor: float | None
    max_hops: int | None
    vnodes: int


@dataclass(frozen=True, slots=True)
class FadeIn:
    """A fade-in curve: Skipper's ``fadeIn`` or cslb's N-ring window.

    Attributes
    ----------
    duration_s
        The fade window, in seconds.
    exponent
        The curve's exponent.
    """

    duration_s: float
    exponent: float


class Router:
    """Routes calls to global pod numbers; subclasses hold the lbcore structures.

    Parameters
    ----------
    ring
        How the rings are built and walked.
    """

    mode = ""

    def __init__(self, ring: RingOptions) -> None:
        self.balance_factor = ring.balance_factor
        self.max_hops = ring.max_hops
        self.vnodes = ring.vnodes
        self.pod_of = np.empty(0, dtype=np.int64)  # ring endpoint index -> global pod

    @property
    def members(self) -> np.ndarray:
        """Global numbers of the pods currently in the routing table."""
        return self.pod_of

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        """Add ``pods`` to the routing table at ``now_s`` (seconds)."""
        raise NotImplementedError

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        """Take ``pods`` out of the routing table at ``now_s`` (seconds)."""
        raise NotImplementedError

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        """Global pod number for every call.

        Parameters
        ----------
        hashes
            ``uint64`` key hashes (:func:`lbcore.hash_keys`).
        now_s
            The present, in seconds.
        loads
            Load per *global* pod number (needed when a balance factor is set).
        """
        raise NotImplementedError

    def _ring_loads(self, loads: np.ndarray | None) -> np.ndarray | None:
        """``loads`` (by global pod) reordered to the ring's endpoint indices."""
        if self.balance_factor is None:
            return None
        if loads is None:
            raise ValueError("bounded-load routing needs a load snapshot")
        return loads[self.pod_of]

    def _plan(
        self, rings: lbcore.RingSet, now_ns: int, loads: np.ndarray | None, mode: str
    ) -> Plan:
        """The plan of one load snapshot at ``now_ns`` (no gate, no key length limit)."""
        return Plan(
            rings,
            now_ns,
            loads=self._ring_loads(loads),
            balance_factor=self.balance_factor,
            max_hops=self.max_hops,
            fade_mode=mode,
            max_key_bytes=None,
        )

    def to_pods(self, idx: np.ndarray) -> np.ndarray:
        """The global pods of ring endpoint indices ``idx`` (an lbcore routing answer).

        Raises
        ------
        SimRoutingError
            lbcore answered its fallback for some call: the simulator has no gate and
            never an empty table, so that is a bug, never a pod.
        """
        if idx.size and int(idx.min()) < 0:
            raise SimRoutingError(
                f"lbcore returned fallback ({lbcore.FALLBACK}) for "
                f"{int((idx < 0).sum())} of {idx.size} calls; the simulator has no gate and "
                "never an empty table, so every call must get a pod"
            )
        return self.pod_of[idx]


class PlainRouter(Router):
    """No fade-in (``off``): one ring of all published pods."""

    rings: lbcore.RingSet

    mode = "off"

    def __init__(self, pods: Sequence[int], ring: RingOptions) -> None:
        super().__init__(ring)
        self._rebuild(list(pods))

    def _rebuild(self, pods: list[int]) -> None:
        self.pod_of = np.array(pods, dtype=np.int64)
        self.rings = lbcore.RingSet([endpoint_name(p) for p in pods], vnodes=self.vnodes)

    @property
    def ring(self) -> lbcore.Ring:
        """The ring of the published pods."""
        assert self.rings.newest is not None
        return self.rings.newest

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        """Add ``pods``; they take their full share at once."""
        self._rebuild([*self.pod_of.tolist(), *pods])

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        """Take ``pods`` out of the ring."""
        gone = set(pods)
        self._rebuild([p for p in self.pod_of.tolist() if p not in gone])

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        """The plan of this snapshot (bounded load with a balance factor)."""
        plan = self._plan(self.rings, _ns(now_s), loads, "off")
        return self.to_pods(plan.route_hashes(hashes)[0])


class SkipperRouter(PlainRouter):
    """Skipper's fade-in: a uniform threshold per call filters young pods.

    Parameters
    ----------
    pods
        The established pods (fully faded in).
    ring
        As for :class:`Router`.
    fade
        Skipper's ``fadeIn`` duration and exponent.
    rng
        Draws the per-call thresholds.
    """

    mode = "skipper"

    def __init__(
        self, pods: Sequence[int], ring: RingOptions, fade: FadeIn, rng: np.random.Generator
    ) -> None:
        self.detected: dict[int, int | None] = dict.fromkeys(pods)  # None: long ago
        self.duration_ns = _ns(fade.duration_s)
        self.exponent = fade.exponent
        self.rng = rng
        super().__init__(pods, ring)

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        """Detect ``pods`` at ``now_s``: their fade-in clocks start.

        Skipper stamps the detected time when it first sees an endpoint, and a request
        always comes strictly later; :func:`lbcore.fadein_score` treats an age of exactly
        0 as "not fading" (full share). The simulator routes at the tick's start, the
        same instant it publishes, so the stamp is 1 ns earlier: the first calls see
        the pod at score ~0, as Skipper's would.
        """
        for p in pods:
            self.detected[p] = _ns(now_s) - 1
        super().publish(pods, now_s)

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        """Forget ``pods`` (deleted)."""
        for p in pods:
            self.detected.pop(p, None)
        super().remove(pods, now_s)

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        """:func:`lbcore.fade.skipper_fadein_route` with one fresh threshold per call."""
        now = _ns(now_s)
        detected = [self.detected[p] for p in self.pod_of.tolist()]
        ages = [None if d is None else now - d for d in detected]
        thresholds = self.rng.random(hashes.size)
        idx = skipper_fadein_route(
            self.ring,
            None,
            ages,
            self.duration_ns,
            self.exponent,
            thresholds,
            loads=self._ring_loads(loads),
            balance_factor=self.balance_factor,
            max_hops=self.max_hops,
            hashes=hashes,
        )
        return self.to_pods(idx)


class NRingRouter(Router):
    """cslb's N-ring fade-in: one :class:`lbcore.RingSet`, one ring per published event.

    Parameters
    ----------
    pods
        The pods of the established ring.
    ring
        As for :class:`Router`.
    fade
        The fade window ``D`` and curve exponent ``E``.
    """

    mode = "n-ring"

    def __init__(self, pods: Sequence[int], ring: RingOptions, fade: FadeIn) -> None:
        super().__init__(ring)
        self.rings = lbcore.RingSet(
            [endpoint_name(p) for p in pods],
            duration_ns=_ns(fade.duration_s),
            exponent=fade.exponent,
            vnodes=ring.vnodes,
        )
        self._pod_by_name = {endpoint_name(p): p for p in pods}
        self._sync()

    def _sync(self) -> None:
        self.pod_of = np.array([self._pod_by_name[e] for e in self.rings.endpoints], dtype=np.int64)

    def publish(self, pods: Sequence[int], now_s: float) -> None:
        """One scale-up event: ``RingSet.scale_up`` at ``now_s``."""
        self._pod_by_name.update({endpoint_name(p): p for p in pods})
        self.rings = self.rings.scale_up([endpoint_name(p) for p in pods], _ns(now_s))
        self._sync()

    def remove(self, pods: Sequence[int], now_s: float) -> None:
        """``RingSet.remove``: deleted pods leave every ring at once."""
        self.rings = self.rings.remove([endpoint_name(p) for p in pods])
        self._sync()

    def route(self, hashes: np.ndarray, now_s: float, loads: np.ndarray | None) -> np.ndarray:
        """The plan of this snapshot (after ``advance``: finished fades merge into one ring)."""
        now = _ns(now_s)
        self.rings = self.rings.advance(now)
        return self.to_pods(self._plan(self.rings, now, loads, "n-ring").route_hashes(hashes)[0])


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
    """Build the router of a fade-in ``mode`` (one of :data:`FADE_MODES`).

    Parameters
    ----------
    mode
        ``"n-ring"``, ``"skipper"`` or ``"off"``.
    pods
        Global numbers of the established pods.
    balance_factor, max_hops, vnodes
        As in :class:`RingOptions`.
    fade_s
        Fade-in window, in seconds.
    fade_exponent
        Fade-in curve exponent.
    rng
        Skipper's per-call thresholds come from it.
    """
    ring = RingOptions(balance_factor, max_hops, vnodes)
    fade = FadeIn(fade_s, fade_exponent)
    if mode == "off":
        return PlainRouter(pods, ring)
    if mode == "skipper":
        return SkipperRouter(pods, ring, fade, rng)
    if mode == "n-ring":
        return NRingRouter(pods, ring, fade)
    raise ValueError(f"unknown fade-in mode {mode!r}; expected one of {', '.join(FADE_MODES)}")
