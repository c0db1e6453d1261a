"""The router tests' host: a TableWriter and a CounterStore in the test process (the
discovery process's and the gunicorn master's parts) on real shared memory, routers
reading them, and an injected clock.

Test modules take the fixtures by assignment (``host = router_harness.host``), so pytest
finds them in the module without an import that looks unused.
"""

from __future__ import annotations

import time

import pytest

import lbcore
import shm
from tests.shm_names import Namespaces
from workers.routing.router import Router

D_NS = 30_000_000_000
KEYS = [f"SKU-{i:06d}" for i in range(4000)]
NAMES = Namespaces("r")

ZERO_STATS = dict.fromkeys(shm.layout.STATS_FIELDS, 0)


class Clock:
    """An injectable CLOCK_MONOTONIC (ns) that only moves when told."""

    def __init__(self) -> None:
        self.now = time.monotonic_ns()

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


class Host:
    """The host's shared state: counters (master) and a table writer (discovery)."""

    def __init__(self, namespace: str, clock: Clock, rows: int = 8) -> None:
        self.ns = namespace
        self.clock = clock
        self.store = shm.CounterStore.create(namespace, rows=rows, clock=clock)
        self.writer = shm.TableWriter(namespace, counters=self.store, clock=clock)
        self.routers: list[Router] = []

    def publish(self, rs: lbcore.RingSet, **kw) -> int:
        n = len(rs.endpoints)
        kw.setdefault("nodes", [f"node-{i}" for i in range(n)])
        kw.setdefault("zones", [f"zone-{i % 3}" for i in range(n)])
        return self.writer.publish(rs, **kw)

    def router(self, **kw) -> Router:
        kw.setdefault("clock", self.clock)
        r = Router(self.ns, **kw)
        self.routers.append(r)
        return r

    def loads(self) -> shm.HostLoads:
        return self.store.reader().read(self.clock())

    def close(self) -> None:
        for r in self.routers:
            r.close()
        self.writer.close()
        self.store.close()


@pytest.fixture
def namespace():
    with NAMES.one() as ns:
        yield ns


@pytest.fixture(scope="module", autouse=True)
def swept():
    """Remove whatever a module's tests left in /dev/shm under the router tests' prefix."""
    yield
    NAMES.sweep()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def host(namespace, clock):
    h = Host(namespace, clock)
    yield h
    h.close()


def endpoints(n: int, net: int = 0) -> list[str]:
    return [f"http://10.{net}.0.{i + 1}:8080" for i in range(n)]


def knobs(**kw) -> shm.Knobs:
    return shm.Knobs(**kw)


def followed(r: Router, generation: int, keys=KEYS, timeout_s: float = 10.0):
    """``r.route_table(keys)`` once ``r`` routes on ``generation`` (waiting at most
    ``timeout_s``: a router maps a new generation in the background unless it is small).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        idx, t = r.route_table(keys)
        assert t.valid()
        if t.generation >= generation:
            return idx, t
        assert time.monotonic() < deadline, (
            f"still on generation {t.generation} after {timeout_s} s"
        )
        time.sleep(0.002)


def load_up(host: Host, table: shm.Table, per_endpoint: dict[int, int]) -> shm.Recorder:
    """Open calls on some endpoints from another worker's row (host-wide in-flight)."""
    rec = host.store.claim()
    slots = [int(table.slots[e]) for e, c in per_endpoint.items() for _ in range(c)]
    rec.record_start(slots, host.clock())
    return rec
