"""Skipper parity: every public golden vector, through lbcore's public API, on both kernels.

Each test runs once per kernel (the ``kernel`` fixture): through ``Ring`` (hashing on the
active kernel) and through a ``Plan`` (one kernel call per batch).
"""

import hashlib
import math
import struct

import numpy as np
import pytest

import lbcore
from tests.adapters import skipper_adapter as adapter
from tests.conftest import load_vectors

RING = load_vectors("ring")
BOUNDED = load_vectors("bounded_load")
PIPELINE = load_vectors("fadein_pipeline")
SCORE = load_vectors("fadein_score")
DEFAULT_KEY = load_vectors("default_key")


def test_every_vector_kind_is_present():
    assert len(RING) >= 6 and BOUNDED and PIPELINE and SCORE and DEFAULT_KEY


@pytest.mark.parametrize(("name", "v"), RING, ids=[n for n, _ in RING])
def test_ring_vectors(name, v, kernel):
    keys = v["keys"]
    assert lbcore.hash_keys(keys).tolist() == [int(h) for h in v["key_hashes"]]
    # Hashing key by key (the small-batch strategy) must agree with the batch strategy.
    assert [int(lbcore.hash_keys([k])[0]) for k in keys[:200]] == [
        int(h) for h in v["key_hashes"][:200]
    ]
    ring = lbcore.Ring(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    assert len(ring) == v["ring_size"]
    digest = hashlib.sha256()
    for h, i in zip(ring.hashes.tolist(), ring.owners.tolist(), strict=True):
        digest.update(f"{h},{i}\n".encode())
    assert digest.hexdigest() == v["ring_digest_sha256"]
    assert ring.hashes[0] == int(v["ring_min_hash"]) and ring.hashes[-1] == int(v["ring_max_hash"])
    if "ring" in v:
        assert [
            [str(h), i] for h, i in zip(ring.hashes.tolist(), ring.owners.tolist(), strict=True)
        ] == v["ring"]
    for pos, h, i in v.get("ring_sample", []):
        assert (int(ring.hashes[pos]), int(ring.owners[pos])) == (int(h), i)
    hashes = lbcore.hash_keys(keys)
    assert ring.positions(hashes).tolist() == v["expected_ring_index"]
    assert ring.lookup(keys).tolist() == v["expected"]
    # Key classes: exact ring points, rollover above the maximum, below the minimum.
    for cls, (a, b) in v["key_classes"].items():
        assert b > a, cls
        assert ring.lookup(keys[a:b]).tolist() == v["expected"][a:b]
    # Endpoint order only changes index labels, never the chosen address.
    rev = list(reversed(v["endpoints"]))
    chosen = lbcore.Ring(rev, vnodes=v["hashes_per_endpoint"]).lookup(keys)
    assert [rev[i] for i in chosen.tolist()] == [v["endpoints"][i] for i in v["expected"]]
    # The plan: one kernel call for the batch, and key by key (batch 1).
    assert adapter.route(v["endpoints"], keys, v["hashes_per_endpoint"]) == v["expected"]
    plan = lbcore.Plan(lbcore.RingSet(v["endpoints"], vnodes=v["hashes_per_endpoint"]), 0)
    assert plan.kernel == kernel
    assert [int(plan.route([k])[0][0]) for k in keys[:100]] == v["expected"][:100]
    assert adapter.hash64(keys[0]) == int(v["key_hashes"][0])


@pytest.mark.parametrize(("name", "v"), BOUNDED, ids=[n for n, _ in BOUNDED])
def test_bounded_vectors(name, v, kernel):
    ring = lbcore.Ring(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    keys = v["keys"]
    assert lbcore.hash_keys(keys).tolist() == [int(h) for h in v["key_hashes"]]
    for case in v["cases"]:
        inflight = np.asarray(case["inflight"], dtype=np.float64)
        got = ring.lookup_bounded(
            keys,
            inflight,
            case["balance_factor"],
            candidates=case["available"],
            sequential=case["sequential"],
        )
        assert got.tolist() == case["expected"], case["id"]
        via_plan = adapter.route_bounded(
            v["endpoints"],
            keys,
            v["hashes_per_endpoint"],
            case["available"],
            case["inflight"],
            case["balance_factor"],
            case["sequential"],
        )
        assert via_plan == case["expected"], case["id"]
        if case["sequential"]:
            final = list(case["inflight"])
            for i in got.tolist():
                final[i] += 1
            assert final == case["expected_final_inflight"], case["id"]
        else:
            # The unlimited walk with a hop cap larger than the endpoint count is the same walk.
            capped = ring.lookup_bounded(
                keys,
                inflight,
                case["balance_factor"],
                candidates=case["available"],
                max_hops=len(v["endpoints"]) + 1,
            )
            assert capped.tolist() == case["expected"], case["id"]


@pytest.mark.parametrize(("name", "v"), PIPELINE, ids=[n for n, _ in PIPELINE])
def test_fadein_pipeline_vectors(name, v, kernel):
    ring = lbcore.Ring(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    for case in v["cases"]:
        filtered = lbcore.fadein_filter(
            case["ages_ns"], case["duration_ns"], case["exponent"], case["threshold"]
        )
        assert filtered.tolist() == case["expected_filtered"], case["id"]
        got = ring.lookup_bounded(
            v["keys"],
            np.asarray(case["inflight"], dtype=np.float64),
            case["balance_factor"],
            candidates=filtered,
        )
        assert got.tolist() == case["expected"], case["id"]
        via_plan = adapter.route_bounded(
            v["endpoints"],
            v["keys"],
            v["hashes_per_endpoint"],
            filtered.tolist(),
            case["inflight"],
            case["balance_factor"],
            False,
        )
        assert via_plan == case["expected"], case["id"]


def _ulps(a: float, b: float) -> int:
    ia = struct.unpack("<q", struct.pack("<d", a))[0]
    ib = struct.unpack("<q", struct.pack("<d", b))[0]
    return abs(ia - ib)


@pytest.mark.parametrize(("name", "v"), SCORE, ids=[n for n, _ in SCORE])
def test_fadein_score_vectors(name, v):
    exact = 0
    for p in v["points"]:
        want = struct.unpack(">d", bytes.fromhex(p["score_bits"]))[0]
        got = lbcore.fadein_score(p["lifetime_ns"], p["duration_ns"], p["exponent"])
        # Go's math.Pow is not correctly rounded; the README allows 1e-12 relative.
        assert got == want or math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0), p
        exact += _ulps(got, want) == 0
    assert exact >= 0.9 * len(v["points"])


@pytest.mark.parametrize(("name", "v"), DEFAULT_KEY, ids=[n for n, _ in DEFAULT_KEY])
def test_default_key_vectors(name, v, kernel):
    ring = lbcore.Ring(v["endpoints"], vnodes=v["hashes_per_endpoint"])
    for case in v["cases"]:
        key = lbcore.default_key(case["xff"], case["remote_addr"])
        assert key == case["expected_key"], case
        assert ring.lookup([key]).tolist() == [case["expected"]], case
        assert adapter.route(v["endpoints"], [key], v["hashes_per_endpoint"]) == [case["expected"]]
