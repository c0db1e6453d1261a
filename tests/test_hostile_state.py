"""Wrong answers and lying health under damaged shared memory, with real processes.

A table a worker found corrupt is checked again (not refused forever) and /healthz says
so while the worker cannot route; garbage written into the counter matrix is left out of
routing and of the lifetime totals, with one rate-limited log line, never a 500."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np

import shm
from shm.segment import Segment
from tests.gunicorn_harness import serving, wait_for
from tests.serve_probes import metrics, route, slot_section
from tests.shm_damage import newest_data

ENDPOINTS = [f"http://10.5.0.{i}:8080" for i in range(1, 5)]
KEYS = [f"sku-{i}" for i in range(40)]


def _serve(tmp_path: Path, workers: int, **env: str):
    eps = tmp_path / "endpoints.json"
    eps.write_text(json.dumps(ENDPOINTS))
    args = ["--endpoints-file", str(eps), "--workers", str(workers)]
    return serving(args, tmp_path, env={"CSLB_LOAD_REFRESH": "0", **env})


def test_a_worker_that_mapped_a_briefly_corrupt_table_routes_again(tmp_path: Path) -> None:
    with _serve(tmp_path, 1) as server:
        server.wait_ready(workers=1, path="/healthz")
        wait_for("routing", lambda: route(server, KEYS)[1] is not None, 20.0)
        table, off, _ = slot_section(server.namespace)
        seg = Segment.attach(table.segment, writable=True)
        try:
            byte = seg.buf[off]
            seg.buf[off] = byte ^ 0xFF  # the checksum no longer matches
            (old,) = server.worker_pids()
            os.kill(old, signal.SIGKILL)  # its replacement maps the damaged table
            wait_for("a new worker", lambda: [p for p in server.worker_pids() if p != old], 30)

            def all_fallback() -> bool:
                status, doc = route(server, KEYS)
                return status == 200 and doc["endpoints"] == [None] * len(KEYS)

            wait_for("fallback on the corrupt table", all_fallback, 30.0)
            status, body = server.request("GET", "/healthz")
            assert status == 503, body
            assert b"checksum" in body
            status, body = server.request("GET", "/readyz")
            assert status == 200 and json.loads(body)["routing"] == "fallback"
        finally:
            seg.buf[off] = byte  # repaired: the same bytes, the same sequence number
            seg.close()

        def routes() -> bool:
            status, doc = route(server, KEYS)
            return status == 200 and all(e in ENDPOINTS for e in doc["endpoints"])

        wait_for("routing again on the repaired table", routes, 30.0)
        wait_for("/healthz ok", lambda: server.request("GET", "/healthz")[0] == 200, 30.0)
        status, body = server.request("GET", "/readyz")
        assert json.loads(body)["routing"] == "client-side"
        result = server.stop()
    assert result["exit"] == 0 and result["segments"] == []


def test_garbage_in_the_counter_matrix_is_left_out_and_routing_goes_on(tmp_path: Path) -> None:
    with _serve(tmp_path, 2) as server:
        server.wait_ready(workers=2, path="/healthz")
        for _ in range(20):
            assert route(server, KEYS)[0] == 200
        before = metrics(server)["cslb_decisions_total"][0].value
        store = shm.CounterStore.attach(server.namespace, writable=False)
        try:
            rows = [s.row for s in store.slots() if s.claimed]
            data = newest_data(server.namespace, "counters")
        finally:
            store.close(unlink=False)
        assert rows
        seg = Segment.attach(data, writable=True)
        try:
            from shm.layout import COUNTERS_DATA

            h = seg.header(COUNTERS_DATA)[0]
            per_row, start = int(h["row_words"]), int(h["rows_offset"])
            words = seg.array(np.int64, start, per_row * int(h["rows"]))
            rng = np.random.default_rng(19)
            row = rows[0]
            words[row * per_row : (row + 1) * per_row] = rng.integers(
                -(2**62), 2**62, per_row, dtype=np.int64
            )
        finally:
            seg.close()
        for _ in range(30):
            status, doc = route(server, KEYS)
            assert status == 200, doc
            assert all(e in ENDPOINTS for e in doc["endpoints"])
        m = metrics(server)
        decisions = m["cslb_decisions_total"][0].value
        # The damaged row's own count is left out; the rest stays a sane total.
        assert 0 <= decisions <= before + 30 * len(KEYS), decisions
        for name in ("cslb_endpoint_requests_total", "cslb_endpoint_in_flight"):
            assert all(0 <= s.value < 1e9 for s in m.get(name, [])), (name, m.get(name))
        assert all(0 <= s.value < 1e6 for s in m.get("cslb_endpoint_occupancy", []))
        wait_for(
            "the rate-limited log line",
            lambda: "hold values no recorder writes" in server.log(),
            20.0,
        )
        assert server.log().count("hold values no recorder writes") <= 2  # one per worker
        assert "Traceback" not in server.log()
        result = server.stop()
    assert result["exit"] == 0 and result["segments"] == []
