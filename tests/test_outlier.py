"""lbcore's outlier rules and ejection state machine, alone: counts and time in, decisions out."""

import numpy as np
import pytest

from lbcore.ejection import Ejections, routing_mask, step
from lbcore.errors import OutlierError
from lbcore.outlier import (
    REASON_CONSECUTIVE,
    REASON_FAILURE_PERCENTAGE,
    REASON_SUCCESS_RATE,
    SUCCESS_RATE_MIN_GAP,
    TIMEOUT_MARGIN,
    TIMEOUT_PEER_MAX,
    OutlierParams,
    interval_counts,
    judge,
    streaks,
)

S = 1_000_000_000
P = OutlierParams()


def kinds(connect=0, timeout=0, status=0, other=0):
    return [connect, timeout, status, other]


# -- timeouts: the pod's or the caller's ---------------------------------------------------


def test_a_frozen_pods_timeouts_count_and_a_saturated_callers_do_not():
    # Pod 2 is frozen: all its calls time out, its peers answer.
    frozen = interval_counts(
        [10, 10, 8, 10, 0], [kinds(), kinds(timeout=1), kinds(timeout=8)] * 1 + [kinds(), kinds()]
    )
    assert frozen.failures.tolist() == [0, 0, 8, 0, 0]
    assert frozen.local_timeouts.tolist() == [0, 1, 0, 0, 0]
    assert frozen.successes.tolist() == [10, 9, 0, 10, 0]
    # A frozen pod that got a single call among busy peers: still its own.
    one = interval_counts(
        [100, 100, 1, 100, 100], [kinds(), kinds(), kinds(timeout=1)] + [kinds()] * 2
    )
    assert one.failures.tolist() == [0, 0, 1, 0, 0]
    # The caller is saturated: every pod times out about as often, even entirely.
    calls = [10, 12, 9, 11]
    sat = interval_counts(calls, [kinds(timeout=t) for t in (6, 8, 9, 5)])
    assert sat.failures.tolist() == [0, 0, 0, 0]
    assert sat.local_timeouts.tolist() == [6, 8, 9, 5]
    everything = interval_counts(calls, [kinds(timeout=c) for c in calls])
    assert everything.failures.tolist() == [0] * 4 and everything.successes.tolist() == [0] * 4


