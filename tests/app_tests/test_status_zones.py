"""Zone affinity on the host's surfaces, from real shared memory: ``/metrics`` (the local
share, cap, state, reason, transitions and calls by locality), ``/status`` (the zone
controller beside the zone grouping, each pod red over its own bar) and the host
snapshot's per-pod bars, which are the plan's."""

from __future__ import annotations

import time

import numpy as np
import pytest

import lbcore
import shm
from lbcore.bounded import share_bars
from shm.tables import ZoneCurve
from tests.app_tests.conftest import ENDPOINTS, ZONES, Host
from tests.app_tests.test_metrics import samples, scalar, scrape
from tests.app_tests.test_status_page import Tree
from workers.routing.snapshot import build_plan
from workers.surfaces.hosts import HostMonitor
from workers.surfaces.status import render

KEYS = [f"SKU-{i:05d}" for i in range(2000)]
FULL = ZoneCurve(
    zone="eu-1a", affinity=True, min_pods=2, state="full", reason="ramp_done", x0=1.0, cap=1.0
)


def publish(host: Host, curve: ZoneCurve, **kw) -> None:
    host.writer.publish(
        lbcore.RingSet(ENDPOINTS),
        zones=ZONES,
        zone=curve,
        now_ns=time.monotonic_ns(),
        **kw,
    )


def test_metrics_show_the_zone_controller_and_calls_by_locality(host: Host) -> None:
    curve = ZoneCurve(
        zone="eu-1a",
        affinity=True,
        state="floor",
        reason="latency",
        x0=0.01,
        cap=0.75,
        transitions=4,
        start_ns=time.monotonic_ns(),
    )
    publish(host, curve)
    host.recorder.tally("calls_local", 7)
    host.recorder.tally("calls_remote", 3)
    _, fams = scrape(host.namespace)
    assert samples(fams, "cslb_zone_local_share") == {(("zone", "eu-1a"),): 0.01}
    assert samples(fams, "cslb_zone_local_share_cap") == {(("zone", "eu-1a"),): 0.75}
    states = {dict(k)["state"]: v for k, v in samples(fams, "cslb_zone_affinity_state").items()}
    assert states == {"off": 0, "short": 0, "ramping": 0, "full": 0, "floor": 1}
    reasons = {dict(k)["reason"]: v for k, v in samples(fams, "cslb_zone_affinity_reason").items()}
    assert reasons["latency"] == 1 and sum(reasons.values()) == 1 and "none" not in reasons
    assert scalar(fams, "cslb_zone_transitions", "cslb_zone_transitions_total") == 4
    calls = samples(fams, "cslb_calls", "cslb_calls_total")
    assert calls == {(("locality", "local"),): 7, (("locality", "remote"),): 3}


def test_a_ramp_is_shown_at_the_scrapes_instant(host: Host) -> None:
    start = time.monotonic_ns() - 5_000_000_000
    publish(
        host,
        ZoneCurve(
            zone="eu-1a",
            affinity=True,
            state="ramping",
            reason="started",
            rate=0.1,
            cap=1.0,
            start_ns=start,
        ),
    )
    _, fams = scrape(host.namespace)
    (x,) = samples(fams, "cslb_zone_local_share").values()
    assert 0.5 <= x <= 0.6  # five seconds and a bit into a ramp of 0.1 a second


def test_without_a_zone_the_page_has_no_zone_section_and_the_metrics_say_off(host: Host) -> None:
    host.publish()
    _, fams = scrape(host.namespace)
    assert samples(fams, "cslb_zone_local_share") == {(("zone", ""),): 0.0}
    states = {dict(k)["state"]: v for k, v in samples(fams, "cslb_zone_affinity_state").items()}
    assert states["off"] == 1
    tree = Tree(render(HostMonitor(host.namespace).snapshot(), refresh_s=None))
    assert not tree.root.find_all(lambda e: e.attrs.get("id") == "zone-affinity")


def test_the_page_shows_the_zone_controller_beside_the_zone_grouping(host: Host) -> None:
    publish(host, FULL)
    for e in ENDPOINTS:
        host.busy(e, 0.5, calls=10)
    host.recorder.tally("calls_local", 90)
    host.recorder.tally("calls_remote", 10)
    snap = HostMonitor(host.namespace).snapshot()
    tree = Tree(render(snap, refresh_s=None))
    assert tree.by_id("zone-name").all_text() == "eu-1a"
    assert tree.by_id("zone-state").attrs["data-state"] == "full"
    assert tree.by_id("zone-reason").all_text() == "ramp done"
    assert tree.by_id("zone-share").all_text() == "100.0%"
    assert tree.by_id("zone-cap").all_text() == "100.0%"
    assert tree.by_id("zone-calls").all_text() == "90.0%"
    (mine,) = tree.by_class("caller")
    assert mine.attrs["data-zone"] == "eu-1a" and "100.0% of keys local" in mine.all_text()
    # under full affinity the local pods carry every key: their own bars, not the average
    assert snap.bars is not None and snap.bar is not None
    own = dict(zip(ENDPOINTS, snap.bars, strict=True))
    assert own[ENDPOINTS[0]] > snap.bar
    # a remote pod keeps the average's bar (lbcore.bounded.share_bars never goes below it)
    assert 0.0 < own[ENDPOINTS[2]] == min(snap.bars) < own[ENDPOINTS[0]]
    assert "own bounded-load bar" in tree.by_id("load-bar").all_text()


