"""The fan-out tests' host: five pods published on real shared memory (routing independent
of the loads recorded), routers on it, and in-process pods as send functions (a dead pod
raises ConnectionRefusedError, a slow one sleeps). Real HTTP pods and real gunicorn are in
test_fanout_e2e.py; the senders against real HTTP in test_fanout_parts.py.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import lbcore
import shm
import shm.names
from workers.fanout.senders import CallStatusError
from workers.fanout.settings import FanoutSettings
from workers.routing.router import Router

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
        shm.names.unlink_name(name)


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
