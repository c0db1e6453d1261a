import numpy as np
import pytest

import lbcore
from lbcore.draws import unit_interval
from lbcore.fade import (
    FADE_SALT,
    RingSet,
    fade_share,
    skipper_fadein_candidates,
    skipper_fadein_route,
)
from lbcore.route import route_ring_set
from tests import reference as ref

S = 1_000_000_000
D = 30 * S
BASE = [f"http://10.10.0.{i}:8080" for i in range(1, 21)]
NEW1 = [f"http://10.10.1.{i}:8080" for i in range(1, 11)]
NEW2 = [f"http://10.10.2.{i}:8080" for i in range(1, 6)]
KEYS = np.arange(60_000, dtype=np.int64) * 104729 + 7
T0 = 1_000 * S


def names(rs, idx):
    eps = np.array(rs.endpoints, dtype=object)
    return eps[idx]


def ring_of(rs, h, now):
    """Each key's ring by the definition: the newest ring k with u < s_k(now), else 0."""
    u = unit_interval(h, FADE_SALT)
    k = np.zeros(h.size, dtype=np.intp)
    for j, share in enumerate(rs.share_list(now), start=1):
        k[u < share] = j  # newer rings have smaller shares: a newer one overwrites
    return k


def on_own_ring(rs, h, now, candidates=None, loads=None, bf=None, hops=None, attempt=0):
    """Each key routed on its own ring alone (its Ring object, not the plan's masks)."""
    k = ring_of(rs, h, now)
    out = np.empty(h.size, dtype=np.int32)
    for j, ring in enumerate(rs.rings):
        rows = np.flatnonzero(k == j)
        if rows.size:
            cand = candidates
            if candidates is not None:
                cand = np.asarray(candidates) & ring.present  # the ring's own members
            out[rows] = ring.lookup_bounded(
                None, loads, bf, candidates=cand, max_hops=hops, attempt=attempt, hashes=h[rows]
            )
    return out


@pytest.mark.parametrize(
    ("frac", "share"),
    [(0.1, 0.003), (0.3, 0.049), (0.5, 0.177), (0.7, 0.410), (0.9, 0.768), (1.0, 1.0)],
)
def test_published_share_table(frac, share):
    assert round(fade_share(int(frac * D), D, 2.5), 3) == share


def test_share_clamps_before_start_and_after_the_window():
    assert fade_share(-5 * S, D, 2.5) == 0.0
    assert fade_share(10 * D, D, 2.5) == 1.0
    assert fade_share(5 * S, 0, 2.5) == 1.0


def test_share_of_keys_on_the_new_ring_follows_the_curve():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    h = lbcore.hash_keys(KEYS)
    for frac in (0.1, 0.5, 0.9):
        now = T0 + int(frac * D)
        on_new = (ring_of(rs, h, now) == 1).mean()
        assert abs(on_new - frac**2.5) < 0.01
        np.testing.assert_array_equal(
            route_ring_set(rs, None, now, hashes=h), on_own_ring(rs, h, now)
        )


def test_each_key_moves_at_most_once_and_only_to_new_pods():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    steady = lbcore.Ring(BASE + NEW1).lookup(KEYS)
    before = route_ring_set(RingSet(BASE), KEYS, T0)
    prev = names(rs, before)
    changes = np.zeros(KEYS.size, dtype=int)
    for t in range(T0, T0 + D + S, S):
        cur = names(rs, route_ring_set(rs, KEYS, t))
        moved = cur != prev
        assert set(cur[moved].tolist()) <= set(NEW1)
        changes += moved
        prev = cur
    assert changes.max() == 1
    # At the end of the window every key is where the steady-state ring puts it.
    assert np.array_equal(prev, np.array(rs.endpoints, dtype=object)[steady])
    assert changes.sum() == np.isin(prev, NEW1).sum()


