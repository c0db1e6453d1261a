"""The Prometheus collector over real shared memory, parsed with prometheus_client's parser."""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import signal
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import shm
from lbcore.ejection import Ejections
from lbcore.outlier import FAIL_CONNECT, FAIL_STATUS, REASON_CONSECUTIVE
from tests.app_tests.conftest import ENDPOINTS, ZONES, Host
from workers.surfaces.collector import CslbCollector
from workers.surfaces.hosts import STALE_AFTER, HostMonitor

NEW = ["http://10.9.1.1:8080", "http://10.9.1.2:8080"]


def scrape(namespace: str, **kw) -> tuple[str, dict]:
    registry = CollectorRegistry()
    registry.register(CslbCollector(namespace, **kw))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return text, families


def samples(families: dict, family: str, sample: str | None = None) -> dict:
    """{labels as a sorted tuple: value} of one family's samples named ``sample``."""
    name = sample or family
    return {
        tuple(sorted(s.labels.items())): s.value for s in families[family].samples if s.name == name
    }


def per_endpoint(families: dict, family: str, sample: str | None = None) -> dict[str, float]:
    return {dict(k)["endpoint"]: v for k, v in samples(families, family, sample).items()}


def scalar(families: dict, family: str, sample: str | None = None) -> float:
    (value,) = samples(families, family, sample).values()
    return value


EXPECTED_FAMILIES = {
    "cslb_endpoint_occupancy": "gauge",
    "cslb_endpoint_in_flight": "gauge",
    "cslb_endpoint_latency_seconds": "gauge",
    "cslb_endpoint_requests": "counter",
    "cslb_endpoint_failures": "counter",
    "cslb_endpoint_failures_by_kind": "counter",
    "cslb_endpoint_ejected": "gauge",
    "cslb_endpoint_ejections": "counter",
    # the pods' own load reports (CSLB_LOAD_REPORTS)
    "cslb_endpoint_reported_utilization": "gauge",
    "cslb_endpoint_reported_age_seconds": "gauge",
    "cslb_endpoint_load_source": "gauge",
    "cslb_outlier_panic": "gauge",
    "cslb_decisions": "counter",
    "cslb_fallback": "counter",
    "cslb_bounded_load_moves": "counter",
    "cslb_table_generation": "gauge",
    "cslb_table_age_seconds": "gauge",
    "cslb_discovery_heartbeat_age_seconds": "gauge",
    "cslb_fade_share": "gauge",
    "cslb_discovery_up": "gauge",
    "cslb_build_info": "gauge",
    # the fan-out helper's counters
    "cslb_retries": "counter",
    "cslb_retries_failed": "counter",
    "cslb_retry_budget_exhausted": "counter",
    "cslb_bulkhead_rejections": "counter",
    "cslb_load_reports_malformed": "counter",
    # zone affinity: calls by locality and the zone controller
    "cslb_calls": "counter",
    "cslb_zone_local_share": "gauge",
    "cslb_zone_local_share_cap": "gauge",
    "cslb_zone_affinity_state": "gauge",
    "cslb_zone_affinity_reason": "gauge",
    "cslb_zone_transitions": "counter",
}


def test_nothing_there_yet_still_answers(namespace: str) -> None:
    text, fams = scrape(namespace)
    assert {n: f.type for n, f in fams.items()} == EXPECTED_FAMILIES
    assert scalar(fams, "cslb_discovery_up") == 0.0
    assert scalar(fams, "cslb_table_generation") == 0.0
    assert samples(fams, "cslb_table_age_seconds") == {}
    assert samples(fams, "cslb_endpoint_occupancy") == {}
    assert samples(fams, "cslb_decisions", "cslb_decisions_total") == {}
    # Every family has help text and the text format has HELP and TYPE lines for it.
    for name, f in fams.items():
        assert f.documentation, name
        suffix = "_total" if f.type == "counter" else ""
        assert f"# HELP {name}{suffix} " in text
        assert f"# TYPE {name}{suffix} {f.type}" in text


