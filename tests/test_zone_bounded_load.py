"""B1 (issue 21): bounded load in zone mode bars each pod at its expected share.

On a balanced fleet whose loads are what the plan itself sends each pod, fewer than
1 % of keys walk at local shares 0.25, 0.5 and 0.75; Skipper's flat average would call
every local pod overloaded there (kept below as the regression it guards against).
"""

from __future__ import annotations

import numpy as np
import pytest

from lbcore import Plan
from lbcore.bounded import share_bars, target_load
from lbcore.zones import local_mask
from tests.test_zone_rings import FLEET, KEYS, addresses, pod, split, zone_of

BF = 1.25
CALL = 0.004  # busy-seconds one call adds to a pod's occupancy (a 4 ms call in 1 s)


def steady_loads(plan: Plan) -> np.ndarray:
    """Each pod's load when this host sends it exactly the keys the plan gives it."""
    idx = plan.route_hashes(KEYS)[0]
    return np.bincount(idx, minlength=len(plan.ring_set.endpoints)) * CALL


@pytest.mark.parametrize("x", [0.25, 0.5, 0.75])
def test_on_a_balanced_fleet_fewer_than_1_percent_of_keys_walk(x, kernel):
    zone = split(FLEET, x)
    loads = steady_loads(Plan(FLEET, 0, zone=zone))
    plan = Plan(FLEET, 0, zone=zone, loads=loads / CALL, balance_factor=BF, max_hops=10)
    _, fallbacks, moves, _ = plan.route_hashes(KEYS)
    assert fallbacks == 0 and moves / KEYS.size < 0.01
    # The regression: the flat average (Skipper's bar) is below every local pod's load.
    flat = target_load(loads / CALL, np.ones(12, dtype=np.bool_), BF)
    over = loads / CALL > flat
    assert {zone_of(e) for e, o in zip(FLEET.endpoints, over, strict=True) if o} == {"z-a"}
    walked_under_flat = over[plan.route_hashes(KEYS)[0]].mean()
    assert walked_under_flat > 0.25  # every key of a local pod would walk


def test_the_bar_is_zalandos_local_plus_global_load_per_pod():
    n, n_local, x, bf = 12, 4, 0.5, 1.25
    loads = np.full(n, 2.0)
    total = 1.0 + loads.sum()
    shares = np.where(np.arange(n) < n_local, x / n_local + (1 - x) / n, (1 - x) / n)
    bars = share_bars(loads, np.ones(n, dtype=np.bool_), shares, bf)
    per_local, per_global = x * total / n_local, (1 - x) * total / n
    assert bars[0] == pytest.approx((per_local + per_global) * bf)
    flat = target_load(loads, np.ones(n, dtype=np.bool_), bf)
    # a remote pod, expected to carry less than the average, keeps the average's bar
    assert per_global * bf < flat and bars[-1] == flat
    assert share_bars(loads, np.ones(n, dtype=np.bool_), np.full(n, 1 / n), bf)[0] == pytest.approx(
        flat
    )


def test_expected_shares_are_arcs_times_split_times_fade(kernel):
    grown = FLEET.scale_up([pod(12), pod(13)], 0)  # z-a and z-b pods fading in
    zone = split(grown, 0.6)
    plan = Plan(grown, 12_000_000_000, zone=zone)
    shares = plan.expected_shares
    assert shares.sum() == pytest.approx(1.0)
    counts = np.bincount(plan.route_hashes(KEYS)[0], minlength=14) / KEYS.size
    assert np.abs(counts - shares).max() < 0.006
    # the local part: x of the keys plus the global part's local arcs
    plain = Plan(grown, 12_000_000_000).expected_shares
    local = zone.local
    assert shares[local].sum() == pytest.approx(0.6 + 0.4 * plain[local].sum())


