"""The list+watch informers, driving the real ``kubernetes`` client against a small
Kubernetes API server on 127.0.0.1 (tests/kubeapi/)."""

import random
import threading
import time

import pytest

from discovery.events import EventLog
from discovery.informers import ConfigMapInformer, EndpointSliceInformer
from discovery.kube import ListWatch, WatchTiming
from discovery.kube_client import KubeConfigError, load_client
from tests.discovery_harness import FAST
from tests.kubeapi import (
    CONFIGMAPS,
    SLICES,
    configmap,
    endpoint,
    endpoint_slice,
)

NS = "shop"


def ips(n, start=1, prefix="10.1.0"):
    return [f"{prefix}.{i}" for i in range(start, start + n)]


def slice_of(name, addrs, service="catalog", **kw):
    return endpoint_slice(name, service, [endpoint(a, node=f"node-{a}") for a in addrs], **kw)


class Recorder:
    """Collects informer updates and log events; waits for conditions."""

    def __init__(self):
        self.updates = []
        self.events = []
        self.cond = threading.Condition()
        self.log = EventLog(None)
        self.log.add_sink(self._event)

    def _event(self, rec):
        with self.cond:
            self.events.append(rec)
            self.cond.notify_all()

    def __call__(self, value, reason):
        with self.cond:
            self.updates.append((reason, value))
            self.cond.notify_all()

    def wait(self, pred, timeout=10.0, what="condition"):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out waiting for {what}; updates={self.updates[-3:]} "
                        f"events={[e['event'] for e in self.events][-10:]}"
                    )
                self.cond.wait(left)

    def addresses(self, i=-1):
        return [s.address for s in self.updates[i][1]]

    def wait_addresses(self, want, timeout=10.0):
        want = sorted(want)
        self.wait(lambda: self.updates and self.addresses() == want, timeout, f"endpoints {want}")

    def named(self, event):
        return [e for e in self.events if e["event"] == event]


@pytest.fixture
def client(kube, tmp_path):
    c, ns = load_client(kube.kubeconfig(str(tmp_path / "kubeconfig"), namespace=NS))
    assert ns == NS
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def informer(client):
    made = []

    def make(rec, timing=FAST, **kw):
        inf = EndpointSliceInformer(client, NS, "catalog", rec, log=rec.log, timing=timing, **kw)
        made.append(inf)
        inf.start()
        return inf

    try:
        yield make
    finally:
        for inf in made:
            inf.stop()
            assert not inf.watch.is_running()


def urls(addrs, port=8080):
    return [f"http://{a}:{port}" for a in addrs]


def listed_two_pods(kube, informer, timing=FAST):
    """An informer started on one slice of two pods, once it has listed them."""
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    rec = Recorder()
    inf = informer(rec, timing)
    rec.wait_addresses(urls(ips(2)))
    return rec, inf


