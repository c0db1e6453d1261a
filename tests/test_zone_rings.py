"""Zone rules Z1, Z2, Z3 and Z5 (issue 21) on both kernels, without bounded load.

A fleet of 12 pods in three zones (``z-a``, ``z-b``, ``z-c``, round robin); the caller
is in ``z-a``. Answers are compared as addresses, so ring sets with other endpoint
lists compare too.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import lbcore
from lbcore import Plan, RingSet, ZoneSplit
from lbcore.zones import local_mask

D = 30_000_000_000
ZONES = ("z-a", "z-b", "z-c")
KEYS = np.random.default_rng(21).integers(0, 2**64, size=40_000, dtype=np.uint64)


def pod(i: int) -> str:
    return f"http://10.1.{i % 3}.{i}:8080"


def zone_of(address: str) -> str:
    return ZONES[int(address.split(".")[2])]


def split(rs: RingSet, share: float, *, zone: str = "z-a", min_pods: int = 3) -> ZoneSplit:
    return ZoneSplit.for_zone([zone_of(e) for e in rs.endpoints], zone, share, min_pods=min_pods)


def addresses(plan: Plan, attempt: int = 0, keys: np.ndarray = KEYS) -> np.ndarray:
    idx = plan.route_hashes(keys, attempt)[0]
    eps = np.array([*plan.ring_set.endpoints, "fallback"], dtype=object)
    return eps[idx]  # -1 reads the last entry


FLEET = RingSet([pod(i) for i in range(12)], duration_ns=D)


# --- Z1: a zone's ring is the global ring restricted to its pods ---------------------


def test_a_key_whose_global_owner_is_local_keeps_it(kernel):
    plain = addresses(Plan(FLEET, 0))
    zoned = addresses(Plan(FLEET, 0, zone=split(FLEET, 1.0)))
    local_owner = np.array([zone_of(a) == "z-a" for a in plain])
    assert 0.2 < local_owner.mean() < 0.5
    assert (zoned[local_owner] == plain[local_owner]).all()
    assert all(zone_of(a) == "z-a" for a in zoned)  # share 1: every key stays in the zone


def test_a_keys_local_pod_changes_only_when_local_membership_changes(kernel):
    before = addresses(Plan(FLEET, 0, zone=split(FLEET, 1.0)))
    more_remote = RingSet([pod(i) for i in range(12)] + [pod(13), pod(14)])  # z-b, z-c
    fewer_remote = FLEET.remove([pod(1), pod(5)])  # z-b, z-c
    for rs in (more_remote, fewer_remote):
        assert addresses(Plan(rs, 0, zone=split(rs, 1.0))).tolist() == before.tolist()
    more_local = RingSet([pod(i) for i in range(12)] + [pod(15)])  # z-a
    after = addresses(Plan(more_local, 0, zone=split(more_local, 1.0)))
    moved = after != before
    assert 0.05 < moved.mean() < 0.4
    assert set(after[moved]) == {pod(15)}  # keys only move onto the new local pod


# --- Z2: split by key, nested sets -----------------------------------------------------


def test_raising_the_share_only_adds_local_keys():
    shares = np.linspace(0.0, 1.0, 21)
    masks = [local_mask(KEYS, x, "z-a") for x in shares]
    for a, b in itertools.pairwise(masks):
        assert not (a & ~b).any()
    for x, m in zip(shares, masks, strict=True):
        assert abs(m.mean() - x) < 0.01
    keys = [f"sku-{i}" for i in range(500)]
    assert lbcore.local_keys(keys, 0.4, "z-a").tolist() == local_mask(
        lbcore.hash_keys(keys), 0.4, "z-a"
    ).tolist()


def test_each_key_moves_at_most_once_as_the_share_rises(kernel):
    steps = [addresses(Plan(FLEET, 0, zone=split(FLEET, x))) for x in np.linspace(0, 1, 11)]
    changes = sum((a != b).astype(int) for a, b in itertools.pairwise(steps))
    assert changes.max() == 1
    # and exactly the keys that became local, whose global owner was remote
    became_local = local_mask(KEYS, 1.0, "z-a") & ~local_mask(KEYS, 0.0, "z-a")
    assert not (changes.astype(bool) & ~became_local).any()
    moved = changes.astype(bool)
    assert all(zone_of(a) != "z-a" for a in steps[0][moved])
    assert all(zone_of(a) == "z-a" for a in steps[-1][moved])


def test_the_local_share_of_keys_is_the_split(kernel):
    zoned = addresses(Plan(FLEET, 0, zone=split(FLEET, 0.5)))
    in_zone = np.array([zone_of(a) == "z-a" for a in zoned])
    # half the keys local, a third of the others' global owners local too
    assert in_zone.mean() == pytest.approx(0.5 + 0.5 / 3, abs=0.03)


# --- Z3: the capacity cap and the zone's size ------------------------------------------


def test_zone_cap_arithmetic():
    pods = {"z-a": 2, "z-b": 5, "z-c": 5}
    even = {"z-a": 10, "z-b": 10, "z-c": 10}
    assert lbcore.zone_cap(pods, even, "z-a") == pytest.approx((2 / 12) / (1 / 3))
    assert lbcore.zone_cap(pods, even, "z-b") == 1.0
    assert lbcore.zone_cap(pods, None, "z-a") == 1.0  # callers in proportion to pods
    assert lbcore.zone_cap(pods, {"z-a": 1, "z-b": 0, "z-c": 0}, "z-a") == pytest.approx(2 / 12)
    assert lbcore.zone_cap(pods, even, "z-d") == 0.0  # no pods in the zone
    assert lbcore.zone_cap({"z-a": 0}, None, "z-a") == 0.0
    assert lbcore.zone_cap(pods, {"z-b": 3}, "z-a") == 1.0  # no callers there: nothing to cap
    for bad in ({"z-a": -1}, {"z-a": float("nan")}, {"z-a": "2"}, {"z-a": True}, [2]):
        with pytest.raises(lbcore.ArgumentError):
            lbcore.zone_cap(bad, None, "z-a")  # type: ignore[arg-type]
        with pytest.raises(lbcore.ArgumentError):
            lbcore.zone_cap(pods, bad, "z-a")  # type: ignore[arg-type]


def test_a_zone_short_of_pods_is_global_not_floored(kernel):
    short = FLEET.remove([pod(3), pod(6), pod(9)])  # z-a keeps pod 0 only
    plain = Plan(short, 0)
    for min_pods in (2, 3):
        plan = Plan(short, 0, zone=split(short, 1.0, min_pods=min_pods))
        assert plan.zone_views == 0 and plan.zone_share == 0.0
        assert addresses(plan).tolist() == addresses(plain).tolist()
    one = Plan(short, 0, zone=split(short, 1.0, min_pods=1))
    assert one.zone_share == 1.0 and set(addresses(one)) == {pod(0)}


def test_ejected_local_pods_do_not_count_toward_min_pods(kernel):
    ejected = np.zeros(12, dtype=np.bool_)
    ejected[[3, 6]] = True  # z-a keeps pods 0 and 9
    plan = Plan(FLEET, 0, ejected=ejected, zone=split(FLEET, 1.0))
    assert plan.zone_views == 0
    assert addresses(plan).tolist() == addresses(Plan(FLEET, 0, ejected=ejected)).tolist()
    two = Plan(FLEET, 0, ejected=ejected, zone=split(FLEET, 1.0, min_pods=2))
    assert set(addresses(two)) == {pod(0), pod(9)}


def test_retries_of_local_keys_stay_in_the_zone_while_it_has_two_pods(kernel):
    plan = Plan(FLEET, 0, zone=split(FLEET, 1.0))
    first, retry = addresses(plan), addresses(plan, 1)
    assert all(zone_of(a) == "z-a" for a in retry)
    assert (first != retry).all()
    # two healthy local pods (min_pods 2): the retry is the other one
    ejected = np.zeros(12, dtype=np.bool_)
    ejected[[3, 6]] = True
    two = Plan(FLEET, 0, ejected=ejected, zone=split(FLEET, 1.0, min_pods=2))
    a0, a1 = addresses(two), addresses(two, 1)
    assert set(a1) == {pod(0), pod(9)} and (a0 != a1).all()
    # one healthy local pod: the retry leaves the zone, as the global ring's retry
    ejected[9] = True
    one = Plan(FLEET, 0, ejected=ejected, zone=split(FLEET, 1.0, min_pods=1))
    assert set(addresses(one)) == {pod(0)}
    assert addresses(one, 1).tolist() == addresses(Plan(FLEET, 0, ejected=ejected), 1).tolist()
    # attempts beyond the zone's size leave it too: the global ring's answer
    assert addresses(two, 2).tolist() == addresses(Plan(FLEET, 0, ejected=two.ejected), 2).tolist()


# --- Z5: composition with N-ring fade-in and ejection -----------------------------------


def test_an_ejected_local_pods_keys_go_where_retries_already_go(kernel):
    zone = split(FLEET, 0.6)
    plan = Plan(FLEET, 0, zone=zone)
    first, retry = addresses(plan), addresses(plan, 1)
    ejected = np.zeros(12, dtype=np.bool_)
    ejected[3] = True
    after = addresses(Plan(FLEET, 0, ejected=ejected, zone=zone))
    on_3 = first == pod(3)
    assert on_3.sum() > 1000
    assert (after[on_3] == retry[on_3]).all()
    assert (after[~on_3] == first[~on_3]).all()


def test_fade_choice_and_zone_choice_are_independent():
    view = FLEET.scale_up([pod(12), pod(13)], 0).ring_choice(KEYS, D // 2)
    newest = view == 1
    local = local_mask(KEYS, 0.5, "z-a")
    s = newest.mean()
    assert 0.1 < s < 0.3
    # P(local and newest ring) = P(local) P(newest ring), within four standard errors
    joint = (local & newest).mean()
    assert abs(joint - 0.5 * s) < 4 * np.sqrt(0.5 * s * (1 - 0.5 * s) / KEYS.size)


def test_a_pod_added_during_a_zone_fade_follows_its_own_curve(kernel):
    grown = FLEET.scale_up([pod(12), pod(15)], 0)  # pod 12 in z-a, pod 15 in z-a too
    grown = grown.scale_up([pod(13)], 0)  # z-b, a second event at the same instant
    zone = split(grown, 0.5)
    done = addresses(Plan(grown, 2 * D, zone=zone))
    for t in (D // 4, D // 2, 3 * D // 4):
        got = addresses(Plan(grown, t, zone=zone))
        share = lbcore.fade_share(t, D, grown.exponent)
        for new in (pod(12), pod(15), pod(13)):
            full = (done == new).sum()
            assert (got == new).sum() == pytest.approx(share * full, rel=0.15, abs=30)


def test_no_key_moves_twice_for_one_event(kernel):
    grown = FLEET.scale_up([pod(12), pod(13), pod(14)], 0)  # one pod per zone
    for x in (0.0, 0.3, 1.0):
        zone = split(grown, x)
        steps = [addresses(Plan(grown, t, zone=zone)) for t in np.linspace(0, D, 16).astype(int)]
        changes = sum((a != b).astype(int) for a, b in itertools.pairwise(steps))
        assert changes.max() == 1, x
        assert all(len(set(h)) == len(h) for h in map(_dedup, np.array(steps, dtype=object).T))
        moved = changes.astype(bool)
        assert set(steps[-1][moved]) <= {pod(12), pod(13), pod(14)}
    # the zone's ramp and the fade at once: at most once per event, two events
    both = [
        addresses(Plan(grown, t, zone=split(grown, x)))
        for t, x in zip(np.linspace(0, D, 16).astype(int), np.linspace(0, 1, 16), strict=True)
    ]
    changes = sum((a != b).astype(int) for a, b in itertools.pairwise(both))
    assert changes.max() <= 2
    history = [_dedup(h) for h in np.array(both, dtype=object).T]
    zone_owner_before = addresses(Plan(FLEET, 0, zone=split(FLEET, 1.0)))
    zone_owner = addresses(Plan(grown, D, zone=split(grown, 1.0)))  # x = 1 once faded in
    new = {pod(12), pod(13), pod(14)}
    assert all(h[-1] == zone_owner[k] for k, h in enumerate(history))  # every key ends local
    twice = [(k, h) for k, h in enumerate(history) if len(h) == 3]
    assert twice
    for k, h in twice:
        if h[1] == zone_owner_before[k]:  # the ramp first: onto its zone-ring owner ...
            assert h[2] == pod(12)  # ... then the fade onto the new local pod
        else:  # the fade first, onto a new pod; then the ramp onto its zone-ring owner
            assert h[1] in new and h[2] == zone_owner[k]
    # No key returns where it was, but one: a key on a local pod that the fade moves to a
    # new remote pod and the ramp then takes back to that local pod, its zone-ring owner.
    # Two events, each moving it once; about 1 % of keys here (the new pods are one
    # per zone, the ramp and the fade running at once).
    back = [(k, h) for k, h in twice if h[2] == h[0]]
    assert len(back) / KEYS.size < 0.02
    for k, h in back:
        assert zone_of(h[0]) == "z-a" and h[1] in {pod(13), pod(14)} and h[0] == zone_owner[k]
    assert all(len(set(h)) == len(h) for k, h in enumerate(history) if k not in dict(back))


def _dedup(steps) -> list[str]:
    """A key's pods over time, a pod repeated only when the key returns to it."""
    out = [steps[0]]
    for a in steps[1:]:
        if a != out[-1]:
            out.append(a)
    return out
