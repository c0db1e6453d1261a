"""The simulator's three scenarios on small configurations: what matches Zalando's
published results, and (load signal) what does not, as the README states it."""

from dataclasses import replace

import pytest

from perf.sim.model import SimConfig
from perf.sim.scenarios import load_signal, scale_up, slow_pod

SMALL = SimConfig(
    pods=10,
    catalogue=50_000,
    cache_size=300,
    rate_per_pod=700.0,
    window_s=5.0,
    warmup_s=6.0,
    seconds=35.0,
    fade_s=10.0,
)


@pytest.fixture(scope="module")
def scale_up_result():
    return scale_up(replace(SMALL, cache_size=1_000), at_s=5.0, ready_spread_s=5.0)


def test_scale_up_without_fade_in_dips_hardest(scale_up_result):
    m = scale_up_result.summary["by_mode"]
    for fade in ("skipper", "n-ring"):
        assert m["off"]["hit_rate_min_1s"] < m[fade]["hit_rate_min_1s"] - 0.015
    assert m["off"]["db_reads_per_s_peak_1s"] > 1.2 * m["off"]["db_reads_per_s_before"]
    # the new pods end up with their steady-state share in every mode
    shares = {f: m[f]["new_pod_share_end"] for f in m}
    assert max(shares.values()) - min(shares.values()) < 0.05 and shares["n-ring"] > 0.35


def test_scale_up_nring_dips_less_than_skipper(scale_up_result):
    # Measured margin in this configuration: 1.6 points for the lowest second (0.5-1.6
    # over seeds 1-3), 1.1 for the lowest 5 s (0.6-1.1); the test demands 0.5 and 0.3.
    m = scale_up_result.summary["by_mode"]
    nring, skipper = m["n-ring"], m["skipper"]
    assert nring["hit_rate_min_1s"] > skipper["hit_rate_min_1s"] + 0.005
    assert nring["hit_rate_min_5s"] > skipper["hit_rate_min_5s"] + 0.003


def test_scale_up_nring_moves_each_key_once_and_only_to_its_owner(scale_up_result):
    m = scale_up_result.summary["by_mode"]
    nring, skipper = m["n-ring"], m["skipper"]
    assert nring["keys_moved"] > 1000
    assert nring["moves_per_moved_key"] == 1.0
    assert nring["new_pod_foreign_fetch_share"] == 0.0
    assert nring["new_pod_cached_owned_share"] == 1.0
    assert nring["publishes"] == 1  # ready 5 s apart at most 0.5 s: one debounced event
    # Skipper's per-request draw sends a key back and forth, and (new pods detected at
    # different polls) warms new pods with keys another new pod will own.
    assert skipper["moves_per_moved_key"] > 1.5
    assert skipper["new_pod_foreign_fetch_share"] > 0.01
    assert skipper["new_pod_cached_owned_share"] < 0.995
    # Skipper detects pods at its 3-s polls (6, 9, 12 s), N-ring publishes one event
    # after the 2-s trailing debounce (9.5 + 2 s)
    assert skipper["publishes"] == 3 and skipper["first_publish_s"] < nring["first_publish_s"]


def _load_base():
    return replace(SMALL, pods=20, cache_size=1_000, rate_per_pod=350.0, seconds=20.0)


def test_load_signal_occupancy_keeps_cache_hits_but_does_not_narrow_the_spread():
    r = load_signal(_load_base(), slo_p99_ms=None)
    v = r.summary["by_variant"]
    inflight = v["in-flight bf 1.1"]
    for occ in (v["occupancy bf 1.25"], v["occupancy bf 1.35"]):
        # in-flight counts per client host are small integers, so the 1.10 bound fires on
        # almost any open call and spills keys around: cache hits suffer
        assert occ["hit_rate"] > inflight["hit_rate"] + 0.03
        assert occ["db_reads_per_s"] < 0.85 * inflight["db_reads_per_s"]
        assert occ["moves_per_s"] < 0.1 * inflight["moves_per_s"]
        # Not reproduced (README): Zalando's narrower occupancy spread. Here the spill
        # evens in-flight's load, and occupancy's bound trims the top but cannot lift
        # pods that consistent hashing gives little: the spread over the mean is wider.
        assert occ["over_mean"]["p5"] < inflight["over_mean"]["p5"]
        assert occ["over_mean"]["p5_p95_width"] > inflight["over_mean"]["p5_p95_width"]


