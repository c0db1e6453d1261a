"""A new table's zone views' arcs (the one part of a zone plan that passes over the whole
ring) are summed by the tables reader's map thread, with the table itself, when a worker
maps new generations in the background: its routing thread's first plan of the table
finds them kept with the ring, and takes the plan they were computed on as its reuse."""

from __future__ import annotations

import threading

import numpy as np

import lbcore
from lbcore import zones
from shm.tables import ZoneCurve
from tests import router_harness as harness
from tests.router_harness import KEYS, endpoints, followed
from workers.routing import snapshot

namespace, clock, host, swept = harness.namespace, harness.clock, harness.host, harness.swept


def _zones(n: int) -> list[str]:
    return [f"z-{'abc'[i % 3]}" for i in range(n)]


def test_a_new_generations_zone_arcs_are_summed_in_the_map_thread(host, clock, monkeypatch):
    where: list[str] = []
    real = zones.arc_sums

    def spy(ring, rows):
        where.append(threading.current_thread().name)
        return real(ring, rows)

    monkeypatch.setattr(zones, "arc_sums", spy)
    built: list[tuple[object, dict]] = []
    real_build = snapshot.build_plan

    def build(table, *a, **kw):
        built.append((table, kw))
        return real_build(table, *a, **kw)

    monkeypatch.setattr(snapshot, "build_plan", build)
    curve = ZoneCurve(
        zone="z-a", affinity=True, state="full", reason="ramp_done", x0=0.5, cap=0.5,
        start_ns=clock(),
    )  # fmt: skip
    host.publish(lbcore.RingSet(endpoints(30)), zones=_zones(30), zone=curve)
    r = host.router(refresh_s=0.0, background=True)
    r.route(KEYS)  # the first generation is mapped by the batch that meets it
    assert where == [threading.current_thread().name]
    where.clear()
    gen = host.publish(lbcore.RingSet(endpoints(33)), zones=_zones(33), zone=curve)
    idx, table = followed(r, gen)
    assert table.generation == gen and len(table.endpoints) == 33
    # summed once, by the map thread; the routing thread's plans found them
    assert where == ["cslb-table-map"]
    # the first plan of the new table reused the plan the map thread prepared (its
    # zone split's local endpoints and arcs), as a refresh reuses its predecessor's
    first = next(kw["reuse"] for t, kw in built if t is table and "reports" in kw)
    assert first is not None and first.ring_set is table.ring_set and first.loads is None
    local = np.array([z == "z-a" for z in _zones(33)])
    assert local[idx].mean() > 0.4  # a zone plan: about half the keys stayed local


def test_a_table_without_zone_affinity_needs_no_arcs(host, clock, monkeypatch):
    where: list[str] = []
    real = zones.arc_sums
    monkeypatch.setattr(zones, "arc_sums", lambda r, m: where.append("x") or real(r, m))
    host.publish(lbcore.RingSet(endpoints(30)), zones=_zones(30))
    r = host.router(refresh_s=0.0, background=True)
    r.route(KEYS)
    gen = host.publish(lbcore.RingSet(endpoints(33)), zones=_zones(33))
    followed(r, gen)
    assert where == []
