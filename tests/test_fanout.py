"""router.fanout / router.afanout on real shared memory, with in-process send functions.

The pods here are Python functions (a dead pod raises ConnectionRefusedError, a slow
one sleeps), so each rule of the helper is checked alone and fast: results in key
order, the single retry on attempt 1's pod, the budget, the bulkhead, the deadline,
the fallback, the grouped form, the per-call recording. Real HTTP pods and real
gunicorn are in test_fanout_e2e.py; the senders against real HTTP in test_fanout_parts.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid

import numpy as np
import pytest

import lbcore
import shm
from lbcore.outlier import FAIL_CONNECT, FAIL_OTHER, FAIL_STATUS, FAIL_TIMEOUT
from workers.fanout.senders import CallAnswerError, CallStatusError
from workers.fanout.settings import FanoutSettings
from workers.fanout.threads import DeadlineError, RejectedError, Result
from workers.routing.router import Router, RouterInputError, RouterStateError

EPS = [f"http://10.9.0.{i}:8080" for i in range(1, 6)]
KEYS = [f"SKU-{i:05d}" for i in range(100)]


@pytest.fixture
def host():
    ns = f"fo{uuid.uuid4().hex[:10]}"
    store = shm.CounterStore.create(ns, rows=8)
    writer = shm.TableWriter(ns, counters=store)
    writer.publish(
        lbcore.RingSet(EPS),
        knobs=shm.Knobs(balance_factor=None),  # routes independent of the loads recorded
        nodes=[f"node-{i}" for i in range(5)],
        zones=["z1"] * 5,
    )
    routers: list[Router] = []

    class H:
        namespace = ns

        def router(self, **settings) -> Router:
            r = Router(ns, fanout_settings=FanoutSettings(**settings) if settings else None)
            routers.append(r)
            return r

        def loads(self) -> shm.HostLoads:
            return store.reader().read(time.monotonic_ns())

        def stats(self) -> dict:
            return store.reader().stats()

        def slot(self, url: str, r: Router) -> int:
            t = r.table()
            return int(t.slots[t.endpoints.index(url)])

        writer_ = writer

    yield H()
    for r in routers:
        r.close()
    writer.close()
    store.close()
    for name in shm.list_segments(ns):
        shm.segment.unlink_name(name)


def pods(dead=(), status=(), slow_s=0.0, other=()):
    """A send function over in-process pods, and the calls it saw (url, key)."""
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def send(url, key, timeout=None):
        with lock:
            seen.append((url, key))
        if url in dead:
            raise ConnectionRefusedError(f"{url} refused")
        if url in status:
            raise CallStatusError(503, url)
        if url in other:
            raise KeyError("a bug in the caller's code")
        if slow_s:
            time.sleep(slow_s)
        return f"{key}@{url}"

    return send, seen


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


@pytest.mark.parametrize("form", ["threads", "asyncio"])
def test_a_dead_pod_is_retried_once_on_attempt_ones_pod(host, form):
    r = host.router()
    dead = EPS[2]
    send, seen = pods(dead={dead})
    if form == "threads":
        res = r.fanout(KEYS, send)
    else:

        async def asend(url, key, timeout=None):
            return send(url, key)

        res = asyncio.run(r.afanout(KEYS, asend))
    first = r.endpoints_of(r.route(KEYS))
    retry = r.endpoints_of(r.route(KEYS, attempt=1))
    hit = [i for i, u in enumerate(first) if u == dead]
    assert 5 < len(hit) < 50
    for i, x in enumerate(res):
        assert x.ok, x
        if i in hit:
            assert x.attempts == 2 and x.endpoint == retry[i] != dead
            assert x.value == f"{KEYS[i]}@{retry[i]}"
        else:
            assert x.attempts == 1 and x.endpoint == first[i]
    assert len(seen) == len(KEYS) + len(hit)  # exactly one retry each, no third call
    # The dead pod's failures are recorded, as connection failures; no other pod failed.
    loads = host.loads()
    slot = host.slot(dead, r)
    t = r.table()
    by_slot = dict(zip(t.slots.tolist(), range(len(EPS)), strict=True))
    kinds = loads.failures_total_by_kind
    assert int(loads.failures_total[slot]) == len(hit)
    assert int(kinds[slot, FAIL_CONNECT - 1]) == len(hit)
    assert int(loads.failures_total.sum()) == len(hit)
    assert by_slot[slot] == t.endpoints.index(dead)
    st = host.stats()
    assert st["retries"] == len(hit) and st["retries_failed"] == 0


@pytest.mark.parametrize("form", ["threads", "asyncio", "grouped"])
def test_a_retry_never_goes_back_to_the_pod_that_failed_when_routing_moved_meanwhile(host, form):
    # Attempt 1 is the pod after a key's attempt-0 pod at the time of the retry, which
    # need not be the pod the fan-out sent the key to (loads refreshed, a new table).
    # Here: pod `q` is ejected while the fan-out routes, so keys whose ring order is
    # q, p go to p; p answers 503 and, before its first failure returns, q is readmitted.
    # Now attempt 0 of those keys is q and attempt 1 is p itself: the retry must not go
    # there (seen on the uvicorn worker, where bounded load moved attempt 0).
    r = host.router()
    order0 = r.endpoints_of(r.route(KEYS))
    order1 = r.endpoints_of(r.route(KEYS, attempt=1))
    q, p = EPS[1], EPS[3]
    both = [i for i in range(len(KEYS)) if order0[i] == q and order1[i] == p]
    assert both  # (the key set has some whose ring order is q, p)
    ejected = np.zeros(len(EPS), dtype=bool)
    ejected[EPS.index(q)] = True
    knobs = shm.Knobs(balance_factor=None)
    host.writer_.publish(lbcore.RingSet(EPS), ejected=ejected, knobs=knobs)
    seen: list[tuple[str, object]] = []
    lock = threading.Lock()
    readmitted = []

    def send(url, key, timeout=None):
        with lock:
            seen.append((url, key))
            if url == p:
                if not readmitted:
                    host.writer_.publish(lbcore.RingSet(EPS), knobs=knobs)
                    readmitted.append(True)
                raise CallStatusError(503, url)
        return [f"{k}@{url}" for k in key] if form == "grouped" else f"{key}@{url}"

    if form == "threads":
        res = r.fanout(KEYS, send)
    elif form == "grouped":
        res = r.fanout(KEYS, send, grouped=True)
    else:

        async def asend(url, key, timeout=None):
            return send(url, key)

        res = asyncio.run(r.afanout(KEYS, asend))
    assert readmitted
    for i in both:
        x = res[i]
        assert x.ok and x.attempts == 2 and x.endpoint == q, (i, x)
    calls_to_p = [k for u, k in seen if u == p]
    if form != "grouped":  # each key sent to p at most once
        assert len(calls_to_p) == len(set(calls_to_p))
    assert all(x.ok for x in res), [x for x in res if not x.ok][:3]
    st = host.stats()
    assert st["retries_failed"] == 0


def test_a_failed_retry_returns_its_error_and_other_errors_are_not_retried(host):
    r = host.router()
    first = r.endpoints_of(r.route(KEYS))
    retry = r.endpoints_of(r.route(KEYS, attempt=1))
    of_pod0 = {k for k, u in zip(KEYS, first, strict=True) if u == EPS[0]}
    seen: list[tuple[str, str]] = []

    def send(url, key, timeout=None):
        seen.append((url, key))
        if url == EPS[0]:
            raise CallStatusError(503, url)
        if key in of_pod0:  # their retry pod fails them too
            raise ConnectionRefusedError(f"{url} refused")
        if url == EPS[4]:
            raise KeyError("a bug in the caller's code")
        return key

    res = r.fanout(KEYS, send)
    for i, x in enumerate(res):
        if first[i] == EPS[0]:
            assert x.attempts == 2 and x.endpoint == retry[i]
            assert isinstance(x.error, ConnectionRefusedError) and x.kind == FAIL_CONNECT
        elif first[i] == EPS[4]:
            assert x.attempts == 1 and isinstance(x.error, KeyError) and x.kind == FAIL_OTHER
        else:
            assert x.ok and x.attempts == 1
    assert len(seen) == len(KEYS) + len(of_pod0)  # no third call
    kinds = host.loads().failures_total_by_kind
    assert int(kinds[host.slot(EPS[0], r), FAIL_STATUS - 1]) == len(of_pod0)
    assert int(kinds[host.slot(EPS[4], r), FAIL_OTHER - 1]) == first.count(EPS[4])
    st = host.stats()
    assert st["retries"] == st["retries_failed"] == len(of_pod0)


def test_a_4xx_answer_is_the_keys_error_but_not_the_pods_failure(host):
    r = host.router()
    seen = []

    def send(url, key, timeout=None):
        seen.append(url)
        if url == EPS[1]:
            raise CallAnswerError(404, url)
        return key

    res = r.fanout(KEYS, send)
    first = r.endpoints_of(r.route(KEYS))
    for x, u in zip(res, first, strict=True):
        if u == EPS[1]:
            assert isinstance(x.error, CallAnswerError) and x.attempts == 1 and x.kind == 0
        else:
            assert x.ok
    assert len(seen) == len(KEYS)  # not retried
    loads = host.loads()
    assert int(loads.failures_total.sum()) == 0  # the pod answered: healthy
    assert int(loads.requests_total[host.slot(EPS[1], r)]) == first.count(EPS[1])


def test_an_ejected_pods_keys_go_where_its_retries_went_and_no_other_key_moves(host):
    r = host.router()
    before0 = r.route(KEYS).tolist()
    before1 = r.route(KEYS, attempt=1).tolist()
    dead = 2
    ejected = np.zeros(len(EPS), dtype=bool)
    ejected[dead] = True
    host.writer_.publish(lbcore.RingSet(EPS), ejected=ejected, knobs=shm.Knobs(balance_factor=None))
    assert r.table().generation == 2
    after = r.route(KEYS).tolist()
    hit = [i for i, e in enumerate(before0) if e == dead]
    assert hit and all(after[i] == before1[i] for i in hit)  # the retries' pods
    assert all(after[i] == e for i, e in enumerate(before0) if e != dead)  # nothing else


def test_the_retry_budget_bounds_retries_and_counts_the_refused(host):
    r = host.router(retry_percent=0.0, retry_floor_per_s=0.5)  # 5 retries per 10 s
    dead = EPS[1]
    send, _ = pods(dead={dead})
    res = r.fanout(KEYS, send)
    first = r.endpoints_of(r.route(KEYS))
    n_dead = first.count(dead)
    retried = [x for x in res if x.attempts == 2]
    failed = [x for x in res if not x.ok]
    assert len(retried) == 5 and all(x.ok for x in retried)
    assert len(failed) == n_dead - 5
    assert all(isinstance(x.error, ConnectionRefusedError) and x.endpoint == dead for x in failed)
    st = host.stats()
    assert st["retries"] == 5 and st["retries_refused"] == n_dead - 5
    # 20 % of the calls deposited (this fan-out's own 100), no floor.
    r2 = host.router(retry_percent=20.0, retry_floor_per_s=0.0)
    assert sum(x.attempts == 2 for x in r2.fanout(KEYS, send)) == min(n_dead, 20)


def test_the_retry_waits_a_jittered_backoff_and_never_starts_past_the_deadline(host):
    r = host.router(retry_backoff_s=0.2)
    dead = EPS[2]
    stamps: dict[str, list[int]] = {}
    lock = threading.Lock()

    def send(url, key, timeout=None):
        with lock:
            stamps.setdefault(key, []).append(time.monotonic_ns())
        if url == dead:
            raise ConnectionRefusedError(f"{url} refused")
        return key

    first = r.endpoints_of(r.route(KEYS))
    hit = [k for k, u in zip(KEYS, first, strict=True) if u == dead]
    res = r.fanout(KEYS, send, timeout_s=1.0, deadline_s=5.0)
    assert all(x.ok for x in res) and all(len(stamps[k]) == 2 for k in hit)
    gaps = [(stamps[k][1] - stamps[k][0]) / 1e9 for k in hit]
    assert min(gaps) >= 0.1  # at least the lower half of the 0.2-s backoff
    # Jittered over the upper half of the setting, never beyond it.
    state = r.fanout_machinery.prepare(KEYS[:1], send, None, None, False)
    waits = [state.backoff_ns() for _ in range(200)]
    assert 0.1e9 <= min(waits) and max(waits) <= 0.2e9 and len(set(waits)) > 100
    # A retry that would start past the deadline is not sent (nor charged to the budget):
    # backoffs of 0.5-1 s, a deadline of 0.45 s.
    stamps.clear()
    r2 = host.router(retry_backoff_s=1.0)
    res = r2.fanout(KEYS, send, timeout_s=0.4, deadline_s=0.45)
    assert all(len(stamps.get(k, ())) <= 1 for k in hit)
    refused = [x for k, x in zip(KEYS, res, strict=True) if k in hit and x.attempts == 1]
    assert refused and all(isinstance(x.error, ConnectionRefusedError) for x in refused)
    st = host.stats()
    assert st["retries"] == len(hit) and st["retries_refused"] == 0  # the first fan-out's


def test_a_timeout_the_deadline_cut_short_is_the_callers_a_longer_one_the_pods(host):
    r = host.router()
    frozen = EPS[0]

    def send(url, key, timeout=None):  # a sender that honours its timeout
        if url == frozen:
            time.sleep(timeout)
            raise TimeoutError(f"{url}: no answer within {timeout} s")
        return key

    keys = [k for k, u in zip(KEYS, r.endpoints_of(r.route(KEYS)), strict=True) if u == frozen]
    keys = keys[:2]
    slot = host.slot(frozen, r)

    def ended(n):
        for _ in range(200):  # (the calls end on the pool after the fan-out returned)
            r.fanout_machinery.ledger.flush()
            loads = host.loads()
            if int(loads.requests_total[slot]) >= n:
                return int(loads.failures_total_by_kind[slot, FAIL_TIMEOUT - 1])
            time.sleep(0.01)
        raise AssertionError("calls did not end")

    # The deadline leaves each call 0.15 s of its 0.2 s: still no answer is the pod's.
    res = r.fanout(keys, send, timeout_s=0.2, deadline_s=0.15)
    assert not any(x.ok for x in res)  # (timed out, or the deadline came first)
    assert ended(2) == 2
    busy = float(host.loads().occupancy[slot])
    # It leaves them 0.04 s (a fifth): they started too late, the caller's doing, and
    # they are no success either (a success resets the pod's consecutive failures):
    # only their busy time counts.
    r.fanout(keys, send, timeout_s=0.2, deadline_s=0.04)
    ledger = r.fanout_machinery.ledger
    for _ in range(200):  # (the calls end on the pool after the fan-out returned)
        if ledger.in_flight(slot) == 0:
            break
        time.sleep(0.01)
    ledger.flush()
    loads = host.loads()
    assert int(loads.in_flight[slot]) == 0
    assert int(loads.requests_total[slot]) == 2 and int(loads.completed[slot]) == 2
    assert int(loads.failures_total_by_kind[slot, FAIL_TIMEOUT - 1]) == 2
    assert float(loads.occupancy[slot]) > busy


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


def test_afanout_tasks_interleave_on_one_thread(host):
    r = host.router(endpoint_cap=100)  # (no bulkhead moves: every key on its own pod)

    async def asend(url, key, timeout=None):
        await asyncio.sleep(0.001 * (hash(key) % 5))
        return f"{key}@{url}"

    async def main():
        a, b = KEYS[:50], [f"OTHER-{i}" for i in range(70)]
        return a, b, await asyncio.gather(r.afanout(a, asend), r.afanout(b, asend))

    a, b, (ra, rb) = asyncio.run(main())
    for keys, res in ((a, ra), (b, rb)):
        want = r.endpoints_of(r.route(keys))
        assert [x.value for x in res] == [f"{k}@{u}" for k, u in zip(keys, want, strict=True)]
    assert int(host.loads().in_flight.sum()) == 0


def test_an_afanout_that_started_with_no_free_slot_gets_the_slots_given_back(host):
    # Fan-out `a` takes the loop's 4 slots; `b`, started meanwhile, runs on one runner.
    # When `a` ends its slots go to `b` (in line), not only to fan-outs started later:
    # else `b` stays on one runner while each later fan-out takes all the slots again,
    # and runs many times slower than they do, into its deadline (seen on the uvicorn
    # worker: keys never sent, DeadlineError).
    r = host.router(threads=4, endpoint_cap=100)
    out: dict[str, int] = {}
    now: dict[str, int] = {}

    async def asend(url, key, timeout=None):
        who = key.split("-")[0]
        now[who] = now.get(who, 0) + 1
        out[who] = max(out.get(who, 0), now[who])
        total = sum(now.values())
        out["total"] = max(out.get("total", 0), total)
        await asyncio.sleep(0.002)
        now[who] -= 1
        return key

    async def later():
        for i in range(3):  # fan-outs started after `a`, one after the other
            await r.afanout([f"C{i}-{j}" for j in range(20)], asend)

    async def main():
        ta = asyncio.ensure_future(r.afanout([f"A-{j}" for j in range(20)], asend))
        await asyncio.sleep(0)
        tb = asyncio.ensure_future(r.afanout([f"B-{j}" for j in range(100)], asend))
        await ta
        tc = asyncio.ensure_future(later())
        rb = await tb
        await tc
        return rb

    rb = asyncio.run(main())
    assert all(x.ok for x in rb)
    assert out["A"] == 4
    assert out["B"] >= 4  # more runners once `a` gave its slots back (else 1)
    assert out["total"] <= 4 + 1 + 1  # the slots, plus one runner each for b and a `later`
    assert int(host.loads().in_flight.sum()) == 0


def test_afanout_cancels_a_call_past_its_timeout_and_retries_it(host):
    r = host.router()
    frozen = EPS[4]

    async def asend(url, key):  # ignores timeouts: cancellation enforces them
        if url == frozen:
            await asyncio.sleep(30)
        return key

    t0 = time.monotonic()
    res = asyncio.run(r.afanout(KEYS, asend, timeout_s=0.2))
    took = time.monotonic() - t0
    first = r.endpoints_of(r.route(KEYS))
    assert took < 5.0
    assert [x for x in res if not x.ok] == []
    timed_out = [x for i, x in enumerate(res) if first[i] == frozen and x.attempts == 2]
    # The bulkhead's cap (4) of them were sent and timed out; the rest went to their
    # retry pods at once.
    assert len(timed_out) == 4
    assert all(x.endpoint != frozen for i, x in enumerate(res) if first[i] == frozen)
    kinds = host.loads().failures_total_by_kind
    assert int(kinds[host.slot(frozen, r), FAIL_TIMEOUT - 1]) == 4


def test_a_cancelled_afanout_cancels_its_calls_and_records_their_end(host):
    r = host.router(threads=4)
    calls = []

    async def asend(url, key, timeout=None):
        calls.append(key)
        await asyncio.sleep(0.05)
        return key

    async def main():
        task = asyncio.ensure_future(r.afanout(KEYS, asend, timeout_s=5.0, deadline_s=30.0))
        await asyncio.sleep(0.12)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        sent = len(calls)
        await asyncio.sleep(0.3)  # six more rounds of calls, if they went on
        assert len(calls) == sent < len(KEYS)
        out.append(sent)
        # The loop's call slots came back: the next fan-out runs 4 at once again.
        res = await r.afanout(KEYS[:8], asend, timeout_s=5.0)
        assert all(x.ok for x in res)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    out: list[int] = []
    assert asyncio.run(main()) == []
    r.fanout_machinery.ledger.flush()
    loads = host.loads()
    assert int(loads.in_flight.sum()) == 0 and int(loads.failures_total.sum()) == 0
    # The 4 calls out when it was cancelled count as neither success nor failure; the
    # others, and the next fan-out's 8, completed.
    assert int(loads.requests_total.sum()) == out[0] - 4 + 8


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
