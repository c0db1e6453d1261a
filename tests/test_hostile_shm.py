"""Segments shrunk, replaced or removed under the processes that map them.

A shrunk POSIX shared-memory object faults (SIGBUS) on any touch past its new end; every
process checks the object's size before it touches a mapping (one ``fstat``) and treats a
shrunk segment as lost: the gunicorn master replaces the counters, discovery publishes
into new tables segments, workers fall back until then and never die. Unit tests first,
then a real ``cslb serve`` whose segments are truncated and unlinked one by one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import shm
import shm.names
from discovery.publisher import Publisher
from discovery.ringstate import FadeParams, RingState
from shm.segment import SIZE_CHECK_NS, Segment
from tests.discovery_harness import shm_namespace
from tests.gunicorn_harness import serving, wait_for
from tests.serve_probes import route, slot_section
from tests.shm_damage import counters_in_use, newest_data, shrink

ENDPOINTS = [f"http://10.8.0.{i}:8080" for i in range(1, 5)]


def test_segment_reports_a_shrink_of_its_own_object_not_of_the_name() -> None:
    with shm_namespace() as ns:
        name = shm.segment_name(ns, "probe")
        seg = Segment.create(name, 8192)
        try:
            assert seg.shrunk_to() is None
            seg.check_size()
            shrink(name, 100)
            assert seg.shrunk_to() == 100
            with pytest.raises(shm.SegmentSizeError, match="shrank to 100 bytes"):
                seg.check_size()
            # Unlinked and created anew under the name: this mapping is still whole.
            shrink(name, 8192)
            seg.unlink()
            other = Segment.create(name, 64)
            other.close()
            assert seg.shrunk_to() is None
        finally:
            seg.close()


def test_counters_refuse_shrunk_segments_and_the_owner_repairs_the_data() -> None:
    with counters_in_use() as (_, store, rec, reader):
        data = f"{store.name}.1"
        shrink(data, 4096)
        with pytest.raises(shm.SegmentSizeError, match="shrank to 4096 bytes"):
            rec.record_start([1], 10**9)
        with pytest.raises(shm.SegmentSizeError):
            reader.read(10**9)
        with pytest.raises(shm.SegmentSizeError):
            store.reap()
        assert not store.replaced()
        assert store.repair() is True
        assert store.repair() is False
        rec.record_start([3], 10**9)  # follows the new epoch, copies nothing shrunk
        loads = reader.read(10**9)
        assert loads.in_flight[3] == 1 and loads.in_flight[1] == 0
        # Removed, or truncated with its header intact: replaced as well.
        shm.names.unlink_name(f"{store.name}.2")
        assert store.repair() is True
        shrink(f"{store.name}.3", 4096)
        assert store.repair() is True
        rec.record_start([3], 10**9)
        # The recorder's own row (still mapped whole) is its authoritative copy.
        assert reader.read(10**9).in_flight[3] == 2
        shrink(store.name, 64)
        assert store.replaced()
        with pytest.raises(shm.SegmentSizeError):
            store.reap()
        with pytest.raises(shm.SegmentSizeError):
            rec.record_start([1], 10**9)


def _transition(endpoints: list[str], now: int):
    state = RingState(FadeParams(0, 2.5, 100))
    return state.transition([_spec(a) for a in endpoints], now, state.params, set())


def _spec(address: str):
    from discovery.static import EndpointSpec

    return EndpointSpec(address)


def test_table_reader_and_writer_survive_shrunk_and_removed_segments() -> None:
    knobs = {"enabled": True, "percentage": 100.0, "balance_factor": 1.25, "max_hops": 10}
    knobs |= {"load_signal": "effective", "fade_mode": "n-ring"}
    with shm_namespace() as ns:
        pub = Publisher(ns)
        try:
            assert pub.publish(_transition(ENDPOINTS, 1), knobs, 1) == 1
            reader = shm.TableReader(ns, recheck_s=0.0)
            assert reader.table().endpoints == tuple(ENDPOINTS)
            assert pub.check_tables() is None
            # Data segment shrunk: the reader refuses it, the writer publishes anew.
            data = shm.segment_name(ns, "tables", 1)
            shrink(data, 128)
            with pytest.raises(shm.SegmentCorruptError):
                reader.table()
            assert "shrank to 128 bytes" in pub.check_tables()
            pub.publish(_transition(ENDPOINTS, 2), knobs, 2)
            assert reader.table().generation == 2
            # Control segment shrunk: a new writer continues the generation count.
            shrink(shm.segment_name(ns, "tables"), 16)
            with pytest.raises(shm.SegmentSizeError):
                reader.generation()
            with pytest.raises(shm.SegmentSizeError):
                pub.heartbeat(3)
            assert "control segment" in pub.check_tables()
            assert pub.publish(_transition(ENDPOINTS, 3), knobs, 3) == 3
            assert reader.table().generation == 3 and reader.generation() == 3
            # Every segment unlinked (a /dev/shm cleanup): noticed, published again.
            for name in shm.list_segments(ns):
                shm.names.unlink_name(name)
            assert "removed or replaced" in pub.check_tables()
            assert pub.publish(_transition(ENDPOINTS, 4), knobs, 4) == 4
            fresh = shm.TableReader(ns)
            assert fresh.table().generation == 4
            assert reader.table().generation == 4
            fresh.close()
            reader.close()
        finally:
            pub.close()


def _route_ok(server, keys: list[str]) -> bool:
    status, body = server.post_json("/route", keys)
    return status == 200 and all(e in ENDPOINTS for e in body["endpoints"])


def test_serve_survives_every_segment_shrunk_or_removed(tmp_path: Path) -> None:
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(ENDPOINTS))
    env = {"CSLB_DEBOUNCE": "0.1", "CSLB_LOAD_REFRESH": "0"}
    args = ["--endpoints-file", str(eps), "--workers", "2"]
    keys = [f"sku-{i}" for i in range(40)]
    with serving(args, tmp_path, env=env) as server:
        server.wait_ready(workers=2, path="/healthz")
        ns = server.namespace
        master = server.pid
        workers = sorted(server.worker_pids())
        (disc,) = server.discovery_pids()
        wait_for("routing", lambda: _route_ok(server, keys), 20.0)

        def still_whole(what: str) -> None:
            assert server.proc.poll() is None, f"master died after {what}:\n{server.log()}"
            assert sorted(server.worker_pids()) == workers, f"a worker died after {what}"
            assert server.discovery_pids() == [disc], f"discovery died after {what}"

        steps = [
            ("counters data shrunk", lambda: shrink(newest_data(ns, "counters"), 4096),
             "counters_repaired"),
            ("counters data emptied", lambda: shrink(newest_data(ns, "counters"), 0),
             "counters_repaired"),
            ("counters control shrunk", lambda: shrink(shm.segment_name(ns, "counters"), 64),
             "counters_replaced"),
            ("tables data shrunk", lambda: shrink(newest_data(ns, "tables"), 64),
             "tables_lost"),
            ("tables control shrunk", lambda: shrink(shm.segment_name(ns, "tables"), 8),
             "tables_lost"),
            ("tables unlinked", lambda: [
                shm.names.unlink_name(n) for n in shm.list_segments(ns) if ".tables" in n
            ], "tables_lost"),
        ]
        for what, act, event in steps:
            before = len(server.events(event))
            act()
            wait_for(f"{event} after {what}", lambda e=event, b=before: len(
                server.events(e)) > b, 30.0)
            # Routing works again (null endpoints would be fallback): several answers
            # in a row, so both workers answered some of them.
            streak = [0]

            def routed(streak: list[int] = streak) -> bool:
                _, doc = route(server, keys)
                good = doc is not None and all(e in ENDPOINTS for e in doc["endpoints"])
                streak[0] = streak[0] + 1 if good else 0
                return streak[0] >= 10

            wait_for(f"routing again after {what}", routed, 30.0)
            wait_for(
                f"/healthz ok after {what}",
                lambda: server.request("GET", "/healthz")[0] == 200,
                30.0,
            )
            status, _ = server.request("GET", "/metrics")
            assert status == 200, what
            still_whole(what)
        assert server.pid == master
        assert not server.events("crashed")
        result = server.stop()
    assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []


def test_repair_of_a_never_mapped_emptied_data_segment_reads_as_an_idle_host() -> None:
    with shm_namespace() as ns:
        store = shm.CounterStore.create(ns, rows=2, columns=8)
        try:
            shrink(f"{store.name}.1", 0)
            assert store.repair()
            loads = store.reader().read(10**9)
            assert np.all(loads.in_flight == 0) and np.all(loads.requests_total == 0)
        finally:
            store.close()


def test_host_loads_take_costs_what_the_slot_count_costs_not_the_largest_slot() -> None:
    loads = shm.HostLoads.idle(4, 10**9)
    got = loads.take(np.array([0, 3, 0x7FFFFFF0, 2**40], dtype=np.int64))
    assert got.in_flight.shape == (4,) and got.in_flight.tolist() == [0, 0, 0, 0]
    assert np.isnan(got.mean_latency_s[2:]).all()


def test_slot_section_corrupted_after_mapping_sizes_nothing(tmp_path: Path) -> None:
    """A worker's table was checked when mapped; values written over it later (here
    every counter slot 0x7FFFFFF0) must not size arrays: the worker keeps answering."""
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(ENDPOINTS))
    env = {"CSLB_LOAD_REFRESH": "0"}
    keys = [f"sku-{i}" for i in range(40)]
    with serving(["--endpoints-file", str(eps), "--workers", "1"], tmp_path, env=env) as server:
        server.wait_ready(workers=1, path="/healthz")
        (worker,) = server.worker_pids()
        wait_for("routing", lambda: route(server, keys)[1] is not None, 20.0)
        table, off, nbytes = slot_section(server.namespace)
        seg = Segment.attach(table.segment, writable=True)
        try:
            seg.array(np.int32, off, nbytes // 4)[:] = 0x7FFFFFF0
        finally:
            seg.close()
        for _ in range(20):
            status, doc = route(server, keys)
            assert status == 200 and all(e in ENDPOINTS for e in doc["endpoints"])
        with open(f"/proc/{worker}/status") as f:
            vm = {k: v for k, _, v in (line.partition(":") for line in f)}
        assert int(vm["VmSize"].split()[0]) < 8 << 20, vm["VmSize"]  # KiB: under 8 GiB
        assert server.worker_pids() == [worker]
        result = server.stop()
    assert result["exit"] == 0 and result["segments"] == []


def test_a_router_routes_as_idle_while_its_counters_are_shrunk(caplog, monkeypatch) -> None:
    """A worker whose counters were shrunk under it keeps answering (loads idle, one
    warning), records nothing there, and reads loads again once they are repaired."""
    import uuid

    from tests.router_harness import KEYS, Clock, Host, endpoints
    from workers.routing import snapshot

    snapshot.reset_counter_warnings()  # (other tests' clocks)
    host = Host(f"rs{os.getpid()}x{uuid.uuid4().hex[:8]}", Clock())
    try:
        host.publish(lbcore_ring_set(endpoints(5)))
        r = host.router(refresh_s=0)
        before = r.route(KEYS)
        shrink(newest_data(host.ns, "counters"), 0)
        # The routing path checks sizes at most every SIZE_CHECK_NS: a shrink within that
        # interval of the last check may still fault (documented); past it, it is seen.
        time.sleep(SIZE_CHECK_NS / 1e9 * 1.5)
        with caplog.at_level("WARNING"):
            for _ in range(5):
                host.clock.advance(0.5)
                assert (r.route(KEYS) == before).all()  # idle loads: the plain ring
        assert sum("counters of" in rec.getMessage() for rec in caplog.records) == 1
        assert host.store.repair()
        host.clock.advance(0.5)
        assert (r.route(KEYS) == before).all()
        assert r.loads().in_flight.shape == (5,)
    finally:
        host.close()


def lbcore_ring_set(eps: list[str]):
    import lbcore

    return lbcore.RingSet(tuple(eps))
