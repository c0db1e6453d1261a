"""The simulator's three scenarios come out as Zalando reported, on small configurations."""

from dataclasses import replace

import pytest

from perf.sim.model import SimConfig
from perf.sim.scenarios import load_signal, slow_pod

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
    from perf.sim.scenarios import scale_up

    return scale_up(replace(SMALL, cache_size=1_000), at_s=5.0, ready_spread_s=5.0)


def test_scale_up_without_fade_in_dips_hardest(scale_up_result):
    m = scale_up_result.summary["by_mode"]
    for fade in ("skipper", "n-ring"):
        assert m["off"]["hit_rate_min_1s"] < m[fade]["hit_rate_min_1s"] - 0.015
    assert m["off"]["db_reads_per_s_peak_1s"] > 1.2 * m["off"]["db_reads_per_s_before"]
    # the new pods end up with their steady-state share in every mode
    shares = {f: m[f]["new_pod_share_end"] for f in m}
    assert max(shares.values()) - min(shares.values()) < 0.05 and shares["n-ring"] > 0.35


def test_scale_up_nring_moves_each_key_once_and_only_to_its_owner(scale_up_result):
    m = scale_up_result.summary["by_mode"]
    nring, skipper = m["n-ring"], m["skipper"]
    assert nring["keys_moved"] > 1000
    assert nring["moves_per_moved_key"] == 1.0
    assert nring["new_pod_foreign_fetch_share"] == 0.0
    assert nring["new_pod_cached_owned_share"] == 1.0
    # Skipper's per-request draw sends a key back and forth, and (new pods detected at
    # different polls) warms new pods with keys another new pod will own.
    assert skipper["moves_per_moved_key"] > 1.5
    assert skipper["new_pod_foreign_fetch_share"] > 0.01
    assert skipper["new_pod_cached_owned_share"] < 0.995
    # and N-ring's dip is no deeper than Skipper's
    assert nring["hit_rate_min_5s"] >= skipper["hit_rate_min_5s"] - 0.01


def test_load_signal_occupancy_narrows_the_spread_and_needs_fewer_pods():
    base = replace(SMALL, pods=20, cache_size=1_000, rate_per_pod=350.0, seconds=20.0)
    r = load_signal(base, search_seconds=8.0)
    v = r.summary["by_variant"]
    inflight, occ = v["in-flight bf 1.1"], v["occupancy bf 1.3"]
    assert occ["occupancy"]["max"] < inflight["occupancy"]["max"]
    assert occ["occupancy"]["p95"] < inflight["occupancy"]["p95"]
    assert occ["hit_rate"] > inflight["hit_rate"] + 0.01  # in-flight noise spills keys
    assert occ["db_reads_per_s"] < inflight["db_reads_per_s"]
    assert occ["pods_needed"]["pods"] < inflight["pods_needed"]["pods"]


def test_slow_pod_loses_traffic_while_slow_and_gets_it_back():
    base = replace(SMALL, rate_per_pod=350.0, seconds=40.0)
    r = slow_pod(base, at_s=10.0, until_s=25.0, signals=(None, "effective"))
    v = r.summary["by_variant"]
    off, eff = v["no bounded load"], v["effective bf 1.25"]
    assert eff["share_slow"] < 0.5 * eff["share_before"]
    assert eff["share_after"] == pytest.approx(eff["share_before"], rel=0.3)
    assert off["share_slow"] == pytest.approx(off["share_before"], rel=0.2)
    assert eff["lat_p99_ms_slow"] < off["lat_p99_ms_slow"]
