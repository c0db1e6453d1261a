import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbcore
from lbcore.bounded import target_load
from tests import reference as ref

EPS = [f"http://10.8.0.{i}:8080" for i in range(1, 13)]
KEYS = [f"SKU{i:05d}" for i in range(400)]
RING = lbcore.Ring(EPS)


# (the kernel fixture sets the kernel for the whole test: every example runs on it)
_KERNEL_FIXTURE = [HealthCheck.function_scoped_fixture]

@settings(max_examples=80, deadline=None, suppress_health_check=_KERNEL_FIXTURE)
@given(
    loads=st.lists(st.integers(0, 30), min_size=12, max_size=12),
    bf=st.sampled_from([1.0, 1.1, 1.25, 1.35, 2.0]),
    cands=st.one_of(st.none(), st.sets(st.integers(0, 11), min_size=1)),
    sequential=st.booleans(),
)
def test_integer_loads_match_skipper_exactly(loads, bf, cands, sequential, kernel):
    got = RING.lookup_bounded(
        KEYS[:120],
        np.array(loads, float),
        bf,
        candidates=None if cands is None else sorted(cands),
        sequential=sequential,
    )
    want = ref.bounded(EPS, KEYS[:120], loads, bf, candidates=cands, sequential=sequential)
    assert got.tolist() == want


@settings(max_examples=60, deadline=None, suppress_health_check=_KERNEL_FIXTURE)
@given(
    loads=st.lists(st.floats(0, 3, allow_nan=False), min_size=12, max_size=12),
    bf=st.floats(1.0, 2.0),
    hops=st.integers(1, 13),
    cands=st.one_of(st.none(), st.sets(st.integers(0, 11), min_size=2)),
)
def test_hop_cap_takes_least_loaded_visited(loads, bf, hops, cands, kernel):
    c = None if cands is None else sorted(cands)
    got = RING.lookup_bounded(KEYS[:150], np.array(loads), bf, candidates=c, max_hops=hops)
    want = ref.bounded(EPS, KEYS[:150], loads, bf, candidates=cands, max_hops=hops)
    assert got.tolist() == want


def test_float_loads_unlimited_walk_matches_reference(kernel):
    rng = np.random.default_rng(3)
    for _ in range(20):
        loads = rng.pareto(1.5, size=12)
        bf = float(rng.choice([1.05, 1.25, 1.5]))
        assert RING.lookup_bounded(KEYS, loads, bf).tolist() == ref.bounded(
            EPS, KEYS, loads.tolist(), bf
        )


def test_target_is_computed_in_skippers_order():
    # (1 + 0.1 + 0.2) / 3 * 1.5 differs in the last bit from (1 + 0.1 + 0.2) * 1.5 / 3.
    loads = np.array([0.1, 0.2, 0.0])
    t = target_load(loads, np.ones(3, bool), 1.5)
    assert t == ((1.0 + 0.1) + 0.2) / 3.0 * 1.5


def test_load_equal_to_the_target_is_accepted():
    ring = lbcore.Ring(EPS[:4])
    # target = (1 + 4 + 0 + 0 + 0) / 4 * 3.2 = 4.0 exactly: endpoint 0 (load 4) is accepted.
    loads = np.array([4.0, 0.0, 0.0, 0.0])
    assert ring.lookup_bounded(KEYS, loads, 3.2).tolist() == ring.lookup(KEYS).tolist()
    # With 3.1 the target is 3.875 < 4: every key of endpoint 0 moves on.
    got = ring.lookup_bounded(KEYS, loads, 3.1)
    assert 0 not in got.tolist()
    plain = ring.lookup(KEYS)
    assert np.array_equal(got[plain != 0], plain[plain != 0])


def test_hot_endpoint_sheds_to_the_next_endpoints_on_the_ring():
    loads = np.zeros(12)
    loads[5] = 100
    plain = RING.lookup(KEYS)
    got = RING.lookup_bounded(KEYS, loads, 1.25)
    assert 5 not in got.tolist()
    assert np.array_equal(got[plain != 5], plain[plain != 5])
    assert np.array_equal(got[plain == 5], RING.lookup(KEYS, attempt=1)[plain == 5])


def test_snapshot_attempt_excludes_the_first_choice(kernel):
    loads = np.zeros(12)
    loads[[1, 2]] = 50
    first = RING.lookup_bounded(KEYS, loads, 1.25)
    second = RING.lookup_bounded(KEYS, loads, 1.25, attempt=1)
    assert np.all(first != second)
    assert not set(second.tolist()) & {1, 2}
    third = RING.lookup_bounded(KEYS, loads, 1.25, attempt=2)
    assert np.all((third != first) & (third != second))


