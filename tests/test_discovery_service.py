"""The discovery loop end to end inside one process: fake Kubernetes API -> real
``kubernetes`` client -> debounce and ring-set state -> real shared memory."""

import json
import os
import time

import numpy as np
import pytest

import shm
from discovery.static import EndpointSpec
from lbcore.route import route_ring_set
from tests.discovery_harness import Loop, shm_namespace, wait_until
from tests.kubeapi import CONFIGMAPS, SLICES, configmap, endpoint, endpoint_slice

NS = "shop"


def ips(n, start=0):
    return [f"10.1.{i // 200}.{i % 200 + 1}" for i in range(start, start + n)]


def urls(addrs):
    return sorted(f"http://{a}:8080" for a in addrs)


def slices_for(addrs, per=10, prefix="catalog"):
    """The way the EndpointSlice controller splits pods: up to `per` per slice."""
    out = []
    for j in range(0, len(addrs), per):
        chunk = addrs[j : j + per]
        out.append(
            endpoint_slice(
                f"{prefix}-{j // per}",
                "catalog",
                [
                    endpoint(a, node=f"node-{a}", zone="eu-central-1a", pod=f"pod-{a}")
                    for a in chunk
                ],
            )
        )
    return out


@pytest.fixture
def ns():
    with shm_namespace() as n:
        yield n


@pytest.fixture
def loop(kube, ns, tmp_path):
    kc = kube.kubeconfig(str(tmp_path / "kubeconfig"), namespace=NS)
    made = []

    def make(**kw):
        kw.setdefault("kube", kube)
        kw.setdefault("kubeconfig", kc)
        lp = Loop(ns, **kw).start()
        made.append(lp)
        return lp

    try:
        yield make
    finally:
        for lp in made:
            if lp.thread.is_alive():
                lp.stop()


def test_seed_then_a_50_pod_scale_up_is_one_publish_and_one_fading_ring(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(10)))
    lp = loop()
    t = lp.wait_generation(1)
    assert sorted(t.endpoints) == urls(ips(10)) and t.ring_set.starts_ns == ()
    assert set(t.nodes) == {f"node-{a}" for a in ips(10)}
    # A burst: 50 pods over ~0.25 s, slice by slice, some slices modified twice.
    burst = slices_for(ips(60))
    t0 = time.monotonic_ns()
    for s in burst[1:]:
        half = dict(s, endpoints=s["endpoints"][:5])
        kube.put(SLICES, NS, half)
        time.sleep(0.02)
        kube.put(SLICES, NS, s)
        time.sleep(0.02)
    t = lp.wait_generation(2)
    time.sleep(0.5)  # nothing else follows the burst
    assert lp.generation() == 2
    assert sorted(t.endpoints) == urls(ips(60))
    rs = t.ring_set
    assert len(rs.starts_ns) == 1 and rs.starts_ns[0] >= t0
    assert int((rs.tiers == 1).sum()) == 50
    new = {rs.endpoints[i] for i in np.flatnonzero(rs.tiers == 1)}
    assert new == set(urls(ips(50, start=10)))
    (pub,) = [p for p in lp.named("publish") if p["generation"] == 2]
    assert pub["added"] == 50 and pub["fading_rings"] == 1 and pub["folded_changes"] > 1
    assert pub["reason"] == "endpoints changed"
    added = [e for e in lp.named("endpoint_added") if e["generation"] == 2]
    assert len(added) == 50
    assert {(e["ip"], e["node"], e["pod"]) for e in added} == {
        (a, f"node-{a}", f"pod-{a}") for a in ips(50, start=10)
    }
    # Keys move to the new pods along the fade curve only.
    keys = [f"product-{i}" for i in range(4000)]
    now = time.monotonic_ns()
    routed = route_ring_set(rs, keys, now)
    on_new = np.isin(routed, np.flatnonzero(rs.tiers == 1)).mean()
    share = rs.share_list(now)[0]
    assert on_new <= share * 50 / 60 + 0.05