def test_overlapping_events_each_follow_their_own_curve():
    t2 = T0 + 10 * S
    rs = RingSet(BASE).scale_up(NEW1, T0).scale_up(NEW2, t2)
    assert rs.starts_ns == (T0, t2)
    h = lbcore.hash_keys(KEYS)
    prev = names(rs, route_ring_set(rs, KEYS, T0))
    first_moves = np.zeros(KEYS.size, dtype=int)
    second_moves = np.zeros(KEYS.size, dtype=int)
    for t in range(T0, t2 + D + S, S):
        shares = rs.shares(t)
        assert np.allclose(shares, [ref.fade_share(t - T0, D, 2.5), ref.fade_share(t - t2, D, 2.5)])
        choice = ring_of(rs, h, t)
        assert abs((choice >= 1).mean() - shares[0]) < 0.01
        assert abs((choice == 2).mean() - shares[1]) < 0.01
        routed = route_ring_set(rs, KEYS, t)
        if t % (5 * S) == 0:
            np.testing.assert_array_equal(routed, on_own_ring(rs, h, t))
        cur = names(rs, routed)
        moved = cur != prev
        first_moves += moved & np.isin(cur, NEW1)
        second_moves += moved & np.isin(cur, NEW2)
        assert not (moved & ~np.isin(cur, NEW1 + NEW2)).any()
        prev = cur
    assert first_moves.max() == 1 and second_moves.max() == 1
    assert np.array_equal(prev, names(rs, lbcore.Ring(BASE + NEW1 + NEW2).lookup(KEYS)))


def test_deleted_pod_receives_nothing_from_the_moment_it_is_deleted():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    t = T0 + 15 * S
    for gone in (BASE[3], NEW1[2]):
        after = rs.remove([gone])
        got = names(after, route_ring_set(after, KEYS, t))
        assert gone not in set(got.tolist())
        assert gone not in after.endpoints
        # Keys of other pods stay where they were.
        was = names(rs, route_ring_set(rs, KEYS, t))
        assert np.array_equal(got[was != gone], was[was != gone])


def test_deleting_every_new_pod_drops_the_fading_ring():
    rs = RingSet(BASE).scale_up(NEW1, T0).remove(NEW1)
    assert rs.starts_ns == () and rs.endpoints == tuple(BASE)


def test_deleting_every_established_pod_promotes_the_oldest_fading_ring():
    rs = RingSet(BASE).scale_up(NEW1, T0).remove(BASE)
    assert rs.starts_ns == () and set(rs.endpoints) == set(NEW1)
    assert (route_ring_set(rs, KEYS[:100], T0 + S) >= 0).all()


def test_advance_collapses_completed_fades():
    t2 = T0 + 10 * S
    rs = RingSet(BASE).scale_up(NEW1, T0).scale_up(NEW2, t2)
    assert rs.advance(T0 + D - 1).starts_ns == (T0, t2)
    mid = rs.advance(T0 + D)
    assert mid.starts_ns == (t2,)
    assert sorted(mid.tiers.tolist()) == [0] * 30 + [1] * 5
    t = T0 + D + 3 * S
    assert np.array_equal(
        names(mid, route_ring_set(mid, KEYS, t)), names(rs, route_ring_set(rs, KEYS, t))
    )
    done = rs.advance(t2 + D)
    assert done.starts_ns == ()


def test_with_endpoints_applies_deletions_and_one_scale_event():
    rs = RingSet(BASE)
    nxt = rs.with_endpoints(BASE[2:] + NEW1, T0)
    assert nxt.starts_ns == (T0,)
    assert set(nxt.endpoints) == set(BASE[2:] + NEW1)


def test_bounded_routing_through_the_ring_set():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    loads = np.zeros(len(rs.endpoints))
    loads[0] = 1000.0
    got = route_ring_set(rs, KEYS[:5000], T0 + 20 * S, loads=loads, balance_factor=1.25)
    assert 0 not in set(got.tolist())
    plain = route_ring_set(rs, KEYS[:5000], T0 + 20 * S)
    assert np.array_equal(got[plain != 0], plain[plain != 0])


def test_empty_ring_set_is_fallback():
    assert route_ring_set(RingSet([]), ["a", "b"], T0).tolist() == [-1, -1]
    assert RingSet([]).scale_up(NEW1, T0).starts_ns == ()


