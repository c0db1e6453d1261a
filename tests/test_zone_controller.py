"""The zone controller's state machine (discovery.zonecontrol): ramp rate, the probe
floor on latency and on unhealthy pods, hold and hysteresis (a signal oscillating around
the margin does not flap), a short zone at 0, recoveries that ramp rather than jump."""

from __future__ import annotations

import itertools
import math

import pytest

from discovery.zonecontrol import MIN_CALLS, ZoneController, ZoneSignals
from lbcore.zone_settings import ZoneSettings

S = 1_000_000_000
P = ZoneSettings(
    affinity=True, ramp_ns=60 * S, probe_floor=0.01, min_pods=3, latency_margin=0.35, hold_ns=30 * S
)


def sig(
    excess: float | None = 0.0,
    *,
    pods: int = 5,
    healthy: int | None = None,
    cap: float = 1.0,
    zone: str = "z-a",
    calls: float = 1000.0,
) -> ZoneSignals:
    lat = math.nan if excess is None else 0.010 * (1 + excess)
    return ZoneSignals(
        zone, pods, pods if healthy is None else healthy, cap, lat, 0.010, calls, calls
    )


def test_off_without_affinity_or_zone():
    c = ZoneController(ZoneSettings(affinity=False))
    assert c.step(0, sig()).state == "off" and c.share_at(10 * S) == 0.0
    c = ZoneController(P)
    cur = c.step(0, sig(zone=""))
    assert (cur.state, cur.reason, c.share_at(S)) == ("off", "no_zone", 0.0)


def test_ramps_to_the_cap_at_cap_over_ramp_per_second_then_full():
    c = ZoneController(P)
    cur = c.step(0, sig(cap=0.8))
    assert (cur.state, cur.reason, cur.x0) == ("ramping", "started", 0.0)
    assert cur.rate == pytest.approx(0.8 / 60)
    assert c.share_at(30 * S) == pytest.approx(0.4)
    assert c.share_at(90 * S) == pytest.approx(0.8)  # capped
    assert c.due_ns() == 60 * S
    assert c.step(30 * S, sig(cap=0.8)) is cur  # no change mid-ramp: no publish
    done = c.step(60 * S, sig(cap=0.8))
    assert (done.state, done.reason, done.x0, done.rate) == ("full", "ramp_done", 0.8, 0.0)
    assert c.due_ns() is None


def test_a_cap_below_x_takes_x_down_at_once_and_a_higher_cap_ramps_from_x():
    c = ZoneController(P)
    c.step(0, sig(cap=1.0))
    c.step(60 * S, sig(cap=1.0))
    down = c.step(61 * S, sig(cap=0.5))
    assert (down.state, down.reason, c.share_at(61 * S)) == ("full", "cap_changed", 0.5)
    up = c.step(62 * S, sig(cap=0.8))
    assert (up.state, up.x0) == ("ramping", 0.5)
    assert c.share_at(62 * S) == pytest.approx(0.5)  # no jump


def test_latency_over_the_margin_drops_to_the_floor_and_recovers_after_the_hold_by_ramping():
    c = ZoneController(P)
    c.step(0, sig())
    c.step(60 * S, sig())
    drop = c.step(61 * S, sig(0.5))
    assert (drop.state, drop.reason) == ("floor", "latency")
    assert c.share_at(61 * S) == 0.01
    # below the margin but above the recovery threshold: stays at the floor
    for t in range(62, 200):
        assert c.step(t * S, sig(0.30)).state == "floor"
    # below the lower threshold for less than the hold: still the floor
    for t in range(200, 229):
        assert c.step(t * S, sig(0.1)).state == "floor"
    back = c.step(230 * S, sig(0.1))
    assert (back.state, back.reason, back.x0) == ("ramping", "recovered", 0.01)
    assert c.share_at(230 * S) == pytest.approx(0.01)
    # the cap at 1 - probe floor, over the ramp's 60 s
    assert c.share_at(260 * S) == pytest.approx(0.01 + 0.99 / 2)


