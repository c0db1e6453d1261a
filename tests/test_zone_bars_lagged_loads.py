"""B1 while the local share ramps and a ring fades in (issue 21): bars expect what loads saw.

Loads averaged over the counters' occupancy window (10 s) reflect the expected shares
averaged over that window, behind the instant's while the local share ramps or an
N-ring fade-in runs. Bars at the instant's shares call remote pods (and a fading
ring's older pods) overloaded and send many keys walking; bars averaged over the
window (``ZoneSplit.bar_window_ns``, ``bar_shares``) keep the walk under 1 %.
"""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore import Plan, RingSet, ZoneSplit
from lbcore.errors import ArgumentError
from lbcore.zones import WINDOW_SAMPLES, window_instants
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.router_harness import endpoints
from tests.test_zone_bounded_load import BF
from tests.test_zone_rings import FLEET, KEYS, pod, zone_of
from workers.routing.snapshot import build_plan

namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept

S = 1_000_000_000
RAMP_S = 30.0  # seconds from 0 to 1
WINDOW_NS = shm.counters.store.DEFAULT_WINDOW_NS
GRID_NS = S // 4  # the loads' own time grid: finer than, and apart from, the bars'


def ramp(
    start_ns: int = 0, *, cap: float = 1.0, x0: float = 0.0, ramp_s: float = RAMP_S
) -> ZoneCurve:
    return ZoneCurve(
        zone="z-a",
        affinity=True,
        state="ramping",
        reason="started",
        start_ns=start_ns,
        x0=x0,
        rate=1.0 / ramp_s,
        cap=cap,
    )


def split(rs: RingSet, curve: ZoneCurve, now: int, window_ns: int = 0) -> ZoneSplit | None:
    x = curve.share_at(now)
    if x <= 0.0:
        return None
    bars = tuple(curve.share_at(t) for t in window_instants(now, window_ns)) if window_ns else None
    zones = [zone_of(e) for e in rs.endpoints]
    return ZoneSplit.for_zone(zones, "z-a", x, bar_window_ns=window_ns, bar_shares=bars)