def test_rolling_deploy_inside_the_debounce_is_one_publish(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(30)))
    lp = loop(debounce_s=0.6)
    lp.wait_generation(1)
    old, new = ips(30), ips(20, start=100)
    current = list(old)
    for i in range(20):  # surge one, retire one: 20 times within ~0.4 s
        current.append(new[i])
        kube.put_many(SLICES, NS, slices_for(current))
        current.remove(old[i])
        kube.put_many(SLICES, NS, slices_for(current))
        time.sleep(0.01)
    kube.delete(SLICES, NS, "catalog-3")  # the slice count shrank back to 3
    t = lp.wait_generation(2)
    time.sleep(0.8)
    assert lp.generation() == 2
    assert sorted(t.endpoints) == urls(old[20:] + new)
    assert len(t.ring_set.starts_ns) == 1 and int((t.ring_set.tiers == 1).sum()) == 20
    (pub,) = [p for p in lp.named("publish") if p["generation"] == 2]
    assert (pub["added"], pub["removed"]) == (20, 20)
    removed = [e for e in lp.named("endpoint_removed") if e["generation"] == 2]
    assert sorted(e["ip"] for e in removed) == sorted(old[:20])


def test_deletions_and_not_ready_pods_leave_every_ring(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(10)))
    lp = loop(knobs={"fade_duration_s": 60.0})
    lp.wait_generation(1)
    kube.put_many(SLICES, NS, slices_for(ips(15)))
    t = lp.wait_generation(2)
    assert len(t.ring_set.starts_ns) == 1
    # One established pod becomes not ready, one fading pod is deleted.
    gone_ready, gone_deleted = ips(10)[3], ips(15)[12]
    eps = [
        endpoint(a, ready=(a != gone_ready), node=f"node-{a}") for a in ips(15) if a != gone_deleted
    ]
    kube.put(SLICES, NS, endpoint_slice("catalog-0", "catalog", eps))
    kube.delete(SLICES, NS, "catalog-1")
    t = lp.wait_generation(3)
    gone = set(urls([gone_ready, gone_deleted]))
    rs = t.ring_set
    assert not gone & set(rs.endpoints)
    assert len(rs.starts_ns) == 1  # the fade goes on for the pods that stay
    for ring in rs.rings:
        assert not gone & {rs.endpoints[o] for o in np.unique(ring.owners)}
    routed = route_ring_set(rs, [f"k{i}" for i in range(3000)], time.monotonic_ns())
    assert not gone & {rs.endpoints[i] for i in routed}


def test_api_down_keeps_the_last_good_table_then_recovers(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(12)))
    lp = loop()
    t1 = lp.wait_generation(1)
    kube.pause()  # connection refused from now on
    reader = lp.reader
    hb0 = reader.heartbeat_ns()
    wait_until(lambda: len(lp.named("api_error")) >= 5, what="API errors")
    assert lp.generation() == 1
    assert reader.heartbeat_ns() > hb0  # alive, just not changing
    assert sorted(lp.table().endpoints) == sorted(t1.endpoints)
    errors = lp.named("api_error")
    assert all("retry_in_s" in e and e["keeping"].startswith("last good") for e in errors)
    # While down, 5 pods went away and history was compacted: recovery relists.
    kube.put_many(SLICES, NS, [slices_for(ips(7))[0]])
    kube.delete(SLICES, NS, "catalog-1")
    kube.compact()
    kube.resume()
    t = lp.wait_generation(2)
    assert sorted(t.endpoints) == urls(ips(7))
    assert lp.named("watch_expired") or any(e["event"] == "api_list" for e in lp.events[-10:])


def test_an_empty_service_is_published_only_when_it_really_is_empty(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(5)))
    lp = loop()
    lp.wait_generation(1)
    kube.fail("any", SLICES, "status", code=500, times=3)
    kube.pause()
    kube.resume()
    wait_until(lambda: sum(f.hits for f in kube.faults) >= 3, what="5xx answers")
    assert lp.generation() == 1 and len(lp.table().endpoints) == 5
    kube.delete(SLICES, NS, "catalog-0")  # the Service has no pods now
    t = lp.wait_generation(2)
    assert t.endpoints == () and t.ring_set.rings == ()
    assert route_ring_set(t.ring_set, ["k1", "k2"], time.monotonic_ns()).tolist() == [-1, -1]
    (empty,) = lp.named("publish_empty")
    assert empty["generation"] == 2


