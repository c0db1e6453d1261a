import numpy as np
import pytest

import lbcore
from tests import reference as ref

ENDPOINT_SETS = {
    "ipv4": [f"http://10.2.{i // 250}.{i % 250 + 1}:8080" for i in range(40)],
    "ipv6": [f"http://[2001:db8::{i:x}]:8080" for i in range(1, 13)],
    "https-h2c": [f"https://10.9.0.{i}:8443" for i in range(1, 6)]
    + [f"h2c://10.9.1.{i}:9000" for i in range(1, 6)],
    "dns": [f"http://product-{i}.product.svc.cluster.local:8080" for i in range(7)],
}
KEYS = (
    [f"AD112G0AB-K{i:03d}" for i in range(300)]
    + [str(i) for i in range(300)]
    + ["", " ", "ürün-42", "\n"]
)


@pytest.mark.parametrize("name", list(ENDPOINT_SETS))
def test_lookup_matches_reference(name, kernel):
    eps = ENDPOINT_SETS[name]
    assert lbcore.Ring(eps).lookup(KEYS).tolist() == ref.lookup(eps, KEYS)


def test_thousand_vnodes_and_two_hundred_endpoints_match_reference(kernel):
    eps = [f"http://10.3.{i // 200}.{i % 200 + 1}:8080" for i in range(200)]
    r = lbcore.Ring(eps)
    assert r.lookup(KEYS).tolist() == ref.lookup(eps, KEYS)
    eps10 = eps[:10]
    r1000 = lbcore.Ring(eps10, vnodes=1000)
    assert len(r1000) == 10_000
    assert r1000.lookup(KEYS).tolist() == ref.lookup(eps10, KEYS, vnodes=1000)


def test_ring_attributes():
    eps = ENDPOINT_SETS["ipv4"][:5]
    r = lbcore.Ring(eps)
    assert r.endpoints == tuple(eps)
    assert r.hashes.dtype == np.uint64 and r.owners.dtype == np.int32
    assert np.all(np.diff(r.hashes.astype(object)) > 0)
    assert sorted(np.bincount(r.owners).tolist()) == [100] * 5


@pytest.mark.parametrize("cands", [[0], [1, 3], [0, 2, 4, 6], list(range(1, 40, 3))])
def test_candidates_match_reference_skip_rule(cands, kernel):
    eps = ENDPOINT_SETS["ipv4"]
    r = lbcore.Ring(eps)
    got = r.lookup(KEYS, candidates=cands)
    assert got.tolist() == ref.lookup(eps, KEYS, candidates=set(cands))
    mask = np.zeros(len(eps), dtype=bool)
    mask[cands] = True
    assert r.lookup(KEYS, candidates=mask).tolist() == got.tolist()


def test_skipping_equals_building_the_ring_from_candidates_only():
    eps = ENDPOINT_SETS["ipv4"]
    cands = [2, 5, 11, 17, 30]
    full = lbcore.Ring(eps).lookup(KEYS, candidates=cands)
    small = lbcore.Ring([eps[i] for i in cands]).lookup(KEYS)
    assert [eps[i] for i in full.tolist()] == [eps[cands[i]] for i in small.tolist()]
    sub = lbcore.Ring(eps).subset(cands)
    assert sub.lookup(KEYS).tolist() == full.tolist()


def test_long_runs_of_skipped_nodes_use_the_search_fallback():
    eps = [f"http://10.4.0.{i}:80" for i in range(1, 101)]
    r = lbcore.Ring(eps)
    keys = [f"k{i}" for i in range(3000)]
    assert (
        r.lookup(keys, candidates=[42]).tolist() == [42] * 3000
    )  # Skipper's single-candidate shortcut
    assert r.lookup(keys, candidates=[42, 77]).tolist() == ref.lookup(
        eps, keys, candidates={42, 77}
    )


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_attempt_is_the_next_distinct_eligible_endpoint(attempt, kernel):
    eps = ENDPOINT_SETS["ipv4"][:8]
    r = lbcore.Ring(eps)
    got = r.lookup(KEYS, attempt=attempt)
    assert got.tolist() == ref.lookup(eps, KEYS, attempt=attempt)
    first = r.lookup(KEYS)
    assert np.all(got != first)
    cands = [1, 2, 5, 6]
    assert r.lookup(KEYS, candidates=cands, attempt=attempt).tolist() == ref.lookup(
        eps, KEYS, candidates=set(cands), attempt=attempt
    )


