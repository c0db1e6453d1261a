"""The fan-out in a zone: calls counted by locality (retries included, fallbacks not, a
monotonic counter across table changes), retries and bulkhead overflow of a local key
kept in the caller's zone while it has two or more healthy pods, all on real shared
memory with the host's collector reading the counts."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import lbcore
import shm
from lbcore.zones import local_keys
from shm.tables import ZoneCurve
from tests.shm_names import Namespaces
from workers.fanout.senders import CallStatusError
from workers.fanout.settings import FanoutSettings
from workers.routing.router import Router
from workers.surfaces.collector import CslbCollector

N = 9
EPS = [f"http://10.7.0.{i + 1}:8080" for i in range(N)]
ZONES = [f"z-{'abc'[i % 3]}" for i in range(N)]
ZONE_OF = dict(zip(EPS, ZONES, strict=True))
KEYS = [f"P-{i:05d}" for i in range(600)]
_NAMES = Namespaces("fz")


@pytest.fixture
def namespace():
    with _NAMES.one() as ns:
        yield ns


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers():
    yield
    _NAMES.sweep()


def curve(x: float, zone: str = "z-a") -> ZoneCurve:
    return ZoneCurve(
        zone=zone, affinity=True, state="full", reason="ramp_done", x0=x, cap=max(x, 0.0)
    )


class ZoneHost:
    """Counters and tables as the master and discovery leave them, and a router."""

    def __init__(self, ns: str, **settings) -> None:
        self.store = shm.CounterStore.create(ns, rows=8)
        self.writer = shm.TableWriter(ns, counters=self.store)
        self.ns = ns
        self.settings = FanoutSettings(**settings)
        self.router: Router | None = None

    def publish(self, eps=EPS, x: float = 0.0, zone: str = "z-a", **kw) -> None:
        self.writer.publish(
            lbcore.RingSet(list(eps)),
            zones=[ZONE_OF.get(e, "z-a") for e in eps],
            zone=curve(x, zone),
            knobs=shm.Knobs(balance_factor=None),
            **kw,
        )

    def attach(self) -> Router:
        self.router = Router(self.ns, fanout_settings=self.settings, refresh_s=0.0)
        return self.router

    def calls(self) -> dict[str, float]:
        registry = CollectorRegistry()
        registry.register(CslbCollector(self.ns))
        fams = {
            f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
        }
        return {
            s.labels["locality"]: s.value
            for s in fams["cslb_calls"].samples
            if s.name == "cslb_calls_total"
        }

    def close(self) -> None:
        if self.router is not None:
            self.router.close()
        self.writer.close()
        self.store.close()


@pytest.fixture
def zhost(namespace):
    h = ZoneHost(namespace, threads=8, timeout_s=5.0, retry_backoff_s=0.001)
    yield h
    h.close()


def _answer(url: str, key: str) -> str:
    return f"{key}@{url}"


def test_calls_are_counted_by_the_called_pods_zone(zhost):
    zhost.publish(x=0.0)
    r = zhost.attach()
    res = r.fanout(KEYS, _answer)
    assert all(x.ok for x in res)
    local = sum(ZONE_OF[x.endpoint] == "z-a" for x in res)
    assert 0.2 < local / len(KEYS) < 0.45  # no affinity: about a third in the zone
    assert zhost.calls() == {"local": local, "remote": len(KEYS) - local}
    # full affinity: every call in the zone; the counter keeps counting from where it was
    zhost.publish(x=1.0)
    res = r.fanout(KEYS, _answer)
    assert all(ZONE_OF[x.endpoint] == "z-a" for x in res)
    assert zhost.calls() == {"local": local + len(KEYS), "remote": len(KEYS) - local}


def test_the_counter_survives_a_table_without_the_pods_it_counted(zhost):
    zhost.publish(x=0.0)
    r = zhost.attach()
    r.fanout(KEYS, _answer)
    before = zhost.calls()
    # the remote pods leave: their per-endpoint series go, the locality totals stay
    zhost.publish(eps=[e for e in EPS if ZONE_OF[e] == "z-a"], x=1.0)
    r.fanout(KEYS[:10], _answer)
    after = zhost.calls()
    assert after["remote"] == before["remote"] and after["local"] == before["local"] + 10


def test_an_unknown_caller_zone_counts_every_call_remote(zhost):
    zhost.publish(x=0.0, zone="")
    r = zhost.attach()
    r.fanout(KEYS[:50], _answer)
    assert zhost.calls() == {"local": 0, "remote": 50}


def test_fallback_calls_are_not_counted(namespace):
    h = ZoneHost(namespace, fallback_url="http://127.0.0.1:9/ingress")
    try:
        h.writer.publish(
            lbcore.RingSet(EPS), zones=ZONES, zone=curve(1.0), knobs=shm.Knobs(enabled=False)
        )
        r = h.attach()
        res = r.fanout(KEYS[:20], _answer)
        assert all(x.fallback and x.attempts == 1 for x in res)
        assert h.calls() == {"local": 0, "remote": 0}
    finally:
        h.close()


def test_a_local_keys_retry_stays_in_the_zone_and_is_counted(zhost):
    zhost.publish(x=1.0)
    r = zhost.attach()
    first: dict[str, str] = {}
    lock = threading.Lock()

    def flaky(url: str, key: str) -> str:
        with lock:
            if key not in first:
                first[key] = url
                raise CallStatusError(503, url)
        return _answer(url, key)

    res = r.fanout(KEYS[:40], flaky)
    retried = [x for x in res if x.attempts == 2]
    assert retried, "the retry budget's floor lets a few retries through"
    for x, key in zip(res, KEYS[:40], strict=True):
        if x.attempts == 2:
            assert ZONE_OF[x.endpoint] == "z-a" and x.endpoint != first[key]
    calls = zhost.calls()
    assert calls["remote"] == 0 and calls["local"] == 40 + len(retried)


def test_a_zone_of_one_healthy_pod_retries_on_the_global_ring(zhost):
    # min_pods 1: the zone is open with one pod, but a retry needs a second local pod
    eps = [EPS[0], *[e for e in EPS if ZONE_OF[e] != "z-a"]]
    zhost.writer.publish(
        lbcore.RingSet(eps),
        zones=[ZONE_OF[e] for e in eps],
        zone=ZoneCurve(zone="z-a", affinity=True, min_pods=1, state="full", x0=1.0, cap=1.0),
        knobs=shm.Knobs(balance_factor=None),
    )
    r = zhost.attach()
    assert set(r.route(KEYS).tolist()) == {0}
    plain = lbcore.Plan(lbcore.RingSet(eps), time.monotonic_ns())
    assert np.array_equal(r.route(KEYS, attempt=1), plain.route(KEYS, 1)[0])
    # the fan-out never retries on the pod that failed (the global ring's attempt 1 can
    # be that very pod: the next one then)
    failed: set[str] = set()
    lock = threading.Lock()

    def flaky(url: str, key: str) -> str:
        with lock:
            if key not in failed:
                failed.add(key)
                raise CallStatusError(503, url)
        return _answer(url, key)

    res = r.fanout(KEYS[:30], flaky)
    retried = [x for x in res if x.attempts == 2]
    assert retried and all(x.endpoint != EPS[0] for x in retried)


def test_bulkhead_overflow_of_a_local_key_stays_in_the_zone(namespace):
    # one call in flight per pod and worker; one local pod holds its first call until
    # every other key is answered: its other keys overflow to their retry pods at once
    h = ZoneHost(namespace, threads=16, endpoint_cap=1, timeout_s=5.0)
    try:
        h.publish(x=1.0)
        r = h.attach()
        keys = KEYS[:30]
        first = r.route(keys)
        held = EPS[int(np.bincount(first).argmax())]
        assert int((first == EPS.index(held)).sum()) >= 2
        gate = threading.Event()
        lock = threading.Lock()
        others = [0]

        def send(url: str, key: str) -> str:
            if url == held and not gate.is_set():
                gate.wait(5.0)
            else:
                with lock:
                    others[0] += 1
                    if others[0] == len(keys) - 1:
                        gate.set()  # every key but the held one answered
            return _answer(url, key)

        res = r.fanout(keys, send)
        assert gate.is_set() and all(x.ok for x in res)
        assert all(ZONE_OF[x.endpoint] == "z-a" for x in res)
        moved = [x for x, e in zip(res, first, strict=True) if x.endpoint != EPS[e]]
        # every key of the held pod but the one it holds overflowed; a key of another pod
        # may overflow too when its pod's one call is still out (a loaded machine)
        of_held = [x for x, e in zip(res, first, strict=True) if EPS[e] == held]
        assert sum(x.endpoint == held for x in of_held) == 1
        assert sum(x.endpoint != held for x in of_held) == len(of_held) - 1
        assert all(x.endpoint != held and x.attempts == 1 for x in moved)
        assert h.calls() == {"local": len(keys), "remote": 0}
    finally:
        h.close()


@pytest.mark.parametrize("x", [0.25, 0.5])
def test_only_local_keys_are_kept_in_the_zone(zhost, x):
    zhost.publish(x=x)
    r = zhost.attach()
    res = r.fanout(KEYS, _answer)
    is_local = local_keys(KEYS, x, "z-a")
    zones = np.array([ZONE_OF[v.endpoint] for v in res])
    assert (zones[is_local] == "z-a").all()
    calls = zhost.calls()
    assert calls["local"] == int((zones == "z-a").sum())
