"""Log lines of outlier ejection: what one publish changed about who is ejected.

Derived from the published states (before and after a publish), not from the monitor's
decisions, so a publish that failed and was retried logs its ejections once, with the
generation that carried them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from discovery.events import EventLog
from discovery.outlier import Published
from lbcore.outlier import EJECT_REASONS

__all__ = ["log_changes"]


def log_changes(
    log: EventLog,
    generation: int,
    before: Published,
    after: Published,
    *,
    now_ns: int,
    pod: Callable[[str], dict[str, Any]],
    counts: Callable[[str], dict[str, int]],
    faded: Collection[str],
    fade: str,
    fade_duration_s: float,
    panic_threshold: float,
) -> None:
    """``endpoint_ejected``, ``endpoint_readmitted``, ``outlier_panic(_ended)`` lines.

    Parameters
    ----------
    pod, counts
        An endpoint's identity fields (address, ip, node, zone, pod) and the window counts
        it was judged on, by address.
    faded, fade, fade_duration_s
        The readmitted endpoints that fade in with this publish, the fade mode and window.
    """
    ejected, readmitted = before.changes(after)
    st = after.state
    for i in ejected:
        a = after.addresses[i]
        until = int(st.until_ns[i])
        log.warning(
            "endpoint_ejected",
            generation=generation,
            **pod(a),
            reason=EJECT_REASONS[int(st.reason[i]) - 1],
            until_ns=until,
            duration_s=round((until - now_ns) / 1e9, 3),
            multiplier=int(st.multiplier[i]),
            ejections=int(st.counts[i].sum()),
            counts=counts(a),
        )
    for a in readmitted:
        i = after.addresses.index(a)
        log.info(
            "endpoint_readmitted",
            generation=generation,
            **pod(a),
            fade=fade if a in faded else "none",
            fade_duration_s=fade_duration_s,
            multiplier=int(st.multiplier[i]),
            ejections=int(st.counts[i].sum()),
        )
    if after.panic != before.panic:
        fields = {
            "generation": generation,
            "ejected": int(st.ejected.sum()),
            "endpoints": len(after.addresses),
            "panic_threshold": panic_threshold,
        }
        if after.panic:
            log.warning(
                "outlier_panic",
                **fields,
                action="routing ignores every ejection until enough endpoints are healthy",
            )
        else:
            log.info("outlier_panic_ended", **fields)
