"""Fixtures for the app, metrics and status-page tests: a real host in shared memory.

Every test gets its own namespace; every segment under it is unlinked afterwards, even
when the test fails, and the process's router (if a test attached one) is closed.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import lbcore
import shm
from shm.names import SHM_DIR, unlink_name

_counter = itertools.count()
_PREFIX = f"a{os.getpid()}x"

ENDPOINTS = [f"http://10.9.0.{i}:8080" for i in range(1, 7)]
ZONES = ["eu-1a", "eu-1a", "eu-1b", "eu-1b", "eu-1c", "eu-1c"]
NODES = [f"node-{i}" for i in range(1, 7)]


def _ours(prefix: str) -> list[str]:
    try:
        return sorted("/" + e for e in os.listdir(SHM_DIR) if e.startswith(f"cslb.{prefix}"))
    except OSError:
        return []


def new_namespace() -> str:
    return f"{_PREFIX}{next(_counter)}{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace() -> Iterator[str]:
    """A namespace no other test uses; every segment under it is unlinked afterwards."""
    ns = new_namespace()
    yield ns
    for name in _ours(f"{ns}."):
        unlink_name(name)


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_segments() -> Iterator[None]:
    yield
    for name in _ours(_PREFIX):  # a crashed test's leftovers
        unlink_name(name)


class Host:
    """A host's shared memory as discovery and the gunicorn master leave it: tables
    published by a :class:`shm.TableWriter` and counters owned by a :class:`shm.CounterStore`,
    plus a claimed counter row to record load into (as a worker would)."""

    def __init__(self, namespace: str, *, counters: bool = True) -> None:
        self.namespace = namespace
        self.counters = shm.CounterStore.create(namespace, rows=8, columns=16) if counters else None
        self.writer = shm.TableWriter(namespace, counters=self.counters)
        self.recorder = self.counters.claim() if self.counters is not None else None

    def publish(
        self,
        endpoints: Sequence[str] = ENDPOINTS,
        *,
        fading: Sequence[tuple[Sequence[str], float]] = (),
        knobs: shm.Knobs | None = None,
        ejected: Sequence[bool] | None = None,
        ejections: Any = None,
        outlier_panic: bool = False,
        now_ns: int | None = None,
    ) -> int:
        """Publish ``endpoints`` established, then each (new endpoints, fade age in s)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        rs = lbcore.RingSet(list(endpoints), vnodes=100)
        for added, age_s in fading:
            rs = rs.scale_up(list(added), now_ns=now - int(age_s * 1e9))
        eps = rs.endpoints
        zone_of = dict(zip(ENDPOINTS, ZONES, strict=True))
        node_of = dict(zip(ENDPOINTS, NODES, strict=True))
        return self.writer.publish(
            rs,
            zones=[zone_of.get(e, "") for e in eps],
            nodes=[node_of.get(e, "") for e in eps],
            knobs=knobs,
            ejected=None if ejected is None else list(ejected),
            ejections=ejections,
            outlier_panic=outlier_panic,
            now_ns=now,
        )

    def slot(self, endpoint: str) -> int:
        with shm.TableReader(self.namespace) as r:
            t = r.table()
            return int(t.slots[t.endpoints.index(endpoint)])

    def busy(
        self,
        endpoint: str,
        seconds: float,
        *,
        calls: int = 1,
        failed: int = 0,
        ago_s: float = 6.0,
        kind: int | None = None,
    ) -> None:
        """Record ``calls`` calls to ``endpoint`` that ended, busy ``seconds`` in total,
        started ``ago_s`` seconds ago (all inside the 10 s occupancy window); the first
        ``failed`` failed (as failure ``kind`` if given, else as booleans)."""
        assert self.recorder is not None
        s = self.slot(endpoint)
        now = time.monotonic_ns()
        start = now - int(ago_s * 1e9)
        slots = np.full(calls, s, dtype=np.int64)
        self.recorder.record_start(slots, start)
        d = np.full(calls, int(seconds * 1e9 / calls), dtype=np.int64)
        fails: np.ndarray = np.zeros(calls, dtype=bool if kind is None else np.int64)
        fails[:failed] = True if kind is None else kind
        self.recorder.record_end(slots, start, d, start + int(d.max()), failed=fails)

    def open(self, endpoint: str, n: int) -> None:
        """Start ``n`` calls to ``endpoint`` that stay open (in flight)."""
        assert self.recorder is not None
        self.recorder.record_start(
            np.full(n, self.slot(endpoint), dtype=np.int64), time.monotonic_ns()
        )

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.release()
        self.writer.close()
        if self.counters is not None:
            self.counters.close(unlink=True)


@pytest.fixture
def host(namespace: str) -> Iterator[Host]:
    h = Host(namespace)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(autouse=True)
def _close_router() -> Iterator[None]:
    """A router a test attached (through the app) is closed, whatever happened."""
    yield
    try:
        from workers.routing.router import Router
    except ImportError:
        return
    r = Router.current()
    if r is not None:
        r.close()
