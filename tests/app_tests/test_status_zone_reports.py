"""/status and the metrics show, with zone affinity and load reports, the loads the plan
compares: reports folded onto its bar shares (lbcore.reported.effective_loads), so a pod
reporting the average sits at its expected part, under its own bar."""

from __future__ import annotations

import time

import numpy as np
import pytest

import lbcore
import shm
from lbcore.reported import KIND_OCCUPANCY, pod_identity
from shm.tables import ZoneCurve
from tests.app_tests.conftest import ENDPOINTS, ZONES, Host
from workers.surfaces.hosts import HostMonitor


@pytest.mark.usefixtures("reports_on")
def test_the_snapshot_shows_reports_folded_onto_the_plans_shares(host: Host) -> None:
    curve = ZoneCurve(
        zone="eu-1a", affinity=True, min_pods=2, state="full", reason="ramp_done", x0=0.5, cap=0.5
    )
    host.writer.publish(
        lbcore.RingSet(ENDPOINTS),
        zones=ZONES,
        zone=curve,
        knobs=shm.Knobs(load_signal="in-flight"),
        now_ns=time.monotonic_ns(),
    )
    assert host.recorder is not None
    slots = [host.slot(e) for e in ENDPOINTS]
    now = time.monotonic_ns()
    ids = [int(pod_identity(e)) for e in ENDPOINTS]
    n = len(ENDPOINTS)
    host.recorder.record_reports(
        slots, [0.8] * n, [0.5] * n, [KIND_OCCUPANCY] * n, ids, now, 30 * 10**9
    )
    snap = HostMonitor(host.namespace).snapshot()
    assert snap.bars is not None
    loads = np.array([e.load for e in snap.endpoints])
    assert {e.load_source for e in snap.endpoints} == {"reported"}
    local = np.array([z == "eu-1a" for z in ZONES])
    # equal reports: the local pods carry more of this host's keys, so they show more
    assert loads[local].min() > loads[~local].max()
    assert (loads <= np.array(snap.bars)).all()
