"""Zone mode off is Skipper's routing, bit for bit, on both kernels.

Every public golden vector (ring, bounded load, and the fade-in pipeline: Skipper's
fade-in filter, then bounded load over the endpoints it keeps) routed through a plan
with ``zone=None``, with a zone whose share is 0, and with a zone too small to open
(fewer local pods than ``min_pods``): the same answers as the vectors, the same moves
as the plan without a zone.
"""

from __future__ import annotations

import numpy as np
import pytest

import lbcore
from lbcore import Plan, RingSet, ZoneSplit
from tests.conftest import load_vectors

RING = load_vectors("ring")
BOUNDED = load_vectors("bounded_load")
PIPELINE = load_vectors("fadein_pipeline")


def _zones(n: int) -> dict[str, ZoneSplit | None]:
    local = np.arange(n) % 3 == 0
    return {
        "none": None,
        "share 0": ZoneSplit(local, 0.0),
        "share 0, every endpoint local": ZoneSplit(np.ones(n, dtype=np.bool_), 0.0, min_pods=1),
        "too few local pods": ZoneSplit(local, 1.0, min_pods=int(local.sum()) + 1),
    }


@pytest.mark.parametrize(("name", "v"), RING, ids=[n for n, _ in RING])
def test_ring_vectors_with_zone_mode_off(name, v, kernel):
    rs = RingSet(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    for label, zone in _zones(len(v["endpoints"])).items():
        plan = Plan(rs, 0, max_key_bytes=None, zone=zone)
        assert plan.kernel == kernel and plan.zone_views == 0, label
        idx, fallbacks, moves, valid = plan.route(v["keys"])
        assert idx.tolist() == v["expected"], label
        assert (fallbacks, moves, valid) == (0, 0, True), label
        retry = Plan(rs, 0, max_key_bytes=None).route(v["keys"], attempt=1)[0]
        assert plan.route(v["keys"], attempt=1)[0].tolist() == retry.tolist(), label


@pytest.mark.parametrize(("name", "v"), BOUNDED, ids=[n for n, _ in BOUNDED])
def test_bounded_vectors_with_zone_mode_off(name, v, kernel):
    n = len(v["endpoints"])
    rs = RingSet(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    for case in v["cases"]:
        if case["sequential"]:
            continue  # one plan per key: the same plans as below, key by key
        ejected = None
        if case["available"] is not None:
            ejected = np.ones(n, dtype=np.bool_)
            ejected[np.asarray(case["available"], dtype=np.intp)] = False
        loads = np.asarray(case["inflight"], dtype=np.float64)
        plain = Plan(
            rs, 0, ejected=ejected, loads=loads, balance_factor=case["balance_factor"]
        ).route(v["keys"])
        for label, zone in _zones(n).items():
            plan = Plan(
                rs,
                0,
                ejected=ejected,
                loads=loads,
                balance_factor=case["balance_factor"],
                max_key_bytes=None,
                zone=zone,
            )
            got = plan.route(v["keys"])
            assert got[0].tolist() == case["expected"], (case["id"], label)
            assert got[1:] == plain[1:], (case["id"], label)


@pytest.mark.parametrize(("name", "v"), PIPELINE, ids=[n for n, _ in PIPELINE])
def test_fadein_pipeline_vectors_with_zone_mode_off(name, v, kernel):
    n = len(v["endpoints"])
    rs = RingSet(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    for case in v["cases"]:
        kept = lbcore.fadein_filter(
            case["ages_ns"], case["duration_ns"], case["exponent"], case["threshold"]
        )
        assert kept.tolist() == case["expected_filtered"], case["id"]
        # the filter's endpoints are the candidates: the others are left out as ejected
        ejected = np.ones(n, dtype=np.bool_)
        ejected[np.asarray(kept, dtype=np.intp)] = False
        loads = np.asarray(case["inflight"], dtype=np.float64)
        bf = case["balance_factor"]
        plain = Plan(rs, 0, ejected=ejected, loads=loads, balance_factor=bf).route(v["keys"])
        for label, zone in _zones(n).items():
            plan = Plan(
                rs,
                0,
                ejected=ejected,
                loads=loads,
                balance_factor=bf,
                max_key_bytes=None,
                zone=zone,
            )
            assert plan.zone_views == 0, (case["id"], label)
            got = plan.route(v["keys"])
            assert got[0].tolist() == case["expected"], (case["id"], label)
            assert got[1:] == plain[1:], (case["id"], label)


def test_a_zone_plan_of_share_0_keeps_skippers_bar(kernel):
    """Not the expected-share bar: the bar of a plan without a zone, exactly."""
    eps = [f"http://10.0.0.{i}:8080" for i in range(9)]
    rs = RingSet(eps)
    loads = np.array([5.0, 0, 1, 9, 2, 2, 3, 0, 7])
    zone = ZoneSplit(np.arange(9) < 3, 0.0)
    a = Plan(rs, 0, loads=loads, balance_factor=1.25, zone=zone)
    b = Plan(rs, 0, loads=loads, balance_factor=1.25)
    assert a.under is None and a.good.tolist() == b.good.tolist()
    keys = [f"k{i}" for i in range(2000)]
    assert a.route(keys)[0].tolist() == b.route(keys)[0].tolist()


def test_expected_shares_without_a_zone_are_the_arc_lengths(kernel):
    eps = [f"http://10.0.0.{i}:8080" for i in range(5)]
    plan = Plan(RingSet(eps), 0)
    keys = np.random.default_rng(3).integers(0, 2**64, size=200_000, dtype=np.uint64)
    counts = np.bincount(plan.route_hashes(keys)[0], minlength=5) / keys.size
    assert plan.expected_shares.sum() == pytest.approx(1.0)
    assert np.abs(counts - plan.expected_shares).max() < 0.005
    assert lbcore.expected_shares(plan).tolist() == plan.expected_shares.tolist()
