"""Where the callers are: this caller's zone and the callers per zone.

Zone affinity needs two facts about the *callers* (the hosts running cslb), not the
pods they call: the zone of this host, and how many callers each zone holds (the
capacity cap, :func:`lbcore.zones.zone_cap`, compares a zone's share of the pods with
its share of the callers). They come, lowest priority first, from:

* nothing: the zone is unknown (no key is local) and callers are assumed in
  proportion to the pods (the cap is then 1 wherever there are pods);
* the endpoints file's optional ``callers`` object (ready callers per zone,
  :func:`discovery.static.parse_callers`);
* the caller's own Service (``CSLB_CALLER_SERVICE``): its EndpointSlices, watched like
  the backend's, hold this pod (found by ``CSLB_POD_IP``, the downward API's
  ``status.podIP``) with its zone, and the ready caller pods per zone
  (:class:`discovery.informers.CallerSliceInformer`). The same Role
  that reads the backend's slices reads these (same namespace, same resource);
* ``CSLB_ZONE`` names this caller's zone outright (the counts still come from above).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from discovery.endpoints import ParsedSlice, merge_slices

__all__ = ["CallerView", "callers_from_slices"]


@dataclass(frozen=True, slots=True)
class CallerView:
    """What one source knows about the callers.

    Attributes
    ----------
    zone
        This caller's zone (``""``: unknown).
    counts
        Ready callers per zone (``None``: unknown; callers in proportion to pods).
    found
        The caller's own pod was found (by IP) in the source (always true without one).
    """

    zone: str = ""
    counts: Mapping[str, int] | None = None
    found: bool = True


def callers_from_slices(slices: Iterable[ParsedSlice], pod_ip: str) -> CallerView:
    """The caller's zone and ready callers per zone, from its own Service's slices.

    The own pod is looked up among every endpoint, ready or not (a caller is not ready
    before its workers serve, and discovery starts first); it counts in its zone even
    then, since it is about to call. Counts are the ready pods per zone, de-duplicated
    and with terminating ones out, as :func:`discovery.endpoints.merge_slices` keeps
    them; pods without a zone are not counted.
    """
    slices = list(slices)
    zone = ""
    found = False
    for s in slices:
        for ep in s.endpoints:
            if ep.host == pod_ip and not found:
                zone, found = ep.zone, True
    counts: dict[str, int] = {}
    ready = merge_slices(slices)
    for spec in ready:
        if spec.zone:
            counts[spec.zone] = counts.get(spec.zone, 0) + 1
    if found and zone and pod_ip not in {spec.address for spec in ready}:
        counts[zone] = counts.get(zone, 0) + 1
    return CallerView(zone, counts, found)
