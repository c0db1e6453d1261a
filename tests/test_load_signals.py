"""The routing signals lbcore computes from the sums shm reads: failure rate, the host's
mean latency, busy time of open calls, and the load bounded load compares (failed calls
counted as calls of the host's mean latency)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbcore.errors import LoadError
from lbcore.signals import (
    failure_rate,
    global_latency,
    load_for,
    open_busy_ns,
    routing_load,
    with_failures,
)

S = 1_000_000_000


def test_failure_rate_is_failures_over_completions_and_nan_without_any():
    rate = failure_rate([1, 0, 3], [4, 0, 3])
    assert rate[0] == 0.25 and math.isnan(rate[1]) and rate[2] == 1.0


def test_global_latency_is_summed_latency_over_summed_completions_in_seconds():
    assert global_latency(np.array([2 * S, 4 * S]), np.array([1, 2])) == 2.0
    assert math.isnan(global_latency(np.zeros(3), np.zeros(3)))


def test_open_calls_count_their_age_but_at_most_the_window():
    w = 10 * S
    counts = np.array([[2, 1]])
    since = np.array([[3 * S]])  # the bucket started 3 s ago
    offsets = np.array([[2 * S, 0]])  # two calls started 1 s into it; one at its start
    np.testing.assert_array_equal(open_busy_ns(counts, since, offsets, w), [[4 * S, 3 * S]])
    old = open_busy_ns(np.array([[2]]), np.array([[30 * S]]), np.array([[0]]), w)
    assert old.tolist() == [[2 * w]]  # clipped to one window per call
    assert open_busy_ns(np.array([[-1]]), since, np.array([[0]]), w).tolist() == [[0]]


@pytest.mark.parametrize("signal", ["effective", "occupancy", "in-flight"])
def test_routing_load_is_load_for_on_the_signals_with_failures(signal):
    in_flight = np.array([1.0, 0.0, 2.0])
    occ = np.array([0.5, 0.01, 0.2])
    lat = np.array([0.1, 0.001, np.nan])
    completed = np.array([10.0, 50.0, 0.0])
    failures = np.array([0.0, 40.0, 0.0])
    g, window_s = 0.05, 10.0
    o, la = with_failures(occ, lat, completed, failures, g, window_s)
    want = load_for(signal, in_flight, o, la, g)
    got = routing_load(signal, in_flight, occ, lat, completed, failures, g, window_s)
    np.testing.assert_array_equal(got, want)
    if signal == "occupancy":
        assert got[1] > occ[1]  # the pod that fails fast does not look idle
    with pytest.raises(LoadError, match="unknown load signal"):
        routing_load("queue", in_flight, occ, lat, completed, failures, g, window_s)