def test_a_signal_oscillating_around_the_margin_does_not_flap():
    c = ZoneController(P)
    c.step(0, sig())
    c.step(60 * S, sig())
    states = []
    for t in range(61, 661):
        excess = 0.40 if t % 2 else 0.30  # around 0.35, never below 0.175
        states.append(c.step(t * S, sig(excess)).state)
    changes = sum(a != b for a, b in itertools.pairwise(states))
    assert states[0] == "floor" and changes == 0


def test_a_bad_reading_during_the_hold_starts_the_hold_over():
    c = ZoneController(P)
    c.step(0, sig())
    c.step(60 * S, sig())
    c.step(61 * S, sig(0.5))
    for t in range(62, 90):
        c.step(t * S, sig(0.0))
    c.step(90 * S, sig(0.5))  # breaks the run
    for t in range(91, 120):
        assert c.step(t * S, sig(0.0)).state == "floor"
    assert c.step(121 * S, sig(0.0)).state == "ramping"


def test_latency_without_enough_calls_neither_drops_nor_recovers():
    c = ZoneController(P)
    c.step(0, sig())
    c.step(60 * S, sig())
    assert c.step(61 * S, sig(2.0, calls=MIN_CALLS - 1)).state == "full"
    c.step(62 * S, sig(0.5))
    for t in range(63, 200):  # no reading at all: no recovery
        assert c.step(t * S, sig(None)).state == "floor"
    c.step(200 * S, sig(0.0))  # a good reading starts the run; gaps do not break it
    for t in range(201, 230):
        assert c.step(t * S, sig(None)).state == "floor"
    assert c.step(231 * S, sig(None)).state == "ramping"


def test_unhealthy_local_pods_drop_to_the_floor_with_hysteresis():
    c = ZoneController(P)
    c.step(0, sig(pods=8))
    c.step(60 * S, sig(pods=8))
    drop = c.step(61 * S, sig(pods=8, healthy=3))  # 3/8 < 1/2
    assert (drop.state, drop.reason) == ("floor", "unhealthy")
    for t in range(62, 200):  # 5/8 is not bad, but not good enough to recover
        assert c.step(t * S, sig(pods=8, healthy=5)).state == "floor"
    for t in range(200, 230):
        c.step(t * S, sig(pods=8, healthy=6))
    assert c.step(231 * S, sig(pods=8, healthy=6)).state == "ramping"


def test_a_short_zone_routes_globally_at_zero_then_recovers_after_the_hold():
    c = ZoneController(P)
    c.step(0, sig())
    c.step(60 * S, sig())
    short = c.step(61 * S, sig(pods=5, healthy=2))
    assert (short.state, short.reason, c.share_at(61 * S)) == ("short", "short", 0.0)
    for t in range(62, 91):
        assert c.step(t * S, sig(pods=5)).state == "short"
    c.step(91 * S, sig(pods=5, healthy=2))  # flaps back: the hold starts over
    for t in range(92, 121):
        assert c.step(t * S, sig(pods=5)).state == "short"
    back = c.step(122 * S, sig(pods=5))
    assert (back.state, back.x0) == ("ramping", 0.0)


def test_affinity_switched_off_goes_to_zero_and_on_again_ramps_from_zero():
    c = ZoneController(P)
    c.step(0, sig())
    off = c.step(10 * S, sig(), ZoneSettings(affinity=False))
    assert (off.state, off.reason, c.share_at(11 * S)) == ("off", "affinity_off", 0.0)
    on = c.step(20 * S, sig(), P)
    assert (on.state, on.reason, on.x0) == ("ramping", "started", 0.0)


def test_a_ramp_of_zero_seconds_jumps_to_the_cap():
    c = ZoneController(ZoneSettings(affinity=True, ramp_ns=0))
    cur = c.step(5 * S, sig(cap=0.7))
    assert (cur.state, cur.reason, c.share_at(5 * S)) == ("full", "started", 0.7)


def test_every_transition_counts_once_and_a_kept_state_does_not():
    c = ZoneController(P)
    c.step(0, sig())  # started
    c.step(30 * S, sig())  # mid-ramp: no transition
    c.step(60 * S, sig())  # ramp_done
    c.step(61 * S, sig(0.5))  # floor
    c.step(62 * S, sig(0.5))  # still the floor
    assert c.curve.transitions == 3
