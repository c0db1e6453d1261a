"""The simulator's three scenarios on small configurations: what matches Zalando's
published results, and (load signal) under which model settings, as the README states it."""

import types
from dataclasses import replace

import pytest

from perf.sim import scenarios
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


def _load_base(**kw):
    return replace(SMALL, pods=20, cache_size=1_000, rate_per_pod=350.0, seconds=20.0, **kw)


def test_load_signal_equal_pods_few_hosts_skippers_one_keeps_cache_hits_does_not_narrow():
    # Equal pods, 8 client hosts and Skipper's 1.0 for the routed call
    # (bar_increment="skipper", what cslb's router did for occupancy before): the
    # configuration the scenario used to default to, kept as the README's "does not
    # narrow" row.
    r = load_signal(_load_base(bar_increment="skipper"), slo_p99_ms=None)
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


def _unequal_base(**kw):
    # Pods on unequal nodes, 32 client hosts each with its own counters: a host has about
    # 0.05 calls open per pod.
    return replace(
        SMALL, pods=40, clients=32, pod_speed_sigma=0.3, rate_per_pod=350.0, seconds=10.0, **kw
    )


def test_load_signal_unequal_pods_skippers_one_caps_occupancy_at_an_inflated_bar():
    # The in-flight bar is below one call, so it fires on whichever pod a host happens to
    # have a call open to; occupancy (a 5-s rate) holds every pod under its bar, which
    # with Skipper's 1.0 for the routed call is bf x (1 + 1 / a host's summed load) x the
    # mean, 1.9-2.2 x here. It trims the top but does not lift the slowest-loaded pods
    # (README, Load signal). Seeds 1-3: occupancy max 1.64-1.93 of the mean under bars of
    # 1.92-2.15; in-flight max 1.80-2.46 over bars of 1.65-1.70; p5 equal within 0.01.
    base = _unequal_base(bar_increment="skipper")
    v = load_signal(base, slo_p99_ms=None).summary["by_variant"]
    inflight = v["in-flight bf 1.1"]
    assert inflight["host_load_per_pod"] < 0.1 and inflight["host_bar"] < 1.0
    assert inflight["over_mean"]["max"] > inflight["host_bar_over_mean"] + 0.1
    for occ in (v["occupancy bf 1.25"], v["occupancy bf 1.35"]):
        assert occ["over_mean"]["max"] <= occ["host_bar_over_mean"] + 0.05
        assert occ["over_mean"]["max"] < inflight["over_mean"]["max"]
        assert occ["over_mean"]["p5"] == pytest.approx(inflight["over_mean"]["p5"], abs=0.05)
        assert occ["hit_rate"] > inflight["hit_rate"]
        assert occ["host_bar_over_mean"] > occ["balance_factor"] + 0.5


def test_load_signal_routed_call_increment_narrows_occupancy_at_both_ends():
    # The same fleet with the bar counting the routed call as what it adds to occupancy
    # (its latency's share of the window, ~0.001): the bar is bf x the mean, more pods
    # are over it in some host's noisy partial view, and the spill lands on the light
    # pods. Seeds 1-3, occupancy at 1.25 / 1.35 against in-flight at 1.10: p5 +0.07 to
    # +0.13 / +0.04 to +0.08; p95 -0.18 to -0.76 / -0.11 to -0.69; width -0.31 to -0.83 /
    # -0.19 to -0.73; max within 0.01 of the bar. The cost: more keys move and fewer
    # calls hit the cache (72-75 % against 75-76 %).
    v = load_signal(_unequal_base(bar_increment="routed-call"), slo_p99_ms=None)
    v = v.summary["by_variant"]
    inflight = v["in-flight bf 1.1"]["over_mean"]
    assert v["in-flight bf 1.1"]["bar_increment"] == 1.0
    for bf in (1.25, 1.35):
        row = v[f"occupancy bf {bf:g}"]
        occ = row["over_mean"]
        assert 0 < row["bar_increment"] < 0.01
        assert row["host_bar_over_mean"] == pytest.approx(bf, abs=0.01)
        assert occ["max"] <= bf + 0.05
        assert occ["p5"] > inflight["p5"] + 0.02
        assert occ["p95"] < inflight["p95"] - 0.1
        assert occ["p5_p95_width"] < inflight["p5_p95_width"] - 0.15
        assert row["moves_per_s"] > v["in-flight bf 1.1"]["moves_per_s"]


def test_load_signal_occupancy_needs_fewer_pods_for_the_same_p99(tmp_path):
    # equal pods, 8 hosts, the routed call counted as what it adds (as cslb's router)
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
    # Latency weighting, at the same balance factor, while slow: p99 41 vs 93 ms here
    # (seeds 1-3: 0.35-0.67 of occupancy's with the routed-call bar, 0.41-0.49 with
    # Skipper's 1.0), share 1.06 vs 1.50 % (0.69-0.75; Skipper's 1.0: 0.65-0.94).
    assert eff["lat_p99_ms_slow"] < 0.75 * occ["lat_p99_ms_slow"]
    assert eff["share_slow"] < occ["share_slow"]
    assert occ["lat_p99_ms_slow"] < off["lat_p99_ms_slow"]


class _P99Curve:
    """Stands in for a simulation run in the pods-needed search: a known, monotone p99
    curve (ms) over the pod count, so the search's bracketing and bisection are checked
    against the exact boundary."""

    def __init__(self, boundary: int) -> None:
        self.boundary = boundary
        self.probed: list[int] = []

    def __call__(self, cfg, label="", **kw):
        self.probed.append(cfg.pods)
        p99 = 20.0 if cfg.pods >= self.boundary else 20.0 + (self.boundary - cfg.pods)
        return types.SimpleNamespace(config=cfg, totals={"lat_p99_ms": p99})


@pytest.mark.parametrize("start", [None, 30, 37, 41, 60, 150])
def test_pods_needed_finds_the_boundary_from_any_start(monkeypatch, start):
    curve = _P99Curve(boundary=37)
    monkeypatch.setattr(scenarios, "run", curve)
    base = replace(SMALL, pods=100)
    kw = {} if start is None else {"start": start, "shrink": 0.9}
    found = scenarios.pods_needed(base, 20.5, **kw)
    # within the tolerance (2 % of 100 pods), never below the boundary
    assert 37 <= found["pods"] <= 39
    assert found["result"].config.pods == found["pods"]
    assert [p for p, _ in found["probes"]] == curve.probed
    if start == 41:  # a start near the answer needs few probes
        assert len(curve.probed) <= 4


def test_pods_needed_gives_up_past_max_factor_and_rejects_a_bad_shrink(monkeypatch):
    monkeypatch.setattr(scenarios, "run", _P99Curve(boundary=10_000))
    found = scenarios.pods_needed(replace(SMALL, pods=10), 20.5, max_factor=3.0)
    assert found["pods"] is None and found["result"] is None
    with pytest.raises(ValueError, match="shrink must be between 0 and 1"):
        scenarios.pods_needed(replace(SMALL, pods=10), 20.5, shrink=1.0)
