"""The zone controller's inputs in the discovery loop (discovery.zoneloop): which source
names the caller's zone and the callers per zone, the cap from healthy pods, and the
latency reading (each side the mean of its pods' mean latencies, each pod weighed once)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from discovery.callers import CallerView
from discovery.events import EventLog
from discovery.zonecontrol import latency_reading
from discovery.zoneloop import KUBERNETES_CALLERS, ZoneLoop
from lbcore.zone_settings import ZoneSettings

S = 1_000_000_000
ZONES = ["z-a"] * 3 + ["z-b"] * 3 + ["z-c"] * 3
EPS = tuple(f"http://10.0.0.{i}:80" for i in range(1, 10))


def _loop(**kw) -> tuple[ZoneLoop, list[dict]]:
    events: list[dict] = []
    log = EventLog(None)
    log.add_sink(events.append)
    return ZoneLoop(ZoneSettings(affinity=True, ramp_ns=0, **kw), log), events


def test_the_zone_setting_wins_over_the_caller_slices_and_the_slices_counts_over_the_files():
    z, _ = _loop()
    assert z.zone() == "" and z.callers() is None
    z.set_view("file", CallerView("", {"z-a": 1}))
    assert (z.zone(), z.callers()) == ("", {"z-a": 1})
    z.set_view(KUBERNETES_CALLERS, CallerView("z-b", {"z-b": 2}))
    assert (z.zone(), z.callers()) == ("z-b", {"z-b": 2})
    z2, _ = _loop(zone="z-c")
    z2.set_view(KUBERNETES_CALLERS, CallerView("z-b", {"z-b": 2}))
    assert z2.zone() == "z-c"


def test_the_cap_counts_healthy_pods_and_the_callers():
    z, events = _loop(zone="z-a")
    ok = np.ones(9, np.bool_)
    # callers in proportion to pods: capacity cap 1, held at 1 - the probe floor (1 %)
    assert z.curve(0, ZONES, ok).cap == 0.99
    z.set_view("file", CallerView("", {"z-a": 2, "z-b": 1, "z-c": 1}))
    assert z.curve(S, ZONES, ok).cap == pytest.approx(2 / 3)
    ok[6:] = False  # z-c's pods ejected: z-a holds half of the healthy pods
    assert z.curve(2 * S, ZONES, ok).cap == pytest.approx(0.99)
    (line, *_) = [e for e in events if e["event"] == "zone_transition"]
    assert line["zone"] == "z-a" and line["state"] == "full"
    assert (line["cap"], line["capacity_cap"]) == (0.99, 1.0)


def test_the_latency_reading_weighs_each_pod_once():
    z, _ = _loop(zone="z-a")
    completed = np.array([10, 30, 0, 20, 20, 0, 0, 0, 0], dtype=float)
    mean_s = np.array([0.001, 0.003, np.nan, 0.002, 0.004, np.nan, np.nan, np.nan, np.nan])
    z.read_latency(EPS, ZONES, lambda e: (completed, mean_s))
    lo, re, lo_n, re_n = z.latency
    # the mean of the pods' means (a pod without a call is not in it); calls summed
    assert (lo, lo_n) == (pytest.approx(0.002), 40.0)
    assert (re, re_n) == (pytest.approx(0.003), 40.0)
    z.read_latency(EPS, ZONES, lambda e: None)  # no counters: no reading
    assert math.isnan(z.latency[0])


def test_one_hot_remote_pod_with_many_fast_calls_does_not_make_remote_look_fast():
    # Every pod answers its ordinary calls in 4 ms, local and remote alike, but one remote
    # pod also owns a hot key, always a cache hit: 900 calls at 1 ms. By calls, remote
    # reads 1.8 ms and local 2.2 times that, far past the margin; by pod it reads ~3.6 ms.
    z, _ = _loop(zone="z-a")
    completed = np.array([40, 40, 40, 1000, 40, 40, 40, 40, 40], dtype=float)
    mean_s = np.full(9, 0.004)
    mean_s[3] = (100 * 0.004 + 900 * 0.001) / 1000
    z.read_latency(EPS, ZONES, lambda e: (completed, mean_s))
    lo, re, lo_n, re_n = z.latency
    pooled = float((completed[3:] * mean_s[3:]).sum() / completed[3:].sum())
    assert lo / pooled - 1 > ZoneSettings().latency_margin  # what the pooled mean said
    assert lo == pytest.approx(0.004) and re == pytest.approx((5 * 0.004 + mean_s[3]) / 6)
    assert (lo_n, re_n) == (120.0, 1200.0)
    z.curve(0, ZONES, np.ones(9, np.bool_))
    assert z.curve(S, ZONES, np.ones(9, np.bool_)).state == "full"  # no drop


def test_a_local_fault_still_shows_when_remote_has_a_hot_pod():
    z, _ = _loop(zone="z-a")
    completed = np.array([40, 40, 40, 1000, 40, 40, 40, 40, 40], dtype=float)
    mean_s = np.full(9, 0.004)
    mean_s[3] = 0.0013
    mean_s[:3] = 0.012  # every local pod three times slower
    z.read_latency(EPS, ZONES, lambda e: (completed, mean_s))
    z.curve(0, ZONES, np.ones(9, np.bool_))
    c = z.curve(S, ZONES, np.ones(9, np.bool_))
    assert (c.state, c.reason) == ("floor", "latency")


def test_broken_counters_are_no_pod_with_calls():
    completed = np.array([10, np.nan, 5, -3, 20, 10], dtype=float)
    mean_s = np.array([0.002, 0.001, np.inf, 0.009, -1.0, 0.004])
    local = np.array([True, True, True, False, False, False])
    lo, re, lo_n, re_n = latency_reading(completed, mean_s, local)
    assert (lo, lo_n) == (pytest.approx(0.002), 10.0)
    assert (re, re_n) == (pytest.approx(0.004), 10.0)
    lo, re, lo_n, re_n = latency_reading(np.zeros(3), np.full(3, np.nan), np.ones(3, np.bool_))
    assert math.isnan(lo) and math.isnan(re) and lo_n == re_n == 0.0


def test_no_counters_are_read_while_affinity_is_off():
    z = ZoneLoop(ZoneSettings(zone="z-a"), EventLog(None))
    asked = []
    z.tick(0, EPS, ZONES, None, lambda e, now: asked.append(e))
    assert asked == []
    z.tick(
        0, EPS, ZONES, None, lambda e, now: asked.append(e), ZoneSettings(zone="z-a", affinity=True)
    )
    assert asked == [EPS]


def test_the_callers_zone_is_a_process_setting_and_the_rest_a_configmap_may_set():
    from discovery.settings import DISCOVERY_KNOBS, LAYERED_KNOBS, unknown_configmap_keys

    assert "CSLB_ZONE" in {k.env for k in DISCOVERY_KNOBS}
    assert "CSLB_ZONE" not in {k.env for k in LAYERED_KNOBS}
    # one ConfigMap serves hosts in every zone: a zone in it is an unknown key
    assert unknown_configmap_keys({"CSLB_ZONE": "z-a", "CSLB_ZONE_AFFINITY": "on"}) == [
        "CSLB_ZONE"
    ]