def test_table_without_counters(namespace: str) -> None:
    h = Host(namespace, counters=False)
    try:
        h.publish(ejected=[i == 2 for i in range(len(ENDPOINTS))])
        _, fams = scrape(namespace)
        assert scalar(fams, "cslb_discovery_up") == 1.0
        assert scalar(fams, "cslb_table_generation") == 1.0
        assert per_endpoint(fams, "cslb_endpoint_ejected") == {
            e: float(i == 2) for i, e in enumerate(ENDPOINTS)
        }
        assert samples(fams, "cslb_endpoint_occupancy") == {}  # unknown, not zero
        assert samples(fams, "cslb_decisions", "cslb_decisions_total") == {}
    finally:
        h.close()


def test_per_endpoint_load_totals_and_labels(host: Host) -> None:
    host.publish()
    a, b, c = ENDPOINTS[:3]
    host.busy(a, 5.0, calls=10, failed=3)  # 0.5 busy-seconds per second over 10 s
    host.busy(b, 2.0, calls=4)
    host.open(c, 3)
    host.recorder.count(100, 7, 4)
    host.recorder.count(20, 1, 0)
    _, fams = scrape(host.namespace)
    occ = per_endpoint(fams, "cslb_endpoint_occupancy")
    assert set(occ) == set(ENDPOINTS)
    assert occ[a] == pytest.approx(0.5, abs=0.02)
    assert occ[b] == pytest.approx(0.2, abs=0.02)
    assert 0.0 <= occ[c] < 0.3  # three calls open since just now (under a second)
    assert all(occ[e] == 0.0 for e in ENDPOINTS[3:])
    assert per_endpoint(fams, "cslb_endpoint_in_flight") == {
        e: (3.0 if e == c else 0.0) for e in ENDPOINTS
    }
    latency = per_endpoint(fams, "cslb_endpoint_latency_seconds")
    assert set(latency) == {a, b}  # no sample where nothing ended in the window
    assert latency[a] == pytest.approx(0.5, rel=1e-6)
    assert latency[b] == pytest.approx(0.5, rel=1e-6)
    req = per_endpoint(fams, "cslb_endpoint_requests", "cslb_endpoint_requests_total")
    fail = per_endpoint(fams, "cslb_endpoint_failures", "cslb_endpoint_failures_total")
    assert req == {e: {a: 10.0, b: 4.0}.get(e, 0.0) for e in ENDPOINTS}
    assert fail == {e: (3.0 if e == a else 0.0) for e in ENDPOINTS}
    assert scalar(fams, "cslb_decisions", "cslb_decisions_total") == 120.0
    assert scalar(fams, "cslb_fallback", "cslb_fallback_total") == 8.0
    assert scalar(fams, "cslb_bounded_load_moves", "cslb_bounded_load_moves_total") == 4.0
    # Labels: endpoint and zone, as published.
    zone_of = dict(zip(ENDPOINTS, ZONES, strict=True))
    for s in fams["cslb_endpoint_occupancy"].samples:
        assert set(s.labels) == {"endpoint", "zone"}
        assert s.labels["zone"] == zone_of[s.labels["endpoint"]]


