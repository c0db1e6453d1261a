"""The zone controller's inputs in the discovery loop (discovery.zoneloop): which source
names the caller's zone and the callers per zone, the cap from healthy pods, and the
latency reading (call-weighted means of local and remote pods)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from discovery.callers import CallerView
from discovery.events import EventLog
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


def test_the_latency_reading_is_the_call_weighted_mean_of_each_side():
    z, _ = _loop(zone="z-a")
    completed = np.array([10, 30, 0, 20, 20, 0, 0, 0, 0], dtype=float)
    mean_s = np.array([0.001, 0.003, np.nan, 0.002, 0.004, np.nan, np.nan, np.nan, np.nan])
    z.read_latency(EPS, ZONES, lambda e: (completed, mean_s))
    lo, re, lo_n, re_n = z.latency
    assert (lo, lo_n) == (pytest.approx(0.0025), 40.0)
    assert (re, re_n) == (pytest.approx(0.003), 40.0)
    z.read_latency(EPS, ZONES, lambda e: None)  # no counters: no reading
    assert math.isnan(z.latency[0])


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