def test_a_saturated_caller_at_small_counts_per_interval_ejects_nobody():
    # A 0.25-s interval, an asyncio worker saturated, a few calls per
    # pod, each pod's calls timing out together. Judged by the median of the others'
    # shares, pod 1 (2 of 2) stood out by more than the margin in the first interval and
    # counted 2 failures with no success; a few such intervals made 5 in a row.
    p = OutlierParams(interval_ns=S // 4, window_ns=2 * S)
    rng = np.random.default_rng(7)
    streak = np.zeros(5, np.int64)
    worst = 0
    for i in range(400):  # 100 s of intervals
        if i == 0:
            calls = np.array([3, 2, 4, 3, 2])
            t = np.array([1, 2, 2, 0, 1])
        else:
            calls = rng.integers(1, 5, 5)
            t = rng.binomial(calls, rng.uniform(0.05, 0.6))  # the caller's share this interval
        c = interval_counts(calls, [kinds(timeout=x) for x in t])
        assert c.failures.sum() == 0, (i, calls.tolist(), t.tolist())
        streak = streaks(streak, c.successes, c.failures)
        worst = max(worst, int(streak.max()))
    assert worst == 0
    assert judge(np.zeros(5), np.zeros(5), streak, p).reasons.tolist() == [0] * 5
    # A milder saturation (peers at ~10 %): two of two calls timing out are no evidence.
    assert (
        interval_counts([8, 2, 8, 8, 8], [kinds(timeout=x) for x in (1, 2, 1, 0, 1)]).failures.sum()
        == 0
    )


def test_a_frozen_pod_among_healthy_ones_is_ejected_within_a_few_short_intervals():
    # The same 0.25-s interval: the frozen pod's calls (a few per interval, the bulkhead
    # holds the rest) all time out while its peers answer; a dead pod's connect errors.
    p = OutlierParams(interval_ns=S // 4, window_ns=2 * S)
    for kind in ("timeout", "connect"):
        streak = np.zeros(5, np.int64)
        took = 0
        v = judge(np.zeros(5), np.zeros(5), streak, p)
        while not v.reasons.any() and took < 10:
            calls = [40, 40, 3, 40, 40]
            c = interval_counts(calls, [kinds(), kinds(), kinds(**{kind: 3}), kinds(), kinds()])
            streak = streaks(streak, c.successes, c.failures)
            v = judge(np.zeros(5), np.zeros(5), streak, p)
            took += 1
        assert v.reasons.tolist() == [0, 0, REASON_CONSECUTIVE, 0, 0] and took == 2, (kind, took)


def test_timeouts_count_only_with_quiet_peers_past_the_margin_and_with_evidence():
    # Peers' pooled timeout share is 0.1 (30 of 300); the pod needs >= 0.1 + the margin.
    base = [kinds(timeout=10)] * 3
    just = round((0.1 + TIMEOUT_MARGIN) * 100)
    at = interval_counts([100] * 4, [*base, kinds(timeout=just)])
    below = interval_counts([100] * 4, [*base, kinds(timeout=just - 1)])
    assert at.failures[3] == just and below.failures[3] == 0
    # Peers over TIMEOUT_PEER_MAX: the caller is slow, nobody's timeouts count.
    peer_t = int(TIMEOUT_PEER_MAX * 100) + 1  # of 100 calls each
    slow = interval_counts([100] * 4, [kinds(timeout=peer_t)] * 3 + [kinds(timeout=100)])
    assert slow.failures.tolist() == [0] * 4
    quiet = interval_counts([100] * 4, [kinds(timeout=peer_t - 2)] * 3 + [kinds(timeout=100)])
    assert quiet.failures.tolist() == [0, 0, 0, 100]
    # The z-test: the same shares count with enough calls, not with a handful.
    assert (
        interval_counts(
            [3, 3, 2, 3, 3], [kinds(), kinds(), kinds(timeout=2), kinds(), kinds()]
        ).failures.sum()
        == 0
    )
    assert (
        interval_counts(
            [10, 10, 2, 10, 10], [kinds(), kinds(), kinds(timeout=2), kinds(), kinds()]
        ).failures[2]
        == 2
    )
    # Connect errors, statuses and other failures count even when everyone has them.
    mixed = interval_counts([10, 10], [kinds(connect=3, status=2, other=1), kinds(connect=4)])
    assert mixed.failures.tolist() == [6, 4] and mixed.successes.tolist() == [4, 6]
    # Two pods: the frozen one's peer is its only reference; without peers' calls there
    # is nothing to judge a timeout against.
    two = interval_counts([10, 20], [kinds(timeout=10), kinds()])
    assert two.failures.tolist() == [10, 0]
    alone = interval_counts([3, 0], [kinds(timeout=3), kinds()])
    assert alone.failures.tolist() == [0, 0] and alone.local_timeouts.tolist() == [3, 0]


def test_ejected_endpoints_are_no_peers_for_timeouts():
    # Pod 0 was ejected (frozen); the tail of its calls still times out. Pod 2 freezes
    # now: judged against pods 1, 3, 4 only.
    calls = [20, 20, 4, 20, 20]
    by = [kinds(timeout=20), kinds(), kinds(timeout=4), kinds(), kinds()]
    assert interval_counts(calls, by).failures[2] == 0  # with pod 0: peers at 25 % timeouts
    peers = np.array([False, True, True, True, True])
    assert interval_counts(calls, by, peers=peers).failures.tolist() == [20, 0, 4, 0, 0]
    with pytest.raises(OutlierError, match="peers"):
        interval_counts(calls, by, peers=[True, False])


@pytest.mark.parametrize(
    "calls, by_kind, match",
    [
        ([1, 2], [kinds()], "failures by kind"),
        ([1], [[0, 0, 0]], "failures by kind"),
        ([-1], [kinds()], ">= 0"),
        ([1], [kinds(connect=2)], "at most the calls"),
    ],
)
def test_bad_interval_counts_are_refused(calls, by_kind, match):
    with pytest.raises(OutlierError, match=match):
        interval_counts(calls, by_kind)


# -- the rules -----------------------------------------------------------------------------


def test_a_success_ends_a_streak_and_a_quiet_interval_keeps_it():
    st = np.zeros(3, np.int64)
    st = streaks(st, [0, 1, 0], [3, 3, 0])
    assert st.tolist() == [3, 0, 0]
    st = streaks(st, [0, 0, 0], [0, 2, 1])  # no calls to pod 0: still 3
    assert st.tolist() == [3, 2, 1]
    st = streaks(st, [2, 0, 0], [9, 3, 0])
    assert st.tolist() == [0, 5, 1]


def test_consecutive_failures_eject_at_the_threshold_with_little_traffic():
    v = judge([0, 0, 5], [5, 4, 0], [5, 4, 0], P)
    assert v.reasons.tolist() == [REASON_CONSECUTIVE, 0, 0]


def test_failure_percentage_needs_its_volume():
    few = judge([5], [45], [0], P)  # 90 % of 50 calls
    assert few.reasons.tolist() == [REASON_FAILURE_PERCENTAGE]
    assert np.isclose(few.failure_rate[0], 0.9)
    assert judge([4], [45], [0], P).reasons.tolist() == [0]  # 49 calls: under the volume
    assert judge([10], [40], [0], P).reasons.tolist() == [0]  # 80 % < 85 %


def test_success_rate_finds_the_outlier_among_enough_hosts():
    succ = [200, 198, 199, 200, 140]
    fail = [0, 2, 1, 0, 60]  # pod 4 at 70 %: far below the others
    assert judge(succ, fail, [0] * 5, P).reasons.tolist() == [0, 0, 0, 0, REASON_SUCCESS_RATE]
    # Four hosts with volume are not enough.
    assert judge(succ[1:], fail[1:], [0] * 4, P).reasons.tolist() == [0] * 4
    # Nor are hosts under the volume counted among them.
    low = [200, 198, 199, 50, 140]
    assert judge(low, [0, 2, 1, 0, 60], [0] * 5, P).reasons.tolist() == [0] * 5


def test_one_failure_among_perfect_peers_is_not_an_outlier():
    """Their stdev is tiny, so mean - 1.9 stdev sits just below 100 %: the minimum gap
    keeps a 99 % pod in (Envoy would eject it)."""
    succ = [1000] * 9 + [990]
    fail = [0] * 9 + [10]
    ok = 1 - np.array(fail) / 1000
    assert ok[-1] < ok.mean() - 1.9 * ok.std()  # an outlier by the stdev alone
    assert ok.mean() - ok[-1] < SUCCESS_RATE_MIN_GAP
    assert judge(succ, fail, [0] * 10, P).reasons.tolist() == [0] * 10


def test_rules_can_be_switched_off_and_the_first_rule_names_the_reason():
    off = OutlierParams(consecutive_failures=0, failure_percentage=0, success_rate_stdev=0)
    assert judge([0], [100], [100], off).reasons.tolist() == [0]
    assert judge([0], [100], [100], OutlierParams(enabled=False)).reasons.tolist() == [0]
    assert judge([0], [100], [100], P).reasons.tolist() == [REASON_CONSECUTIVE]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"interval_ns": 0}, "interval"),
        ({"interval_ns": 11 * S}, "at most the window"),
        ({"base_ejection_ns": 0}, "ejection times"),
        ({"max_ejection_percent": 101}, "max_ejection_percent"),
        ({"panic_threshold": -1}, "panic_threshold"),
        ({"consecutive_failures": -1}, "consecutive_failures"),
        ({"success_rate_stdev": float("inf")}, "success_rate_stdev"),
    ],
)
def test_bad_params_are_refused(kw, match):
    with pytest.raises(OutlierError, match=match):
        OutlierParams(**kw)