def test_failure_kinds_ejections_and_panic(host: Host) -> None:
    a, b = ENDPOINTS[:2]
    e = Ejections.none(len(ENDPOINTS))
    reason, until, counts = e.reason.copy(), e.until_ns.copy(), e.counts.copy()
    reason[1] = REASON_CONSECUTIVE
    until[1] = time.monotonic_ns() + 25 * 10**9
    counts[1] = [2, 0, 1]
    counts[3] = [0, 1, 0]  # ejected before, readmitted since
    state = Ejections.of(reason, until, e.multiplier, e.decay_ns, counts)
    host.publish(ejections=state)
    host.busy(a, 1.0, calls=10, failed=4, kind=FAIL_CONNECT)
    host.busy(a, 1.0, calls=10, failed=2, kind=FAIL_STATUS)
    host.busy(b, 1.0, calls=4, failed=1)  # a boolean failure: "other"
    _, fams = scrape(host.namespace)
    kinds = samples(fams, "cslb_endpoint_failures_by_kind", "cslb_endpoint_failures_by_kind_total")
    got = {(dict(k)["endpoint"], dict(k)["kind"]): v for k, v in kinds.items()}
    assert got[(a, "connect")] == 4 and got[(a, "status")] == 2 and got[(a, "timeout")] == 0
    assert got[(b, "other")] == 1 and len(got) == 4 * len(ENDPOINTS)
    fail = per_endpoint(fams, "cslb_endpoint_failures", "cslb_endpoint_failures_total")
    assert fail[a] == 6 and fail[b] == 1  # the old family is unchanged
    ej = samples(fams, "cslb_endpoint_ejections", "cslb_endpoint_ejections_total")
    by = {(dict(k)["endpoint"], dict(k)["reason"]): v for k, v in ej.items()}
    assert by[(b, "consecutive_failures")] == 2 and by[(b, "success_rate")] == 1
    assert by[(ENDPOINTS[3], "failure_percentage")] == 1 and by[(a, "success_rate")] == 0
    assert per_endpoint(fams, "cslb_endpoint_ejected") == {e: float(e == b) for e in ENDPOINTS}
    assert scalar(fams, "cslb_outlier_panic") == 0.0
    # In panic the state stays, routing (and the ejected gauge) ignores it.
    host.publish(ejections=state, outlier_panic=True)
    _, fams = scrape(host.namespace)
    assert scalar(fams, "cslb_outlier_panic") == 1.0
    assert set(per_endpoint(fams, "cslb_endpoint_ejected").values()) == {0.0}
    snap = HostMonitor(host.namespace).snapshot()
    assert snap.outlier_panic and snap.endpoints[1].eject_reason == "consecutive_failures"
    assert 20 < snap.endpoints[1].ejected_for_s <= 25


def _record_in_child(namespace: str, slot: int, conn) -> None:
    """A second worker: claims its own row, records 3 s busy and 50 decisions, exits."""
    try:
        store = shm.CounterStore.attach(namespace)
        rec = store.claim()
        now = time.monotonic_ns()
        start = now - 5_000_000_000
        s = np.array([slot], dtype=np.int64)
        rec.record_start(s, start)
        rec.record_end(s, start, np.array([3_000_000_000]), start + 3_000_000_000)
        rec.count(50, 5, 2)
        conn.send(rec.row)
    finally:
        os._exit(0)


def test_sums_every_workers_row(host: Host) -> None:
    """Any worker answers for the whole host: rows of other processes are summed."""
    host.publish()
    a = ENDPOINTS[0]
    host.busy(a, 2.0, calls=2)
    host.recorder.count(10, 1, 1)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_record_in_child, args=(host.namespace, host.slot(a), child))
    p.start()
    try:
        assert parent.poll(10)
        assert parent.recv() != host.recorder.row
    finally:
        p.join(10)
        if p.exitcode is None:
            os.kill(p.pid, 9)
            p.join(5)
    _, fams = scrape(host.namespace)
    assert per_endpoint(fams, "cslb_endpoint_occupancy")[a] == pytest.approx(0.5, abs=0.02)
    assert per_endpoint(fams, "cslb_endpoint_requests", "cslb_endpoint_requests_total")[a] == 3
    assert scalar(fams, "cslb_decisions", "cslb_decisions_total") == 60.0
    assert scalar(fams, "cslb_fallback", "cslb_fallback_total") == 6.0
    assert scalar(fams, "cslb_bounded_load_moves", "cslb_bounded_load_moves_total") == 3.0