def test_bad_fade_parameters_and_events():
    with pytest.raises(lbcore.FadeError, match="exponent"):
        RingSet(BASE, exponent=0)
    with pytest.raises(lbcore.FadeError, match="duration"):
        RingSet(BASE, duration_ns=-1)
    rs = RingSet(BASE).scale_up(NEW1, T0)
    with pytest.raises(lbcore.FadeError, match="backwards"):
        rs.scale_up(NEW2, T0 - S)
    with pytest.raises(lbcore.EndpointError, match="already exist"):
        rs.scale_up([BASE[0]], T0 + S)


def test_skipper_fade_in_groups_equal_per_request_filtering(kernel):
    eps = BASE[:6]
    ring = lbcore.Ring(eps)
    ages = [None, 5 * S, 25 * S, -S, 40 * S, 12 * S]
    scores = np.array([lbcore.fadein_score(2**63 - 1 if a is None else a, D, 2.0) for a in ages])
    rng = np.random.default_rng(9)
    thresholds = rng.random(2000)
    keys = [f"F{i}" for i in range(2000)]
    h = lbcore.hash_keys(keys)
    got = np.empty(2000, dtype=np.int32)
    for rows, mask in skipper_fadein_candidates(scores, thresholds):
        got[rows] = ring.lookup(None, candidates=mask, hashes=h[rows])
    for i in range(0, 2000, 37):
        cands = lbcore.fadein_filter(ages, D, 2.0, float(thresholds[i]))
        assert got[i] == ring.lookup([keys[i]], candidates=cands)[0]
    assert np.array_equal(skipper_fadein_route(ring, keys, ages, D, 2.0, thresholds), got)
    loads = rng.integers(0, 5, 6).astype(float)
    bounded = skipper_fadein_route(
        ring, keys, ages, D, 2.0, thresholds, loads=loads, balance_factor=1.1
    )
    for i in range(0, 2000, 41):
        cands = lbcore.fadein_filter(ages, D, 2.0, float(thresholds[i]))
        assert bounded[i] == ring.lookup_bounded([keys[i]], loads, 1.1, candidates=cands)[0]


def test_listing_every_endpoint_answers_as_listing_none():
    t2 = T0 + 10 * S
    rs = RingSet(BASE).scale_up(NEW1, T0).scale_up(NEW2, t2)
    everyone = np.ones(len(rs.endpoints), dtype=bool)
    keys = KEYS[:4000]
    rng = np.random.default_rng(2)
    for t in (T0, T0 + 7 * S, t2 + 5 * S, t2 + D):
        grouped = route_ring_set(rs, keys, t, candidates=everyone)
        assert np.array_equal(route_ring_set(rs, keys, t), grouped)
        assert [
            int(route_ring_set(rs, keys[i : i + 1], t)[0]) for i in range(0, 400, 7)
        ] == grouped[:400:7].tolist()
        loads = rng.exponential(1.0, len(rs.endpoints))
        want = route_ring_set(
            rs, keys, t, loads=loads, balance_factor=1.25, max_hops=5, candidates=everyone
        )
        got = route_ring_set(rs, keys, t, loads=loads, balance_factor=1.25, max_hops=5)
        assert np.array_equal(got, want)
        assert (
            route_ring_set(rs, keys[:3], t, loads=loads, balance_factor=1.25, max_hops=5).tolist()
            == want[:3].tolist()
        )


def test_a_single_string_is_not_a_list_of_endpoints():
    rs = RingSet(BASE)
    for call in (
        lambda: rs.with_endpoints(BASE[0], T0),
        lambda: rs.remove(BASE[0]),
        lambda: rs.scale_up(NEW1[0], T0),
        lambda: RingSet(BASE[0]),
    ):
        with pytest.raises(lbcore.EndpointError, match="one string"):
            call()