# -- ejections over time -------------------------------------------------------------------


def eject_one(state, i, now, params=P):
    why = np.zeros(len(state), np.uint8)
    why[i] = REASON_CONSECUTIVE
    return step(state, why, now, params)


def test_ejection_time_grows_with_repeats_up_to_the_max_and_decays_while_healthy():
    params = OutlierParams(base_ejection_ns=30 * S, max_ejection_ns=100 * S)
    st = Ejections.none(10)
    t = 1000 * S
    lengths = []
    for _ in range(5):
        out = eject_one(st, 3, t, params)
        assert out.ejected.tolist() == [3]
        st = out.state
        lengths.append(int(st.until_ns[3]) - t)
        t = int(st.until_ns[3])
        out = step(st, np.zeros(10, np.uint8), t, params)  # over: readmitted
        assert out.readmitted.tolist() == [3] and not out.state.ejected.any()
        st = out.state
    assert lengths == [30 * S, 60 * S, 90 * S, 100 * S, 100 * S]
    assert st.counts[3].tolist() == [5, 0, 0] and st.multiplier[3] == 5
    # Healthy for one window: one step down; for three more: three more.
    w = params.window_ns
    st = step(st, np.zeros(10, np.uint8), t + w - 1, params).state
    assert st.multiplier[3] == 5
    st = step(st, np.zeros(10, np.uint8), t + w, params).state
    assert st.multiplier[3] == 4
    st = step(st, np.zeros(10, np.uint8), t + 4 * w + 5, params).state
    assert st.multiplier[3] == 1
    # An ejection now lasts the base again... after one more healthy window, exactly.
    st = step(st, np.zeros(10, np.uint8), t + 5 * w, params).state
    assert st.multiplier[3] == 0 and st.decay_ns[3] == 0
    out = eject_one(st, 3, t + 6 * w, params)
    assert int(out.state.until_ns[3]) - (t + 6 * w) == 30 * S


