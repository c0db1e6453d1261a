"""What one publish says in discovery's log: its endpoints, its summary and its warnings.

Every publish writes one ``publish`` line (generation, reason, counts, fade state, knob
changes, build time); before it, one ``endpoint_added`` / ``endpoint_removed`` /
``endpoint_updated`` line per changed endpoint, capped so that a publish of a hundred
thousand new pods stays readable; after it, ``publish_drop`` when more endpoints left at
once than the operator allows and ``publish_empty`` when every key falls back.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from discovery.events import EventLog
from discovery.ringstate import Transition
from discovery.static import EndpointSpec

__all__ = ["ENDPOINT_LINES_PER_PUBLISH", "log_endpoint_lines", "log_publish", "pod_fields"]

#: Per-endpoint log lines of one publish (added, removed, updated); the rest is counted
#: in one summary line, so a publish of 100,000 new pods writes 100 lines, not 100,000.
ENDPOINT_LINES_PER_PUBLISH = 100


def _host(address: str) -> str:
    try:
        return urlsplit(address).hostname or address
    except ValueError:
        return address


def pod_fields(s: EndpointSpec) -> dict[str, str]:
    """An endpoint's identity fields in log lines: address, ip, node, zone (and pod if known)."""
    out = {"address": s.address, "ip": _host(s.address), "node": s.node, "zone": s.zone}
    if s.pod:
        out["pod"] = s.pod
    return out


def log_endpoint_lines(log: EventLog, generation: int, t: Transition) -> None:
    """Log one line per endpoint ``t`` added, removed or updated.

    At most :data:`ENDPOINT_LINES_PER_PUBLISH` in all, then one ``endpoint_lines_capped``
    line with the counts left out.
    """
    budget = ENDPOINT_LINES_PER_PUBLISH
    unlogged: dict[str, int] = {}
    for event, specs in (
        ("endpoint_added", t.added),
        ("endpoint_removed", t.removed),
        ("endpoint_updated", t.updated),
    ):
        for s in specs[:budget]:
            log.info(event, generation=generation, **pod_fields(s))
        if len(specs) > budget:
            unlogged[event] = len(specs) - budget
        budget = max(budget - len(specs), 0)
    if unlogged:
        log.info(
            "endpoint_lines_capped",
            generation=generation,
            not_logged=unlogged,
            why=f"at most {ENDPOINT_LINES_PER_PUBLISH} endpoint lines per publish",
        )


def log_publish(
    log: EventLog,
    generation: int,
    t: Transition,
    *,
    reason: str,
    ejected: int,
    now_ns: int,
    folded: int,
    knob_changes: dict[str, Any],
    build_ms: float,
    drop_warn_share: float,
) -> None:
    """The ``publish`` line of generation ``generation`` and its warnings.

    Parameters
    ----------
    ejected
        Endpoints published as ejected.
    now_ns
        The publish instant on the fade clock (CLOCK_MONOTONIC), in nanoseconds.
    folded
        Endpoint changes the debounce folded into this publish.
    knob_changes
        ``{name: {"old": ..., "new": ...}}`` of the published knobs that changed.
    build_ms
        Time spent building and publishing the table, in milliseconds.
    drop_warn_share
        Share of the previous endpoints (0 to 1) above which a publish that removes
        them warns ``publish_drop``.
    """
    rs = t.ring_set
    log.info(
        "publish",
        generation=generation,
        reason=reason,
        endpoints=len(rs.endpoints),
        added=len(t.added),
        removed=len(t.removed),
        updated=len(t.updated),
        readmitted=len(t.readmitted),
        ejected=ejected,
        fading_rings=len(rs.starts_ns),
        shares=[round(s, 4) for s in rs.share_list(now_ns)],
        collapsed=t.collapsed,
        folded_changes=folded,
        knob_changes=knob_changes,
        fade_params={
            "duration_s": t.params.duration_ns / 1e9,
            "exponent": t.params.exponent,
            "vnodes": t.params.vnodes,
        },
        build_ms=build_ms,
    )
    before = len(rs.endpoints) - len(t.added) + len(t.removed)
    if before and len(t.removed) > drop_warn_share * before:
        log.warning(
            "publish_drop",
            generation=generation,
            endpoints_before=before,
            endpoints=len(rs.endpoints),
            removed=len(t.removed),
            share_removed=round(len(t.removed) / before, 4),
            warn_above=drop_warn_share,
            removed_endpoints=[s.address for s in t.removed[:20]],
            why="more endpoints left in one publish than --drop-warn-share allows; "
            "published all the same (check the Service, the file or the selector)",
        )
    if not rs.endpoints:
        log.warning(
            "publish_empty",
            generation=generation,
            why="the sources report no ready endpoints: every key falls back",
        )
