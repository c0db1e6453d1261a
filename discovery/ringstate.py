"""The ring-set state machine: membership changes become fade events, deletions, collapses.

Each publish applies one endpoint list to the current :class:`lbcore.RingSet`:

1. fades that have completed (share 1) collapse into the established ring
   (:meth:`lbcore.RingSet.advance`) — this changes no key's route, but the discovery
   process publishes it when the fade completes (:meth:`discovery.service.Discovery.fade_due`),
   so the tables never show a finished fade as running;
2. a change of the fade curve or of the virtual-node count rebuilds the set with the
   same endpoints, tiers and start times;
3. endpoints whose outlier ejection ended (*readmitted*) are removed from every ring
   (:meth:`lbcore.RingSet.remove`) so that they come back as new ones in step 4: their
   keys fade back to them along the usual curve from now, and their caches warm before
   they take their whole share;
4. :meth:`lbcore.RingSet.with_endpoints` removes deleted endpoints from every ring at
   once and adds the new ones (and the readmitted ones) as one scale-up event (one
   fading ring starting now);
5. with fade-in off (``fade_mode=off`` or a zero window) the new ring collapses at once.

A readmitted endpoint keeps its counter slot (slots follow the address, not the ring).

Pure apart from the committed state: :meth:`RingState.transition` computes the next
state and what changed without touching the current one; :meth:`RingState.commit`
adopts it once it was published, so a failed publish leaves the state as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lbcore
from discovery.static import EndpointSpec

__all__ = ["FadeParams", "RingState", "Transition"]


@dataclass(frozen=True, slots=True)
class FadeParams:
    """How rings are built: fade window (ns), exponent and virtual nodes per endpoint."""

    duration_ns: int = lbcore.fade.DEFAULT_FADE_DURATION_NS
    exponent: float = lbcore.fade.DEFAULT_FADE_EXPONENT
    vnodes: int = lbcore.DEFAULT_VNODES

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any]) -> FadeParams:
        """From resolved routing knobs (``fade_mode``, ``fade_duration_s``, ...)."""
        off = knobs["fade_mode"] == "off"
        duration = 0 if off else round(float(knobs["fade_duration_s"]) * 1e9)
        return cls(duration, float(knobs["fade_exponent"]), int(knobs["vnodes"]))

    @classmethod
    def of(cls, ring_set: lbcore.RingSet) -> FadeParams:
        """The parameters a ring set was built with."""
        return cls(ring_set.duration_ns, ring_set.exponent, ring_set.vnodes)


@dataclass(frozen=True, slots=True)
class Transition:
    """The next state and how it differs from the current one.

    Attributes
    ----------
    ring_set
        The ring set to publish.
    meta
        Endpoint details (zone, node, pod) by address, for every endpoint of ``ring_set``.
    added, removed
        Endpoints that joined (in one new fading ring, unless fade-in is off) or left.
    updated
        Endpoints whose zone or node changed (the pod name is not published).
    readmitted
        Endpoints whose ejection ended, fading back in with the new ring.
    collapsed
        Fading rings that completed and merged into the established ring.
    params_changed
        The fade curve or virtual-node count changed (rings rebuilt).
    """

    ring_set: lbcore.RingSet
    params: FadeParams
    meta: Mapping[str, EndpointSpec]
    added: tuple[EndpointSpec, ...]
    removed: tuple[EndpointSpec, ...]
    updated: tuple[EndpointSpec, ...]
    collapsed: int
    params_changed: bool
    readmitted: tuple[EndpointSpec, ...] = ()

    @property
    def membership_changed(self) -> bool:
        """Endpoints joined or left."""
        return bool(self.added or self.removed)

    @property
    def routing_changed(self) -> bool:
        """Something a worker must see: membership, endpoint details or ring parameters.

        A collapse alone routes every key as before, so it does not count.
        """
        return bool(
            self.added or self.removed or self.updated or self.params_changed or self.readmitted
        )

    def zones(self) -> list[str]:
        """Zone per endpoint, in :attr:`ring_set` order."""
        return [self.meta[ep].zone for ep in self.ring_set.endpoints]

    def nodes(self) -> list[str]:
        """Node name per endpoint, in :attr:`ring_set` order."""
        return [self.meta[ep].node for ep in self.ring_set.endpoints]


class RingState:
    """The published ring set plus each endpoint's details.

    Parameters
    ----------
    params
        Fade window, exponent and virtual nodes of an empty start.
    ring_set, meta
        A state to continue from (a table recovered from shared memory); by default an
        empty ring set.
    """

    def __init__(
        self,
        params: FadeParams | None = None,
        ring_set: lbcore.RingSet | None = None,
        meta: Mapping[str, EndpointSpec] | None = None,
    ) -> None:
        if ring_set is None:
            p = params or FadeParams()
            ring_set = lbcore.RingSet(
                (), duration_ns=p.duration_ns, exponent=p.exponent, vnodes=p.vnodes
            )
        self.ring_set = ring_set
        self.params = FadeParams.of(ring_set)
        given = dict(meta or {})
        self.meta: dict[str, EndpointSpec] = {
            ep: given.get(ep, EndpointSpec(ep)) for ep in ring_set.endpoints
        }

    @classmethod
    def recovered(
        cls,
        ring_set: lbcore.RingSet,
        zones: Sequence[str],
        nodes: Sequence[str],
    ) -> RingState:
        """Continue from a published table (a restarted publisher): fades go on as they were."""
        meta = {
            ep: EndpointSpec(ep, z, n)
            for ep, z, n in zip(ring_set.endpoints, zones, nodes, strict=True)
        }
        return cls(ring_set=ring_set, meta=meta)

    def transition(
        self,
        endpoints: Sequence[EndpointSpec],
        now_ns: int,
        params: FadeParams | None = None,
        readmit: Iterable[str] = (),
    ) -> Transition:
        """Apply ``endpoints`` (the complete wanted set) at ``now_ns``; the state is unchanged.

        ``readmit`` names endpoints whose ejection ended: those still wanted fade in
        again from ``now_ns`` as if new (remove, then add, in this one transition).

        Raises
        ------
        lbcore.EndpointError
            If an address is listed twice.
        lbcore.FadeError
            If ``now_ns`` is earlier than the newest fading event.
        """
        params = params or self.params
        wanted = list(endpoints)
        new_meta = {s.address: s for s in wanted}
        if len(new_meta) != len(wanted):
            addresses = [s.address for s in wanted]
            dup = sorted({a for a in addresses if addresses.count(a) > 1})
            raise lbcore.EndpointError(f"endpoint list names addresses twice: {dup[:5]}")
        rs = self.ring_set
        fading = len(rs.starts_ns)
        rs = rs.advance(now_ns)
        collapsed = fading - len(rs.starts_ns)
        params_changed = params != self.params
        if params_changed:
            rs = lbcore.RingSet(
                rs.endpoints,
                rs.tiers,
                rs.starts_ns,
                duration_ns=params.duration_ns,
                exponent=params.exponent,
                vnodes=params.vnodes,
                newest=rs.newest if params.vnodes == rs.vnodes else None,
            )
        meta = self.meta
        back = sorted({a for a in readmit if a in new_meta and a in meta})
        if back:
            rs = rs.remove(back)
        # The steps of RingSet.with_endpoints (deletions at once, then the new endpoints
        # in the list's order as one scale-up), from the diff against the meta this state
        # keeps for the ring set's endpoints: with_endpoints would check and diff every
        # address of a large list again.
        gone = sorted(a for a in meta if a not in new_meta)
        if gone:
            rs = rs.remove(gone)
        added: list[EndpointSpec] = []
        updated: list[EndpointSpec] = []
        for s in wanted:  # one pass over a list that may hold tens of thousands
            old = meta.get(s.address)
            if old is None:
                added.append(s)
            elif old is not s and (old.zone, old.node) != (s.zone, s.node):
                updated.append(s)
        joining = [s.address for s in added]
        if back:  # the readmitted ones join too, each at its place in the list
            back_set = set(back)
            joining = [s.address for s in wanted if s.address not in meta or s.address in back_set]
        if joining:
            rs = rs.scale_up(joining, now_ns)
        if params.duration_ns == 0 and rs.starts_ns:
            rs = rs.advance(now_ns)
        removed = tuple(meta[a] for a in gone)
        readmitted = tuple(new_meta[a] for a in back)
        return Transition(
            rs,
            params,
            new_meta,
            tuple(added),
            removed,
            tuple(updated),
            collapsed,
            params_changed,
            readmitted,
        )

    def commit(self, t: Transition) -> None:
        """Adopt a transition (after it was published)."""
        self.ring_set = t.ring_set
        self.params = t.params
        self.meta = dict(t.meta)

    def endpoints(self) -> tuple[EndpointSpec, ...]:
        """Current endpoints with their details, sorted by address."""
        return tuple(self.meta[a] for a in sorted(self.meta))