def test_attempt_beyond_available_endpoints_is_fallback(kernel):
    r = lbcore.Ring(["http://a:80", "http://b:80"])
    first = r.lookup(KEYS)
    assert r.lookup(KEYS, attempt=1).tolist() == (1 - first).tolist()  # the other pod
    assert r.lookup(KEYS, attempt=2).tolist() == [-1] * len(KEYS)
    assert r.lookup(KEYS, candidates=[1], attempt=1).tolist() == [-1] * len(KEYS)


def test_no_candidates_is_fallback_not_an_error():
    r = lbcore.Ring(ENDPOINT_SETS["dns"])
    assert r.lookup(["a", "b"], candidates=[]).tolist() == [-1, -1]
    assert r.lookup(["a"], candidates=np.zeros(7, bool)).tolist() == [-1]


def _moves(before, after, keys):
    a = np.array([before.endpoints[i] for i in before.lookup(keys).tolist()])
    b = np.array([after.endpoints[i] for i in after.lookup(keys).tolist()])
    return a, b


def test_adding_one_endpoint_moves_about_one_in_n_plus_one_keys_all_to_it():
    keys = np.arange(100_000, dtype=np.int64) * 7919 + 13
    eps = [f"http://10.5.0.{i}:8080" for i in range(1, 21)]
    new = "http://10.5.1.1:8080"
    a, b = _moves(lbcore.Ring(eps), lbcore.Ring([*eps, new]), keys)
    moved = a != b
    assert set(b[moved].tolist()) == {new}
    share = moved.mean()
    assert abs(share - 1 / 21) < 0.35 / 21, share  # 100 vnodes: within ~35 % of the ideal


def test_removing_one_endpoint_moves_only_its_keys():
    keys = [f"SKU-{i}" for i in range(100_000)]
    eps = [f"http://10.6.0.{i}:8080" for i in range(1, 31)]
    gone = eps[11]
    a, b = _moves(lbcore.Ring(eps), lbcore.Ring([e for e in eps if e != gone]), keys)
    moved = a != b
    assert set(a[moved].tolist()) == {gone}
    assert np.all(moved == (a == gone))


def test_host_aliases_count_as_one_host_for_the_skip_rule():
    eps = ["http://10.7.0.1:80", "http://10.7.0.1", "http://10.7.0.2:80", "http://10.7.0.3:80"]
    r = lbcore.Ring(eps)
    got = r.lookup(KEYS, candidates=[0, 2])
    # Endpoint 1 has host 10.7.0.1:80 like the candidate 0, so Skipper does not skip it.
    assert set(got.tolist()) == {0, 1, 2}
    assert got.tolist() == ref.lookup(eps, KEYS, candidates={0, 1, 2})
    # But Skipper counts and averages the listed candidates only: one listed candidate
    # takes every key (Apply's shortcut) ...
    assert r.lookup(KEYS, candidates=[0]).tolist() == [0] * len(KEYS)
    # ... and the bar is (1 + 2 + 0) / 2 * 1.25 = 1.875, so only endpoint 2 is under it.
    loads = np.array([2.0, 2.0, 0.0, 0.0])
    assert set(r.lookup_bounded(KEYS, loads, 1.25, candidates=[0, 2]).tolist()) == {2}
    # h2c has no default port in Skipper's SchemeHost: no alias there.
    assert lbcore.Ring(["h2c://10.7.0.1:80", "h2c://10.7.0.1"]).lookup(
        KEYS, candidates=[0]
    ).tolist() == [0] * len(KEYS)


def test_hashes_must_be_uint64_arrays():
    r = lbcore.Ring(ENDPOINT_SETS["dns"])
    h = lbcore.hash_keys(KEYS[:5])
    for bad in (h.view(np.int64), h.tolist(), h.reshape(5, 1), h[:1].view(np.int64)):
        with pytest.raises(lbcore.ArgumentError, match="uint64"):
            r.lookup(None, hashes=bad)
        with pytest.raises(lbcore.ArgumentError, match="uint64"):
            r.lookup_bounded(None, np.zeros(7), 1.25, hashes=bad)


@pytest.mark.parametrize("bad", [1.5, None, np.float64(1.0), {"a", "b"}, {"a": 1}])
def test_unsupported_key_containers(bad):
    with pytest.raises(lbcore.KeyTypeError):
        lbcore.Ring(ENDPOINT_SETS["dns"]).lookup(bad)


def test_duplicate_candidate_indices_are_rejected():
    with pytest.raises(lbcore.CandidatesError, match="repeat"):
        lbcore.Ring(ENDPOINT_SETS["dns"]).lookup(KEYS, candidates=[1, 1, 2])


