"""Outlier ejection by the discovery loop (in a thread) on real shared memory: real
counters recorded through shm.Recorder, real tables read back with shm.TableReader."""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import pytest

import shm
from discovery.outlier import OutlierMonitor, Totals
from lbcore.outlier import (
    FAIL_CONNECT,
    FAIL_STATUS,
    FAIL_TIMEOUT,
    REASON_CONSECUTIVE,
    OutlierParams,
)
from tests.discovery_harness import Loop, shm_namespace, wait_until
from tests.kubeapi import CONFIGMAPS, configmap

S = 1_000_000_000
EPS = [f"http://10.7.0.{i}:8080" for i in range(1, 11)]
FAST = {
    "outlier_interval_s": 0.1,
    "outlier_window_s": 1.0,
    "outlier_ejection_time_s": 1.5,
    "fade_duration_s": 2.0,
}


def write_endpoints(path, addresses):
    doc = {
        "endpoints": [{"address": a, "node": f"node-{a[-6:-5]}", "zone": "z1"} for a in addresses]
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


class Fleet:
    """The host: counters (the master's), the discovery loop, one worker row."""

    def __init__(self, ns, tmp_path, addresses=EPS, knobs=None, **kw):
        self.ns = ns
        self.store = shm.CounterStore.create(ns, rows=4, columns=16)
        self.file = tmp_path / "endpoints.json"
        write_endpoints(self.file, addresses)
        self.knobs = {**FAST, **(knobs or {})}
        self.kw = kw
        self.loop = self._start()
        self.rec = self.store.claim()

    def _start(self):
        kw = {"debounce_s": 0.2, **self.kw}
        return Loop(self.ns, endpoints_file=str(self.file), knobs=self.knobs, **kw).start()

    def restart(self):
        self.loop.stop(unlink=False)
        self.loop = self._start()

    def table(self):
        return self.loop.table()

    def calls(self, plan):
        """Record calls that ended just now: {address: (successes, failures, kind)}."""
        t = self.table()
        slots, codes = [], []
        for a, (ok, bad, kind) in plan.items():
            s = int(t.slots[t.endpoints.index(a)])
            slots += [s] * (ok + bad)
            codes += [0] * ok + [kind] * bad
        now = time.monotonic_ns()
        slots = np.array(slots, dtype=np.int64)
        self.rec.record_start(slots, now - 2 * 10**6)
        self.rec.record_end(slots, now - 2 * 10**6, np.full(slots.size, 10**6), now, failed=codes)

    def traffic(self, seconds, plan, every=0.05):
        """Keep recording ``plan`` every ``every`` seconds for ``seconds`` (bounded)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.calls(plan)
            time.sleep(every)

    def ejected(self):
        t = self.table()
        return {a for a, e in zip(t.endpoints, t.ejected.tolist(), strict=True) if e}

    def reason(self, address):
        t = self.table()
        return int(t.ejections.reason[t.endpoints.index(address)])

    def close(self):
        self.rec.release()
        self.loop.stop()
        self.store.close()


@pytest.fixture
def fleet(tmp_path):
    made = []

    def make(**kw):
        ns = stack.enter_context(shm_namespace())
        f = Fleet(ns, tmp_path, **kw)
        made.append(f)
        f.loop.wait_generation(1)
        # Calls recorded before the monitor's first read are its baseline, not failures.
        wait_until(lambda: f.loop.disc.monitor.has_baseline, 5, "the monitor's first read")
        return f

    with contextlib.ExitStack() as stack:
        try:
            yield make
        finally:
            for f in made:
                if f.loop.thread.is_alive():
                    f.close()
                else:
                    f.store.close()


def healthy(addresses, n=3):
    return {a: (n, 0, 0) for a in addresses}


def test_a_refusing_pod_is_ejected_skipped_then_readmitted_through_a_fading_ring(fleet):
    f = fleet()
    bad = EPS[4]
    slot = int(f.table().slots[f.table().endpoints.index(bad)])
    gen0 = f.loop.generation()
    t0 = time.monotonic_ns()
    f.calls({**healthy(EPS), bad: (0, 6, FAIL_CONNECT)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    took = (time.monotonic_ns() - t0) / S
    assert took < 2.0  # within a couple of 0.1-s intervals (plus a loaded machine)
    t = f.table()
    assert t.generation == gen0 + 1 and not t.outlier_panic
    i = t.endpoints.index(bad)
    assert t.ejections.reason[i] == REASON_CONSECUTIVE
    assert t.ejections.counts[i].tolist() == [1, 0, 0] and t.ejections.multiplier[i] == 1
    until = int(t.ejections.until_ns[i])
    assert 1.4 * S <= until - t0 <= 1.5 * S + took * S
    assert t.ring_set.starts_ns == ()  # skipped on the unchanged ring
    (ev,) = f.loop.named("endpoint_ejected")
    assert (
        ev["address"] == bad and ev["ip"] == "10.7.0.5" and ev["reason"] == "consecutive_failures"
    )
    assert ev["generation"] == t.generation and ev["until_ns"] == until
    assert ev["counts"]["failures_connect"] == 6 and ev["ejections"] == 1
    # Readmitted after the ejection time, fading in through its own ring.
    wait_until(lambda: not f.ejected(), 5, "the readmission")
    t = f.table()
    i = t.endpoints.index(bad)
    assert int(t.slots[i]) == slot  # keeps its counter slot
    assert t.ring_set.tiers[i] == 1 and len(t.ring_set.starts_ns) == 1
    assert until <= t.ring_set.starts_ns[0] <= until + S
    assert int((t.ring_set.tiers == 1).sum()) == 1
    (ev,) = f.loop.named("endpoint_readmitted")
    assert ev["address"] == bad and ev["fade"] == "n-ring" and ev["generation"] == t.generation
    # Judged afresh: the failures before the ejection do not count again.
    f.traffic(0.5, healthy(EPS))
    assert not f.ejected() and len(f.loop.named("endpoint_ejected")) == 1


def test_inspect_shows_why_and_until_when(fleet):
    from workers.surfaces import inspect_report as inspect_cmd

    f = fleet(knobs={"outlier_ejection_time_s": 20.0})
    bad = EPS[8]
    f.calls({bad: (0, 5, FAIL_CONNECT)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    snap = inspect_cmd.snapshot(f.ns)
    (row,) = [e for e in snap["endpoints"] if e["address"] == bad]
    j = row["ejection"]
    assert row["ejected"] and j["reason"] == "consecutive_failures" and j["multiplier"] == 1
    assert 18 < j["remaining_s"] <= 20 and j["ejections"]["consecutive_failures"] == 1
    others = [e for e in snap["endpoints"] if e["address"] != bad]
    assert all(e["ejection"]["reason"] is None and not e["ejected"] for e in others)
    assert snap["outlier_panic"] is False
    text = inspect_cmd.render_text(snap)
    (line,) = [ln for ln in text.splitlines() if bad in ln]
    assert "ejected: consecutive_failures, " in line and "s left, ejection 1" in line


@pytest.mark.parametrize("mode", ["off", "skipper"])
def test_readmission_follows_the_fade_mode(fleet, mode):
    f = fleet(knobs={"fade_mode": mode})
    bad = EPS[2]
    f.calls({bad: (0, 5, FAIL_STATUS)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    wait_until(lambda: not f.ejected(), 5, "the readmission")
    t = f.table()
    i = t.endpoints.index(bad)
    if mode == "off":
        assert t.ring_set.starts_ns == () and t.ring_set.tiers[i] == 0  # full share at once
    else:  # Skipper's fade-in from the readmission time
        assert t.ring_set.tiers[i] == 1 and t.knobs.fade_mode == "skipper"
        assert time.monotonic_ns() - t.ring_set.starts_ns[0] < 2 * S
    (ev,) = f.loop.named("endpoint_readmitted")
    assert ev["fade"] == mode


def test_every_pod_timing_out_together_ejects_nobody_one_alone_is_ejected(fleet):
    f = fleet()
    # The caller is saturated: a third of every pod's calls time out.
    f.traffic(1.2, {a: (4, 2, FAIL_TIMEOUT) for a in EPS})
    assert not f.ejected() and not f.loop.named("endpoint_ejected")
    # Even all of them, for a while.
    f.traffic(0.6, {a: (0, 3, FAIL_TIMEOUT) for a in EPS})
    assert not f.ejected()
    # One frozen pod among answering peers is the pod's own doing.
    frozen = EPS[7]
    # (it keeps timing out while its peers answer: an interval that still holds the
    # saturated calls' tail does not count, the next ones do)
    plan = {**healthy(EPS), frozen: (0, 5, FAIL_TIMEOUT)}
    wait_until(lambda: f.calls(plan) or f.ejected() == {frozen}, 5, "the frozen pod's ejection")


def test_at_most_the_maximum_share_is_ejected_and_the_rest_is_named(fleet):
    f = fleet()  # 10 endpoints, 10 %: one at a time
    bad = EPS[1:4]
    f.traffic(0.8, {**healthy(EPS), **{a: (0, 5, FAIL_CONNECT) for a in bad}})
    wait_until(lambda: len(f.loop.named("ejection_held_back")) >= 2, 5, "held-back lines")
    assert len(f.ejected()) == 1 and f.ejected() < set(bad)
    held = {e["address"] for e in f.loop.named("ejection_held_back")}
    assert held | f.ejected() == set(bad)


def test_below_the_panic_threshold_ejections_are_ignored_and_panic_is_logged_once(fleet):
    # (ejections of 4 s: the first two must still stand when the third fails, loaded or not)
    f = fleet(
        addresses=EPS[:4],
        knobs={"outlier_max_ejection_percentage": 100.0, "outlier_ejection_time_s": 4.0},
    )
    # The third pod gets no calls before its failures: a success of it in the interval its
    # failures land in (the monitor reads once per interval, later on a loaded machine)
    # would end their streak, and with no more failures it would never be ejected.
    f.traffic(0.6, {**healthy(EPS[3:4]), **{a: (0, 5, FAIL_CONNECT) for a in EPS[:2]}})
    wait_until(lambda: f.ejected() == set(EPS[:2]), 5, "the first two ejections")
    assert not f.table().outlier_panic  # 50 % left: not below the threshold
    f.calls({**healthy(EPS[3:4]), EPS[2]: (0, 5, FAIL_CONNECT)})
    wait_until(lambda: f.table().outlier_panic, 5, "panic")
    t = f.table()
    assert not t.ejected.any()  # routing as if nobody were ejected
    still = {a for a, r in zip(t.endpoints, t.ejections.reason.tolist(), strict=True) if r}
    assert still == set(EPS[:3])  # the ejections stand, only routing ignores them
    f.traffic(0.5, healthy(EPS[3:4]))
    assert len(f.loop.named("outlier_panic")) == 1
    wait_until(lambda: not f.table().outlier_panic, 10, "the end of the panic")
    assert len(f.loop.named("outlier_panic_ended")) == 1


def test_with_panic_off_a_table_of_ejected_pods_routes_every_key_to_fallback(fleet):
    from workers.routing.router import Router

    f = fleet(
        addresses=EPS[:3],
        knobs={
            "outlier_max_ejection_percentage": 100.0,
            "outlier_panic_threshold": 0.0,
            "outlier_ejection_time_s": 30.0,
        },
    )
    f.traffic(0.6, {a: (0, 5, FAIL_STATUS) for a in EPS[:3]})
    wait_until(lambda: f.ejected() == set(EPS[:3]), 5, "every pod ejected")
    assert not f.table().outlier_panic
    r = Router(f.ns, background=False)
    try:
        keys = [f"SKU-{i}" for i in range(500)]
        assert (r.route(keys) == -1).all() and (r.route(keys, attempt=1) == -1).all()
    finally:
        r.close()


def test_a_pod_deleted_while_ejected_comes_back_as_a_new_pod(fleet):
    f = fleet()
    bad = EPS[5]
    f.calls({bad: (0, 5, FAIL_CONNECT)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    write_endpoints(f.file, [a for a in EPS if a != bad])
    wait_until(lambda: bad not in f.table().endpoints, 5, "the deletion")
    assert not f.table().ejected.any() and not f.loop.named("endpoint_readmitted")
    write_endpoints(f.file, EPS)
    wait_until(lambda: bad in f.table().endpoints, 5, "the re-addition")
    t = f.table()
    i = t.endpoints.index(bad)
    assert t.ejections.reason[i] == 0 and t.ejections.counts[i].sum() == 0  # state dropped
    assert t.ring_set.tiers[i] == 1  # fades in like any new pod


def test_a_readmission_does_not_wait_for_a_pending_debounce(fleet):
    f = fleet(debounce_s=3.0, debounce_max_s=10.0)
    bad = EPS[0]
    f.calls({bad: (0, 5, FAIL_CONNECT)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    new = "http://10.7.1.1:8080"
    write_endpoints(f.file, [*EPS, new])  # debounced for 3 s
    wait_until(lambda: not f.ejected(), 5, "the readmission")
    t = f.table()
    assert new not in t.endpoints  # published with the current set, the addition waits
    assert t.ring_set.tiers[t.endpoints.index(bad)] == 1
    wait_until(lambda: new in f.table().endpoints, 8, "the debounced addition")
    t = f.table()
    assert t.ring_set.tiers[t.endpoints.index(new)] == 2  # its own, newer ring


def test_a_restarted_discovery_keeps_ejections_and_their_until_times(fleet):
    f = fleet(knobs={"outlier_ejection_time_s": 3.0})
    bad = EPS[3]
    f.calls({bad: (0, 5, FAIL_CONNECT)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    t = f.table()
    until = int(t.ejections.until_ns[t.endpoints.index(bad)])
    gen = t.generation
    f.restart()
    time.sleep(0.5)
    t = f.table()
    assert f.ejected() == {bad} and t.generation == gen  # nothing to republish
    assert int(t.ejections.until_ns[t.endpoints.index(bad)]) == until
    assert f.loop.named("resumed")[0]["ejected"] == [bad]
    wait_until(lambda: not f.ejected(), 6, "the readmission")
    assert time.monotonic_ns() >= until
    assert f.loop.named("endpoint_readmitted")[0]["address"] == bad


@pytest.fixture
def kube_bookmark_s() -> None:
    return None  # (bookmarks only when asked)


def test_the_configmap_sets_outlier_knobs_and_turning_detection_off_readmits_at_once(
    fleet, kube, tmp_path
):
    kube.put(CONFIGMAPS, "shop", configmap("cslb", {"CSLB_OUTLIER_EJECTION_TIME": "60"}))
    kc = kube.kubeconfig(str(tmp_path / "kubeconfig"), namespace="shop")
    f = fleet(kube=kube, kubeconfig=kc, configmap="cslb", service=None)
    bad = EPS[6]
    f.calls({bad: (0, 5, FAIL_CONNECT)})
    wait_until(lambda: f.ejected() == {bad}, 5, "the ejection")
    t = f.table()
    left = int(t.ejections.until_ns[t.endpoints.index(bad)]) - time.monotonic_ns()
    assert 55 * S < left <= 60 * S  # the ConfigMap's base ejection time, not the 1.5 s flag
    assert not f.loop.named("configmap_unknown_keys")
    kube.put(CONFIGMAPS, "shop", configmap("cslb", {"CSLB_OUTLIER_DETECTION": "false"}))
    wait_until(lambda: not f.ejected(), 5, "the readmission")
    f.calls({bad: (0, 9, FAIL_CONNECT)})
    time.sleep(0.4)
    assert not f.ejected()


# -- the monitor's deltas, alone -----------------------------------------------------------


def totals(source, slots, requests, kinds):
    return Totals(
        source,
        np.array(slots, np.int32),
        np.array(requests, np.int64),
        np.array(kinds, np.int64).reshape(-1, 4),
    )


def test_deltas_restart_on_a_new_slot_a_reset_and_a_replaced_matrix():
    p = OutlierParams(consecutive_failures=3)
    m = OutlierMonitor()
    m.align(["a", "b"], 10)
    m.evaluate(totals(1, [0, 1], [100, 50], [[90, 0, 0, 0], [0, 0, 0, 0]]), 1 * S, p)
    assert not m.state.ejected.any()  # the first read is only a baseline
    v = m.evaluate(totals(1, [0, 1], [103, 50], [[93, 0, 0, 0], [0, 0, 0, 0]]), 2 * S, p)
    assert v.ejected == ("a",)
    m2 = OutlierMonitor()
    m2.align(["a"], 10)
    m2.evaluate(totals(1, [0], [100], [[90, 0, 0, 0]]), 1 * S, p)
    # Slot reused (totals reset to 4), slot moved, matrix replaced: no phantom failures.
    for t in (
        totals(1, [0], [4], [[4, 0, 0, 0]]),
        totals(1, [3], [9], [[9, 0, 0, 0]]),
        totals(2, [3], [20], [[20, 0, 0, 0]]),
    ):
        assert m2.evaluate(t, 3 * S, p).ejected == ()
    assert m2.evaluate(totals(2, [3], [23], [[23, 0, 0, 0]]), 4 * S, p).ejected == ("a",)


def test_the_monitor_follows_a_new_endpoint_list():
    p = OutlierParams(consecutive_failures=3)
    m = OutlierMonitor()
    m.align(["a", "b"], 10)
    m.evaluate(totals(1, [0, 1], [0, 0], [[0] * 4, [0] * 4]), 1 * S, p)
    m.evaluate(totals(1, [0, 1], [2, 0], [[2, 0, 0, 0], [0] * 4]), 2 * S, p)  # streak 2
    m.align(["c", "a"], 10)
    v = m.evaluate(totals(1, [2, 0], [0, 3], [[0] * 4, [3, 0, 0, 0]]), 3 * S, p)
    assert v.ejected == ("a",)  # its streak went with it
    assert m.ejections_for(["a", "zz"]).reason.tolist() == [REASON_CONSECUTIVE, 0]