def test_a_suppressed_zone_is_marked(host: Host) -> None:
    curve = ZoneCurve(zone="eu-1a", affinity=True, state="short", reason="short", min_pods=3)
    publish(host, curve)
    tree = Tree(render(HostMonitor(host.namespace).snapshot(), refresh_s=None))
    el = tree.by_id("zone-state")
    assert "bad" in el.classes() and "short" in el.all_text()
    assert tree.by_id("zone-calls").all_text() == "no fan-out calls yet"


@pytest.mark.parametrize("x", [0.25, 0.75])
def test_the_snapshots_bars_are_the_plans(host: Host, x: float) -> None:
    curve = ZoneCurve(
        zone="eu-1a", affinity=True, min_pods=2, state="full", reason="ramp_done", x0=x, cap=x
    )
    publish(host, curve, knobs=shm.Knobs(load_signal="in-flight"))
    host.open(ENDPOINTS[0], 3)
    host.open(ENDPOINTS[3], 1)
    snap = HostMonitor(host.namespace).snapshot()
    with shm.TableReader(host.namespace) as r:
        t = r.table()
        loads = host.counters.reader().read(time.monotonic_ns())
        plan = build_plan(t, loads.take(np.asarray(t.slots, dtype=np.intp)), snap.now_ns)
        want = share_bars(plan.loads, plan.listed[plan.zone_views - 1], plan.expected_shares, 1.25)
        # the routers' own test: a pod is under its bar iff its load is at or below it
        assert np.array_equal(plan.under, plan.loads <= want)
        assert plan.bars is not None and np.array_equal(plan.bars, want)
        # and the plan routes by them: a key moves exactly when its pod without bounded
        # load (a local key's zone pod) is over its bar; here only the busy local pod is
        assert plan.under.tolist() == [False, True, True, True, True, True]
        plain = build_plan(t, None, snap.now_ns, balance_factor=None).route(KEYS)[0]
        moved = plan.route(KEYS)[0] != plain
        assert moved.any() and np.array_equal(moved, ~plan.under[plain])
    assert snap.bars == pytest.approx(want.tolist())


def test_cslb_inspect_shows_the_zone_record(host: Host) -> None:
    from workers.surfaces.inspect_report import render_text, snapshot

    start = time.monotonic_ns() - 2_000_000_000
    curve = ZoneCurve(
        zone="eu-1a",
        affinity=True,
        min_pods=2,
        state="ramping",
        reason="recovered",
        x0=0.01,
        rate=0.05,
        cap=0.8,
        transitions=3,
        start_ns=start,
    )
    publish(host, curve)
    s = snapshot(host.namespace)
    z = s["zone"]
    assert (z["zone"], z["state"], z["reason"], z["cap"], z["transitions"]) == (
        "eu-1a",
        "ramping",
        "recovered",
        0.8,
        3,
    )
    assert 0.11 <= z["share"] <= 0.2 and z["started_age_s"] >= 2.0
    (line,) = [x for x in render_text(s).splitlines() if x.startswith("zone ")]
    assert line.startswith("zone eu-1a: affinity on, ramping (recovered), ")
    assert "rising 5 %/s, cap 80.00 %, min pods 2, 3 transition(s)" in line
    host.publish()  # no zone record: no zone line
    assert not [
        x for x in render_text(snapshot(host.namespace)).splitlines() if x.startswith("zone ")
    ]


def test_the_monitor_computes_a_zone_plans_bars_base_once_per_table(host: Host) -> None:
    publish(host, FULL)
    host.busy(ENDPOINTS[0], 0.5, calls=10)
    monitor = HostMonitor(host.namespace)
    first = monitor.snapshot()
    plan = monitor.last_plan
    second = monitor.snapshot()
    assert plan is not None and monitor.last_plan is not plan
    assert monitor.last_plan.view_arcs is plan.view_arcs
    assert second.bars == pytest.approx(first.bars)
    publish(host, FULL)  # a new table: its own pass
    monitor.snapshot()
    assert monitor.last_plan.view_arcs is not plan.view_arcs