def window_loads(ring_set_at, curve: ZoneCurve, now: int, n: int) -> np.ndarray:
    """Each pod's load averaged over the window before ``now``: steady traffic all along."""
    total = np.zeros(n)
    instants = range(now - WINDOW_NS + GRID_NS // 2, now, GRID_NS)
    for t in instants:
        rs = ring_set_at(t)
        idx = Plan(rs, t, zone=split(rs, curve, t)).route_hashes(KEYS)[0]
        total[: len(rs.endpoints)] += np.bincount(idx, minlength=len(rs.endpoints))
    return total / len(instants)


def bounded(rs: RingSet, curve: ZoneCurve, now: int, loads: np.ndarray, window_ns: int) -> Plan:
    zone = split(rs, curve, now, window_ns)
    return Plan(rs, now, zone=zone, loads=loads, balance_factor=BF, max_hops=10)


def test_the_window_instants_average_a_line_to_its_mean():
    ts = window_instants(50 * S, WINDOW_NS)
    assert len(ts) == WINDOW_SAMPLES and ts == sorted(ts)
    assert 40 * S < ts[0] and ts[-1] < 50 * S
    assert np.mean(ts) == pytest.approx(45 * S)  # the window's midpoint
    on_ramp = window_instants(20 * S, WINDOW_NS)  # x from 1/3 to 2/3 over the window
    assert np.mean([ramp(0).share_at(t) for t in on_ramp]) == pytest.approx(0.5)


def test_bar_shares_go_with_a_window_of_their_length():
    local = np.zeros(12, dtype=np.bool_)
    with pytest.raises(ArgumentError):
        ZoneSplit(local, 0.5, bar_shares=(0.5,) * WINDOW_SAMPLES)  # no window
    with pytest.raises(ArgumentError):
        ZoneSplit(local, 0.5, bar_window_ns=WINDOW_NS)  # no shares
    with pytest.raises(ArgumentError):
        ZoneSplit(local, 0.5, bar_window_ns=WINDOW_NS, bar_shares=(0.5,) * 3)
    with pytest.raises(ArgumentError):
        ZoneSplit(local, 0.5, bar_window_ns=WINDOW_NS, bar_shares=(1.5,) * WINDOW_SAMPLES)
    ok = ZoneSplit(local, 0.5, bar_window_ns=WINDOW_NS, bar_shares=[0.4] * WINDOW_SAMPLES)
    assert ok.bar_shares == (0.4,) * WINDOW_SAMPLES


@pytest.mark.parametrize("x", [0.3, 0.5, 0.8])
def test_lagged_loads_of_a_ramp_make_fewer_than_1_percent_of_keys_walk(x, kernel):
    curve, now = ramp(0), round(x * RAMP_S * S)
    loads = window_loads(lambda t: FLEET, curve, now, 12)
    plan = bounded(FLEET, curve, now, loads, WINDOW_NS)
    _, fallbacks, moves, _ = plan.route_hashes(KEYS)
    assert fallbacks == 0 and moves / KEYS.size < 0.01
    # routing is the share of the instant; only the bars look back
    plain = Plan(FLEET, now, zone=split(FLEET, curve, now))
    assert plan.zone_share == pytest.approx(x)
    assert plan.expected_shares.tolist() == plain.expected_shares.tolist()
    assert plan.route_hashes(KEYS)[0].tolist() == plain.route_hashes(KEYS)[0].tolist()


@pytest.mark.parametrize("now_s", [4, 6, 8, 10, 12, 16])
def test_a_local_pod_fading_in_during_the_ramp_makes_fewer_than_1_percent_walk(now_s, kernel):
    # the e2e scale-up's shape: a 12-s ramp, a local pod fading in over 8 s from 3 s
    base = RingSet([pod(i) for i in range(9)], duration_ns=8 * S)
    grown = base.scale_up([pod(9)], 3 * S)  # pod 9 is in z-a
    curve, now = ramp(0, ramp_s=12.0), now_s * S
    loads = window_loads(lambda t: grown if t >= 3 * S else base, curve, now, 10)
    plan = bounded(grown, curve, now, loads, WINDOW_NS)
    _, fallbacks, moves, _ = plan.route_hashes(KEYS)
    assert fallbacks == 0 and moves / KEYS.size < 0.01


@pytest.mark.parametrize("now_s", [7, 8, 9])
def test_a_local_fade_in_at_full_affinity_walks_keys_only_with_the_instants_bars(now_s, kernel):
    # x = 1: the older local pods' expected shares shrink as the new one fades in over
    # 8 s, and their loads, averaged over 10 s, follow behind
    base = RingSet([pod(i) for i in range(9)], duration_ns=8 * S)
    grown = base.scale_up([pod(9)], 0)
    full = ZoneCurve(zone="z-a", affinity=True, state="full", reason="ramp_done", x0=1.0, cap=1.0)
    now = now_s * S
    loads = window_loads(lambda t: grown if t >= 0 else base, full, now, 10)
    _, fallbacks, moves, _ = bounded(grown, full, now, loads, WINDOW_NS).route_hashes(KEYS)
    assert fallbacks == 0 and moves / KEYS.size < 0.01
    # the regression: the instant's bars call the older local pods overloaded
    instant = bounded(grown, full, now, loads, 0)
    assert {zone_of(grown.endpoints[i]) for i in np.flatnonzero(~instant.under)} == {"z-a"}
    assert instant.route_hashes(KEYS)[2] / KEYS.size > 0.15


class Dropped:
    """Full affinity until 0, then the probe floor (the table keeps only the last curve)."""

    full = ZoneCurve(zone="z-a", affinity=True, state="full", reason="ramp_done", x0=1.0, cap=1.0)
    floor = ZoneCurve(zone="z-a", affinity=True, state="floor", reason="latency", x0=0.01, cap=0.01)

    def share_at(self, t: int) -> float:
        return (self.full if t < 0 else self.floor).share_at(t)


@pytest.mark.parametrize("now_s", [1, 4, 7])
def test_a_drop_to_the_probe_floor_walks_keys_only_with_the_instants_bars(now_s, kernel):
    # the local pods' loads stay high for the window after the drop, and global keys
    # whose owner is local would walk off them
    dropped, now = Dropped(), now_s * S
    loads = window_loads(lambda t: FLEET, dropped, now, 12)  # type: ignore[arg-type]
    plan = bounded(FLEET, dropped, now, loads, WINDOW_NS)  # type: ignore[arg-type]
    _, fallbacks, moves, _ = plan.route_hashes(KEYS)
    assert fallbacks == 0 and moves / KEYS.size < 0.01
    instant = bounded(FLEET, dropped, now, loads, 0)  # type: ignore[arg-type]
    assert {zone_of(FLEET.endpoints[i]) for i in np.flatnonzero(~instant.under)} == {"z-a"}
    assert instant.route_hashes(KEYS)[2] / KEYS.size > 0.15


def test_bars_never_fall_below_the_average_so_a_ramp_alone_walks_no_key(kernel):
    # remote pods expected to carry less than the average keep the average's bar: the
    # ramp's lag on them (loads from a lower share than now) walks no key even with the
    # instant's bars
    curve, now = ramp(0), round(0.5 * RAMP_S * S)
    loads = window_loads(lambda t: FLEET, curve, now, 12)
    plan = bounded(FLEET, curve, now, loads, 0)
    assert plan.under.all() and plan.route_hashes(KEYS)[2] == 0


@pytest.mark.parametrize(("signal", "looks_back"), [("occupancy", True), ("in-flight", False)])
def test_a_workers_plan_bars_on_the_curve_over_its_loads_window(host, clock, signal, looks_back):
    rs = lbcore.RingSet(endpoints(9))
    zones = [f"z-{'abc'[i % 3]}" for i in range(9)]
    curve = ramp(clock() - 12 * S)
    host.publish(rs, zones=zones, zone=curve, knobs=shm.Knobs(load_signal=signal))
    r = host.router(refresh_s=0.0)
    table = r.route_table(KEYS[:10])[1]
    now = clock()
    plan = build_plan(table, shm.HostLoads.idle(9, now, WINDOW_NS), now)
    assert plan.zone.share == pytest.approx(curve.share_at(now))
    if looks_back:  # occupancy is averaged over the counters' window
        assert plan.zone.bar_window_ns == WINDOW_NS
        want = [curve.share_at(t) for t in window_instants(now, WINDOW_NS)]
        assert plan.zone.bar_shares == pytest.approx(want)
        assert np.mean(want) < curve.share_at(now) - 0.1
        assert not np.allclose(plan.bar_shares, plan.expected_shares)
    else:  # in-flight is a count now
        assert plan.zone.bar_window_ns == 0 and plan.zone.bar_shares is None
        assert plan.bar_shares is plan.expected_shares
    # the bars a worker's plan bounds its keys with are lbcore's, from these shares
    want_bars = lbcore.bounded.share_bars(
        plan.loads, plan.listed[plan.zone_views - 1], plan.bar_shares, plan.balance_factor
    )
    assert plan.under.tolist() == (plan.loads <= want_bars).tolist()