def test_many_endpoints_over_the_bar_use_the_search_fallback():
    eps = [f"http://10.9.0.{i}:80" for i in range(1, 61)]
    ring = lbcore.Ring(eps)
    loads = np.full(60, 100.0)
    loads[[7, 33]] = 0.0
    keys = [f"k{i}" for i in range(2000)]
    # target = (1 + 5800) / 60 * 1.0 = 96.7: only the two idle endpoints qualify.
    got = ring.lookup_bounded(keys, loads, 1.0)
    assert set(got.tolist()) == {7, 33}
    assert got.tolist() == ref.bounded(eps, keys, loads.tolist(), 1.0)


def test_plan_answers_give_each_position_what_a_key_there_gets(kernel):
    rng = np.random.default_rng(5)
    keys = [f"R{i}" for i in range(3000)]
    h = lbcore.hash_keys(keys)
    for hops in (None, 3):
        loads = rng.exponential(1.0, 12)
        plan = lbcore.Plan(lbcore.RingSet(EPS), 0, loads=loads, balance_factor=1.25, max_hops=hops)
        answer, moved = plan.answers()
        via_table = answer[0][RING.positions(h)]
        routed = RING.lookup_bounded(None, loads, 1.25, max_hops=hops, hashes=h)
        assert via_table.tolist() == routed.tolist()
        assert (moved[0] == (answer[0] != RING.owners)).all()


def test_balance_factor_none_is_plain_lookup():
    assert RING.lookup_bounded(KEYS, np.arange(12.0), None).tolist() == RING.lookup(KEYS).tolist()


@pytest.mark.parametrize("bf", [0.99, 0.0, -1.0, float("nan"), float("inf"), "1.2", True])
def test_bad_balance_factor(bf):
    with pytest.raises(lbcore.BalanceFactorError, match="balance factor"):
        RING.lookup_bounded(KEYS, np.zeros(12), bf)


@pytest.mark.parametrize(
    ("loads", "match"),
    [
        (np.zeros(11), "shape"),
        (np.array([0.0] * 11 + [-1.0]), "endpoint 11 is -1.0"),
        (np.array([0.0] * 11 + [np.nan]), "finite"),
        (np.array([np.inf] + [0.0] * 11), "endpoint 0"),
        (["a"] * 12, "real numbers"),
        (np.array([1j] * 12), "real numbers"),
        ([True] * 12, "real numbers"),
    ],
)
def test_bad_loads(loads, match):
    with pytest.raises(lbcore.LoadError, match=match):
        RING.lookup_bounded(KEYS, loads, 1.25)


def test_bad_max_hops():
    with pytest.raises(lbcore.ArgumentError, match="max_hops"):
        RING.lookup_bounded(KEYS, np.zeros(12), 1.25, max_hops=0)


def test_no_candidates_is_fallback():
    assert RING.lookup_bounded(KEYS[:3], np.zeros(12), 1.25, candidates=[]).tolist() == [-1] * 3


def test_repeated_and_changed_snapshots_answer_as_the_reference(kernel):
    ring = lbcore.Ring(EPS)
    rng = np.random.default_rng(11)
    keys = [f"C{i}" for i in range(500)]
    for _ in range(3):
        loads = rng.exponential(1.0, 12)
        cands = sorted(rng.choice(12, 8, replace=False).tolist())
        want = ref.bounded(EPS, keys, loads.tolist(), 1.25, candidates=set(cands), max_hops=4)
        for _ in range(2):  # the same snapshot again: the same answers (no state kept)
            got = ring.lookup_bounded(keys, loads, 1.25, candidates=cands, max_hops=4)
            assert got.tolist() == want
        for i in range(0, 40, 3):  # tiny batches: the same answers
            small = ring.lookup_bounded(keys[i : i + 3], loads, 1.25, candidates=cands, max_hops=4)
            assert small.tolist() == want[i : i + 3]
        # A changed load changes the answers at once.
        loads2 = loads.copy()
        loads2[int(np.argmin(loads))] = 50.0
        want2 = ref.bounded(EPS, keys, loads2.tolist(), 1.25, candidates=set(cands), max_hops=4)
        assert (
            ring.lookup_bounded(keys, loads2, 1.25, candidates=cands, max_hops=4).tolist() == want2
        )
        # Other candidates or balance factor: their own answers.
        other = ref.bounded(EPS, keys, loads.tolist(), 1.25, max_hops=4)
        assert ring.lookup_bounded(keys, loads, 1.25, max_hops=4).tolist() == other
        assert ring.lookup_bounded(
            keys, loads, 1.5, candidates=cands, max_hops=4
        ).tolist() == ref.bounded(EPS, keys, loads.tolist(), 1.5, candidates=set(cands), max_hops=4)


