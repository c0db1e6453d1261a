"""Differential test over zone plans: the native kernel and the NumPy reference alike.

The random plans of :mod:`tests.test_kernel_differential` (ring sets with fading rings,
ejections, gates, every fade mode, loads, balance factors, hop caps) with a random
zone: which endpoints are local, the share (0, 1 or between), ``min_pods``, the caller
zone's name (the local draw's salt) and in some a bar window with the local share at
its instants (B1's bars then mix each instant's views). Both kernels must give the same
indices, counts and errors, for drawn key batches and for keys on and just past every
ring point, at attempts 0 to 3.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lbcore
from lbcore import Plan, ZoneSplit
from lbcore.zones import MAX_BAR_WINDOW_NS, WINDOW_SAMPLES
from tests.kernel_harness import on
from tests.test_kernel_differential import KEY_ERRORS, D, batches, plans, routed_and_recorded

pytestmark = pytest.mark.skipif(
    lbcore.kernel.native() is None and lbcore.kernel.load_native() is None,
    reason="needs the native kernel",
)


@st.composite
def zone_plans(draw):
    args = draw(plans())
    n = len(args["ring_set"].endpoints)
    kind = draw(st.sampled_from(["random", "most", "few", "none", "all"]))
    if kind == "random":
        local = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    else:
        k = {"most": max(1, n - 2), "few": min(n, 2), "none": 0, "all": n}[kind]
        local = [i < k for i in range(n)]
        if draw(st.booleans()):
            local = local[::-1]
    share = draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0))
    # the caller's zone salts the local draw: both kernels must take it from the split
    name = draw(st.sampled_from(["", "z-a", "z-b"]) | st.text(st.characters(codec="utf-8")))
    # B1's bars over a window: the fade-in curves at each instant (some before a ring
    # started) and the local share there, constant, ramping or anything
    window = draw(st.sampled_from([0, 0, D // 2, 3 * D]) | st.integers(1, MAX_BAR_WINDOW_NS))
    bar_shares = None
    if window:
        a, b = draw(st.floats(0.0, 1.0)), draw(st.floats(0.0, 1.0))
        bar_shares = draw(
            st.just(tuple(np.linspace(a, b, WINDOW_SAMPLES).tolist()))
            | st.lists(st.floats(0.0, 1.0), min_size=WINDOW_SAMPLES, max_size=WINDOW_SAMPLES)
        )
    args["zone"] = ZoneSplit(
        np.array(local, dtype=np.bool_),
        share,
        min_pods=draw(st.integers(1, 5)),
        name=name,
        bar_window_ns=window,
        bar_shares=bar_shares,
    )
    return args


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(zone_plans(), batches(), st.integers(0, 3))
def test_native_and_numpy_route_zone_plans_alike(args, keys, attempt):
    native = on("native", lambda: routed_and_recorded(args, keys, attempt))
    reference = on("numpy", lambda: routed_and_recorded(args, keys, attempt))
    assert native == reference
    if native[0] == "error":
        assert issubclass(native[1], KEY_ERRORS), native


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(zone_plans(), st.integers(0, 3))
def test_native_and_numpy_agree_on_every_position_of_zone_plans(args, attempt):
    def every_position():
        plan = Plan(**args)
        answer, moved = plan.answers()
        if plan.closed:
            return answer.tolist(), moved.tolist(), [], plan.views
        h = plan.newest.hashes.copy()  # keys exactly on ring points, and just past them
        h2 = h + np.uint64(1)
        routed = plan.route_hashes(np.concatenate((h, h2)), attempt)
        return answer.tolist(), moved.tolist(), routed[0].tolist(), routed[1:], plan.views

    assert on("native", every_position) == on("numpy", every_position)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(zone_plans(), st.integers(0, 2**32 - 1))
def test_native_and_numpy_route_many_random_hashes_alike(args, seed):
    """Thousands of keys per plan: the zone draw splits them, spills and walks happen."""
    h = np.random.default_rng(seed).integers(0, 2**64, size=3000, dtype=np.uint64)

    def routed():
        plan = Plan(**args)
        return [plan.route_hashes(h, a)[0].tolist() for a in (0, 1)], plan.route_hashes(h)[1:]

    assert on("native", routed) == on("numpy", routed)