def test_generation_age_and_fade_shares(host: Host) -> None:
    host.publish()
    t0 = time.monotonic_ns()
    host.publish(fading=[(NEW[:1], 15.0), (NEW[1:], 3.0)], now_ns=t0 - 2_000_000_000)
    _, fams = scrape(host.namespace)
    elapsed = (time.monotonic_ns() - t0) / 1e9
    assert scalar(fams, "cslb_table_generation") == 2.0
    assert 2.0 <= scalar(fams, "cslb_table_age_seconds") <= 2.0 + elapsed + 0.01
    shares = {dict(k)["started_ns"]: v for k, v in samples(fams, "cslb_fade_share").items()}
    first, second = str(t0 - 17_000_000_000), str(t0 - 5_000_000_000)
    assert set(shares) == {first, second}
    # Ring 1 started 17 s ago, ring 2 5 s ago, of a 30 s window with exponent 2.5.
    assert shares[first] == pytest.approx((17 / 30) ** 2.5, abs=0.03)
    assert shares[second] == pytest.approx((5 / 30) ** 2.5, abs=0.005)
    assert set(per_endpoint(fams, "cslb_endpoint_occupancy")) == set(ENDPOINTS) | set(NEW)


def test_fade_share_series_keep_their_name_when_an_older_ring_finishes(host: Host) -> None:
    """A ring's series is named by its start, not its position among the
    fading rings, so it does not jump when the oldest ring finishes."""
    t = time.monotonic_ns()
    host.publish(fading=[(NEW[:1], 29.0), (NEW[1:], 3.0)], now_ns=t)
    _, fams = scrape(host.namespace)
    before = {dict(k)["started_ns"]: v for k, v in samples(fams, "cslb_fade_share").items()}
    host.publish([*ENDPOINTS, NEW[0]], fading=[(NEW[1:], 3.0)], now_ns=t)  # ring 1 done
    _, fams = scrape(host.namespace)
    after = {dict(k)["started_ns"]: v for k, v in samples(fams, "cslb_fade_share").items()}
    young = str(t - 3_000_000_000)
    assert set(before) == {str(t - 29_000_000_000), young} and set(after) == {young}
    assert after[young] == pytest.approx(before[young], abs=0.01)  # no jump
    assert after[young] < 0.1


def test_skipper_score_at_the_start_of_a_fade(host: Host) -> None:
    """Where Skipper's score and the N-ring share differ (age 0: Skipper
    counts the pod as fully in, the N-ring share is 0), each mode reports its own."""
    t = time.monotonic_ns()
    for mode, want in (("skipper", 1.0), ("n-ring", 0.0)):
        host.publish(fading=[(NEW, 0.0)], knobs=shm.Knobs(fade_mode=mode), now_ns=t)
        monitor = HostMonitor(host.namespace, clock=lambda: t)
        try:
            registry = CollectorRegistry()
            registry.register(CslbCollector(host.namespace, monitor=monitor))
            fams = {
                f.name: f
                for f in text_string_to_metric_families(generate_latest(registry).decode())
            }
            assert [x.value for x in fams["cslb_fade_share"].samples] == [want], mode
        finally:
            monitor.close()


def test_seconds_gauges_declare_their_unit(host: Host) -> None:
    """OpenMetrics gets a # UNIT line for every *_seconds family."""
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    host.publish()
    host.busy(ENDPOINTS[0], 0.5)
    registry = CollectorRegistry()
    registry.register(CslbCollector(host.namespace))
    text = om_latest(registry).decode()
    units = {line.split()[2]: line.split()[3] for line in text.splitlines() if "# UNIT" in line}
    assert units == {
        "cslb_endpoint_latency_seconds": "seconds",
        "cslb_endpoint_reported_age_seconds": "seconds",
        "cslb_table_age_seconds": "seconds",
        "cslb_discovery_heartbeat_age_seconds": "seconds",
    }


def test_skipper_fade_mode_reports_skipper_scores(host: Host) -> None:
    host.publish(fading=[(NEW, 15.0)], knobs=shm.Knobs(fade_mode="skipper"))
    _, fams = scrape(host.namespace)
    (share,) = samples(fams, "cslb_fade_share").values()
    assert share == pytest.approx(0.5**2.5, abs=0.03)