def test_list_seeds_then_watch_follows(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    kube.put(SLICES, NS, slice_of("other-a", ["10.9.9.9"], service="other"))
    kube.put(SLICES, "elsewhere", slice_of("catalog-x", ["10.8.8.8"]))
    rec = Recorder()
    inf = informer(rec)
    rec.wait_addresses(urls(ips(3)))
    assert rec.updates[0][0] == "list"
    assert [s.node for s in rec.updates[0][1]] == [f"node-{a}" for a in ips(3)]
    kube.put(SLICES, NS, slice_of("catalog-b", ips(2, start=10)))
    rec.wait_addresses(urls(ips(3) + ips(2, start=10)))
    assert rec.updates[-1][0] == "ADDED"
    kube.delete(SLICES, NS, "catalog-a")
    rec.wait_addresses(urls(ips(2, start=10)))
    assert rec.updates[-1][0] == "DELETED"
    (lst,) = kube.requests_of("list")
    assert lst.query["labelSelector"] == "kubernetes.io/service-name=catalog"
    assert lst.headers["authorization"] == "Bearer test-token"
    w = kube.requests_of("watch")[0]
    assert w.query["allowWatchBookmarks"] == "true"
    assert w.query["resourceVersion"] == "103"  # the list's resourceVersion
    assert 2 <= int(w.query["timeoutSeconds"]) <= 4  # jittered in [t, 2t]
    assert inf.watch.stats["lists"] == 1


def test_bookmarks_advance_the_resource_version(kube, informer):
    kube.bookmark_every_s = None
    rec, inf = listed_two_pods(kube, informer, WatchTiming(1.0, 5.0, 30.0, 0.05, 0.2))
    kube.wait_for_requests("watch", SLICES, 1)
    # Changes to another Service move the resource version without events for us.
    for i in range(5):
        kube.put(SLICES, NS, slice_of(f"other-{i}", [f"10.9.0.{i}"], service="other"))
    deadline = time.monotonic() + 5
    while inf.watch.resource_version != str(kube.rv):  # until the watch got a bookmark
        assert time.monotonic() < deadline, "no bookmark reached the informer"
        kube.bookmark()
        time.sleep(0.05)
    # History before the bookmark is compacted, and the watch drops: resuming from the
    # bookmark's version needs no relist.
    kube.compact()
    kube.pause()
    kube.resume()
    kube.wait_for_requests("watch", SLICES, 2)
    time.sleep(0.3)
    assert kube.requests_of("watch")[-1].query["resourceVersion"] == str(kube.compacted_rv)
    assert inf.watch.stats["lists"] == 1 and not rec.named("watch_expired")
    assert inf.watch.stats["bookmarks"] >= 1


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
def test_too_old_resource_version_relists_without_losing_updates(kube, informer, as_http):
    kube.expired_as_http = as_http
    kube.put(SLICES, NS, slice_of("catalog-a", ips(4)))
    rec = Recorder()
    inf = informer(rec)
    rec.wait_addresses(urls(ips(4)))
    kube.pause()  # changes happen while the informer is disconnected ...
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    kube.put(SLICES, NS, slice_of("catalog-b", ips(2, start=50)))
    kube.compact()  # ... and their history is gone when it comes back
    kube.resume()
    rec.wait_addresses(urls(ips(3) + ips(2, start=50)))
    assert rec.updates[-1][0] == "relist"
    assert inf.watch.stats["lists"] == 2
    (expired,) = rec.named("watch_expired")
    assert expired["action"] == "relist" and "410" in expired["error"]
    # No update ever reported a partial or empty state.
    assert all(len(v) >= 4 for _, v in rec.updates[:-1])


def test_api_errors_keep_the_last_good_set_and_back_off(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(5)))
    rec = Recorder()
    inf = informer(rec)
    rec.wait_addresses(urls(ips(5)))
    n_updates = len(rec.updates)
    kube.pause()
    kube.compact()  # force a relist: the list itself then fails in several ways
    kube.fail("watch", SLICES, "status", code=500, times=2)
    kube.fail("watch", SLICES, "gone", times=1)
    kube.fail("list", SLICES, "status", code=503, times=2)
    kube.fail("list", SLICES, "garbage", times=1)
    kube.fail("list", SLICES, "reset", times=1)
    kube.resume()
    rec.wait(lambda: inf.watch.stats["lists"] == 2, what="relist after the faults")
    errors = rec.named("api_error")
    assert len(errors) >= 6
    texts = " | ".join(e["error"] for e in errors)
    assert "HTTP 500" in texts and "HTTP 503" in texts and "not JSON" in texts
    assert "Remote end closed connection" in texts  # the reset
    assert all(e["retry_in_s"] > 0 and e["keeping"].startswith("last good") for e in errors)
    delays = [e["retry_in_s"] for e in errors]
    assert max(delays) <= 0.2
    # While the API failed, no update replaced the good set.
    assert all(len(v) == 5 for _, v in rec.updates[n_updates:])
    assert rec.addresses() == urls(ips(5))
    assert len(kube.faults) == 5 and all(f.times == 0 for f in kube.faults)


def test_a_list_without_items_is_an_error_not_an_empty_service(kube, informer, monkeypatch):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    real = kube.list_doc
    calls = []

    def list_doc(*a):
        doc = real(*a)
        calls.append(1)
        if len(calls) == 1:
            del doc["items"]
        return doc

    monkeypatch.setattr(kube, "list_doc", list_doc)
    rec = Recorder()
    informer(rec)
    rec.wait_addresses(urls(ips(2)))
    assert all(v for _, v in rec.updates)
    assert "lacks an 'items' list" in rec.named("api_error")[0]["error"]


