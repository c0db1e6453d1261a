"""Faults under hostile shared memory: an impossible epoch word in the counters control
segment, a flood of warnings while the counters are shrunk, and the size checks on the
routing path."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import shm
import shm.names
from shm.layout import COUNTERS_CONTROL, word
from tests.gunicorn_harness import serving, wait_for
from tests.shm_damage import counters_in_use, newest_data, segment_path, shrink

ENDPOINTS = [f"http://10.8.0.{i}:8080" for i in range(1, 5)]
KEYS = [f"sku-{i}" for i in range(40)]


def _routes(server) -> bool:
    status, body = server.post_json("/route", KEYS)
    return status == 200 and all(e in ENDPOINTS for e in body["endpoints"])


def _write_epoch_word(ns: str, value: int) -> None:
    with open(segment_path(shm.segment_name(ns, "counters")), "r+b") as f:
        f.seek(word(COUNTERS_CONTROL, "current") * 8)
        f.write(value.to_bytes(8, "little"))


def test_master_survives_an_impossible_epoch_word_and_respawns_workers(tmp_path: Path) -> None:
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(ENDPOINTS))
    with serving(["--endpoints-file", str(eps), "--workers", "2"], tmp_path) as server:
        server.wait_ready(workers=2, path="/healthz")
        wait_for("routing", lambda: _routes(server), 20.0)
        ns = server.namespace
        workers = sorted(server.worker_pids())
        _write_epoch_word(ns, 2**64 - 1)
        os.kill(workers[0], signal.SIGKILL)  # the master forks: pre_fork, child_exit
        wait_for(
            "a worker respawned",
            lambda: (
                server.proc.poll() is not None
                or (len(server.worker_pids()) == 2 and workers[0] not in server.worker_pids())
            ),
            30.0,
        )
        assert server.proc.poll() is None, f"the master died:\n{server.log()}"
        wait_for("counters_repaired", lambda: len(server.events("counters_repaired")) > 0, 10.0)
        wait_for("routing again", lambda: _routes(server), 20.0)
        # Garbage again, with a worker killed in the same second, and 0.
        for value in (0, 2**62, 2**64 - 1):
            _write_epoch_word(ns, value)
            victim = server.worker_pids()[0]
            os.kill(victim, signal.SIGKILL)
            wait_for(
                f"a worker respawned after {value}",
                lambda v=victim: (
                    server.proc.poll() is not None
                    or (len(server.worker_pids()) == 2 and v not in server.worker_pids())
                ),
                30.0,
            )
            assert server.proc.poll() is None, f"the master died:\n{server.log()}"
            wait_for(f"routing after {value}", lambda: _routes(server), 20.0)
        assert "Unhandled exception" not in server.log()
        result = server.stop()
    assert result["exit"] == 0 and result["left"] == [] and result["segments"] == []


def _lines_per_pid(server, text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for rec in server.events():
        if text in json.dumps(rec):
            out[rec.get("pid", 0)] = out.get(rec.get("pid", 0), 0) + 1
    return out


def test_shrunk_counters_log_a_couple_of_lines_per_worker_not_one_per_request(
    tmp_path: Path,
) -> None:
    import time

    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(ENDPOINTS))
    env = {"CSLB_LOAD_REFRESH": "0"}
    with serving(["--endpoints-file", str(eps), "--workers", "2"], tmp_path, env=env) as server:
        server.wait_ready(workers=2, path="/healthz")
        wait_for("routing", lambda: _routes(server), 20.0)
        ns = server.namespace
        sent = 0
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            # Shrink whatever data segment is current (the master repairs each within
            # about a second) and keep routing meanwhile.
            path = segment_path(newest_data(ns, "counters"))
            if os.path.getsize(path) > 4096:
                os.truncate(path, 4096)
                # Past the routing path's size-check interval (a shrink within it of a
                # worker's last check may still fault that worker: documented).
                time.sleep(0.12)
            for _ in range(20):
                status, _ = server.post_json("/route", KEYS)
                assert status == 200
                sent += 1
        assert sent >= 100
        wait_for("counters_repaired", lambda: len(server.events("counters_repaired")) > 0, 10.0)
        lines = _lines_per_pid(server, "decision counts not recorded")
        assert lines, "the shrink was not noticed by any worker"
        assert max(lines.values()) <= 2, lines
        assert server.proc.poll() is None
        result = server.stop()
    assert result["exit"] == 0 and result["segments"] == []


@pytest.mark.parametrize("kernel", ["native", "numpy"])
def test_routing_probes_sizes_only_where_no_guard_catches_a_fault(monkeypatch, kernel) -> None:
    """On the native kernel a batch probes no segment size: its touches of shared memory
    run under the kernel's SIGBUS guard. On the NumPy kernel every batch probes the size
    of each segment it touches, once. Either way a shrunk counters segment is seen by
    the next batch (no fault): idle loads."""
    import uuid

    import lbcore
    import shm.counters.recorder as recorder_mod
    import shm.tables.reader as reader_mod
    from tests.router_harness import Clock, Host, endpoints

    if kernel == "native" and lbcore.kernel.load_native() is None:
        pytest.skip("the native kernel is not built here")
    old = lbcore.use_kernel(kernel)
    host = Host(f"hp{os.getpid()}x{uuid.uuid4().hex[:8]}", Clock())
    try:
        host.publish(lbcore.RingSet(endpoints(100)))
        r = host.router()
        r.route(["warm"])
        checked: list[str] = []

        def counting(real):
            def probe(a, b=None):
                checked.extend(s.name for s in (a, b) if s is not None)
                return real(a, b)

            return probe

        monkeypatch.setattr(reader_mod, "intact", counting(reader_mod.intact))
        monkeypatch.setattr(recorder_mod, "intact", counting(recorder_mod.intact))
        batches = 50
        for b in range(batches):
            idx, table = r.route_table([f"k{b}"])
            with r.track(idx, table):
                pass
        monkeypatch.undo()
        names = set(checked)
        if kernel == "native":
            # none per batch; a bucket rotation (NumPy writes, once a bucket) probes
            assert all(checked.count(n) <= 2 for n in names), checked
        else:
            assert len(names) == 4, names  # tables control and data, counters control and data
            # route, count, start and end each probe (a refresh may probe once more)
            assert all(batches <= checked.count(n) <= 3 * batches + 2 for n in names), checked
        # (fresh throttles: the warnings below must not silence another test's)
        from workers.routing import recording, tracker

        for name in ("START_WARN", "END_WARN"):
            monkeypatch.setattr(tracker, name, recording.WarningThrottle(name))
        monkeypatch.setattr(recording, "COUNTS_WARN", recording.WarningThrottle("counts"))
        shrink(newest_data(host.ns, "counters"), 0)
        host.clock.advance(0.5)
        idx, table = r.route_table(["k1"])
        assert idx.shape == (1,)
        with r.track(idx, table):
            pass
    finally:
        host.close()
        lbcore.use_kernel(old)


def test_an_impossible_epoch_word_is_corruption_the_owner_repairs() -> None:
    import pytest

    with counters_in_use() as (ns, store, rec, reader):
        for value in (2**64 - 1, 0, 2**62):
            _write_epoch_word(ns, value)
            with pytest.raises(shm.SegmentCorruptError, match="out of range"):
                shm.CounterStore.attach(ns)
            with pytest.raises(shm.SegmentCorruptError):
                reader.read(10**9)
            assert store.repair() is True
            assert store.repair() is False
            rec.record_start([3], 10**9)
            loads = reader.read(10**9)
            assert loads.in_flight[1] == 1  # the owner's whole matrix was copied
        assert sorted(shm.names.epoch_segments(ns, "counters")) == [4]


def test_a_warning_a_request_can_raise_is_logged_once_an_interval_with_a_count(
    monkeypatch, caplog
) -> None:
    """The throttle behind the 'not recorded' warnings of the recorder, the call ledger and
    track(): one line per interval, the next saying how many were not logged."""
    import logging

    import workers.routing.recording as recording
    from workers.routing import tracker

    log = logging.getLogger("cslb.router")
    now = [10**12]
    for throttle in (recording.WarningThrottle("x not recorded"), tracker.START_WARN):
        caplog.clear()
        monkeypatch.setattr(throttle, "clock", lambda: now[0])
        with caplog.at_level(logging.WARNING, logger="cslb.router"):
            monkeypatch.setattr(recording, "WARN_INTERVAL_NS", 60_000_000_000)
            for _ in range(100):
                throttle.warn(log, RuntimeError("segment shrunk"))
                now[0] += 500_000_000  # 50 s in all: within the interval
            assert len(caplog.records) == 1
            now[0] += 10_000_000_000  # the interval is over
            throttle.warn(log, RuntimeError("segment shrunk"))
        assert len(caplog.records) == 2
        assert "99 not logged" in caplog.records[1].getMessage()