def test_stale_heartbeat_means_discovery_down(host: Host) -> None:
    host.publish(now_ns=time.monotonic_ns() - 8_000_000_000)
    _, fams = scrape(host.namespace)
    assert scalar(fams, "cslb_discovery_up") == 0.0
    assert scalar(fams, "cslb_discovery_heartbeat_age_seconds") >= 8.0
    assert scalar(fams, "cslb_table_generation") == 1.0  # still routing on it
    _, fams = scrape(host.namespace, stale_after_s=30.0)
    assert scalar(fams, "cslb_discovery_up") == 1.0
    host.writer.heartbeat()
    _, fams = scrape(host.namespace)
    assert scalar(fams, "cslb_discovery_up") == 1.0
    assert scalar(fams, "cslb_discovery_heartbeat_age_seconds") < 1.0


def test_replaced_counters_are_read_afresh(namespace: str) -> None:
    h = Host(namespace)
    monitor = HostMonitor(namespace)
    try:
        h.publish()
        h.recorder.count(5, 0, 0)
        assert monitor.snapshot().decisions == 5
        h.recorder.release()
        h.recorder = None
        h.counters.close(unlink=True)  # the master restarted: new counters
        h.counters = shm.CounterStore.create(namespace, rows=8, columns=16)
        h.recorder = h.counters.claim()
        h.recorder.count(2, 0, 0)
        assert monitor.snapshot().decisions == 2
    finally:
        monitor.close()
        h.close()


def test_stale_after_knob() -> None:
    assert STALE_AFTER.env == "CSLB_STALE_AFTER"
    assert STALE_AFTER.convert("2.5s", "test") == 2.5
    with pytest.raises(ValueError, match="CSLB_STALE_AFTER"):
        STALE_AFTER.convert("0", "test")
    assert not math.isnan(STALE_AFTER.default)


# --------------------------------------------------------------------------------------
# Totals across a SIGKILLed worker, lifetime vs window, ages.


def _totals(namespace: str) -> dict[str, float]:
    _, fams = scrape(namespace)
    out = {}
    for f in fams.values():
        for s in f.samples:
            if s.name.endswith("_total"):
                key = s.name + (f"[{s.labels['endpoint']}]" if "endpoint" in s.labels else "")
                out[key] = s.value
    return out


def _worker_then_hang(namespace: str, row: int, slot: int, conn) -> None:
    """A forked worker adopts ``row``, records, reports and waits to be SIGKILLed."""
    try:
        store = shm.CounterStore.attach(namespace)
        rec = store.claim(row=row)
        s = np.array([slot, slot], dtype=np.int64)
        t0 = 1_000
        rec.record_start(s, t0)
        rec.record_end(s, t0, np.array([10, 10]), t0 + 10, failed=np.array([True, False]))
        rec.record_start(s[:1], t0)  # stays in flight
        rec.count(70, 3, 2)
        conn.send("ready")
        signal.pause()
    finally:
        os._exit(0)


def test_counted_totals_survive_a_sigkilled_worker_and_row_reuse(host: Host) -> None:
    host.publish()
    slot = host.slot(ENDPOINTS[0])
    host.recorder.count(5, 0, 0)
    before = _totals(host.namespace)
    ctx = multiprocessing.get_context("fork")
    for round_ in range(2):  # the second child reuses the first one's row
        row = host.counters.reserve()
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker_then_hang, args=(host.namespace, row, slot, child))
        p.start()
        try:
            assert parent.poll(10) and parent.recv() == "ready"
            live = _totals(host.namespace)
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
            dead = _totals(host.namespace)
            assert host.counters.release(row, p.pid)  # the master's child_exit
            released = _totals(host.namespace)
        finally:
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        assert live == dead == released, (live, dead, released)
        assert live["cslb_decisions_total"] == before["cslb_decisions_total"] + 70 * (round_ + 1)
        assert live[f"cslb_endpoint_requests_total[{ENDPOINTS[0]}]"] == 2 * (round_ + 1)
        assert live[f"cslb_endpoint_failures_total[{ENDPOINTS[0]}]"] == round_ + 1
        for k, v in before.items():
            assert live[k] >= v, k