def test_a_silent_watch_is_dropped_at_the_read_timeout(kube, informer):
    rec, inf = listed_two_pods(kube, informer)
    kube.fail("watch", SLICES, "silent", events=0)
    kube.pause()  # end the current watch; the next one is silent: no data, no FIN
    kube.resume()
    kube.wait_for_requests("watch", SLICES, 2)
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    t0 = time.monotonic()
    rec.wait_addresses(urls(ips(3)), timeout=5)
    waited = time.monotonic() - t0
    assert waited < FAST.request_timeout_s + 1.0
    # A silent watch already waited the read timeout: resumed at once, not an error.
    (silent,) = rec.named("watch_silent")
    assert silent["level"] == "info" and silent["action"] == "resume"
    assert silent["silent_s"] == FAST.request_timeout_s
    # (the pause itself dropped a watch and refused connections: those are errors)
    assert not [e for e in rec.named("api_error") if "timed out" in e["error"]]
    assert inf.watch.stats["lists"] == 1


def test_a_watch_dropped_mid_stream_resumes_where_it_was(kube, informer):
    rec, inf = listed_two_pods(kube, informer)
    kube.fail("watch", SLICES, "drop", events=1)
    kube.pause()
    kube.put(SLICES, NS, slice_of("catalog-b", ["10.2.0.1"]))
    kube.put(SLICES, NS, slice_of("catalog-c", ["10.2.0.2"]))
    kube.put(SLICES, NS, slice_of("catalog-d", ["10.2.0.3"]))
    kube.resume()
    rec.wait_addresses(urls([*ips(2), "10.2.0.1", "10.2.0.2", "10.2.0.3"]))
    assert inf.watch.stats["lists"] == 1  # resumed, not relisted
    assert any("ProtocolError" in e["error"] for e in rec.named("api_error"))


