"""What router.fanout answers: results in key order, fallback keys, the retry to the ingress,
the grouped form, the rate-limited failure log and its argument checks; with in-process pods."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np
import pytest

import lbcore
import shm
from tests import fanout_harness
from tests.fanout_harness import EPS, KEYS, pods
from workers.fanout.settings import FanoutSettings
from workers.fanout.threads import Result
from workers.routing.router import Router, RouterInputError, RouterStateError

# The fan-out tests' host: five pods published, routing independent of the loads.
host = fanout_harness.host


def test_results_come_in_key_order_from_the_routed_pods(host):
    r = host.router()
    send, seen = pods()
    res = r.fanout(KEYS, send)
    want = r.endpoints_of(r.route(KEYS))
    assert [x.value for x in res] == [f"{k}@{u}" for k, u in zip(KEYS, want, strict=True)]
    assert all(isinstance(x, Result) and x.ok and x.attempts == 1 for x in res)
    assert [x.endpoint for x in res] == want
    assert sorted(seen) == sorted(zip(want, KEYS, strict=True))  # one call per key
    # Every call recorded, nothing left in flight.
    loads = host.loads()
    assert int(loads.requests_total.sum()) == len(KEYS)
    assert int(loads.in_flight.sum()) == 0


def test_fallback_keys_come_back_or_go_to_the_fallback_url(host):
    host.writer_.publish(lbcore.RingSet(EPS), knobs=shm.Knobs(percentage=50.0, balance_factor=None))
    r = host.router()
    send, seen = pods()
    idx = r.route(KEYS)
    fb = set(np.flatnonzero(idx < 0).tolist())
    assert 20 < len(fb) < 80
    res = r.fanout(KEYS, send)
    for i, x in enumerate(res):
        if i in fb:
            assert x.fallback and x.attempts == 0 and x.endpoint is None and not x.ok
            assert x.error is None  # the caller's to send through the ingress, at once
        else:
            assert x.ok and not x.fallback
    assert len(seen) == len(KEYS) - len(fb)
    ingress = "http://ingress.test:9999"
    r2 = host.router(fallback_url=ingress)
    seen.clear()
    res = r2.fanout(KEYS, send)
    for i, x in enumerate(res):
        if i in fb:
            assert x.ok and x.fallback and x.attempts == 1 and x.endpoint is None
            assert x.value == f"{KEYS[i]}@{ingress}"
    assert sum(u == ingress for u, _ in seen) == len(fb)
    # Ingress calls are not recorded into the pods' counters.
    assert int(host.loads().requests_total.sum()) == 2 * (len(KEYS) - len(fb))


def test_retry_to_the_ingress(host):
    ingress = "http://ingress.test:9999"
    r = host.router(fallback_url=ingress, retry_to="ingress")
    send, _ = pods(dead={EPS[2]})
    res = r.fanout(KEYS, send)
    first = r.endpoints_of(r.route(KEYS))
    for i, x in enumerate(res):
        if first[i] == EPS[2]:
            assert x.ok and x.attempts == 2 and x.endpoint == ingress
    with pytest.raises(ValueError, match="CSLB_FALLBACK_URL"):
        FanoutSettings(retry_to="ingress")


def test_grouped_form_calls_each_pod_once_and_retries_per_retry_pod(host):
    r = host.router()
    dead = EPS[1]
    calls: list[tuple[str, list]] = []
    lock = threading.Lock()

    def send_group(url, keys, timeout=None):
        with lock:
            calls.append((url, list(keys)))
        if url == dead:
            raise ConnectionRefusedError("refused")
        return [f"{k}@{url}" for k in keys]

    res = r.fanout(KEYS, send_group, grouped=True)
    first = r.endpoints_of(r.route(KEYS))
    retry = r.endpoints_of(r.route(KEYS, attempt=1))
    firsts = [c for c in calls if c[0] == dead]
    assert len(firsts) == 1 and sorted(firsts[0][1]) == sorted(
        k for k, u in zip(KEYS, first, strict=True) if u == dead
    )
    retry_pods = {retry[i] for i, u in enumerate(first) if u == dead}
    assert len(calls) == len(EPS) + len(retry_pods)  # one per pod, one per retry pod
    for i, x in enumerate(res):
        assert x.ok
        want = retry[i] if first[i] == dead else first[i]
        assert x.value == f"{KEYS[i]}@{want}" and x.attempts == (2 if first[i] == dead else 1)
    assert host.stats()["retries"] == len(retry_pods)


def test_grouped_calls_over_the_cap_go_to_retry_pods_and_come_back_if_they_must(host):
    r = host.router(threads=8, endpoint_cap=1)
    dead = EPS[2]
    lock = threading.Lock()
    calls: list[tuple[int, str, list]] = []

    def send_group(url, keys, timeout=None):
        fan = int(keys[0].split("/")[0])
        with lock:
            calls.append((fan, url, list(keys)))
        if url == dead:
            raise ConnectionRefusedError("refused")
        time.sleep(0.05)  # one group call out per pod puts it at its cap
        return [f"{k}@{url}" for k in keys]

    out: dict[int, list] = {}

    def one(fan):
        keys = [f"{fan}/{k}" for k in KEYS]
        out[fan] = r.fanout(keys, send_group, grouped=True, timeout_s=5.0, deadline_s=20.0)

    threads = [threading.Thread(target=one, args=(f,)) for f in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fan, res in out.items():
        assert all(x.ok for x in res), (fan, [x for x in res if not x.ok][:2])
        per_key: dict[str, int] = {}
        for f, _, keys in calls:
            if f == fan:
                for k in keys:
                    per_key[k] = per_key.get(k, 0) + 1
        assert max(per_key.values()) <= 2  # one retry at most
    st = host.stats()
    assert st["bulkhead_rejections"] > 0 and int(host.loads().in_flight.sum()) == 0


def test_the_failure_log_is_rate_limited_per_endpoint(host, caplog):
    r = host.router()
    send, _ = pods(dead={EPS[0]})
    with caplog.at_level(logging.WARNING, logger="cslb.router"):
        for _ in range(5):
            r.fanout(KEYS, send)
    lines = [json.loads(rec.getMessage()) for rec in caplog.records]
    failed = [x for x in lines if x["event"] == "cslb_call_failed"]
    assert 1 <= len(failed) <= 3  # 3 per endpoint per second
    x = failed[0]
    assert x["endpoint"] == EPS[0] and x["pod_ip"] == "10.9.0.1" and x["node"] == "node-0"
    assert x["kind"] == "connect" and x["attempt"] == 0 and x["retry"].startswith("succeeded on")
    assert x["zone"] == "z1" and x["generation"] == 1 and x["product_id"] in KEYS


def test_fanout_needs_a_threaded_router_and_checks_its_arguments(host):
    r = Router(host.namespace, threads=False)
    try:
        with pytest.raises(RouterStateError, match="threads=True"):
            r.fanout(KEYS, lambda u, k: k)
    finally:
        r.close()
    r = host.router()
    for bad in (0, -1, "1", True):
        # The router's input error, as route() raises for bad arguments (a ValueError).
        with pytest.raises(RouterInputError, match="timeout_s"):
            r.fanout(KEYS, lambda u, k: k, timeout_s=bad)
    with pytest.raises(RouterInputError, match="grouped"):
        r.fanout(KEYS, lambda u, k: k, grouped=1)
    with pytest.raises(lbcore.KeyTypeError):
        r.fanout([1.5], lambda u, k: k)
