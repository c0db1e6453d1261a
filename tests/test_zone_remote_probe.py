"""The zone controller keeps the probe floor's share of keys global even at full
affinity (cap at most 1 - CSLB_ZONE_PROBE_FLOOR), so the remote side of the latency
comparison stays measured and a fault at full affinity is seen."""

from __future__ import annotations

from dataclasses import replace

import pytest

from discovery.zonecontrol import ZoneController, ZoneSignals, affinity_cap
from lbcore.zone_settings import ZoneSettings

S = 1_000_000_000
P = ZoneSettings(affinity=True, ramp_ns=60 * S, probe_floor=0.01, hold_ns=30 * S)


def sig(cap: float, local_ms: float = 10.0, remote_calls: float = 1000.0) -> ZoneSignals:
    return ZoneSignals("z-a", 4, 4, cap, local_ms / 1e3, 0.010, 1000.0, remote_calls)


@pytest.mark.parametrize(
    ("capacity", "floor", "expected"),
    [(1.0, 0.01, 0.99), (1.0, 0.0, 1.0), (0.8, 0.01, 0.8), (0.995, 0.01, 0.99), (1.5, 0.5, 0.5)],
)
def test_the_cap_is_the_capacity_cap_at_most_one_minus_the_probe_floor(capacity, floor, expected):
    assert affinity_cap(capacity, floor) == pytest.approx(expected)
    c = ZoneController(replace(P, probe_floor=floor))
    c.step(0, sig(capacity))
    full = c.step(60 * S, sig(capacity))
    assert (full.state, full.cap) == ("full", pytest.approx(expected))
    assert c.share_at(600 * S) == pytest.approx(expected)


def test_an_even_fleet_ramps_to_one_minus_the_floor_and_a_restarted_cap_of_one_comes_down():
    c = ZoneController(P)
    ramp = c.step(0, sig(1.0))
    assert ramp.rate == pytest.approx(0.99 / 60)
    assert c.step(60 * S, sig(1.0)).x0 == pytest.approx(0.99)
    # a curve published before this rule (cap 1) is taken down to the new cap at once
    old = replace(c.curve, x0=1.0, cap=1.0)
    c = ZoneController(P, old)
    down = c.step(61 * S, sig(1.0))
    assert (down.state, down.reason, c.share_at(61 * S)) == ("full", "cap_changed", 0.99)


def test_a_fault_at_full_drops_to_the_floor_on_the_probe_calls():
    c = ZoneController(P)
    c.step(0, sig(1.0))
    c.step(60 * S, sig(1.0))
    # the 1 % of keys left global make a reading possible; 50 % slower locally drops x
    drop = c.step(61 * S, sig(1.0, local_ms=15.0, remote_calls=25.0))
    assert (drop.state, drop.reason, c.share_at(61 * S)) == ("floor", "latency", 0.01)