def test_malformed_slices_are_skipped_with_a_log_line(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    bad_in_list = slice_of("catalog-z", ["10.3.0.1"])
    bad_in_list["addressType"] = 4
    kube.put(SLICES, NS, bad_in_list)
    rec = Recorder()
    inf = informer(rec)
    rec.wait_addresses(urls(ips(2)))
    broken = slice_of("catalog-a", ips(1))
    del broken["addressType"]
    kube.raw_event(SLICES, NS, "MODIFIED", broken)  # previous version of catalog-a stays
    kube.raw_event(SLICES, NS, "ADDED", {"kind": "EndpointSlice"})  # no metadata at all
    kube.raw_event(SLICES, NS, "ADDED", "a string")
    wrong = slice_of("catalog-b", ["10.4.0.1"])
    wrong["endpoints"] = "many"
    kube.raw_event(SLICES, NS, "ADDED", wrong)
    mixed = endpoint_slice(
        "catalog-c",
        "catalog",
        [endpoint("10.5.0.1"), endpoint("10.5.0.999"), {"addresses": [42]}],
    )
    kube.put(SLICES, NS, mixed)
    rec.wait_addresses(urls([*ips(2), "10.5.0.1"]))
    invalid = rec.named("object_invalid")
    assert len(invalid) == 5
    assert invalid[0]["name"] == "catalog-z" and "addressType" in invalid[0]["error"]
    assert invalid[1]["name"] == "catalog-a" and "previous version kept" in invalid[1]["action"]
    assert "no metadata.name" in invalid[2]["error"]
    assert "must be a JSON object" in invalid[3]["error"]
    assert "'endpoints' must be a list" in invalid[4]["error"]
    (problems,) = rec.named("slice_problems")
    assert problems["slice"] == "catalog-c" and problems["skipped"] == 2
    assert inf.watch.is_running()
    kube.delete(SLICES, NS, "catalog-a")
    rec.wait_addresses(urls(["10.5.0.1"]))


def test_not_ready_and_terminating_pods_leave(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    rec = Recorder()
    informer(rec)
    rec.wait_addresses(urls(ips(3)))
    a, b, c = ips(3)
    s = endpoint_slice("catalog-a", "catalog", [endpoint(a), endpoint(b, ready=False), endpoint(c)])
    kube.put(SLICES, NS, s)
    rec.wait_addresses(urls([a, c]))
    s = endpoint_slice(
        "catalog-a",
        "catalog",
        [endpoint(a), endpoint(b), endpoint(c, ready=False, serving=True, terminating=True)],
    )
    kube.put(SLICES, NS, s)
    rec.wait_addresses(urls([a, b]))


def test_same_endpoint_in_two_slices_counts_once(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ["10.1.0.1", "10.1.0.2"]))
    kube.put(SLICES, NS, slice_of("catalog-b", ["10.1.0.2", "10.1.0.3"]))
    rec = Recorder()
    informer(rec)
    rec.wait_addresses(urls(["10.1.0.1", "10.1.0.2", "10.1.0.3"]))
    # The copy in catalog-b starts terminating (pod moving between slices): it leaves.
    kube.put(
        SLICES,
        NS,
        endpoint_slice(
            "catalog-b", "catalog", [endpoint("10.1.0.2", terminating=True), endpoint("10.1.0.3")]
        ),
    )
    rec.wait_addresses(urls(["10.1.0.1", "10.1.0.3"]))


def test_ipv6_and_port_name(kube, informer):
    kube.put(
        SLICES,
        NS,
        endpoint_slice(
            "catalog-v6",
            "catalog",
            [endpoint("fd00:1::a"), endpoint("fd00:1::b")],
            address_type="IPv6",
            ports=[("http", 8080), ("admin", 9000)],
        ),
    )
    rec = Recorder()
    informer(rec, port_name="admin")
    rec.wait_addresses(["http://[fd00:1::a]:9000", "http://[fd00:1::b]:9000"])


def test_configmap_informer(kube, client):
    kube.put(CONFIGMAPS, NS, configmap("cslb", {"CSLB_ENABLED": "true"}))
    kube.put(CONFIGMAPS, NS, configmap("unrelated", {"x": "y"}))
    rec = Recorder()
    inf = ConfigMapInformer(client, NS, "cslb", rec, log=rec.log, timing=FAST)
    inf.start()
    try:
        rec.wait(lambda: rec.updates and rec.updates[-1][1] == {"CSLB_ENABLED": "true"})
        kube.put(CONFIGMAPS, NS, configmap("cslb", {"CSLB_ENABLED": "false"}))
        rec.wait(lambda: rec.updates[-1][1] == {"CSLB_ENABLED": "false"})
        bad = configmap("cslb", {"CSLB_PERCENTAGE": 50})
        bad["metadata"]["labels"] = {}
        kube.raw_event(CONFIGMAPS, NS, "MODIFIED", bad)
        kube.put(CONFIGMAPS, NS, configmap("unrelated", {"x": "z"}))
        kube.delete(CONFIGMAPS, NS, "cslb")
        rec.wait(lambda: rec.updates[-1][1] is None, what="deletion")
        (invalid,) = rec.named("object_invalid")
        assert "must map strings to strings" in invalid["error"]
        assert kube.requests_of("list", CONFIGMAPS)[0].query["fieldSelector"] == (
            "metadata.name=cslb"
        )
    finally:
        inf.stop()


def test_stop_interrupts_a_blocked_watch(kube, informer):
    kube.bookmark_every_s = None
    kube.put(SLICES, NS, slice_of("catalog-a", ips(1)))
    rec = Recorder()
    inf = informer(rec, WatchTiming(1.0, 60.0, 600.0, 0.05, 0.2))
    rec.wait_addresses(urls(ips(1)))
    kube.wait_for_requests("watch", SLICES, 1)
    time.sleep(0.1)
    t0 = time.monotonic()
    inf.stop()
    assert time.monotonic() - t0 < 1.0
    assert not inf.watch.is_running()


def test_load_client_errors_name_the_file(tmp_path):
    with pytest.raises(KubeConfigError, match=r"nope\.yaml"):
        load_client(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: 7\n")
    with pytest.raises(KubeConfigError, match=r"bad\.yaml"):
        load_client(str(bad))


def test_server_side_watch_timeout_resumes_without_relist_or_error(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    rec = Recorder()
    # Seed 7: the first three watches ask for 1, 1 and 2 s.
    inf = informer(rec, WatchTiming(1.0, 1.0, 1.0, 0.05, 0.2), rng=random.Random(7))
    rec.wait_addresses(urls(ips(2)))
    kube.wait_for_requests("watch", SLICES, 3, timeout=8)  # each ends after 1-2 s
    watches = kube.requests_of("watch")
    asked = [int(w.query["timeoutSeconds"]) for w in watches]
    assert set(asked) == {1, 2}  # jittered even for t = 1 s
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    rec.wait_addresses(urls(ips(3)))
    assert inf.watch.stats["lists"] == 1 and not rec.named("api_error")
    rvs = [int(w.query["resourceVersion"]) for w in kube.requests_of("watch")]
    assert rvs == sorted(rvs)  # always resumed from the newest version it had seen


def test_watch_timeouts_are_whole_seconds_spread_over_t_to_2t():
    for t in (1.0, 2.0, 300.0):
        lw = ListWatch(
            kind="EndpointSlice",
            list_call=lambda *a, **kw: None,
            namespace=NS,
            selectors={},
            parse=dict,
            on_change=lambda store, reason: None,
            log=EventLog(None),
            timing=WatchTiming(watch_timeout_s=t),
            rng=random.Random(11),
        )
        got = [lw.watch_timeout() for _ in range(400)]
        assert all(type(x) is int and t <= x <= 2 * t for x in got), (t, got[:10])
        if t < 100:
            assert set(got) == set(range(int(t), int(2 * t) + 1))  # every whole second
        else:
            assert len(set(got)) > 200 and 1.4 * t < sum(got) / len(got) < 1.6 * t


@pytest.mark.parametrize("action", ["gone", "expired"], ids=["http-410", "error-event"])
def test_repeated_expirations_back_off_before_relisting(kube, informer, action):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    fault = kube.fail("watch", SLICES, action, times=-1)  # every watch expires at once
    rec = Recorder()
    inf = informer(rec)
    rec.wait(lambda: len(rec.named("watch_expired")) >= 5, what="five expirations")
    expired = rec.named("watch_expired")[:5]
    assert [e["expired_in_a_row"] for e in expired] == [1, 2, 3, 4, 5]
    delays = [e["retry_in_s"] for e in expired]
    assert delays[0] == 0.0  # the first relists at once
    for n, d in enumerate(delays[1:]):  # then FAST's backoff: 0.05 s doubling to 0.2 s
        base = min(FAST.backoff_max_s, FAST.backoff_s * 2**n)
        assert 0.5 * base - 1e-3 <= d <= base + 1e-3, (n, delays)
    # The server saw the waits: list k+1 came at least delay k after list k.
    lists = [r.t for r in kube.requests_of("list")]
    assert len(lists) >= 5
    for k in range(1, 4):
        assert lists[k + 1] - lists[k] >= delays[k] - 0.005, (lists, delays)
    assert rec.addresses() == urls(ips(2))  # every relist reported the same good set
    # A watch that works ends the run: the next expiration relists at once again.
    kube.clear_faults()
    rec.wait(lambda: inf.watch.expired_in_a_row == 0, what="a working watch")
    kube.fail("watch", SLICES, action)
    fault.times = 0
    kube.pause()  # ends the working watch; the next one expires
    kube.resume()
    rec.wait(lambda: len(rec.named("watch_expired")) > 5 and inf.watch.stats["watches"] > 0)
    rec.wait(lambda: rec.named("watch_expired")[-1]["expired_in_a_row"] == 1, what="reset")
    assert rec.named("watch_expired")[-1]["retry_in_s"] == 0.0


def test_stop_cuts_a_list_that_is_never_answered(kube, informer):
    kube.fail("list", SLICES, "hang", times=-1)
    rec = Recorder()
    inf = informer(rec, WatchTiming(1.0, 30.0, 60.0, 0.05, 0.2))
    kube.wait_for_requests("list", SLICES, 1)
    time.sleep(0.1)  # the informer thread is now blocked waiting for the answer
    t0 = time.monotonic()
    assert inf.stop(timeout_s=5.0)  # the thread has ended ...
    assert time.monotonic() - t0 < 1.0  # ... because its request was cut, not timed out
    assert not rec.updates and not rec.named("api_error")


def test_a_slice_turned_malformed_keeps_its_previous_version_across_a_relist(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    kube.put(SLICES, NS, slice_of("catalog-b", ips(2, start=20)))
    rec = Recorder()
    inf = informer(rec)
    rec.wait_addresses(urls(ips(2) + ips(2, start=20)))
    broken = slice_of("catalog-a", ips(1))
    del broken["addressType"]
    kube.put(SLICES, NS, broken)  # stored: the relist's list returns it too
    rec.wait(lambda: rec.named("object_invalid"), what="the MODIFIED slice rejected")
    kube.fail("watch", SLICES, "gone")  # force a relist ...
    kube.pause()  # ... by ending the current watch
    kube.put(SLICES, NS, slice_of("catalog-c", ["10.1.0.99"]))
    kube.resume()
    rec.wait_addresses(urls([*ips(2), *ips(2, start=20), "10.1.0.99"]))
    assert rec.updates[-1][0] == "relist" and inf.watch.stats["lists"] == 2
    during_list = [e for e in rec.named("object_invalid") if e["during"] == "list"]
    assert [e["name"] for e in during_list] == ["catalog-a"]
    assert during_list[0]["action"] == "ignored; previous version kept"
    assert "addressType" in during_list[0]["error"]


# -- a silent watch (connection open, no bytes, no FIN): the stall check ------------------


def _stall_timing(idle_s: float) -> WatchTiming:
    # A read timeout far beyond the test: only the stall check can notice the silence.
    return WatchTiming(
        connect_timeout_s=1.0,
        request_timeout_s=120.0,
        watch_timeout_s=300.0,
        watch_idle_s=idle_s,
        backoff_s=0.05,
        backoff_max_s=0.2,
    )


def _stalled_watch(kube, informer, timing):
    rec, inf = listed_two_pods(kube, informer, timing)
    fault = kube.fail("watch", SLICES, "silent", events=0)
    kube.pause()  # end the current watch; the next one is silent: no data, no FIN
    kube.resume()
    deadline = time.monotonic() + 10
    while fault.hits < 1:
        assert time.monotonic() < deadline, "no silent watch"
        time.sleep(0.01)
    return rec, inf


def test_a_stalled_watch_is_cut_and_relisted_when_a_list_shows_what_it_missed(kube, informer):
    timing = _stall_timing(idle_s=1.0)
    rec, inf = _stalled_watch(kube, informer, timing)
    time.sleep(2.5)  # silent, but nothing changed: quiet, kept
    assert inf.watch.stall_check.checks >= 1 and inf.watch.stall_check.cuts == 0
    assert not rec.named("watch_stalled")
    errors = len(rec.named("api_error"))  # (the pause's dropped connections)
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    t0 = time.monotonic()
    rec.wait_addresses(urls(ips(3)), timeout=10)
    waited = time.monotonic() - t0
    # idle (1 s) + a check + the grace (1 s) + the resumed watch, far below the read timeout
    assert waited < 5.0
    (stalled,) = rec.named("watch_stalled")
    assert stalled["level"] == "info" and stalled["action"] == "relist"
    assert "the watch did not deliver: catalog-a" in stalled["why"]
    # What the watch missed, a list brings (resuming may not: the watch lost it).
    assert inf.watch.stats["lists"] == 2
    assert rec.named("watch_missed_changes")
    assert len(rec.named("api_error")) == errors  # the cut is not an error, no backoff
    # The check lists read the watch cache (resourceVersion=0); the relist is consistent.
    later = kube.requests_of("list")[1:]
    assert [r.query.get("resourceVersion") for r in later].count(None) == 1
    assert all(r.query.get("resourceVersion") in ("0", None) for r in later)


def test_a_quiet_watch_with_bookmarks_is_never_cut(kube, informer):
    kube.bookmark_every_s = 2.5  # rarer than the idle time, as kube-apiserver's (~1 min)
    rec, inf = listed_two_pods(kube, informer, _stall_timing(idle_s=1.0))
    deadline = time.monotonic() + 20
    while inf.watch.stats["bookmarks"] < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert inf.watch.stats["bookmarks"] >= 3
    assert inf.watch.stats["watches"] == 1  # the same long-lived watch all along
    assert inf.watch.stall_check.checks >= 2 and inf.watch.stall_check.cuts == 0
    assert not rec.named("watch_stalled") and not rec.named("watch_silent")
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    rec.wait_addresses(urls(ips(3)), timeout=5)


def test_the_default_timing_detects_a_stall_within_30_s():
    t = WatchTiming()
    # idle, then a check of at most (connect 4 s + read 9 s), the grace, the tick
    worst = t.watch_idle_s + min(t.connect_timeout_s, 4.0) + min(t.request_timeout_s, 9.0)
    assert worst + 1.0 + 0.25 <= 30.0
    assert t.request_timeout_s >= 60.0  # quiet watches are kept by the check, not cut


@pytest.mark.slow
def test_a_stalled_watch_resumes_within_30_s_with_the_default_settings(kube, informer):
    timing = WatchTiming(backoff_s=0.05, backoff_max_s=0.2)  # production timeouts
    kube.bookmark_every_s = None
    rec, _ = _stalled_watch(kube, informer, timing)
    kube.put(SLICES, NS, slice_of("catalog-a", ips(3)))
    t0 = time.monotonic()
    rec.wait_addresses(urls(ips(3)), timeout=35)
    assert time.monotonic() - t0 <= 30.0
    assert rec.named("watch_stalled")


# -- events the informer cannot decode: relist past them, never replay them forever -------


@pytest.mark.parametrize(
    "bad",
    [
        ("raw_event", "WEIRD", "an unknown type"),
        ("raw_event", "MODIFIED", "a resourceVersion that is not a number"),
        ("raw_event", "BOOKMARK", "a bookmark whose resourceVersion is not a number"),
        ("raw_line", None, "a line that is not JSON"),
    ],
    ids=["unknown-type", "rv-not-a-number", "bookmark-rv", "not-json"],
)
def test_an_undecodable_watch_event_relists_and_the_informer_catches_up(kube, informer, bad):
    how, kind, _ = bad
    rec, inf = listed_two_pods(kube, informer)
    if how == "raw_line":
        kube.raw_line(SLICES, NS, b"{{{ not json")
    else:
        obj = slice_of("catalog-a", ips(1))
        obj["metadata"]["resourceVersion"] = "12x" if kind != "WEIRD" else "1"
        kube.raw_event(SLICES, NS, kind, obj)
    kube.put(SLICES, NS, slice_of("catalog-b", ["10.2.0.1"]))
    rec.wait_addresses(urls([*ips(2), "10.2.0.1"]))
    (undecodable,) = rec.named("watch_undecodable")
    assert undecodable["action"] == "relist"
    assert inf.watch.stats["lists"] == 2
    # Resumed from a version the server gave, never from garbage: no 400, no error loop.
    assert all(r.query.get("resourceVersion", "0").isdigit() for r in kube.requests_of("watch"))
    assert not rec.named("api_error")
    kube.put(SLICES, NS, slice_of("catalog-c", ["10.2.0.2"]))
    rec.wait_addresses(urls([*ips(2), "10.2.0.1", "10.2.0.2"]))
    assert inf.watch.stats["lists"] == 2


def test_a_400_on_resume_relists(kube, informer):
    rec, inf = listed_two_pods(kube, informer)
    kube.fail("watch", SLICES, "status", code=400, times=-1)
    kube.pause()  # end the open watch: the next ones are refused
    kube.resume()
    rec.wait(lambda: rec.named("watch_refused"), what="a refused resume")
    kube.clear_faults()
    kube.put(SLICES, NS, slice_of("catalog-b", ["10.2.0.1"]))
    rec.wait_addresses(urls([*ips(2), "10.2.0.1"]))
    assert rec.named("watch_refused")[0]["action"] == "relist"
    assert inf.watch.stats["lists"] >= 2


def test_a_change_the_watch_never_delivers_is_found_by_the_stall_check_and_relisted(
    kube, informer
):
    # A quiet watch: the stall check looks at it. Set before the informer starts: a watch
    # the server opened with bookmarks on would keep the watch busy, never idle.
    kube.bookmark_every_s = None
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    rec = Recorder()
    inf = informer(rec, timing=_stall_timing(idle_s=0.5))
    rec.wait_addresses(urls(ips(2)))
    kube.put_unannounced(SLICES, NS, slice_of("catalog-a", ips(3)))
    rec.wait_addresses(urls(ips(3)), timeout=30)
    assert rec.named("watch_missed_changes")
    assert inf.watch.stats["lists"] == 2


def test_a_list_whose_resource_version_is_not_a_number_is_an_error_not_a_watch(kube, informer):
    kube.put(SLICES, NS, slice_of("catalog-a", ips(2)))
    kube.fail("list", SLICES, "bad-rv", times=2)
    rec = Recorder()
    inf = informer(rec)
    rec.wait_addresses(urls(ips(2)))
    errors = rec.named("api_error")
    assert len(errors) == 2 and all("is not a number" in e["error"] for e in errors)
    assert all(r.query.get("resourceVersion", "0").isdigit() for r in kube.requests_of("watch"))
    assert inf.watch.stats["lists"] == 1
