"""B1 with pods' load reports (issue 21): reports go onto the plan's expected shares.

A pod's report is its total load from every caller. With zone affinity in every zone,
a balanced fleet reports equal loads, yet this host sends its local pods more keys than
its remote ones: each pod's bar is drawn from its expected share. Rescaling reports onto
those shares (``effective_loads(..., expected=...)``) puts a pod reporting the average at
its expected share, so fewer than 1 % of keys walk, and a pod is over its bar when its
report is ``balance_factor`` times the average, as without a zone.
"""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore import Plan
from lbcore.report_settings import ReportSettings
from lbcore.reported import (
    KIND_OCCUPANCY,
    SOURCE_REPORTED,
    ReportState,
    effective_loads,
    record_reports,
)
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.router_harness import endpoints
from tests.test_zone_bounded_load import BF
from tests.test_zone_rings import FLEET, KEYS, split
from workers.routing.reported import TableReports
from workers.routing.snapshot import build_plan

namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept

S = 1_000_000_000
ON = ReportSettings(enabled=True, blackout_ns=10 * S, expiry_ns=30 * S, refresh_ns=5 * S)
N = len(FLEET.endpoints)
LOCAL = 0  # pod 0 is in z-a, the caller's zone


def reported(values: np.ndarray) -> tuple[ReportState, int]:
    """Occupancy reports of every pod, past their blackout: the state and the instant."""
    state = ReportState.empty(N)
    at = 1000 * S
    state = record_reports(state, np.arange(N), values, KIND_OCCUPANCY, 7, at, ON.expiry_ns)
    state = record_reports(
        state, np.arange(N), values, KIND_OCCUPANCY, 7, at + 11 * S, ON.expiry_ns
    )
    return state, at + 12 * S


def folded_plan(x: float, reports: np.ndarray, *, onto_shares: bool) -> Plan:
    zone = split(FLEET, x)
    plain = Plan(FLEET, 0, zone=zone)
    host = np.bincount(plain.route_hashes(KEYS)[0], minlength=N).astype(np.float64)
    state, now = reported(reports)
    expected = plain.bar_shares if onto_shares else None
    got = effective_loads(host, state, now, ON, 1.0, expected=expected)
    assert (got.source == SOURCE_REPORTED).all()
    return Plan(FLEET, 0, zone=zone, loads=got.loads, balance_factor=BF, max_hops=10)


@pytest.mark.parametrize("x", [0.25, 0.5, 0.75])
def test_equal_reports_walk_fewer_than_1_percent_of_keys(x, kernel):
    plan = folded_plan(x, np.full(N, 0.8), onto_shares=True)
    _, fallbacks, moves, _ = plan.route_hashes(KEYS)
    assert fallbacks == 0 and moves / KEYS.size < 0.01 and plan.under.all()
    # a pod at the average report sits at its expected part of the host's total
    total = plan.loads.sum()
    assert plan.loads / total == pytest.approx(plan.bar_shares, rel=1e-9)


@pytest.mark.parametrize("x", [0.5, 0.75])
def test_a_local_pod_reporting_above_the_bar_is_over_it_as_without_a_zone(x, kernel):
    hot = np.full(N, 0.8)
    hot[LOCAL] = 0.8 * BF * 1.1  # 10 % above balance_factor × the others' report
    plan = folded_plan(x, hot, onto_shares=True)
    assert not plan.under[LOCAL] and plan.under[np.arange(N) != LOCAL].all()
    assert plan.route_hashes(KEYS)[2] > 0
    # the flat view (every pod an equal part of the host's total) would keep sending it
    # its local keys: its bar is drawn from a share well above the average
    flat = folded_plan(x, hot, onto_shares=False)
    assert flat.under[LOCAL]


def test_without_expected_shares_the_rule_is_the_flat_one():
    values = np.linspace(0.5, 1.5, N)
    state, now = reported(values)
    host = np.full(N, 3.0)
    flat = effective_loads(host, state, now, ON, 1.0).loads
    even = effective_loads(host, state, now, ON, 1.0, expected=np.full(N, 1 / N)).loads
    assert even == pytest.approx(flat)
    assert flat.sum() == pytest.approx(host.sum())


def test_a_workers_plan_folds_reports_onto_its_bar_shares(host, clock):
    rs = lbcore.RingSet(endpoints(9))
    zones = [f"z-{'abc'[i % 3]}" for i in range(9)]
    curve = ZoneCurve(zone="z-a", affinity=True, state="full", reason="ramp_done", x0=0.5, cap=0.5)
    host.publish(rs, zones=zones, zone=curve, knobs=shm.Knobs(load_signal="in-flight"))
    table = host.router(refresh_s=0.0).route_table(KEYS[:10])[1]
    now = clock()
    idle = shm.HostLoads.idle(9, now)
    state = ReportState.empty(9)
    for t in (now - 11 * S, now):  # equal reports, past their blackout
        state = record_reports(
            state, np.arange(9), np.full(9, 0.8), KIND_OCCUPANCY, 7, t, ON.expiry_ns
        )
    reports = TableReports(state, np.full(9, np.nan), ON)
    plan = build_plan(table, idle, now, reports=reports)
    assert plan.zone_views and plan.under.all()
    # every pod at the average report: each at its expected part of the host's total
    assert plan.loads / plan.loads.sum() == pytest.approx(plan.bar_shares, rel=1e-9)
    local = np.array([z == "z-a" for z in zones])
    assert plan.loads[local].min() > plan.loads[~local].max()