@pytest.mark.parametrize(
    ("endpoints", "match"),
    [
        ([], "empty"),
        (["http://a:80", "http://a:80"], "appears twice"),
        (["http://a:80", 5], "endpoint 1 is int"),
        ("http://a:80", "got one string"),
        (["http://a:80", ""], "empty string"),
    ],
)
def test_bad_endpoint_lists(endpoints, match):
    with pytest.raises(lbcore.EndpointError, match=match):
        lbcore.Ring(endpoints)


def test_bad_vnodes_and_candidates():
    with pytest.raises(lbcore.EndpointError, match="vnodes"):
        lbcore.Ring(["http://a:80"], vnodes=0)
    r = lbcore.Ring(["http://a:80", "http://b:80"])
    with pytest.raises(lbcore.CandidatesError, match="out of range"):
        r.lookup(["k"], candidates=[2])
    with pytest.raises(lbcore.CandidatesError, match="shape"):
        r.lookup(["k"], candidates=np.ones(3, bool))
    with pytest.raises(lbcore.ArgumentError, match="attempt"):
        r.lookup(["k"], attempt=-1)


def test_small_and_large_batches_agree():
    eps = ENDPOINT_SETS["ipv4"]
    r = lbcore.Ring(eps)
    keys = [f"P{i}" for i in range(2000)]
    big = r.lookup(keys)
    assert [int(r.lookup([k])[0]) for k in keys[:300]] == big[:300].tolist()
    assert r.lookup(keys[:3]).tolist() == big[:3].tolist()


def test_from_arrays_rejects_a_bucket_table_of_the_wrong_size():
    r = lbcore.Ring(ENDPOINT_SETS["dns"])
    with pytest.raises(lbcore.EndpointError, match="power of two"):
        lbcore.Ring.from_arrays(r.endpoints, r.hashes, r.owners, buckets=r.buckets[:-1])


def test_from_arrays_wraps_published_arrays():
    r = lbcore.Ring(ENDPOINT_SETS["dns"])
    copy = lbcore.Ring.from_arrays(
        r.endpoints, r.hashes.copy(), r.owners.copy(), buckets=r.buckets.copy()
    )
    assert copy.lookup(KEYS).tolist() == r.lookup(KEYS).tolist()
    idle = copy.lookup_bounded(None, np.zeros(7), 1.25, hashes=copy.hashes)  # keys on nodes
    assert idle.tolist() == copy.owners.tolist()


def test_from_arrays_with_a_garbage_owner_allocates_by_the_endpoints_not_the_value():
    """A reader wraps shared memory a writer may rewrite after the reader's checks (it
    lapped the reader): an owner of 2**31 - 1 there must not cost a 2**31-entry count."""
    import tracemalloc

    r = lbcore.Ring(ENDPOINT_SETS["dns"])
    owners = r.owners.copy()
    owners[3] = np.iinfo(owners.dtype).max
    tracemalloc.start()
    try:
        garbage = lbcore.Ring.from_arrays(r.endpoints, r.hashes, owners, buckets=r.buckets)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert garbage.present.shape == (len(r.endpoints),)


@pytest.mark.parametrize("bits", [8, 10, 12, 14])
def test_bucket_table_resolution_paths_agree_with_binary_search(bits):
    from lbcore.ring import build_bucket_table

    r = lbcore.Ring(ENDPOINT_SETS["ipv4"])
    small = lbcore.Ring.from_arrays(
        r.endpoints, r.hashes, r.owners, buckets=build_bucket_table(r.hashes, bits)
    )
    assert small.bucket_bits == bits
    rng = np.random.default_rng(bits)
    h = np.concatenate(
        (
            rng.integers(0, 2**63, 5000, dtype=np.int64).view(np.uint64) * np.uint64(2),
            r.hashes,
            r.hashes + np.uint64(1),
            np.array([0, 2**64 - 1], dtype=np.uint64),
        )
    )
    want = np.searchsorted(r.hashes, h, side="left") % len(r)
    assert np.array_equal(small.positions(h), want)
    # Few keys (one path for every size), each with a key past the last node too (it
    # rolls over to position 0).
    top = np.array([2**64 - 1], dtype=np.uint64)
    for k in (200, 100, 40, 20, 8, 3):
        assert np.array_equal(small.positions(h[:k]), want[:k]), k
        got = small.positions(np.concatenate((h[:k], top)))
        assert np.array_equal(got, np.append(want[:k], 0)), k


def test_with_added_equals_a_fresh_build_and_keeps_indices():
    eps = ENDPOINT_SETS["ipv4"]
    grown = lbcore.Ring(eps[:30]).with_added(eps[30:])
    fresh = lbcore.Ring(eps)
    assert grown.endpoints == fresh.endpoints
    assert np.array_equal(grown.hashes, fresh.hashes) and np.array_equal(grown.owners, fresh.owners)
    assert grown.lookup(KEYS).tolist() == fresh.lookup(KEYS).tolist()
    with pytest.raises(lbcore.EndpointError, match="already on the ring"):
        grown.with_added([eps[3]])


