"""``cslb route --live`` with pods' load reports on: the explanation compares what the
worker's plan compares (issue 21).

Real shared memory (tables, counters with open calls and stored reports), a real
:class:`workers.Router` and the host monitor behind ``/status`` on the same namespace at
one frozen instant. One local pod reports itself hot: folded onto the zone plan's bar
shares, its load is over its own bar, so keys spill off it, which neither the host's own
loads nor a flat fold of the reports would do. For every spilled key the explained pod is
the worker's, and the explained load and bar of the pod it left are the ones the worker's
plan compared, and the ones ``/status`` shows. Without a zone the flat fold is checked
the same way.
"""

from __future__ import annotations

import time

import pytest

import lbcore
import shm
from lbcore.reported import KIND_OCCUPANCY, pod_identity
from shm.tables import ZoneCurve
from tests.app_tests.conftest import ENDPOINTS, ZONES, Host
from tests.test_cli_route_live import KEYS, host  # noqa: F401
from workers.routing.router import Router
from workers.routing.snapshot import bounded_bar, build_plan, compared_loads, zone_bars
from workers.surfaces.explain import live
from workers.surfaces.hosts import HostMonitor

HOT = 0  # a pod of eu-1a, the caller's zone
REPORTS = [0.9, 0.3, 0.3, 0.3, 0.3, 0.3]  # occupancy: the hot pod at three times the rest


pytestmark = pytest.mark.usefixtures("reports_on")


def _load_host(h: Host, *, zone: bool) -> None:
    curve = None
    if zone:
        curve = ZoneCurve(
            zone="eu-1a", affinity=True, min_pods=2, state="full", reason="ramp_done", x0=1, cap=1
        )
    h.writer.publish(
        lbcore.RingSet(ENDPOINTS),
        zones=ZONES,
        zone=curve,
        knobs=shm.Knobs(load_signal="in-flight"),
        now_ns=time.monotonic_ns(),
    )
    for e in ENDPOINTS:
        h.open(e, 2)  # the host's own view: every pod alike
    assert h.recorder is not None
    h.recorder.record_reports(
        [h.slot(e) for e in ENDPOINTS],
        REPORTS,
        [float("nan")] * len(ENDPOINTS),
        [KIND_OCCUPANCY] * len(ENDPOINTS),
        [int(pod_identity(e)) for e in ENDPOINTS],
        time.monotonic_ns(),
        30 * 10**9,
    )


@pytest.mark.parametrize("zone", [True, False], ids=["zone", "no_zone"])
def test_a_spill_shows_the_load_and_bar_the_plan_compared(
    host: Host,  # noqa: F811
    zone: bool,
) -> None:
    _load_host(host, zone=zone)
    now = time.monotonic_ns()
    router = Router(host.namespace, background=False, refresh_s=0, clock=lambda: now)
    try:
        idx, table = router.route_table(KEYS)
        snap = router.snapshot()
        answer = live(host.namespace, KEYS, clock=lambda: now)
        status = HostMonitor(host.namespace, clock=lambda: now).snapshot()
    finally:
        router.close()
    assert snap is not None and snap.table is table
    assert [r.index for r in answer.routes] == idx.tolist()  # the worker's pod, key for key
    plan = snap.plan
    inc = snap.loads.bar_increment("in-flight")
    compared = compared_loads(plan, inc)
    assert compared is not None
    own = zone_bars(plan)
    assert (own is not None) == zone
    bar = own[HOT] * inc if own is not None else bounded_bar(plan) * inc  # type: ignore[operator]
    assert {e.load_source for e in status.endpoints} == {"reported"}
    # the host alone sees every pod alike: only the folded reports make the hot pod hot
    assert compared[HOT] > bar and compared[HOT] != float(snap.loads.in_flight[HOT])
    spilled = [r for r in answer.routes if r.kind == "bounded_load"]
    assert spilled and {r.moved_from for r in spilled} == {ENDPOINTS[HOT]}
    for r in spilled:
        assert r.loads["from"] == compared[HOT] == status.endpoints[HOT].load
        assert r.loads["to"] == compared[r.index] == status.endpoints[r.index].load
        assert r.loads["bar"] == bar
        assert r.loads["to"] <= r.loads["bar"] < r.loads["from"]
    if zone:
        assert status.bars is not None and status.bars[HOT] == bar
        # the bars shown are the ones the plan decided with: a key spills exactly when
        # its zone pod is over its bar, as the plan saw it (every key is local here)
        assert plan.bars is not None and plan.under is not None
        assert list(status.bars) == (plan.bars * inc).tolist()
        assert (plan.under == (compared <= plan.bars * inc)).all()
        assert not plan.under[HOT] and plan.under.sum() == len(ENDPOINTS) - 1
        zone_pod = build_plan(table, snap.loads, now, balance_factor=None).route(KEYS)[0]
        spills = [r.kind == "bounded_load" for r in answer.routes]
        assert spills == [not plan.under[p] for p in zone_pod.tolist()]
        # onto the bar shares: every key is local, the remote pods are expected to carry none
        assert all(compared[i] == 0.0 for i, z in enumerate(ZONES) if z != "eu-1a")
    else:
        assert status.bar == bar
