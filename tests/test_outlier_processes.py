"""Outlier ejection with real parts: a real ``cslb discovery`` process on a static endpoint
list, a real counter store (the gunicorn master's part, here the test's), and real worker
processes that route keys with ``workers.Router`` on the live table and record each call
and how it failed through ``shm.Recorder``. Every process is stopped by its PID."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import shm
from lbcore.fade import fade_share
from lbcore.outlier import FAIL_CONNECT, FAIL_STATUS, FAIL_TIMEOUT
from lbcore.route import route_ring_set
from tests.discovery_harness import ROOT, Proc, shm_namespace, wait_until

S = 1_000_000_000
EPS = [f"http://10.8.0.{i}:8080" for i in range(1, 6)]
#: Behaviour code: every other call times out, at every pod (a saturated caller).
SATURATED = 9
INTERVAL_S = 0.25
ENV = {
    "CSLB_OUTLIER_INTERVAL": str(INTERVAL_S),
    "CSLB_OUTLIER_WINDOW": "2",
    "CSLB_OUTLIER_EJECTION_TIME": "2",
    "CSLB_FADE_DURATION": "4",
    "CSLB_HEARTBEAT": "0.2",
    "CSLB_DEBOUNCE": "0.2",
}
KEYS = [f"SKU-{i:05d}" for i in range(4000)]


def caller(ns, behaviour, stop, seconds):
    """A worker: routes 200 keys every 20 ms on the live table, records every call.

    ``behaviour[i]``: how calls to ``EPS[i]`` end (0 success, a FAIL_* kind, or
    SATURATED: every other one times out).
    """
    from workers.routing.router import Router

    router = Router(ns, background=False, refresh_s=0.05)
    rec = shm.CounterStore.attach(ns).claim()
    keys = KEYS[os.getpid() % 10 :: 20]
    end = time.monotonic() + seconds
    flip = 0
    try:
        while not stop.is_set() and time.monotonic() < end:
            idx, t = router.route_table(keys)
            idx = idx[idx >= 0]
            if idx.size:
                pos = np.array([EPS.index(e) for e in t.endpoints])[idx]
                codes = np.array(behaviour[:], dtype=np.int64)[pos]
                sat = codes == SATURATED
                flip ^= 1
                codes[sat] = np.where((np.arange(sat.sum()) + flip) % 2, FAIL_TIMEOUT, 0)
                slots = t.slots[idx].astype(np.int64)
                now = time.monotonic_ns()
                rec.record_start(slots, now - 3_000_000)
                rec.record_end(
                    slots, now - 3_000_000, np.full(slots.size, 3_000_000), now, failed=codes
                )
            time.sleep(0.02)
    finally:
        rec.release()
        router.close()


class Host:
    """Counters, a discovery process and worker processes; all stopped at the end."""

    def __init__(self, ns, *, env=None, endpoints=EPS):
        self.ns = ns
        self.store = shm.CounterStore.create(ns, rows=16, columns=16)
        self.env = {**ENV, **(env or {}), "CSLB_SHM_NAMESPACE": ns}
        self.args = ["discovery", *[x for e in endpoints for x in ("-e", e)]]
        self.ctx = multiprocessing.get_context("fork")
        self.behaviour = self.ctx.Array("i", len(EPS), lock=False)
        self.stop = self.ctx.Event()
        self.workers: list = []
        self.discovery = self.start_discovery()
        self.reader = wait_until(lambda: _reader(ns), 20, "the first table")
        wait_until(lambda: self.reader.generation() >= 1, 20, "the first publish")

    def start_discovery(self) -> Proc:
        return Proc(*self.args, env=self.env)

    def start_workers(self, n=2, seconds=40.0):
        for _ in range(n):
            p = self.ctx.Process(target=caller, args=(self.ns, self.behaviour, self.stop, seconds))
            p.daemon = True
            p.start()
            self.workers.append(p)

    def set(self, address, code):
        self.behaviour[EPS.index(address)] = code

    def table(self):
        return self.reader.table()

    def ejected(self):
        t = self.table()
        return {a for a, e in zip(t.endpoints, t.ejected.tolist(), strict=True) if e}

    def state(self, address):
        t = self.table()
        i = t.endpoints.index(address)
        return int(t.ejections.reason[i]), int(t.ejections.until_ns[i]), t

    def close(self):
        self.stop.set()
        for p in self.workers:
            p.join(5)
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        self.discovery.signal(signal.SIGTERM)
        try:
            self.discovery.wait(10)
        except subprocess.TimeoutExpired:
            self.discovery.kill()
        self.reader.close()
        self.store.close()


def _reader(ns):
    try:
        return shm.TableReader(ns)
    except shm.SegmentMissingError:
        return None


@pytest.fixture
def host():
    made = []

    def make(**kw):
        ns = stack.enter_context(shm_namespace())
        h = Host(ns, **kw)
        made.append(h)
        return h

    with contextlib.ExitStack() as stack:
        try:
            yield make
        finally:
            for h in made:
                h.close()


def share_on(table, i, now):
    """Share of KEYS the table routes to endpoint ``i`` at ``now``."""
    return float((route_ring_set(table.ring_set, KEYS, now) == i).mean())


def test_a_dead_pod_is_ejected_host_wide_then_fades_back_in(host):
    h = host()
    bad = EPS[2]
    h.start_workers()
    time.sleep(1.0)  # healthy traffic first
    assert not h.ejected()
    t0 = time.monotonic_ns()
    h.set(bad, FAIL_CONNECT)  # the pod died: connections refused
    wait_until(lambda: h.ejected() == {bad}, 10, "the ejection")
    reason, until, t = h.state(bad)
    took = (t.published_ns - t0) / S
    assert took <= 3 * INTERVAL_S + 0.5, took  # ~2 intervals (+ load on a shared machine)
    # The first rule to fire: consecutive failures, or (with busy healthy traffic before
    # the death in the same window) the success rate far below its peers'.
    assert reason in (1, 3) and 1.8 * S <= until - t.published_ns <= 2.2 * S
    (ev,) = wait_until(lambda: h.discovery.events("endpoint_ejected"), 5, "the ejection line")
    assert ev["address"] == bad and ev["reason"] in ("consecutive_failures", "success_rate")
    assert ev["counts"]["failures_connect"] >= 5 and ev["node"] == "" and ev["ip"] == "10.8.0.3"
    # cslb inspect says so too.
    doc = json.loads(_inspect(h.ns).stdout)
    (row,) = [e for e in doc["endpoints"] if e["address"] == bad]
    assert row["ejected"] and row["ejection"]["reason"] == ev["reason"]
    assert row["ejection"]["until_ns"] == until
    # The pod comes back; after the ejection time it is readmitted through a fading ring.
    h.set(bad, 0)
    wait_until(lambda: not h.ejected(), 10, "the readmission")
    t = h.table()
    i = t.endpoints.index(bad)
    start = t.ring_set.starts_ns[t.ring_set.tiers[i] - 1]
    assert until <= start <= until + 2 * S
    full = float((t.ring_set.rings[-1].lookup(KEYS) == i).mean())  # its whole share
    seen = []
    while True:
        now = time.monotonic_ns()
        t = h.table()
        i = t.endpoints.index(bad)
        got = share_on(t, i, now)
        want = float(fade_share(now - start, 4 * S, 2.5)) * full
        seen.append((now - start, got, want))
        assert abs(got - want) <= 0.02 + 0.1 * want, seen
        if now - start > 4.2 * S:
            break
        time.sleep(0.5)
    early = [g for e, g, _ in seen if e < 2 * S]
    assert early and max(early) < 0.35 * full  # not its whole share at once
    assert seen[-1][1] == pytest.approx(full, abs=0.02)
    assert not h.discovery.events("endpoint_ejected")[1:]  # not ejected again


def test_max_percentage_panic_and_a_saturated_caller(host):
    h = host(env={"CSLB_OUTLIER_MAX_EJECTION_PERCENTAGE": "40"})  # 2 of 5
    h.start_workers()
    # A saturated caller: every pod times out every other call. Nobody is ejected.
    for a in EPS:
        h.set(a, SATURATED)
    time.sleep(2.0)
    assert not h.ejected()
    # ... nor when every call to every pod times out for a while.
    for a in EPS:
        h.set(a, FAIL_TIMEOUT)
    time.sleep(1.5)
    assert not h.ejected() and not h.discovery.events("endpoint_ejected")
    for a in EPS:
        h.set(a, 0)
    # Three pods answer 503: two are ejected (40 %), the third is held back.
    for a in EPS[:3]:
        h.set(a, FAIL_STATUS)
    wait_until(lambda: len(h.ejected()) == 2, 10, "two ejections")
    wait_until(lambda: h.discovery.events("ejection_held_back"), 10, "the held-back line")
    assert h.ejected() < set(EPS[:3]) and not h.table().outlier_panic


def test_panic_ignores_ejections_when_too_few_pods_are_left(host):
    h = host(
        env={"CSLB_OUTLIER_MAX_EJECTION_PERCENTAGE": "100", "CSLB_OUTLIER_EJECTION_TIME": "30"}
    )
    h.start_workers()
    for a in EPS[:3]:
        h.set(a, FAIL_CONNECT)
    wait_until(lambda: h.table().outlier_panic, 10, "panic")
    t = h.table()
    assert not t.ejected.any()  # fail open: routing as if none were ejected
    assert sorted(a for a, r in zip(t.endpoints, t.ejections.reason, strict=True) if r) == sorted(
        EPS[:3]
    )
    (ev,) = wait_until(lambda: h.discovery.events("outlier_panic"), 5, "the panic line")
    assert ev["ejected"] == 3 and ev["endpoints"] == 5
    doc = json.loads(_inspect(h.ns).stdout)
    assert doc["outlier_panic"] is True


def test_ejections_survive_a_sigkilled_discovery(host):
    h = host(env={"CSLB_OUTLIER_EJECTION_TIME": "4"})
    bad = EPS[4]
    h.start_workers()
    h.set(bad, FAIL_TIMEOUT)  # a frozen pod: its calls time out, its peers' do not
    wait_until(lambda: h.ejected() == {bad}, 10, "the ejection")
    _, until, t = h.state(bad)
    gen = t.generation
    h.discovery.signal(signal.SIGKILL)
    h.discovery.wait(10)
    h.set(bad, 0)
    h.discovery = h.start_discovery()
    wait_until(lambda: h.discovery.events("resumed"), 20, "the takeover")
    assert h.discovery.events("resumed")[0]["ejected"] == [bad]
    reason, until2, t = h.state(bad)
    assert reason and until2 == until and t.generation == gen
    wait_until(lambda: not h.ejected(), 15, "the readmission")
    assert time.monotonic_ns() >= until
    (ev,) = wait_until(lambda: h.discovery.events("endpoint_readmitted"), 5, "the readmission line")
    assert ev["address"] == bad and ev["fade"] == "n-ring"


def _inspect(ns):
    return subprocess.run(
        [sys.executable, "-m", "cslb", "inspect", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "CSLB_SHM_NAMESPACE": ns},
    )
