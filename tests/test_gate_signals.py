import numpy as np
import pytest

import lbcore
from lbcore.gate import Gate, apply_gate, gate_mask
from lbcore.signals import effective_load, mean_latency, occupancy, window_weights

H = lbcore.hash_keys([f"G{i}" for i in range(100_000)])


@pytest.mark.parametrize("pct", [0, 1, 10, 33.3, 50, 99, 100])
def test_percentage_selects_that_share_of_keys(pct):
    m = gate_mask(H, True, pct)
    assert abs(m.mean() - pct / 100) < 0.006


def test_raising_the_percentage_only_adds_keys():
    prev = gate_mask(H, True, 0)
    for pct in (5, 10, 25, 50, 75, 100):
        cur = gate_mask(H, True, pct)
        assert not (prev & ~cur).any()
        prev = cur


def test_gate_is_deterministic_per_key_and_independent_of_the_ring():
    a = gate_mask(H, True, 30)
    assert np.array_equal(a, gate_mask(H.copy(), True, 30))
    ring = lbcore.Ring([f"http://10.11.0.{i}:80" for i in range(1, 6)])
    owners = ring.owners[ring.positions(H)]
    for e in range(5):
        assert abs(a[owners == e].mean() - 0.30) < 0.02


def test_disabled_and_apply():
    assert not gate_mask(H, False, 100).any()
    idx = np.zeros(H.size, dtype=np.int32)
    apply_gate(idx, H, True, 40)
    assert abs((idx == -1).mean() - 0.6) < 0.006
    g = Gate(enabled=False)
    assert (g.apply(np.zeros(10, np.int32), H[:10]) == lbcore.FALLBACK).all()
    assert Gate().passes_all and not Gate(percentage=99.9).passes_all


@pytest.mark.parametrize("bad", [-1, 100.01, float("nan"), "50", None])
def test_bad_percentage(bad):
    with pytest.raises(lbcore.GateError, match="percentage"):
        Gate(percentage=bad)


def test_bad_enabled():
    with pytest.raises(lbcore.GateError, match="enabled"):
        Gate(enabled="yes")


def test_occupancy_is_busy_seconds_per_second():
    window = 10 * 10**9
    assert occupancy([10 * 10**9, 5 * 10**9, 0], window).tolist() == [1.0, 0.5, 0.0]
    buckets = np.array([[10**9] * 10, [2 * 10**9] * 10])
    assert occupancy(buckets, window).tolist() == [1.0, 2.0]


def test_window_weights_cover_partial_buckets():
    starts = np.arange(0, 12 * 10**9, 10**9)  # buckets [0,1) .. [11,12) s
    w = window_weights(starts, 10**9, now_ns=11_500_000_000, window_ns=10 * 10**9)
    # The oldest bucket counts by its overlap; the one in progress (half elapsed) fully.
    assert w[0] == 0.0 and w[1] == 0.5 and w[11] == 1.0 and w[5] == 1.0
    assert w.sum() == pytest.approx(10.5)
    # A busy half second in the elapsed half of the current bucket is all in the window.
    busy = np.zeros((1, 12))
    busy[0, 11] = 0.5e9
    assert occupancy(busy, 10 * 10**9, w)[0] == pytest.approx(0.05)


def test_effective_load():
    inflight = np.array([2.0, 0.0, 1.0, 3.0])
    occ = np.array([1.5, 0.8, 0.2, 0.0])
    lat = np.array([0.010, 0.020, np.nan, 0.500])
    got = effective_load(inflight, occ, lat, 0.010)
    assert got.tolist() == [2.0, 1.6, 1.0, 15.0]  # latency factor capped at 5
    assert effective_load(inflight, occ).tolist() == [2.0, 0.8, 1.0, 3.0]
    assert effective_load(inflight, occ, lat, 0.0).tolist() == [2.0, 0.8, 1.0, 3.0]


def test_mean_latency():
    got = mean_latency([1.0, 0.0], [4, 0])
    assert got[0] == 0.25 and np.isnan(got[1])


def test_signal_validation():
    with pytest.raises(lbcore.LoadError, match="in_flight"):
        effective_load([-1.0], [0.0])
    with pytest.raises(lbcore.LoadError, match="occupancy"):
        effective_load([0.0], [np.nan])
    with pytest.raises(lbcore.LoadError, match="window"):
        occupancy([1], 0)


def test_load_for_each_signal():
    from lbcore.signals import load_for

    inflight, occ, lat = np.array([2.0, 0.0]), np.array([1.5, 0.8]), np.array([0.02, 0.01])
    assert load_for("in-flight", inflight, occ).tolist() == [2.0, 0.0]
    assert load_for("occupancy", inflight, occ).tolist() == [1.5, 0.8]
    assert load_for("effective", inflight, occ, lat, 0.01).tolist() == [4.0, 0.8]
    with pytest.raises(lbcore.LoadError, match="unknown load signal 'cpu'"):
        load_for("cpu", inflight, occ)