def test_configmap_flips_the_kill_switch_at_one_generation(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(6)))
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"CSLB_ENABLED": "false"}))
    lp = loop(configmap="cslb", debounce_s=5.0, knobs={"percentage": 40.0})
    t = lp.wait_generation(1)
    # The first table already obeys the ConfigMap: the switch was never on.
    assert t.knobs.enabled is False and t.knobs.percentage == 40.0
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"enabled": "true", "CSLB_BALANCE_FACTOR": "1.5"}))
    t0 = time.monotonic()
    t = lp.wait_generation(2, timeout=3)
    assert time.monotonic() - t0 < 2.0  # at once, not after the 5 s debounce
    assert t.knobs.enabled is True and t.knobs.balance_factor == 1.5
    assert sorted(t.endpoints) == urls(ips(6))  # same endpoints, same rings
    chg = lp.named("knobs_changed")[-1]
    assert chg["changes"]["enabled"] == {"old": False, "new": True}
    # A bad value is rejected as a whole: nothing is published.
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"enabled": "false", "max_hops": "zero"}))
    wait_until(lambda: lp.named("configmap_invalid"), what="configmap_invalid")
    time.sleep(0.2)
    assert lp.generation() == 2 and lp.table().knobs.enabled is True
    assert "CSLB_MAX_HOPS" in lp.named("configmap_invalid")[0]["error"]
    # Deleting the ConfigMap falls back to flags/environment (enabled by default).
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"CSLB_ENABLED": "off"}))
    assert lp.wait_generation(3).knobs.enabled is False
    kube.delete(CONFIGMAPS, NS, "cslb")
    t = lp.wait_generation(4)
    assert t.knobs.enabled is True and t.knobs.balance_factor == 1.25


def test_heartbeats_do_not_bump_the_generation(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(3)))
    lp = loop(heartbeat_s=0.02)
    lp.wait_generation(1)
    r = lp.reader
    beats = set()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        beats.add(r.heartbeat_ns())
        time.sleep(0.01)
    assert len(beats) >= 5 and r.generation() == 1
    assert r.writer_alive() and r.writer_pid() == os.getpid()


def test_static_file_is_reread_and_a_bad_file_keeps_the_last_good_set(ns, tmp_path):
    f = tmp_path / "endpoints.json"
    f.write_text('["http://10.0.0.1:80", "http://10.0.0.2:80"]')
    lp = Loop(ns, endpoints_file=str(f), debounce_s=0.1).start()
    try:
        assert lp.wait_generation(1).endpoints == ("http://10.0.0.1:80", "http://10.0.0.2:80")
        f.write_text(
            '{"endpoints": [{"address": "http://10.0.0.1:80", "zone": "a"}, '
            '"http://10.0.0.2:80", "http://10.0.0.3:80"]}'
        )
        t = lp.wait_generation(2)
        assert sorted(t.endpoints)[-1] == "http://10.0.0.3:80" and len(t.ring_set.starts_ns) == 1
        assert dict(zip(t.endpoints, t.zones, strict=True))["http://10.0.0.1:80"] == "a"
        f.write_text("[not json")
        wait_until(lambda: lp.named("endpoints_file_invalid"), what="file error")
        time.sleep(0.3)
        assert lp.generation() == 2 and len(lp.table().endpoints) == 3
        f.write_text('["http://10.0.0.3:80"]')
        assert lp.wait_generation(3).endpoints == ("http://10.0.0.3:80",)
    finally:
        lp.stop()


def test_a_restarted_publisher_resumes_without_republishing(kube, loop, ns):
    kube.put_many(SLICES, NS, slices_for(ips(8)))
    lp = loop(knobs={"fade_duration_s": 120.0})
    lp.wait_generation(1)
    kube.put_many(SLICES, NS, slices_for(ips(12)))
    t = lp.wait_generation(2)
    starts = t.ring_set.starts_ns
    lp.stop(unlink=False)  # as if killed: the table stays
    lp2 = loop(knobs={"fade_duration_s": 120.0})
    wait_until(lambda: lp2.named("publish_skipped"), what="comparison with the table")
    assert lp2.generation() == 2
    (resumed,) = lp2.named("resumed")
    assert resumed["generation"] == 2 and resumed["fading_rings"] == 1
    # The fade goes on from its original start when the next change comes.
    kube.put_many(SLICES, NS, slices_for(ips(13)))
    t = lp2.wait_generation(3)
    assert t.ring_set.starts_ns[0] == starts[0] and len(t.ring_set.starts_ns) == 2


