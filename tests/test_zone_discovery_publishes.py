"""The discovery process publishes the zone controller's transitions: a real
``cslb discovery`` on an endpoints file (three zones), read back from shared memory.
Affinity ramps and publishes only its transitions (start, cap reached), callers in the
file move the cap, a short zone goes to 0 and recovers by ramping after the hold, and a
latency fault injected into the local pods' counters drops the share to the probe floor,
held there while the fault lasts and lifted, by a ramp, once it is gone.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import shm
from tests.discovery_harness import Proc, shm_namespace, wait_until

ZONES = {
    "z-a": ["10.1.0.1", "10.1.0.2", "10.1.0.3"],
    "z-b": ["10.2.0.1", "10.2.0.2", "10.2.0.3"],
    "z-c": ["10.3.0.1", "10.3.0.2", "10.3.0.3"],
}
S = 1_000_000_000
ENV = {
    "CSLB_ZONE": "z-a",
    "CSLB_ZONE_AFFINITY": "on",
    "CSLB_ZONE_RAMP": "1",
    "CSLB_ZONE_HOLD": "1",
    "CSLB_DEBOUNCE": "0.05",
    "CSLB_FILE_POLL": "0.05",
    "CSLB_HEARTBEAT": "0.1",
    "CSLB_OUTLIER_DETECTION": "false",
}


def _doc(zones=ZONES, callers=None):
    eps = [{"address": f"http://{ip}:8080", "zone": z} for z, ips in zones.items() for ip in ips]
    doc: dict = {"endpoints": eps}
    if callers is not None:
        doc["callers"] = callers
    return doc


def _write(path: Path, doc) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


class Host:
    def __init__(self, tmp_path: Path, ns: str, env=None):
        self.file = tmp_path / "pods.json"
        _write(self.file, _doc())
        self.ns = ns
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CSLB_")}
        self.env.update(ENV, **(env or {}), CSLB_SHM_NAMESPACE=ns, CSLB_LOG_FORMAT="json")
        self.proc = self.start()
        self.reader = wait_until(self._reader, 20, "the tables")

    def start(self) -> Proc:
        return Proc("discovery", "--endpoints-file", str(self.file), env=self.env, replace_env=True)

    def restart(self) -> None:
        """Kill discovery (its tables stay) and start another on the same namespace."""
        self.proc.kill()
        self.proc = self.start()

    def _reader(self):
        try:
            r = shm.TableReader(self.ns)
        except shm.ShmError:
            return None
        return r

    def table(self):
        return self.reader.table()

    def zone_when(self, pred, what, timeout=20.0):
        return wait_until(
            lambda: (t := self.table()).generation and pred(t.zone) and t, timeout, what
        )

    def transitions(self):
        return [(e["state"], e["reason"]) for e in self.proc.events("zone_transition")]

    def close(self):
        self.reader.close()
        self.proc.signal(signal.SIGTERM)
        try:
            assert self.proc.wait(10) == 0
        finally:
            self.proc.kill()


@pytest.fixture
def host(tmp_path):
    with shm_namespace() as ns:
        h = Host(tmp_path, ns)
        try:
            yield h
        finally:
            h.close()


def test_a_ramp_is_published_at_its_start_and_its_end_only(host):
    t = host.zone_when(lambda z: z.state == "ramping", "the ramp")
    z = t.zone
    # an even fleet, no callers given: capacity cap 1, held at 1 - the probe floor (1 %)
    assert (z.zone, z.affinity, z.reason, z.x0) == ("z-a", True, "started", 0.0)
    assert z.cap == pytest.approx(0.99)
    assert z.rate == pytest.approx(0.99)  # over 1 s
    gen = t.generation
    mid = z.start_ns + S // 2
    assert t.zone_share(mid) == pytest.approx(0.495)  # a worker's x, without a publish
    t = host.zone_when(lambda z: z.state == "full", "the cap")
    assert (t.zone.reason, t.generation) == ("ramp_done", gen + 1)
    assert t.zone_share(time.monotonic_ns()) == pytest.approx(0.99)
    assert host.transitions() == [("ramping", "started"), ("full", "ramp_done")]
    line = host.proc.events("zone_transition")[-1]
    assert (line["cap"], line["capacity_cap"]) == (0.99, 1.0)


def test_callers_in_the_file_move_the_cap(host):
    host.zone_when(lambda z: z.state == "full", "the cap")
    _write(host.file, _doc(callers={"z-a": 2, "z-b": 1, "z-c": 1}))
    t = host.zone_when(lambda z: z.reason == "cap_changed", "the new cap")
    # z-a: a third of the pods, half of the callers
    assert t.zone.cap == pytest.approx(2 / 3) and t.zone_share(time.monotonic_ns()) == (
        pytest.approx(2 / 3)
    )
    assert host.proc.events("zone_callers")[-1]["callers"] == {"z-a": 2, "z-b": 1, "z-c": 1}


def test_a_short_zone_goes_to_zero_and_ramps_back_after_the_hold(host):
    host.zone_when(lambda z: z.state == "full", "the cap")
    short = {**ZONES, "z-a": ZONES["z-a"][:2]}
    _write(host.file, _doc(short))
    t = host.zone_when(lambda z: z.state == "short", "the short zone")
    assert t.zone_share(time.monotonic_ns()) == 0.0 and len(t.endpoints) == 8
    at = time.monotonic_ns()
    _write(host.file, _doc())
    t = host.zone_when(lambda z: z.state == "ramping", "the recovery")
    assert t.zone.reason == "recovered" and t.zone.x0 == 0.0
    assert t.zone.start_ns - at >= S  # not before the hold
    host.zone_when(lambda z: z.state == "full", "the cap again")


def _record(ns, stop, local_ms, remote_ms=2.0):
    """A worker recording calls to every pod: local ones take ``local_ms[0]`` ms."""
    store = shm.CounterStore.attach(ns)
    rec = store.claim()
    reader = shm.TableReader(ns)
    try:
        while not stop.wait(0.02):
            t = reader.table()
            if not t.endpoints:
                continue
            local = np.array([z == "z-a" for z in t.zones])
            ms = np.where(local, local_ms[0], remote_ms)
            slots = t.slots.astype(np.int64)
            now = time.monotonic_ns()
            dur = (ms * 1e6).astype(np.int64)
            rec.record_start(slots, now - dur)
            rec.record_end(slots, now - dur, dur, now)
    finally:
        reader.close()
        rec.release()
        store.close(unlink=False)


def test_a_latency_fault_drops_to_the_floor_holds_and_recovers_by_ramping(tmp_path):
    with shm_namespace() as ns:
        store = shm.CounterStore.create(ns, rows=4, columns=16, window_ns=S, window_buckets=4)
        h = Host(tmp_path, ns)
        stop = threading.Event()
        local_ms = [2.0]
        rec = threading.Thread(target=_record, args=(ns, stop, local_ms), daemon=True)
        rec.start()
        try:
            h.zone_when(lambda z: z.state == "full", "the cap")
            local_ms[0] = 3.0  # +50 % > the 35 % margin
            t = h.zone_when(lambda z: z.state == "floor", "the floor")
            assert t.zone.reason == "latency"
            assert t.zone_share(time.monotonic_ns()) == pytest.approx(0.01)
            line = h.proc.events("zone_transition")[-1]
            assert line["local_latency_ms"] > 1.35 * line["remote_latency_ms"]
            gen = t.generation
            # the fault lasts (the loop beats on, so the controller has decided again and
            # again): no flapping, no publish
            beat = h.reader.heartbeat_ns() + 5 * S // 2
            wait_until(lambda: h.reader.heartbeat_ns() >= beat, 20, "2.5 s of the loop")
            t = h.table()
            assert (t.zone.state, t.generation) == ("floor", gen)
            local_ms[0] = 2.0
            t = h.zone_when(lambda z: z.state == "ramping", "the recovery")
            assert (t.zone.reason, t.zone.x0) == ("recovered", 0.01)
            h.zone_when(lambda z: z.state == "full", "the cap again")
            states = [s for s, _ in h.transitions()]
            assert states == ["ramping", "full", "floor", "ramping", "full"]
        finally:
            stop.set()
            rec.join(10)
            h.close()
            store.close(unlink=True)


def test_a_restarted_discovery_continues_the_curve_and_publishes_nothing_new(host):
    t = host.zone_when(lambda z: z.state == "full", "the cap")
    gen, curve = t.generation, t.zone
    host.restart()
    (resumed,) = wait_until(lambda: host.proc.events("resumed"), 20, "the takeover")
    beat = host.reader.heartbeat_ns() + 2 * S  # two seconds of its decisions
    wait_until(lambda: host.reader.heartbeat_ns() >= beat, 20, "2 s of the new loop")
    t = host.table()
    assert (t.generation, t.zone) == (gen, curve)
    assert resumed["generation"] == gen and not host.proc.events("zone_transition")