def test_deletion_through_with_endpoints_and_bounded_routing():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    t = T0 + 12 * S
    gone = [BASE[1], NEW1[4]]
    after = rs.with_endpoints([e for e in rs.endpoints if e not in gone], t)
    assert after.starts_ns == rs.starts_ns
    loads = np.zeros(len(after.endpoints))
    got = names(after, route_ring_set(after, KEYS[:20000], t, loads=loads, balance_factor=1.25))
    assert not set(got.tolist()) & set(gone)


def test_ring_set_routing_takes_every_parameter():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    everyone = np.ones(len(rs.endpoints), dtype=bool)
    rng = np.random.default_rng(4)
    loads = rng.exponential(1.0, len(rs.endpoints))
    loads[[0, 3, 22]] = 9.0
    t = T0 + 20 * S
    keys = KEYS[:20000]
    h = lbcore.hash_keys(keys)
    for bf, hops in ((1.25, 1), (1.25, 4), (1.6, 1), (1.0, None)):
        want = route_ring_set(
            rs, keys, t, loads=loads, balance_factor=bf, max_hops=hops, candidates=everyone
        )
        got = route_ring_set(rs, keys, t, loads=loads, balance_factor=bf, max_hops=hops)
        assert np.array_equal(got, want), (bf, hops)
        own = on_own_ring(rs, h, t, loads=loads, bf=bf, hops=hops)
        assert np.array_equal(got, own), (bf, hops)
    with pytest.raises(lbcore.ArgumentError, match="needs loads"):
        route_ring_set(rs, keys, t, balance_factor=1.25)


def test_from_parts_wraps_a_built_set():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    parts = RingSet.from_parts(
        rs.endpoints,
        rs.tiers,
        rs.starts_ns,
        rs.rings,
        duration_ns=rs.duration_ns,
        exponent=rs.exponent,
    )
    t = T0 + 9 * S
    assert np.array_equal(route_ring_set(parts, KEYS[:5000], t), route_ring_set(rs, KEYS[:5000], t))
    with pytest.raises(lbcore.FadeError, match="disagree"):
        RingSet.from_parts(
            rs.endpoints,
            rs.tiers,
            (),
            rs.rings,
            duration_ns=rs.duration_ns,
            exponent=rs.exponent,
        )


# ---------------------------------------------------------------------------------------
# Routing a fading ring set against each ring alone, and Skipper with a listed set.


@pytest.mark.parametrize("seed", range(12))
def test_each_key_is_routed_as_its_own_ring_alone_would(seed, kernel):
    """The plan walks every ring on the newest ring's nodes with per-ring masks; each
    key must get what its own ring (a Ring of exactly its nodes) gives it, for every
    combination of candidates, bounded load, hop cap and attempt; and the plan's
    per-position answers are those of a key at each position."""
    rng = np.random.default_rng(seed)
    rs = RingSet(BASE[: int(rng.integers(2, 20))], duration_ns=D, vnodes=int(rng.choice([5, 50])))
    t = T0
    for ev, new in enumerate((NEW1, NEW2)[: int(rng.integers(0, 3))]):
        t += ev * 7 * S
        rs = rs.scale_up(new[: int(rng.integers(1, len(new) + 1))], t)
    n = len(rs.endpoints)
    loads = rng.integers(0, 6, n).astype(np.float64)
    cand = None if rng.random() < 0.4 else rng.random(n) < 0.7
    bf = None if rng.random() < 0.3 else float(rng.choice([1.0, 1.25, 2.0]))
    hops = None if rng.random() < 0.5 else int(rng.integers(1, 6))
    attempt = int(rng.integers(0, 2))
    now = t + int(rng.integers(0, D))
    kw = {} if bf is None else {"loads": loads, "balance_factor": bf}
    h = lbcore.hash_keys(KEYS[:5000])
    got = route_ring_set(
        rs, None, now, **kw, candidates=cand, max_hops=hops, attempt=attempt, hashes=h
    )
    want = on_own_ring(rs, h, now, cand, loads if bf else None, bf, hops, attempt)
    np.testing.assert_array_equal(got, want)
    if cand is not None and cand.any():
        assert not np.isin(got, np.flatnonzero(~cand)).any()
    plan = lbcore.Plan(rs, now, ejected=None if cand is None else ~cand, max_hops=hops, **kw)
    answer, _ = plan.answers()
    first = route_ring_set(rs, None, now, **kw, candidates=cand, max_hops=hops, hashes=h)
    np.testing.assert_array_equal(answer[ring_of(rs, h, now), rs.newest.positions(h)], first)


