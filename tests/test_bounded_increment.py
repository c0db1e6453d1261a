"""The bar's increment for the routed call (lbcore.bounded.routed_call_load / in_call_units).

Skipper's bar adds 1.0, one open request, to the summed load. For occupancy (busy-seconds
per second over a window) a routed call adds only its latency's share of the window;
routing on loads divided by that increment must decide exactly as the bar
``(increment + Σ load) / n × balance_factor`` on the loads themselves.
"""

import math

import numpy as np
import pytest

import lbcore
from lbcore.bounded import in_call_units, routed_call_load, target_load
from lbcore.errors import ArgumentError

EPS = [f"http://10.9.0.{i}:8080" for i in range(1, 17)]
KEYS = [f"SKU{i:05d}" for i in range(600)]
RING = lbcore.Ring(EPS)
ALL = np.ones(len(EPS), dtype=np.bool_)


def test_default_increment_is_skippers_bit_for_bit():
    rng = np.random.default_rng(7)
    for _ in range(50):
        loads = rng.pareto(1.2, size=len(EPS))
        bf = float(rng.uniform(1.0, 2.0))
        assert target_load(loads, ALL, bf) == target_load(loads, ALL, bf, 1.0)
    loads = rng.integers(0, 9, size=len(EPS)).astype(float)
    assert in_call_units(loads, 1.0) is loads  # in-flight counts reach lbcore untouched


def test_increment_replaces_the_one_in_skippers_order():
    loads = np.array([0.1, 0.2, 0.0])
    assert target_load(loads, np.ones(3, bool), 1.5, 0.25) == ((0.25 + 0.1) + 0.2) / 3.0 * 1.5


@pytest.mark.parametrize("inc", [0.0005, 0.03, 0.4, 3.0])
@pytest.mark.parametrize("bf", [1.1, 1.25, 1.35])
def test_routing_on_call_units_decides_as_the_bar_with_that_increment(inc, bf):
    rng = np.random.default_rng([int(inc * 1e4), int(bf * 100)])
    checked = 0
    for _ in range(10):
        loads = rng.gamma(2.0, 0.05, size=len(EPS))  # a host's occupancy per pod, busy-s/s
        bar = target_load(loads, ALL, bf, inc)
        if np.min(np.abs(loads - bar)) < 1e-9 * bar:
            continue  # a load on the bar itself could round either way
        good = np.flatnonzero(loads <= bar)
        got = RING.lookup_bounded(KEYS, in_call_units(loads, inc), bf)
        # unlimited walk: each key goes to the first endpoint under the bar clockwise,
        # which is the plain lookup restricted to those endpoints (Skipper's skip rule)
        assert got.tolist() == RING.lookup(KEYS, candidates=good).tolist()
        checked += 1
    assert checked >= 8


def _capped_walk(loads, bar, hops):
    """Reference: from each key's ring position, the first of ``hops`` distinct endpoints
    under ``bar``, else the least loaded of them (the first seen on a tie)."""
    owners = RING.owners.tolist()
    out = []
    for p in RING.positions(lbcore.hash_keys(KEYS)).tolist():
        seen = []
        while True:
            e = owners[p % len(owners)]
            p += 1
            if e in seen:
                continue
            if loads[e] <= bar:
                out.append(e)
                break
            seen.append(e)
            if len(seen) == hops:
                out.append(min(seen, key=lambda x: loads[x]))
                break
    return out


@pytest.mark.parametrize("inc", [0.0005, 0.05])
def test_hop_cap_walk_on_call_units_matches_the_bar_with_that_increment(inc):
    rng = np.random.default_rng(11)
    loads = rng.gamma(2.0, 0.05, size=len(EPS))
    bar = target_load(loads, ALL, 1.1, inc)
    assert np.min(np.abs(loads - bar)) > 1e-9
    got = RING.lookup_bounded(KEYS, in_call_units(loads, inc), 1.1, max_hops=2)
    want = _capped_walk(loads.tolist(), bar, 2)
    assert got.tolist() == want
    # the cap bites: some keys saw two endpoints over the bar
    assert sum(loads[w] > bar for w in want) > 0


def test_skippers_one_lifts_a_small_hosts_occupancy_bar_far_above_the_factor():
    # A host whose pods add up to 2 busy-seconds per second over 10 pods: Skipper's 1.0
    # puts the bar at 1.25 x (1 + 1/2) = 1.875 x the mean; a 5-ms call in a 10-s window
    # adds 0.0005, and the bar is the balance factor x the mean.
    loads = np.full(10, 0.2)
    mean = loads.mean()
    inc = routed_call_load("occupancy", 0.005, 10.0)
    assert inc == pytest.approx(0.0005)
    assert target_load(loads, np.ones(10, bool), 1.25) / mean == pytest.approx(1.875)
    assert target_load(loads, np.ones(10, bool), 1.25, inc) / mean == pytest.approx(
        1.25 * (1 + 0.0005 / 2)
    )


def test_routed_call_load_per_signal():
    assert routed_call_load("in-flight") == 1.0
    assert routed_call_load("effective", 0.004, 10.0) == 1.0  # its in-flight part counts
    assert routed_call_load("occupancy", 0.015, 0.15) == pytest.approx(0.1)
    # nothing completed in the window: every occupancy is 0 and Skipper's 1.0 is harmless
    assert routed_call_load("occupancy", None, 10.0) == 1.0
    assert routed_call_load("occupancy", math.nan, 10.0) == 1.0


def test_bad_arguments_name_the_problem():
    with pytest.raises(ArgumentError, match="unknown load signal 'cpu'"):
        routed_call_load("cpu", 0.01, 10.0)
    with pytest.raises(ArgumentError, match="occupancy window must be > 0 seconds"):
        routed_call_load("occupancy", 0.01, 0.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ArgumentError, match="increment must be a finite number > 0"):
            in_call_units(np.ones(3), bad)
