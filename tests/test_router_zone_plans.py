"""A worker's plans follow the table's zone record: the caller's zone, the controller's
curve evaluated at the instant a plan is built, the zone's minimum size, and the previous
plan reused for the bars' base; with affinity off every answer is Skipper's."""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
import shm
from lbcore.zones import ZoneSplit, local_keys
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.router_harness import KEYS, Clock, endpoints
from workers.routing.snapshot import build_plan, zone_split

# The router tests' fixtures: a namespace swept afterwards, an injected clock, the host.
namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept

S = 1_000_000_000
N = 9
ZONES = [f"z-{'abc'[i % 3]}" for i in range(N)]


def _curve(clk: Clock, **kw) -> ZoneCurve:
    kw.setdefault("zone", "z-a")
    kw.setdefault("affinity", True)
    kw.setdefault("state", "full")
    kw.setdefault("reason", "ramp_done")
    kw.setdefault("x0", 1.0)
    kw.setdefault("cap", 1.0)
    kw.setdefault("start_ns", clk())
    return ZoneCurve(**kw)


def _expected(rs: lbcore.RingSet, now: int, share: float, attempt: int = 0, **kw) -> np.ndarray:
    zone = ZoneSplit.for_zone(ZONES, "z-a", share, min_pods=kw.pop("min_pods", 3))
    plan = lbcore.Plan(rs, now, zone=zone if share > 0 else None, **kw)
    return plan.route(KEYS, attempt)[0]


def test_a_full_affinity_table_routes_local_keys_on_the_zone_ring(host, clock, kernel):
    rs = lbcore.RingSet(endpoints(N))
    host.publish(rs, zones=ZONES, zone=_curve(clock), knobs=shm.Knobs(balance_factor=None))
    r = host.router(refresh_s=0.0)
    idx = r.route(KEYS)
    assert np.array_equal(idx, _expected(rs, clock(), 1.0))
    local = np.array([ZONES[e] == "z-a" for e in idx])
    assert local.all()  # x = 1 on three healthy local pods: every key stays in z-a
    # the retry of a local key stays in the zone (three local pods: more than one)
    retry = r.route(KEYS, attempt=1)
    assert all(ZONES[e] == "z-a" for e in retry) and not (retry == idx).any()


def test_a_ramp_is_evaluated_when_each_plan_is_built(host, clock, kernel):
    rs = lbcore.RingSet(endpoints(N))
    curve = _curve(clock, state="ramping", reason="started", x0=0.0, rate=0.1, cap=0.9)
    host.publish(rs, zones=ZONES, zone=curve, knobs=shm.Knobs(balance_factor=None))
    r = host.router(refresh_s=0.0)
    seen = []
    for step in range(5):
        x = min(0.9, 0.1 * 2 * step)
        idx = r.route(KEYS)
        assert np.array_equal(idx, _expected(rs, clock(), x)), (step, x)
        is_local = local_keys(KEYS, x, "z-a")
        assert all(ZONES[e] == "z-a" for e in idx[is_local])
        seen.append(idx)
        clock.advance(2.0)
    # nested local sets: a key moves at most once over the whole ramp
    moves = (np.diff(np.array(seen), axis=0) != 0).sum(axis=0)
    assert moves.max() <= 1


@pytest.mark.parametrize(
    "curve",
    [
        {"affinity": False},
        {"zone": ""},
        {"state": "short", "reason": "short", "x0": 0.0, "cap": 0.0},
    ],
)
def test_no_share_routes_exactly_as_skipper(host, clock, curve, kernel):
    rs = lbcore.RingSet(endpoints(N))
    host.publish(rs, zones=ZONES, zone=_curve(clock, **curve))
    r = host.router(refresh_s=0.0)
    loads = host.loads()
    plain = lbcore.Plan(rs, clock(), loads=np.zeros(N), balance_factor=1.25)
    assert np.array_equal(r.route(KEYS), plain.route(KEYS)[0])
    table = r.route_table(KEYS)[1]
    assert build_plan(table, loads, clock()).zone_views == 0
    assert zone_split(table, clock()) is None


def test_a_short_zone_is_global_for_every_key(host, clock, kernel):
    # two local pods against the default minimum of three
    rs = lbcore.RingSet(endpoints(6))
    zones = ["z-a", "z-a", "z-b", "z-b", "z-c", "z-c"]
    host.publish(rs, zones=zones, zone=_curve(clock), knobs=shm.Knobs(balance_factor=None))
    r = host.router(refresh_s=0.0)
    assert np.array_equal(r.route(KEYS), lbcore.Plan(rs, clock()).route(KEYS)[0])


def test_the_zone_minimum_comes_from_the_record(host, clock, kernel):
    rs = lbcore.RingSet(endpoints(6))
    zones = ["z-a", "z-a", "z-b", "z-b", "z-c", "z-c"]
    host.publish(
        rs, zones=zones, zone=_curve(clock, min_pods=2), knobs=shm.Knobs(balance_factor=None)
    )
    r = host.router(refresh_s=0.0)
    idx = r.route(KEYS)
    assert all(zones[e] == "z-a" for e in idx)


def test_a_new_load_snapshot_reuses_the_bars_base_and_the_local_endpoints(host, clock):
    rs = lbcore.RingSet(endpoints(N))
    curve = _curve(clock, state="ramping", reason="started", x0=0.2, rate=0.05, cap=0.8)
    host.publish(rs, zones=ZONES, zone=curve)
    r = host.router(refresh_s=0.0)
    table = r.route_table(KEYS)[1]
    loads = host.loads()
    a = build_plan(table, loads, clock())
    clock.advance(1.0)
    b = build_plan(table, loads, clock(), reuse=a)
    assert b.zone_share == pytest.approx(0.25) and a.zone_share == pytest.approx(0.2)
    assert b.view_arcs is a.view_arcs  # one pass over the ring per table, not per snapshot
    assert b.zone.local is not a.zone.local and np.array_equal(b.zone.local, a.zone.local)
    # a plan of another table takes nothing from it
    host.publish(lbcore.RingSet(endpoints(N + 3)), zones=ZONES + ["z-a"] * 3, zone=curve)
    t2 = r.route_table(KEYS)[1]
    assert t2 is not table
    c = build_plan(t2, None, clock(), reuse=b)
    assert c.view_arcs is not b.view_arcs and int(c.zone.local.sum()) == 6


def test_the_router_passes_its_previous_plan(host, clock, monkeypatch):
    from workers.routing import snapshot as snap

    rs = lbcore.RingSet(endpoints(N))
    host.publish(rs, zones=ZONES, zone=_curve(clock))
    got = []
    real = snap.build_plan

    def spy(*a, **kw):
        got.append(kw.get("reuse"))
        return real(*a, **kw)

    monkeypatch.setattr(snap, "build_plan", spy)
    r = host.router(refresh_s=0.0)
    r.route(KEYS[:10])
    clock.advance(0.5)
    r.route(KEYS[:10])
    assert got[0] is None and isinstance(got[-1], lbcore.Plan)