def test_routing_checks_its_inputs_and_lists_candidates():
    rs = RingSet(BASE[:5]).scale_up(NEW1[:2], T0)
    keys = KEYS[:300]
    assert (route_ring_set(rs, keys, T0, candidates=np.zeros(7, bool)) == -1).all()
    assert (route_ring_set(rs, keys, T0, candidates=[3]) == 3).all()
    with pytest.raises(lbcore.ArgumentError, match="needs loads"):
        route_ring_set(rs, keys, T0, balance_factor=1.25)
    with pytest.raises(lbcore.LoadError):
        route_ring_set(rs, keys, T0, loads=np.ones(3), balance_factor=1.25)
    with pytest.raises(lbcore.BalanceFactorError):
        route_ring_set(rs, keys, T0, loads=np.ones(7), balance_factor=0.5)
    with pytest.raises(lbcore.CandidatesError):
        route_ring_set(rs, keys, T0, candidates=[9])


def _skipper_per_key(ring, h, scores, thr, listed, attempt, loads=None, bf=None, hops=None):
    """Skipper's filter request by request over the listed endpoints (reference)."""
    out = []
    for i in range(h.size):
        m = listed & (thr[i] < scores)
        if not m.any():
            m = listed.copy()
        if bf is None:
            r = ring.lookup(None, candidates=m, attempt=attempt, hashes=h[i : i + 1])
        else:
            r = ring.lookup_bounded(
                None, loads, bf, candidates=m, max_hops=hops, attempt=attempt, hashes=h[i : i + 1]
            )
        out.append(int(r[0]))
    return np.array(out, np.int32)


