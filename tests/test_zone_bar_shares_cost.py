"""B1's expected shares at what they must cost: each view's arcs summed once per ring (in
one pass on the native kernel, the same sums as the NumPy reference), the bar window's
instants as one mix of those arcs, and the pods' reports folded onto the plan's own bar
shares, with no second plan built for them."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore import zones
from lbcore.report_settings import ReportSettings
from lbcore.reported import KIND_OCCUPANCY, ReportState, record_reports
from lbcore.views import CHOICE_NRING, CHOICE_SKIPPER, view_of_draws
from lbcore.zones import WINDOW_SAMPLES, ZoneSplit, window_instants
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.kernel_harness import on
from tests.router_harness import KEYS, endpoints
from workers.routing.reported import TableReports
from workers.routing.snapshot import build_plan

namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept

S = 1_000_000_000
N = 30
ZONES = [f"z-{'abc'[i % 3]}" for i in range(N)]
ON = ReportSettings(enabled=True, blackout_ns=10 * S, expiry_ns=30 * S, refresh_ns=5 * S)


def fading(n: int = N) -> lbcore.RingSet:
    """Two scale-ups fading in (the last sixth, then the last twelfth) at 100 s and 110 s."""
    eps = endpoints(n)
    a, b = n - n // 6, n - n // 12
    rs = lbcore.RingSet(eps[:a], duration_ns=30 * S)
    return rs.scale_up(eps[a:b], 100 * S).scale_up(eps[b:], 110 * S)


def test_arc_sums_are_the_references_to_the_bit_on_both_kernels():
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 150):
        ring = lbcore.Ring(endpoints(n))
        rows = rng.random((5, n)) < 0.5
        rows[0] = False  # no endpoint: no arc
        rows[1] = False
        rows[1, n // 2] = True  # one endpoint: the whole ring
        native = on("native", lambda r=ring, m=rows: zones.arc_sums(r, m))
        reference = on("numpy", lambda r=ring, m=rows: zones.arc_sums(r, m))
        assert np.array_equal(native, reference)
        assert not native[0].any() and native[1, n // 2] == pytest.approx(2.0**64)
        # each other view's arcs cover the ring once
        for v in range(2, 5):
            if rows[v].any():
                assert native[v].sum() == pytest.approx(2.0**64, rel=1e-12)
                assert not native[v][~rows[v]].any()


BAD_OWNERS = [-1, -2, -100, -(2**31), 150, 151, 2**31 - 1]


@pytest.mark.parametrize("bad", BAD_OWNERS)
def test_a_ring_node_owned_by_no_endpoint_is_refused_by_both_kernels(bad):
    ring = lbcore.Ring(endpoints(150))

    class Damaged:
        hashes = ring.hashes
        owners = ring.owners.copy()

    Damaged.owners[777] = bad
    rows = np.ones((2, 150), dtype=np.bool_)
    kernels = ["numpy"] + (["native"] if lbcore.kernel.load_native() is not None else [])
    for k in kernels:
        got = on(k, lambda: zones.arc_sums(Damaged, rows))
        assert got[:2] == ("error", lbcore.TableDataError), (k, got)
        assert f"ring node 777 has owner {bad}:" in got[2], (k, got)


@pytest.mark.parametrize("bad", BAD_OWNERS)
def test_a_ring_wrapping_an_owner_out_of_range_marks_no_endpoint_for_it(bad):
    """A lapped reader wraps owners rewritten after its checks: any value, no error."""
    ring = lbcore.Ring(endpoints(150))
    owners = ring.owners.copy()
    gone = int(owners[777])
    owners[owners == gone] = bad
    garbage = lbcore.Ring.from_arrays(ring.endpoints, ring.hashes, owners, buckets=ring.buckets)
    assert garbage.present.shape == (150,)
    assert not garbage.present[gone] and garbage.present.sum() == 149


def test_each_views_arcs_are_summed_once_per_ring(monkeypatch, kernel):
    calls = []
    real = zones.arc_sums
    monkeypatch.setattr(zones, "arc_sums", lambda r, m: calls.append(m.shape[0]) or real(r, m))
    rs = fading()
    split = ZoneSplit.for_zone(ZONES, "z-a", 0.5)
    plan = lbcore.Plan(rs, 120 * S, zone=split)
    first = plan.expected_shares
    # three global views and their zone parts in one call, a view equal to another once
    # (the second scale-up added no z-a pod: two zone parts are the same)
    assert plan.views == 6 and calls == [5]
    assert len({row.tobytes() for row in plan.eligible}) == 5
    again = lbcore.Plan(rs, 125 * S, zone=ZoneSplit.for_zone(ZONES, "z-a", 0.7))
    shares = again.expected_shares  # another instant and share, the same views: none summed
    assert calls == [5] and not np.array_equal(shares, first)
    assert lbcore.Plan(fading(), 120 * S, zone=split).expected_shares.sum() > 0  # summed
    assert calls == [5, 5]


def test_the_window_shares_are_the_mean_of_the_instants_expected_shares(kernel):
    rs = fading()
    now, window = 118 * S, 16 * S
    at = window_instants(now, window)
    xs = [0.2 + 0.03 * i for i in range(WINDOW_SAMPLES)]
    split = ZoneSplit.for_zone(ZONES, "z-a", xs[-1], bar_window_ns=window, bar_shares=tuple(xs))
    plan = lbcore.Plan(rs, now, zone=split)
    each = [
        lbcore.Plan(rs, t, zone=ZoneSplit.for_zone(ZONES, "z-a", x)).expected_shares
        for t, x in zip(at, xs, strict=True)
    ]
    assert plan.bar_shares == pytest.approx(np.mean(each, axis=0), rel=1e-12, abs=1e-15)
    assert plan.bar_shares.sum() == pytest.approx(1.0)
    assert not np.allclose(plan.bar_shares, plan.expected_shares)


@pytest.mark.parametrize("choice", [CHOICE_NRING, CHOICE_SKIPPER])
def test_rows_of_thresholds_choose_as_each_row_alone(choice):
    rng = np.random.default_rng(8)
    thresholds = rng.integers(0, 2**64 - 1, size=(16, 3), dtype=np.uint64)
    saturated = (rng.random((16, 3)) < 0.2).astype(np.uint8)
    draws = rng.integers(0, 2**64 - 1, size=(16, 40), dtype=np.uint64)
    draws[:, 0] = thresholds[:, 0]  # a draw on a threshold: u < s is strict
    rows = view_of_draws(choice, thresholds, saturated, draws)
    for r in range(16):
        assert np.array_equal(rows[r], view_of_draws(choice, thresholds[r], saturated[r], draws[r]))


def test_loads_on_shares_are_given_the_bar_shares(kernel):
    rs = fading()
    split = ZoneSplit.for_zone(ZONES, "z-a", 0.6)
    seen = []

    def loads(shares):
        seen.append(shares)
        return np.full(N, 2.0) * (1.0 + (shares if shares is not None else 0.0))

    plan = lbcore.Plan(rs, 120 * S, zone=split, loads_on_shares=loads, balance_factor=1.25)
    assert len(seen) == 1 and np.array_equal(seen[0], plan.bar_shares)
    given = lbcore.Plan(rs, 120 * S, zone=split, loads=plan.loads, balance_factor=1.25)
    assert np.array_equal(plan.under, given.under)
    assert np.array_equal(plan.route(KEYS)[0], given.route(KEYS)[0])
    # no zone part open: the function is told so, the plan is Skipper's
    plain = lbcore.Plan(rs, 120 * S, loads_on_shares=loads, balance_factor=1.25)
    assert seen[-1] is None and np.array_equal(plain.loads, np.full(N, 2.0))
    with pytest.raises(lbcore.ArgumentError, match="loads or loads_on_shares"):
        lbcore.Plan(rs, 0, loads=np.ones(N), loads_on_shares=loads, balance_factor=1.25)


def test_a_workers_reports_fold_onto_its_plans_bar_shares_in_one_plan(host, clock, monkeypatch):
    rs = lbcore.RingSet(endpoints(9))
    zones9 = [f"z-{'abc'[i % 3]}" for i in range(9)]
    now = clock()
    curve = ZoneCurve(
        zone="z-a", affinity=True, state="ramping", reason="started", start_ns=now - 20 * S,
        x0=0.1, rate=0.02, cap=0.9,
    )  # fmt: skip
    host.publish(rs, zones=zones9, zone=curve, knobs=shm.Knobs(load_signal="occupancy"))
    table = host.router(refresh_s=0.0).route_table(KEYS[:10])[1]
    state = ReportState.empty(9)
    for t in (now - 11 * S, now):  # equal reports, past their blackout
        state = record_reports(state, np.arange(9), np.full(9, 0.8), KIND_OCCUPANCY, 7, t, 30 * S)
    reports = TableReports(state, np.full(9, np.nan), ON)
    built = []
    real = lbcore.Plan

    class Counted(real):  # type: ignore[misc,valid-type]
        __slots__ = ()

        def __init__(self, *a, **kw):
            built.append(kw.get("zone"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(lbcore, "Plan", Counted)
    loads = shm.HostLoads.idle(9, now, 10 * S)
    plan = build_plan(table, loads, now, reports=reports)
    assert len(built) == 1 and plan.zone_views and plan.zone.bar_window_ns == 10 * S
    # every pod at the average report: each at its share of the host's total the bars
    # expect, the window's (the local share rose over it)
    assert plan.loads / plan.loads.sum() == pytest.approx(plan.bar_shares, rel=1e-9)
    assert not np.allclose(plan.bar_shares, plan.expected_shares)