def test_a_hot_local_pods_keys_walk_the_zones_ring(kernel):
    zone = split(FLEET, 1.0)
    calm = Plan(FLEET, 0, zone=zone)
    first = addresses(calm)
    loads = steady_loads(calm) / CALL
    loads[3] *= 3.0  # pod 3 (z-a) hot
    hot = Plan(FLEET, 0, zone=zone, loads=loads, balance_factor=BF, max_hops=10)
    assert not hot.under[3] and hot.under[[0, 6, 9]].all()
    got = addresses(hot)
    on_3 = first == pod(3)
    assert set(got[on_3]) <= {pod(0), pod(6), pod(9)}  # the next local pods on the ring
    assert (got[~on_3] == first[~on_3]).all()  # the other local pods keep their keys
    assert hot.route_hashes(KEYS)[2] == on_3.sum()
    # the fan-out's retry of a local key stays in the zone
    assert {zone_of(a) for a in addresses(hot, 1)} == {"z-a"}


def test_a_local_key_whose_zone_walk_finds_no_pod_under_its_bar_spills(kernel):
    zone = split(FLEET, 0.5)
    calm = Plan(FLEET, 0, zone=zone)
    loads = steady_loads(calm) / CALL
    loads[[0, 3, 6, 9]] *= 3.0  # the zone's pods slow: three times the busy time per call
    plan = Plan(FLEET, 0, zone=zone, loads=loads, balance_factor=BF, max_hops=10)
    assert not plan.under[[0, 3, 6, 9]].any() and plan.under[plan.zone.local == 0].all()
    got = addresses(plan)
    assert {zone_of(a) for a in got} == {"z-b", "z-c"}
    # spilled keys take the global ring's walk: a key whose global owner is remote (and
    # under its bar) gets that owner
    owner = addresses(Plan(FLEET, 0))
    remote = np.array([zone_of(a) != "z-a" for a in owner])
    assert (got[remote] == owner[remote]).all()
    assert plan.route_hashes(KEYS)[2] == (got != addresses(calm)).sum()
    local = local_mask(KEYS, 0.5, "z-a")
    assert {zone_of(a) for a in addresses(plan, 1)[local]} == {"z-a"}  # retries stay


def test_a_plan_reuses_an_earlier_plans_arcs_only_where_its_views_are_the_same(kernel):
    grown = FLEET.scale_up([pod(12)], 0)
    zone = split(grown, 0.5)
    loads = np.arange(13, dtype=np.float64)
    first = Plan(grown, 5_000_000_000, zone=zone, loads=loads, balance_factor=BF)
    later = Plan(grown, 9_000_000_000, zone=zone, loads=loads * 2, balance_factor=BF, reuse=first)
    assert later.view_arcs is first.view_arcs  # the fade moved on; the views did not
    fresh = Plan(grown, 9_000_000_000, zone=zone, loads=loads * 2, balance_factor=BF)
    assert later.expected_shares.tolist() == fresh.expected_shares.tolist()
    assert later.route_hashes(KEYS)[0].tolist() == fresh.route_hashes(KEYS)[0].tolist()
    ejected = np.zeros(13, dtype=np.bool_)
    ejected[3] = True  # other views: the earlier arcs are not used
    other = Plan(
        grown,
        9_000_000_000,
        ejected=ejected,
        zone=zone,
        loads=loads,
        balance_factor=BF,
        reuse=first,
    )
    alone = Plan(grown, 9_000_000_000, ejected=ejected, zone=zone, loads=loads, balance_factor=BF)
    assert other.view_arcs is not first.view_arcs
    assert other.view_arcs.tolist() == alone.view_arcs.tolist()
    assert other.expected_shares[3] == 0.0


@pytest.mark.parametrize("fade_mode", ["n-ring", "skipper", "off"])
def test_expected_shares_match_the_routed_keys_in_every_fade_mode(fade_mode, kernel):
    grown = FLEET.scale_up([pod(12), pod(13)], 0).scale_up([pod(14)], 5_000_000_000)
    ejected = np.zeros(15, dtype=np.bool_)
    ejected[6] = True  # a local pod out: its arcs go to the next local pod
    plan = Plan(grown, 15_000_000_000, ejected=ejected, zone=split(grown, 0.7), fade_mode=fade_mode)
    counts = np.bincount(plan.route_hashes(KEYS)[0], minlength=15) / KEYS.size
    # four standard errors of a share near 0.1 over the sampled keys
    assert np.abs(counts - plan.expected_shares).max() < 4 * np.sqrt(0.1 / KEYS.size)
    assert plan.expected_shares[6] == 0.0