@pytest.mark.parametrize(("attempt", "bf"), [(0, None), (1, None), (0, 1.25), (1, 1.1)])
def test_skipper_route_with_listed_endpoints_and_retries(attempt, bf, kernel):
    rs = RingSet(BASE[:8], duration_ns=D).scale_up(NEW1[:4], T0)
    ring = rs.newest
    ages = [None] * 8 + [D // 2] * 4
    scores = lbcore.fade.fadein_scores(ages, D, 2.5)
    rng = np.random.default_rng(attempt)
    keys = KEYS[:600]
    h = lbcore.hash_keys(keys)
    thr = rng.random(h.size)
    loads = rng.integers(0, 5, 12).astype(np.float64)
    kw = {} if bf is None else {"loads": loads, "balance_factor": bf, "max_hops": 4}
    for listed in (np.ones(12, bool), np.array([True] * 6 + [False] * 2 + [True, False] * 2)):
        got = skipper_fadein_route(
            ring, keys, ages, D, 2.5, thr, candidates=listed, attempt=attempt, **kw
        )
        exp = _skipper_per_key(ring, h, scores, thr, listed, attempt, loads, bf, kw.get("max_hops"))
        np.testing.assert_array_equal(got, exp)
        assert listed[got].all()
        same = skipper_fadein_route(
            ring,
            None,
            None,
            D,
            2.5,
            thr,
            candidates=listed,
            attempt=attempt,
            hashes=h,
            scores=scores,
            **kw,
        )
        np.testing.assert_array_equal(same, got)
    # Every established endpoint unlisted: the new ones take every key, whatever the draw.
    new_only = np.array([False] * 8 + [True] * 4)
    got = skipper_fadein_route(ring, keys, ages, D, 2.5, thr, candidates=new_only, **kw)
    assert (got >= 8).all()


# Aliases: one host written differently (default port, case, a path). Skipper hashes each
# address string on its own, so a ring holds exactly the endpoints listed for it; only
# the skip rule (candidates) compares hosts.
_HOSTS = [f"http://10.0.0.{i}:8080" for i in range(1, 9)]
_ALIASES = ["http://web-a:80", "HTTP://WEB-A", "http://10.0.0.2:8080/x"]
_LATER = ["http://10.0.1.1:8080", "http://10.0.1.2:8080"]


def _assert_same_set(got: RingSet, want: RingSet) -> None:
    assert got.endpoints == want.endpoints
    np.testing.assert_array_equal(got.tiers, want.tiers)
    assert got.starts_ns == want.starts_ns
    assert len(got.rings) == len(want.rings)
    for a, b in zip(got.rings, want.rings, strict=True):
        np.testing.assert_array_equal(a.hashes, b.hashes)
        np.testing.assert_array_equal(a.owners, b.owners)
        np.testing.assert_array_equal(a.buckets, b.buckets)
        np.testing.assert_array_equal(a.present, b.present)


def test_removing_an_alias_drops_its_nodes_while_its_host_stays():
    rs = RingSet([*_HOSTS, *_ALIASES]).scale_up(_LATER, 10)
    out = rs.with_endpoints([*_HOSTS, *_LATER], 20)
    for ring in out.rings:
        assert len(ring) == 100 * int(ring.present.sum())
    assert [len(r) for r in out.rings] == [800, 1000]
    _assert_same_set(out, RingSet([*_HOSTS, *_LATER], [0] * 8 + [1, 1], (10,)))
    h = lbcore.hash_keys(KEYS[:5000])
    assert set(route_ring_set(out, None, 15, hashes=h).tolist()) <= set(range(len(out.endpoints)))


def test_aliases_in_different_tiers_stay_in_their_own_rings():
    # The alias of an established host fades in as a new endpoint of its own.
    rs = RingSet(_HOSTS).scale_up(["http://10.0.0.2:8080/x", "http://10.0.0.3:8080/"], 10)
    assert [len(r) for r in rs.rings] == [800, 1000]
    assert not rs.rings[0].present[8:].any()
    np.testing.assert_array_equal(np.unique(rs.tiers[rs.rings[0].owners]), [0])
    _assert_same_set(rs, RingSet(rs.endpoints, rs.tiers, rs.starts_ns))
    # Candidates still follow Skipper's skip rule: listing a host keeps its aliases.
    cand = np.zeros(len(rs.endpoints), dtype=bool)
    cand[1] = True  # http://10.0.0.2:8080, host of the alias at index 8
    assert rs.rings[1].candidate_mask(cand)[8]


def test_scale_up_reuses_the_older_rings_and_equals_a_fresh_build():
    rs = RingSet(BASE).scale_up(NEW1, T0)
    rs2 = rs.scale_up(NEW2, T0 + S)
    assert rs2.rings[0].buckets is rs.rings[0].buckets  # not rebuilt
    _assert_same_set(rs2, RingSet(rs2.endpoints, rs2.tiers, rs2.starts_ns))
    # After deletions and a collapse the older rings are rebuilt, still equal.
    rs3 = rs2.with_endpoints([*BASE[2:], *NEW1[1:], *NEW2], T0 + 2 * S).advance(T0 + D)
    _assert_same_set(rs3, RingSet(rs3.endpoints, rs3.tiers, rs3.starts_ns))
    rs4 = rs3.scale_up(["http://10.10.3.1:8080"], T0 + D + S)
    _assert_same_set(rs4, RingSet(rs4.endpoints, rs4.tiers, rs4.starts_ns))


def test_bucket_table_matches_a_direct_computation():
    from lbcore.ring import build_bucket_table

    rng = np.random.default_rng(5)
    for size, bits in [(1, 8), (3, 8), (700, 8), (5000, 12), (20000, 10)]:
        h = np.sort(rng.integers(0, 2**64, size, dtype=np.uint64))
        h[-1] = np.uint64(2**64 - 1) if size % 2 else h[-1]
        got = build_bucket_table(h, bits)
        top = (h >> np.uint64(64 - bits)).astype(np.int64)
        for b in range(1 << bits):
            inside = np.flatnonzero(top == b)
            if inside.size > 1:
                assert got[b] == -1
            elif inside.size == 1:
                assert got[b] == -int(inside[0]) - 2
            else:
                assert got[b] == int(np.searchsorted(top, b)) % size


@pytest.mark.parametrize("hops", [None, 1, 3, 10])
def test_bounded_answers_per_position_equal_each_ring_alone(hops, kernel):
    """A key exactly on a node of the newest ring lands on that position: per ring, the
    plan's answer at every position is that ring's own bounded-load answer for it."""
    rng = np.random.default_rng(11 + (hops or 0))
    rs = RingSet(BASE).scale_up(NEW1, T0).scale_up(NEW2, T0 + S)
    rs = rs.with_endpoints([*BASE[3:], *NEW1, *NEW2[1:]], T0 + 2 * S)
    n = len(rs.endpoints)
    profiles = [
        np.zeros(n),
        rng.integers(0, 5, n).astype(float),
        rng.pareto(1.5, n),
        np.where(np.arange(n) % 4 == 0, 50.0, 0.0),
        np.full(n, 3.0),
    ]
    at_nodes = rs.newest.hashes
    for load in profiles:
        for bf in (1.0, 1.1, 1.25, 2.0):
            want = np.stack(
                [
                    ring.lookup_bounded(None, load, bf, max_hops=hops, hashes=at_nodes)
                    for ring in rs.rings
                ]
            )
            got, moved = lbcore.Plan(rs, T0, loads=load, balance_factor=bf, max_hops=hops).answers()
            np.testing.assert_array_equal(got, want)
            plain = np.stack([ring.lookup(None, hashes=at_nodes) for ring in rs.rings])
            np.testing.assert_array_equal(moved, got != plain)
    # One endpoint on the oldest ring: Skipper's one-candidate shortcut still applies.
    one = RingSet(BASE[:1]).scale_up(NEW2, T0)
    load = np.arange(len(one.endpoints), dtype=float)
    want = np.stack(
        [
            ring.lookup_bounded(None, load, 1.1, max_hops=hops, hashes=one.newest.hashes)
            for ring in one.rings
        ]
    )
    got = lbcore.Plan(one, T0, loads=load, balance_factor=1.1, max_hops=hops).answers()[0]
    np.testing.assert_array_equal(got, want)


def _fmix64(h: int, salt: int) -> int:
    """MurmurHash3's fmix64 of ``h ^ salt``, written from its definition."""
    m = (1 << 64) - 1
    x = h ^ salt
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & m
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & m
    return x ^ (x >> 33)


def test_the_fade_draw_is_fmix64_and_the_plan_picks_the_newest_ring_below_it(kernel):
    """The vectorized draw against fmix64 per key, and the plan's integer thresholds
    against the rule in floats: the newest ring k with u < s_k(t)."""
    from lbcore.draws import mix64

    rng = np.random.default_rng(5)
    d_ns = 30_000_000_000
    t0 = 10**15
    eps = [f"http://10.0.0.{i}:80" for i in range(20)]
    rs = lbcore.RingSet(eps, duration_ns=d_ns)
    rs = rs.scale_up(["http://10.0.1.1:80", "http://10.0.1.2:80"], t0)
    rs = rs.scale_up(["http://10.0.2.1:80"], t0 + d_ns // 3)
    h = rng.integers(0, 2**64, 3000, dtype=np.uint64)
    assert mix64(h, FADE_SALT).tolist() == [_fmix64(x, FADE_SALT) for x in h.tolist()]
    assert mix64(h, 12345).tolist() == [_fmix64(x, 12345) for x in h.tolist()]  # any salt
    seen = set()
    for now in [t0 - 1, t0, t0 + 1, *rng.integers(t0, t0 + 2 * d_ns, 10).tolist(), t0 + 5 * d_ns]:
        np.testing.assert_array_equal(
            route_ring_set(rs, None, now, hashes=h), on_own_ring(rs, h, now)
        )
        seen.update(ring_of(rs, h, now).tolist())
    assert seen == {0, 1, 2}
