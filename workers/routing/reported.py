"""The pods' load reports of one table, as the router, ``/metrics`` and ``/status`` fold them.

The workers store each pod's latest report in their counter rows
(:mod:`workers.fanout.reports`, :mod:`shm.counters.reports`); :func:`read_reports` reads
the newest per endpoint of a table, and :func:`lbcore.reported.effective_loads` (called
by :func:`workers.routing.snapshot.build_plan`) folds them into bounded load.

**Settings.** ``CSLB_LOAD_REPORTS`` and its intervals (:mod:`lbcore.report_settings`)
are read from the environment once per process (:func:`report_settings`), like the
fan-out's own settings, not published with the tables: every worker and the discovery
process of a host are started by the one gunicorn master and inherit its environment,
so they agree; a change takes a restart (a ConfigMap cannot switch it at run time).

**Identity.** A report counts for an endpoint only if it was stored under that
endpoint's identity (:func:`lbcore.reported.pod_identity` of its address, what the
senders store it under): a counter slot handed to another pod, or a late write of the
old pod's report after the slot's reports were forgotten, never lends one pod's load
to another.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

import numpy as np

import shm
from lbcore.report_settings import ReportSettings
from lbcore.reported import KIND_NONE, ReportState, pod_identity

__all__ = ["TableReports", "identities", "read_reports", "report_settings"]

log = logging.getLogger("cslb.router")


@functools.cache
def report_settings() -> ReportSettings:
    """The process's report settings, from ``CSLB_LOAD_REPORTS`` and the others.

    Raises
    ------
    lbcore.knobs.KnobError
        A value the settings refuse (the message names the variable).
    """
    return ReportSettings.from_mapping(os.environ)


@dataclass(frozen=True, slots=True)
class TableReports:
    """The reports of a table's endpoints, in endpoint order.

    Attributes
    ----------
    state : lbcore.reported.ReportState
        Per endpoint (no report where the stored one is another pod's).
    utilization : numpy.ndarray
        ``float64`` each endpoint's last ``application_utilization`` (NaN: none).
    settings : lbcore.report_settings.ReportSettings
        The settings they are folded with.
    """

    state: ReportState
    utilization: np.ndarray
    settings: ReportSettings


@functools.lru_cache(maxsize=8)
def identities(endpoints: tuple[str, ...]) -> np.ndarray:
    """``uint64`` :func:`~lbcore.reported.pod_identity` of each endpoint address."""
    return np.fromiter((pod_identity(e) for e in endpoints), np.uint64, len(endpoints))


def read_reports(
    counters: shm.CounterReader | None,
    table: shm.Table,
    now_ns: int,
    settings: ReportSettings | None = None,
) -> TableReports | None:
    """The reports of ``table``'s endpoints now; ``None`` with reports off or unreadable.

    Parameters
    ----------
    counters
        The host's counters (``None``: none).
    table
        The table (its slots are copied before use).
    now_ns
        CLOCK_MONOTONIC now (ns).
    settings
        The report settings (default: :func:`report_settings`).
    """
    s = report_settings() if settings is None else settings
    n = len(table.endpoints)
    if not s.enabled or counters is None or n == 0:
        return None
    slots = np.array(table.slots, dtype=np.intp)
    try:
        state, util = counters.reports(now_ns, s.expiry_ns, table.n_slots)
    except shm.ShmError as exc:  # (the load read says so, once a minute)
        log.debug("load reports of %s unreadable: %s", counters.namespace, exc)
        return None
    if slots.size and (slots.min() < 0 or slots.max() >= state.value.size):
        return None  # a table rewritten under the reader (its check says so)
    st = state.take(slots)
    u = util.take(slots)
    other = (st.identity != identities(tuple(table.endpoints))) & (st.kind != KIND_NONE)
    if other.any():
        st.kind[other] = KIND_NONE
        st.value[other] = np.nan
        u[other] = np.nan
    return TableReports(st, u, s)