def test_sorted_nodes_orders_ties_in_the_packed_bits_by_the_full_hash():
    from lbcore.ring import sorted_nodes

    rng = np.random.default_rng(5)
    h = rng.integers(0, 2**63, 3000, dtype=np.int64).view(np.uint64) * np.uint64(2)
    h[[10, 20, 30]] = h[5] ^ np.array([1, 2, 3], dtype=np.uint64)  # equal high bits
    hashes, owners = sorted_nodes(h, 100, 7)
    order = np.argsort(h, kind="stable")
    assert np.array_equal(hashes, h[order]) and np.array_equal(owners, order // 100 + 7)


def test_keep_nodes_holds_exactly_the_kept_endpoints_while_subset_widens_to_aliases():
    eps = ["http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.2:8080/x", "http://a"]
    r = lbcore.Ring(eps)
    members = np.array([True, True, False, True])
    exact = r.keep_nodes(members[r.owners])
    fresh = lbcore.Ring([eps[0], eps[1], eps[3]])
    assert len(exact) == 300 and exact.present.tolist() == members.tolist()
    np.testing.assert_array_equal(exact.hashes, fresh.hashes)
    np.testing.assert_array_equal(exact.buckets, fresh.buckets)
    assert len(r.subset(members)) == 400  # Skipper's skip rule: the alias's host is listed
    # Compacted to the kept endpoints' own list.
    kept = tuple(e for e, m in zip(eps, members, strict=True) if m)
    compact = r.keep_nodes(members[r.owners], endpoints=kept, reindex=np.array([0, 1, -1, 2]))
    np.testing.assert_array_equal(compact.owners, fresh.owners)
    grown = fresh.with_more_endpoints((*kept, "http://b"))
    assert grown.buckets is fresh.buckets and grown.present.tolist() == [True] * 3 + [False]
    with pytest.raises(lbcore.EndpointError, match="only grow at its end"):
        fresh.with_more_endpoints(("http://b", *kept))


def test_one_off_routing_answers_for_the_loads_of_each_call(kernel):
    # A ring keeps what one-off routing built for every endpoint; an answer must still
    # be the one for this call's loads, factor and hop cap, whatever the earlier calls.
    eps = [f"http://10.0.0.{i}:80" for i in range(20)]
    ring = lbcore.Ring(eps)
    keys = [f"SKU-{i}" for i in range(500)]

    def fresh(loads, bf, hops=None):
        return lbcore.Ring(eps).lookup_bounded(
            keys, np.array(loads, dtype=float), bf, max_hops=hops
        )

    loads = np.ones(20)
    first = ring.lookup_bounded(keys, loads, 1.25)
    assert first.tolist() == ring.lookup(keys).tolist()
    loads[first[0]] = 100.0  # the same array, changed in place: another snapshot
    again = ring.lookup_bounded(keys, loads, 1.25)
    assert again.tolist() == fresh(loads, 1.25).tolist() and again[0] != first[0]
    for call_loads, bf, hops in (
        (loads.copy(), 1.25, None),
        (loads.tolist(), 1.25, None),
        (loads, 1.5, None),
        (loads, 1.25, 3),
        (np.ones(20), 1.25, 3),
    ):
        got = ring.lookup_bounded(keys, call_loads, bf, max_hops=hops)
        assert got.tolist() == fresh(call_loads, bf, hops).tolist()
    assert ring.lookup(keys).tolist() == first.tolist()
    for bad in (np.nan, -1.0, np.inf):
        wrong = loads.copy()
        wrong[3] = bad
        with pytest.raises(lbcore.LoadError):
            ring.lookup_bounded(keys, wrong, 1.25)
    some = ring.lookup_bounded(keys, loads, 1.25, candidates=list(range(10)))
    assert set(some.tolist()) <= set(range(10))


def test_a_ring_that_routed_pickles_and_routes_alike(kernel):
    import pickle

    ring = lbcore.Ring([f"http://10.0.0.{i}:80" for i in range(8)])
    keys = [f"SKU-{i}" for i in range(100)]
    loads = np.arange(8, dtype=float)
    want = ring.lookup_bounded(keys, loads, 1.25), ring.lookup(keys)
    copy = pickle.loads(pickle.dumps(ring))
    got = copy.lookup_bounded(keys, loads, 1.25), copy.lookup(keys)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    assert copy.endpoints == ring.endpoints and np.array_equal(copy.hashes, ring.hashes)
