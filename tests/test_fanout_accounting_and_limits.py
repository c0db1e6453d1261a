"""What router.fanout records per call (in flight, busy time) and the limits it keeps: the
bulkhead, the pool, the deadline; with in-process pods on real shared memory."""

from __future__ import annotations

import threading
import time

import numpy as np

from tests import fanout_harness
from tests.fanout_harness import EPS, KEYS, pods
from workers.fanout.threads import DeadlineError, RejectedError

# The fan-out tests' host: five pods published, routing independent of the loads.
host = fanout_harness.host


def test_in_flight_counts_only_the_calls_really_out(host):
    """30 calls of 40 ms on 2 threads: the host sees at most 2 in flight, never the 28
    waiting in the pool."""
    r = host.router(threads=2)
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(int(host.loads().in_flight.sum()))
            time.sleep(0.005)

    def send(url, key, timeout=None):
        time.sleep(0.04)
        return key

    th = threading.Thread(target=watch)
    th.start()
    try:
        res = r.fanout(KEYS[:30], send, timeout_s=5.0, deadline_s=30.0)
    finally:
        stop.set()
        th.join()
    assert all(x.ok for x in res)
    # At most the 2 calls out, whatever write of the ledger a reader catches (ends are
    # written before starts).
    assert 1 <= max(seen) <= 2, max(seen)


def test_per_call_busy_time_is_the_calls_own_time_not_the_queue(host):
    """A pool of 2 threads, 30 calls of ~20 ms: each waits up to ~280 ms in the pool's
    queue, which must not count. Recorded latency = what the sends themselves took."""
    r = host.router(threads=2)
    took: list[int] = []
    lock = threading.Lock()

    def send(url, key, timeout=None):
        t0 = time.monotonic_ns()
        time.sleep(0.02)
        with lock:
            took.append(time.monotonic_ns() - t0)
        return key

    t0 = time.monotonic_ns()
    res = r.fanout(KEYS[:30], send, timeout_s=5.0)
    wall = time.monotonic_ns() - t0
    assert all(x.ok for x in res)
    loads = host.loads()
    done = loads.completed.sum()
    mean = np.nansum(loads.mean_latency_s * loads.completed) / done
    own = sum(took) / len(took) / 1e9
    assert done == 30
    assert own * 0.9 <= mean <= own * 1.1 + 0.002  # the calls' own time, clock reads apart
    assert wall / 1e9 > 5 * own  # (while the fan-out itself took many times that)


def test_track_still_counts_from_its_entry(host):
    r = host.router()
    idx, t = r.route_table(KEYS[:4])
    with r.track(idx, t, keys=KEYS[:4]):
        time.sleep(0.03)
    loads = host.loads()
    assert loads.completed.sum() == 4
    assert np.nanmin(loads.mean_latency_s) >= 0.03


def test_the_bulkhead_sends_calls_over_the_cap_to_the_retry_pod_and_blames_nobody(host):
    r = host.router(threads=8, endpoint_cap=1)
    frozen = EPS[3]
    release = threading.Event()

    def send(url, key, timeout=None):
        if url == frozen:
            release.wait(10.0)
        return f"{key}@{url}"

    first = r.endpoints_of(r.route(KEYS))
    retry = r.endpoints_of(r.route(KEYS, attempt=1))
    # The frozen pod answers after 2.5 s, long before its calls' 20-s timeout (and a
    # quarter of it, when it would look stuck): calls over the cap do not wait for it,
    # they go to their retry pods at once.
    timer = threading.Timer(2.5, release.set)
    timer.start()
    try:
        res = r.fanout(KEYS, send, timeout_s=20.0, deadline_s=30.0)
    finally:
        timer.cancel()
        release.set()
    hit = [i for i, u in enumerate(first) if u == frozen]
    went = [i for i in hit if res[i].endpoint == frozen]
    moved = [i for i in hit if res[i].endpoint == retry[i]]
    assert len(went) == 1 and len(moved) == len(hit) - 1  # the cap: one call out to it
    for i in hit:
        assert res[i].ok and res[i].attempts == 1  # one call made either way
    loads = host.loads()
    slot = host.slot(frozen, r)
    assert int(loads.requests_total[slot]) == sum(x.endpoint == frozen for x in res)  # made
    assert int(loads.failures_total.sum()) == 0
    st = host.stats()
    moves = sum(x.endpoint != u for x, u in zip(res, first, strict=True))
    assert st["bulkhead_rejections"] == moves
    assert st["retries"] == 0  # not a retry: the first call was never made


def test_a_call_moved_by_the_bulkhead_to_a_dead_pod_is_retried_on_its_own_pod(host):
    r = host.router(threads=8, endpoint_cap=1)
    dead = EPS[2]
    calls: dict[str, list[str]] = {}
    lock = threading.Lock()

    def send(url, key, timeout=None):
        with lock:
            calls.setdefault(key, []).append(url)
        if url == dead:
            raise ConnectionRefusedError(f"{url} refused")
        time.sleep(0.01)  # busy: one call in flight per pod puts it at its cap
        return f"{key}@{url}"

    first = r.endpoints_of(r.route(KEYS))
    retry = r.endpoints_of(r.route(KEYS, attempt=1))
    res = r.fanout(KEYS, send, timeout_s=5.0, deadline_s=20.0)
    assert all(x.ok for x in res), [x for x in res if not x.ok][:3]
    assert all(len(c) <= 2 for c in calls.values())  # one retry at most, ever
    bounced = [
        i for i, k in enumerate(KEYS) if first[i] != dead and calls[k] == [retry[i], first[i]]
    ]
    assert bounced, "no call went over its pod's cap to a dead retry pod"
    for i in bounced:
        assert retry[i] == dead and res[i].attempts == 2 and res[i].endpoint == first[i]
    assert host.stats()["retries"] == sum(x.attempts == 2 for x in res)


def test_a_full_pool_rejects_locally(host):
    r = host.router(threads=2, queue=10, endpoint_cap=100)  # (the pool alone)
    send, seen = pods()
    res = r.fanout(KEYS[:30], send)
    assert sum(x.ok for x in res) == 10
    rej = [x for x in res if not x.ok]
    assert len(rej) == 20 and all(isinstance(x.error, RejectedError) for x in rej)
    assert len(seen) == 10
    assert host.stats()["bulkhead_rejections"] == 20
    assert int(host.loads().failures_total.sum()) == 0


def test_the_deadline_bounds_the_fan_out_even_if_send_ignores_its_timeout(host):
    r = host.router(threads=4)
    stuck = EPS[0]
    release = threading.Event()

    def send(url, key):  # no timeout keyword: it cannot be told
        if url == stuck:
            release.wait(10.0)
        return key

    try:
        t0 = time.monotonic()
        res = r.fanout(KEYS[:40], send, timeout_s=0.1, deadline_s=0.3)
        took = time.monotonic() - t0
    finally:
        release.set()
    first = r.endpoints_of(r.route(KEYS[:40]))
    assert took < 3.0  # bounded by the deadline (generously: a loaded CI machine)
    cut = 0
    for i, x in enumerate(res):
        if first[i] == stuck and x.endpoint == stuck:  # (past the cap: the retry pod's)
            assert isinstance(x.error, DeadlineError)
            cut += 1
        else:
            assert x.ok
    assert cut == 2  # the bulkhead's cap (half the pool's 4 threads)