def test_lifetime_totals_outlive_the_occupancy_window(host: Host) -> None:
    host.publish()
    host.busy(ENDPOINTS[0], 0.5, calls=4, failed=1, ago_s=40.0)  # long before the window
    t = _totals(host.namespace)
    assert t[f"cslb_endpoint_requests_total[{ENDPOINTS[0]}]"] == 4
    assert t[f"cslb_endpoint_failures_total[{ENDPOINTS[0]}]"] == 1


def test_table_age_is_not_heartbeat_age(host: Host) -> None:
    host.publish(now_ns=time.monotonic_ns() - 20_000_000_000)
    host.writer.heartbeat()
    _, fams = scrape(host.namespace)
    assert scalar(fams, "cslb_table_age_seconds") >= 20.0
    assert scalar(fams, "cslb_discovery_heartbeat_age_seconds") < 5.0


def test_fade_share_under_fade_off_is_one(host: Host) -> None:
    host.publish(fading=[(NEW[:1], 5.0)], knobs=shm.Knobs(fade_mode="off"))
    _, fams = scrape(host.namespace)
    assert [s.value for s in fams["cslb_fade_share"].samples] == [1.0]


# --------------------------------------------------------------------------------------
# /metrics is prometheus_client's own writer over the collector, in both formats.


class _Fixed:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def _library(families: list, openmetrics: bool) -> bytes:
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest

    registry = CollectorRegistry()
    registry.register(_Fixed(families))
    return om_latest(registry) if openmetrics else generate_latest(registry)


def test_metrics_path_serves_the_librarys_exposition_for_both_formats(host: Host) -> None:
    from tests.app_tests.wsgi_calls import call
    from workers.surfaces.app import CslbApp

    host.publish()
    host.busy(ENDPOINTS[0], 1.0)
    app = CslbApp(host.namespace)
    try:
        for accept, om in ((None, False), ("application/openmetrics-text", True)):
            r = call(app, "GET", "/metrics", extra={"HTTP_ACCEPT": accept} if accept else {})
            fixed = _Fixed(list(app.collector.collect()))  # a later snapshot, same shape
            want = _library(fixed.families, om).decode()
            drop = re.compile(r"^cslb_(table_age|discovery_heartbeat_age)_seconds .*$", re.M)
            assert drop.sub("", r.body.decode()) == drop.sub("", want)
    finally:
        app.close()


def test_a_new_pod_on_a_reused_slot_starts_its_totals_at_zero(namespace: str) -> None:
    """/metrics: a slot the table writer reuses for a new pod does not carry the old pod's
    totals over."""
    import lbcore

    store = shm.CounterStore.create(namespace, rows=2, columns=8)
    writer = shm.TableWriter(namespace, counters=store, slot_reuse_ns=1_000_000_000)
    rec = store.claim()
    try:
        old, keep, new = ENDPOINTS[0], ENDPOINTS[1], NEW[0]
        t = time.monotonic_ns()
        writer.publish(lbcore.RingSet([old, keep]), now_ns=t)
        rec.record_start([0, 0, 1], t)
        rec.record_end([0, 0, 1], t, [1000] * 3, t + 1000, failed=[True, False, False])
        writer.publish(lbcore.RingSet([keep]), now_ns=t + 1)  # old leaves: slot 0 freed
        writer.publish(lbcore.RingSet([keep, new]), now_ns=t + 2_000_000_000)  # new gets it
        _, fams = scrape(namespace)
        requests = per_endpoint(fams, "cslb_endpoint_requests", "cslb_endpoint_requests_total")
        failures = per_endpoint(fams, "cslb_endpoint_failures", "cslb_endpoint_failures_total")
        assert requests == {keep: 1.0, new: 0.0} and failures == {keep: 0.0, new: 0.0}
    finally:
        rec.release()
        writer.close()
        store.close(unlink=True)


def test_build_info_names_the_installed_version_and_the_kernel(namespace: str, kernel) -> None:
    import importlib.metadata

    _, fams = scrape(namespace)
    (sample,) = fams["cslb_build_info"].samples
    assert sample.value == 1.0
    assert sample.labels == {"version": importlib.metadata.version("cslb"), "kernel": kernel}