def test_every_parameter_decides_as_the_reference(kernel):
    rng = np.random.default_rng(21)
    keys = [f"K{i}" for i in range(3000)]
    loads = rng.exponential(1.0, 12)
    loads[[2, 5]] = 9.0
    ring = lbcore.Ring(EPS)
    ring.lookup_bounded(keys, loads, 1.25, max_hops=1)
    for bf, hops in ((1.25, 3), (1.25, None), (1.6, 1), (1.0, 1)):
        got = ring.lookup_bounded(keys, loads, bf, max_hops=hops)
        assert got.tolist() == ref.bounded(EPS, keys, loads.tolist(), bf, max_hops=hops), (bf, hops)


def test_bad_input_raises_after_good_calls():
    ring = lbcore.Ring(EPS)
    loads = np.ones(12)
    for _ in range(3):
        ring.lookup_bounded(KEYS, loads, 1.0, max_hops=1)
    with pytest.raises(lbcore.ArgumentError):
        ring.lookup_bounded(KEYS, loads, 1.0, max_hops=True)
    with pytest.raises(lbcore.BalanceFactorError):
        ring.lookup_bounded(KEYS, loads, True, max_hops=1)
    with pytest.raises(lbcore.LoadError, match="shape"):
        ring.lookup_bounded(KEYS, loads.reshape(12, 1), 1.0, max_hops=1)


def test_few_keys_over_the_bar_walk_as_the_reference(kernel):
    rng = np.random.default_rng(8)
    for trial in range(30):
        loads = rng.integers(0, 6, 12).astype(float)
        loads[rng.integers(0, 12)] = 40.0
        hops = [None, 1, 2, 5][trial % 4]
        keys = [f"w{trial}-{i}" for i in range(int(rng.integers(5, 60)))]
        want = ref.bounded(EPS, keys, loads.tolist(), 1.1, max_hops=hops)
        assert lbcore.Ring(EPS).lookup_bounded(keys, loads, 1.1, max_hops=hops).tolist() == want


def test_tiny_batches_answer_as_the_batch(kernel):
    rng = np.random.default_rng(12)
    for trial in range(40):
        loads = rng.integers(0, 8, 12).astype(float)
        hops = [None, 1, 3][trial % 3]
        cands = None if trial % 2 else sorted(rng.choice(12, 7, replace=False).tolist())
        ring = lbcore.Ring(EPS)
        batch = ring.lookup_bounded(
            KEYS[:60], loads, 1.25, max_hops=hops, candidates=cands, attempt=trial % 2
        )
        for i in range(0, 60, 3):
            one = lbcore.Ring(EPS).lookup_bounded(
                KEYS[i : i + 3], loads, 1.25, max_hops=hops, candidates=cands, attempt=trial % 2
            )
            assert one.tolist() == batch[i : i + 3].tolist(), (trial, i)


@pytest.mark.parametrize("n_keys", [1, 2, 3, 4, 5, 50])
def test_a_retry_never_lands_on_the_first_choice_without_a_hop_cap(kernel, n_keys):
    """attempt=1 with Skipper's full lap (max_hops=None) and everything but one endpoint
    over the bar: the retry is another endpoint for every batch size (an old small-batch
    path of up to 4 keys walked attempt 1 without excluding attempt 0's choice)."""
    eps = [f"http://10.7.0.{i}:80" for i in range(1, 6)]
    ring = lbcore.Ring(eps)
    loads = np.array([0.0, 10.0, 10.0, 10.0, 10.0])
    keys = [f"retry-{i}" for i in range(n_keys)]
    first = ring.lookup_bounded(keys, loads, 1.0)
    second = ring.lookup_bounded(keys, loads, 1.0, attempt=1)
    assert (first == 0).all()  # the only endpoint under the bar takes every key
    assert (second != first).all() and (second >= 0).all()
    # Through a plan as the router builds it, key by key and as a batch.
    plan = lbcore.Plan(lbcore.RingSet(eps), 0, loads=loads, balance_factor=1.0)
    assert plan.route(keys, 1)[0].tolist() == second.tolist()
    assert [int(plan.route([k], 1)[0][0]) for k in keys] == second.tolist()