def test_a_completed_fade_is_published_when_it_completes(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(5)))
    lp = loop(knobs={"fade_duration_s": 0.3}, debounce_s=0.1)
    lp.wait_generation(1)
    kube.put_many(SLICES, NS, slices_for(ips(8)))
    assert len(lp.wait_generation(2).ring_set.starts_ns) == 1
    # The fade's end is a publish of its own (readers must not show it running).
    t = lp.wait_generation(3)
    assert t.ring_set.starts_ns == () and int((t.ring_set.tiers == 0).sum()) == 8
    (pub,) = [p for p in lp.named("publish") if p["generation"] == 3]
    assert (pub["reason"], pub["collapsed"], pub["added"]) == ("fade completed", 1, 0)
    time.sleep(0.3)
    assert lp.generation() == 3  # and nothing more while nothing changes
    kube.put_many(SLICES, NS, slices_for(ips(9)))
    t = lp.wait_generation(4)
    assert len(t.ring_set.starts_ns) == 1 and int((t.ring_set.tiers == 1).sum()) == 1


def test_static_list_and_kubernetes_sources_merge(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(2)))
    lp = loop(static=[EndpointSpec("http://10.200.0.1:8080", "static-zone")])
    t = lp.wait_generation(1)
    assert sorted(t.endpoints) == sorted([*urls(ips(2)), "http://10.200.0.1:8080"])


@pytest.mark.parametrize("created", ["before", "after"])
def test_counters_grow_before_a_publish_needs_their_columns(kube, loop, ns, created):
    stores = []
    try:
        if created == "before":  # the writer grows them (and uses their window)
            stores.append(shm.CounterStore.create(ns, rows=2, columns=4))
        kube.put_many(SLICES, NS, slices_for(ips(3)))
        lp = loop()
        lp.wait_generation(1)
        if created == "after":  # created by a master that started later
            stores.append(shm.CounterStore.create(ns, rows=2, columns=4))
        (store,) = stores
        kube.put_many(SLICES, NS, slices_for(ips(40)))
        t = lp.wait_generation(2)
        assert store.columns >= t.n_slots >= 40
        rec = store.claim()
        rec.record_start(t.slots, time.monotonic_ns())  # every slot has a column
        rec.release()
    finally:
        for st in stores:
            st.close()


def test_a_resumed_publisher_keeps_the_kill_switch_until_it_reads_the_configmap(kube, loop):
    kube.put_many(SLICES, NS, slices_for(ips(4)))
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"CSLB_ENABLED": "false"}))
    lp = loop(configmap="cslb")
    assert lp.wait_generation(1).knobs.enabled is False
    lp.stop(unlink=False)
    kube.fail("any", CONFIGMAPS, "status", code=503, times=-1)  # ConfigMap unreadable
    lp2 = loop(configmap="cslb", configmap_wait_s=0.1)
    wait_until(lambda: len(lp2.named("api_error")) >= 3, what="ConfigMap errors")
    time.sleep(0.3)
    assert lp2.generation() == 1 and lp2.table().knobs.enabled is False
    kube.clear_faults()
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"CSLB_ENABLED": "true"}))
    assert lp2.wait_generation(2).knobs.enabled is True


def test_removals_at_once_leave_before_the_debounce_additions_after_it(ns, tmp_path):
    f = tmp_path / "endpoints.json"

    def write(*hosts):
        f.write_text(json.dumps([f"http://10.0.0.{h}:80" for h in hosts]))

    def eps(*hosts):
        return sorted(f"http://10.0.0.{h}:80" for h in hosts)

    write(1, 2, 3, 4)
    lp = Loop(ns, endpoints_file=str(f), debounce_s=0.4, debounce_max_s=2.0)
    lp.disc.removals_at_once = True
    lp.start()
    try:
        lp.wait_generation(1)
        write(2, 3, 4, 9)  # one change: pod 1 terminates, pod 9 arrives
        t = lp.wait_generation(2)
        assert sorted(t.endpoints) == eps(2, 3, 4)  # the removal went out alone ...
        t = lp.wait_generation(3)
        assert sorted(t.endpoints) == eps(2, 3, 4, 9)  # ... the addition after the debounce
        assert len(t.ring_set.starts_ns) == 1
        pubs = {p["generation"]: p for p in lp.named("publish")}
        assert (pubs[2]["reason"], pubs[2]["removed"], pubs[2]["added"]) == (
            "endpoints removed",
            1,
            0,
        )
        assert (pubs[3]["reason"], pubs[3]["added"]) == ("endpoints changed", 1)
        # A burst of removals only: one publish, nothing left for the debounce.
        write(2, 9)
        assert sorted(lp.wait_generation(4).endpoints) == eps(2, 9)
        time.sleep(0.6)  # past the debounce
        assert lp.generation() == 4 and not lp.named("publish_skipped")
    finally:
        lp.stop()
