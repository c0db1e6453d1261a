"""router.fanout's one retry on real shared memory, with in-process pods (Python functions):
attempt 1's pod, never back to the pod that failed, the budget, the jittered backoff, the
deadline, 4xx answers and ejected pods."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import lbcore
import shm
from lbcore.outlier import FAIL_CONNECT, FAIL_OTHER, FAIL_STATUS, FAIL_TIMEOUT
from tests import fanout_harness
from tests.fanout_harness import EPS, KEYS, pods
from workers.fanout.senders import CallAnswerError, CallStatusError

# The fan-out tests' host: five pods published, routing independent of the loads.
host = fanout_harness.host


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