def test_at_most_the_maximum_share_is_ejected_worst_first_and_at_least_one():
    st = Ejections.none(20)  # 10 % of 20: two at once
    why = np.zeros(20, np.uint8)
    why[[2, 5, 9, 11]] = [
        REASON_SUCCESS_RATE,
        REASON_FAILURE_PERCENTAGE,
        REASON_CONSECUTIVE,
        REASON_FAILURE_PERCENTAGE,
    ]
    rate = np.zeros(20)
    rate[[2, 5, 9, 11]] = [0.9, 0.86, 0.5, 0.95]
    out = step(st, why, 10 * S, P, rate)
    assert sorted(out.ejected.tolist()) == [9, 11]  # consecutive first, then the worse %
    assert sorted(out.held_back.tolist()) == [2, 5]
    assert out.state.reason[[9, 11]].tolist() == [REASON_CONSECUTIVE, REASON_FAILURE_PERCENTAGE]
    # Full: the next evaluation ejects nobody more.
    again = step(out.state, why, 11 * S, P, rate)
    assert again.ejected.size == 0 and sorted(again.held_back.tolist()) == [2, 5]
    # Five endpoints: 10 % is half of one, still one.
    five = step(Ejections.none(5), np.array([1, 1, 0, 0, 0], np.uint8), 10 * S, P)
    assert five.ejected.tolist() == [0] and five.held_back.tolist() == [1]
    none = step(
        Ejections.none(5),
        np.array([1, 0, 0, 0, 0], np.uint8),
        10 * S,
        OutlierParams(max_ejection_percent=0),
    )
    assert none.ejected.size == 0


def test_a_readmitted_endpoint_is_not_ejected_again_by_the_same_step():
    st = eject_one(Ejections.none(4), 1, 10 * S).state
    until = int(st.until_ns[1])
    out = step(st, np.array([0, 1, 0, 0], np.uint8), until, P)
    assert out.readmitted.tolist() == [1] and out.ejected.size == 0
    out = step(out.state, np.array([0, 1, 0, 0], np.uint8), until + S, P)
    assert out.ejected.tolist() == [1] and out.state.multiplier[1] == 2


def test_turning_detection_off_readmits_everyone_at_once():
    st = eject_one(Ejections.none(4), 2, 10 * S).state
    out = step(st, np.array([1, 1, 1, 1], np.uint8), 11 * S, OutlierParams(enabled=False))
    assert out.readmitted.tolist() == [2] and out.ejected.size == 0
    assert not out.state.ejected.any()


def test_below_the_panic_threshold_routing_ignores_every_ejection():
    mask, panic = routing_mask([True, False, False, False], 50.0)
    assert mask.tolist() == [True, False, False, False] and not panic
    mask, panic = routing_mask([True, True, False, False], 50.0)  # 50 %: not below
    assert not panic and mask.sum() == 2
    mask, panic = routing_mask([True, True, True, False], 50.0)
    assert panic and not mask.any()
    mask, panic = routing_mask([True, True, True], 0.0)  # panic off: all ejected
    assert not panic and mask.all()
    empty, panic = routing_mask([], 50.0)
    assert empty.size == 0 and not panic


def test_state_follows_a_new_endpoint_list_and_checks_its_input():
    st = eject_one(Ejections.none(3), 1, 10 * S).state
    moved = st.take([1, -1, 0])
    assert moved.reason.tolist() == [REASON_CONSECUTIVE, 0, 0]
    assert moved.counts.tolist() == [[1, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert Ejections.none(0).take([-1, -1]).reason.tolist() == [0, 0]
    again = Ejections.of(st.reason, st.until_ns, st.multiplier, st.decay_ns, st.counts)
    assert again.equal(st) and not again.equal(moved)
    with pytest.raises(OutlierError, match=r"reasons must be 0\.\.3"):
        Ejections.of([4], [0], [0], [0], [[0, 0, 0]])
    with pytest.raises(OutlierError, match=">= 0"):
        Ejections.of([1], [-5], [0], [0], [[0, 0, 0]])
    with pytest.raises(OutlierError, match=r"counts must be \(1, 3\)"):
        Ejections.of([1], [5], [0], [0], [[0, 0]])
    with pytest.raises(OutlierError, match="reasons must be 3 codes"):
        step(st, [0, 0], 10 * S, P)