def test_load_signal_unequal_pods_occupancy_caps_each_pod_at_the_host_bar_in_flight_does_not():
    # Pods on unequal nodes, 32 client hosts each with its own counters: a host has about
    # 0.05 calls open per pod. The in-flight bar is below one call, so it fires on
    # whichever pod a host happens to have a call open to; occupancy (a 5-s rate) holds
    # every pod under its bar, bf x (1 + 1 / a host's summed load) x the mean. Neither
    # lifts the slowest-loaded pods (README, Load signal). Seeds 1-3: occupancy max 1.64-1.93
    # of the mean under bars of 1.92-2.15; in-flight max 1.80-2.46 over bars of 1.65-1.70;
    # p5 equal within 0.01.
    base = replace(
        SMALL, pods=40, clients=32, pod_speed_sigma=0.3, rate_per_pod=350.0, seconds=10.0
    )
    v = load_signal(base, slo_p99_ms=None).summary["by_variant"]
    inflight = v["in-flight bf 1.1"]
    assert inflight["host_load_per_pod"] < 0.1 and inflight["host_bar"] < 1.0
    assert inflight["over_mean"]["max"] > inflight["host_bar_over_mean"] + 0.1
    for occ in (v["occupancy bf 1.25"], v["occupancy bf 1.35"]):
        assert occ["over_mean"]["max"] <= occ["host_bar_over_mean"] + 0.05
        assert occ["over_mean"]["max"] < inflight["over_mean"]["max"]
        assert occ["over_mean"]["p5"] == pytest.approx(inflight["over_mean"]["p5"], abs=0.05)
        assert occ["hit_rate"] > inflight["hit_rate"]


def test_load_signal_occupancy_needs_fewer_pods_for_the_same_p99(tmp_path):
    r = load_signal(_load_base(), occupancy_factors=(1.25,), search_seconds=8.0)
    v = r.summary["by_variant"]
    inflight, occ = v["in-flight bf 1.1"], v["occupancy bf 1.25"]
    assert occ["pods_needed"]["pods"] < inflight["pods_needed"]["pods"]
    for row in (inflight, occ):
        at = row["at_pods_needed"]
        assert at["pods"] == row["pods_needed"]["pods"] and at["lat_p99_ms"] <= 25.0
    assert occ["at_pods_needed"]["hit_rate"] > inflight["at_pods_needed"]["hit_rate"]
    pytest.importorskip("matplotlib")
    from perf.sim.plot import plot

    (png,) = plot(r, tmp_path)
    assert png.name == "sim-load-signal.png" and png.stat().st_size > 10_000


def test_slow_pod_latency_weighting_moves_more_traffic_off_it_than_occupancy():
    base = replace(SMALL, rate_per_pod=350.0, seconds=40.0)
    r = slow_pod(base, at_s=10.0, until_s=25.0)
    v = r.summary["by_variant"]
    off, occ, eff = v["no bounded load"], v["occupancy bf 1.25"], v["effective bf 1.25"]
    # without bounded load the slow pod keeps its share, its queue explodes, and the
    # report says so
    assert off["share_slow"] == pytest.approx(off["share_before"], rel=0.2)
    assert [w.split(":")[0] for w in r.warnings] == ["no bounded load"]
    assert "pod 0 was overloaded for a while" in r.warnings[0]
    # bounded load moves traffic off it and it comes back after
    for row in (occ, eff):
        assert row["share_slow"] < 0.5 * row["share_before"]
        assert row["share_after"] == pytest.approx(row["share_before"], rel=0.3)
    # Latency weighting, at the same balance factor, while slow: p99 41 vs 84 ms here
    # (seeds 1-3: 0.41-0.49 of occupancy's), share 1.06 vs 1.62 % (0.65-0.94).
    assert eff["lat_p99_ms_slow"] < 0.6 * occ["lat_p99_ms_slow"]
    assert eff["share_slow"] < occ["share_slow"]
    assert occ["lat_p99_ms_slow"] < off["lat_p99_ms_slow"]
